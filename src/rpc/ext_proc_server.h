// The gRPC adapter of the endpoint picker: Envoy's ExternalProcessor service over the
// pure exchange (core/extproc/exchange.h), and grpc.health.v1 on a separate port.
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
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/common/status.h"
#include "core/extproc/epp_stats.h"
#include "core/extproc/exchange.h"
#include "core/routing/routing_core.h"

namespace grpc {
class Server;
class CallbackGenericService;
}

namespace kvroute::rpc {

struct ExtProcServerOptions {
  std::string host = "0.0.0.0";  // both ports; "::" for IPv6
  uint16_t port = 9002;          // 0: any free port (read it back with port())
  uint16_t health_port = 9003;   // 0: any free port
  double stream_timeout_s = 60.0;
  // Largest gRPC message accepted (a BUFFERED body arrives in one): keep it above
  // limits.max_body_bytes so that an oversized body gets the exchange's 413.
  std::size_t max_message_bytes = (16u << 20) + (1u << 20);
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

  class Stream;  // one Process call (public for the .cc's service class)
  class Service;

 private:
  friend class Stream;
  friend class Service;
  void Register(const std::shared_ptr<Stream>& s);
  void Unregister(Stream* s);
  void PollLoop();
  void SetReadiness(bool ready);

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
};

}  // namespace kvroute::rpc
