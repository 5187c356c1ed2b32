// The gRPC adapter of the endpoint picker: Envoy's ExternalProcessor service over the
// pure exchange (apps/epp/extproc/exchange.h), and grpc.health.v1 on a separate port.
//
// Each Process stream is one callback-API reactor owning one extproc::Exchange: a message
// read is fed to the exchange (with the clock read here) and its answers written in
// order, one write in flight at a time; the next read starts as soon as the message is
// handled, so a stream never waits for its own writes to drain before reading on. Streams
// run on gRPC's callback threads and share nothing but the routing core and the stats,
// so concurrent streams are never serialised behind one another.
//
// Every stream ends: when Envoy half-closes it, when it is cancelled, after an immediate
// response (the stream is finished with OK once it is written) or after
// `stream_timeout_s` (finished with DEADLINE_EXCEEDED). Whatever the end, the exchange is
// closed, so its request is finished in the core exactly once.
//
// Flow control (ExtProcServerOptions::flow_enabled, with ExchangeSettings::defer_pick):
// a stream whose exchange reaches its pick is admitted into one flow::FlowGate (the rules
// `kvroute serve` uses too: core/flow/flow_gate.h), priority and flow from the exchange.
// Dispatched at once: picked and answered as without flow control. Rejected (sheddable,
// a band over its bounds): ImmediateResponse 429 with retry-after at once. Queued: its
// answer is held back while the stream keeps reading; PumpFlow (called here whenever a
// stream's picked request finishes, with the endpoint it finished on, so that endpoint
// takes a waiting request whose prefix it holds; and by the owner when a scrape result
// arrives) expires what is due, then dispatches waiting streams one at a time while the
// pool has room, each picked at that moment. Past the TTL: 429 with retry-after; past
// no_endpoint_ttl: 503. A held stream that ends (cancelled, timed out, a failed write)
// leaves the queue at once; one Envoy half-closes stays open for its held answer and ends
// after it. The gate's one timer is the poller's wait, shortened to its next expiry. The
// gate's lock is never held while calling into a stream or gRPC; a stream's lock may be
// held while taking it (stream, then gate), never the other way round.
//
// Precise prefix routing (ExtProcServerOptions::tokenize, want_token_ids): a stream whose
// exchange waits for its prompt's token ids (Exchange::awaiting_token_ids) hands the
// prompt to `tokenize` and keeps reading; the answer comes back on the tokenizer's thread,
// where the exchange gets the ids (or none) and goes on to flow admission or its pick.
// Like a held answer, a stream half-closed meanwhile stays open for it.
//
// Health (grpc.health.v1, gRPC's DefaultHealthCheckService on the health port):
// "liveness" and "" SERVING while the server runs; "readiness" and
// "envoy.service.ext_proc.v3.ExternalProcessor" SERVING while RoutingCore::Ready (polled
// every 50 ms, with the stream timeouts), NOT_SERVING otherwise and after Stop.
//
// Threads: Start and Stop from one thread (not a gRPC callback); the rest from any.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/common/status.h"
#include "apps/epp/extproc/epp_stats.h"
#include "apps/epp/extproc/exchange.h"
#include "core/flow/flow_gate.h"
#include "core/flow/flow_queue.h"
#include "core/routing/routing_core.h"

namespace grpc {
class Server;
class CallbackGenericService;
}

namespace kvroute::rpc {

// TLS on the ext_proc port (the health port stays plaintext: kubelet's gRPC probes do not
// speak TLS). Off: plaintext h2c.
struct ExtProcTls {
  bool enabled = false;
  // A fixed pair (PEM), or, when `watched_file` is set, none: gRPC re-reads that file
  // (the certificate chain, then the private key, PEM) every `refresh_s` seconds (at
  // least 1) and new handshakes use what it last read; replace it atomically (rename).
  std::string cert_pem, key_pem;
  std::string watched_file;
  unsigned refresh_s = 1;
};

struct ExtProcServerOptions {
  std::string host = "0.0.0.0";  // both ports; "::" for IPv6
  uint16_t port = 9002;          // 0: any free port (read it back with port())
  uint16_t health_port = 9003;   // 0: any free port
  double stream_timeout_s = 60.0;
  ExtProcTls tls;
  // A connection to the ext_proc port that has not finished its TLS handshake and sent
  // its HTTP/2 preface within this time is closed (a stalled or silent client).
  double handshake_timeout_s = 10.0;
  // Largest gRPC message accepted (a BUFFERED body arrives in one): keep it above
  // limits.max_body_bytes so that an oversized body gets the exchange's 413.
  std::size_t max_message_bytes = (16u << 20) + (1u << 20);
  // Flow control (flow.enabled): the front end's gate, over the same routing core; it
  // must outlive the server. Streams wait in it at their pick while the pool is
  // saturated. Needs streams whose settings have defer_pick (without it the exchange
  // picks on its own); a held exchange without a gate is resumed at once. Null: off.
  flow::FlowGate* flow_gate = nullptr;
  // Precise prefix routing: tokenizes a held exchange's prompt (Exchange::
  // awaiting_token_ids) and calls `done` exactly once, on any thread but never inside
  // this call, with the ids (empty: failed or timed out; the pick is then approximate).
  // Never blocks. Unset: such exchanges are given no ids at once.
  std::function<void(extproc::TokenInput, std::function<void(std::vector<uint32_t>)>)> tokenize;
  // Asked at each pick: whether to tokenize first (RoutingCore::kv_events_active).
  std::function<bool()> want_token_ids;
  // capture: where every exchange hands its request's line (must outlive the server).
  // Null: off.
  capture::Sink* capture = nullptr;
};

// Counters of the adapter itself, any thread may read them.
struct ServerStats {
  std::atomic<int64_t> open_streams{0};
  std::atomic<uint64_t> streams{0};          // started
  std::atomic<uint64_t> timeouts{0};         // ended by stream_timeout
  std::atomic<uint64_t> cancelled{0};        // cancelled by the client (or by Stop)
  std::atomic<uint64_t> messages_in{0}, messages_out{0};
};

class ExtProcServer {
 public:
  // `core` and `stats` (may be null) must outlive the server. `clock`: seconds on the
  // monotonic clock the core's time is measured in. `settings`: the exchange settings in
  // force, read once per new stream (a reload affects new streams only).
  ExtProcServer(routing::RoutingCore& core, extproc::EppStats* stats, std::function<double()> clock,
                std::function<std::shared_ptr<const extproc::ExchangeSettings>()> settings);
  // Stops.
  ~ExtProcServer();
  ExtProcServer(const ExtProcServer&) = delete;
  ExtProcServer& operator=(const ExtProcServer&) = delete;

  // Binds both ports and starts serving. Unavailable ("ext_proc: cannot listen on
  // 0.0.0.0:9002") when a port cannot be bound; nothing keeps running then.
  Status Start(const ExtProcServerOptions& options);
  // Ends every open stream (cancelled: their requests finish as 499), stops both servers
  // and the poller. Idempotent.
  void Stop();

  uint16_t port() const { return port_; }
  uint16_t health_port() const { return health_port_; }
  // For reloads: applies to streams started from now on.
  void set_stream_timeout(double seconds) { timeout_s_.store(seconds, std::memory_order_relaxed); }
  const ServerStats& stats() const { return stats_; }

  // Capacity may have freed (a scrape result reached the core): expires due waiting
  // streams and dispatches waiting ones while the pool has capacity. Cheap when nothing
  // waits or flow control is off. Thread: any, holding no stream's lock (a pump already
  // running on another thread runs once more instead).
  void PumpFlow(uint32_t freed = routing::RoutingCore::kNoEndpoint);
  bool flow_enabled() const { return flow_ != nullptr; }

  class Stream;  // one Process call (public for the .cc's service class)
  class Service;

 private:
  friend class Stream;
  friend class Service;
  void Register(const std::shared_ptr<Stream>& s);
  void Unregister(Stream* s);
  void PollLoop();
  void SetReadiness(bool ready);
  // Flow control, for the streams. Admit takes the stream's own lock's holder as `s`.
  flow::AdmitResult AdmitFlow(flow::FlowRequest& request, const std::weak_ptr<Stream>& s,
                              const sched::SchedRequest& sched_request);

  routing::RoutingCore& core_;
  extproc::EppStats* epp_stats_;
  std::function<double()> clock_;
  std::function<std::shared_ptr<const extproc::ExchangeSettings>()> settings_;
  std::atomic<double> timeout_s_{60.0};
  ServerStats stats_;

  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::CallbackGenericService> health_fallback_;
  std::unique_ptr<grpc::Server> health_server_;
  uint16_t port_ = 0, health_port_ = 0;

  std::mutex mu_;  // guards streams_, stopping_
  std::condition_variable cv_;
  std::map<Stream*, std::shared_ptr<Stream>> streams_;
  bool stopping_ = false;
  std::thread poller_;
  int readiness_ = -1;  // last published (poller thread only): -1 unknown
  bool started_ = false;

  // Flow control; null when off.
  flow::FlowGate* flow_ = nullptr;
  // ExtProcServerOptions::tokenize and want_token_ids (set before streams start).
  std::function<void(extproc::TokenInput, std::function<void(std::vector<uint32_t>)>)> tokenize_;
  std::function<bool()> want_token_ids_;
  capture::Sink* capture_ = nullptr;  // ExtProcServerOptions::capture
};

}  // namespace kvroute::rpc
