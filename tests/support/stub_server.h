// Stand-ins for upstreams in the loopback tests: everything listens on 127.0.0.1, port 0
// (the kernel picks a free port; read it back with port()), and runs on event-loop
// threads of its own, so a test talks to it over real TCP and HTTP exactly as the code
// under test talks to an engine replica.
//
//   ClosedPort()    a port nothing listens on: connecting is refused.
//   SilentListener  accepts TCP connections (in the kernel's backlog) and never reads or
//                   answers: every request hangs.
//   LoopbackServer  an http::Server (the project's own) calling the test's handler.
//   StubUpstream    a scripted replica: GET /metrics answers what the test sets (status,
//                   body, content type, delay; counted), every other request gets the
//                   behaviour of its Mode (answer, hang, reset mid-stream, flood, 503).
//
// Built into the kvroute_test_loopback library (tests/CMakeLists.txt).
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/common/status.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/server.h"

namespace kvroute::test_support {

// The loopback host every stub listens on.
inline constexpr const char* kLoopbackHost = "127.0.0.1";

// "127.0.0.1:<port>".
std::string LoopbackAddress(uint16_t port);

// A port on 127.0.0.1 that nothing listens on: bound to learn a free number, then closed
// at once. A connection to it is refused (unless another process has bound that port in
// the meantime, which the tests accept as unlikely).
uint16_t ClosedPort();

// A TCP listener on 127.0.0.1, port 0, that nobody serves: the kernel completes up to
// `backlog` handshakes into its queue, nothing reads them, so a client's request is sent
// and never answered (only its own timeout ends it). Closed when destroyed.
class SilentListener {
 public:
  explicit SilentListener(int backlog = 64);
  uint16_t port() const { return port_; }

 private:
  boost::asio::io_context ctx_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
};

// The project's http::Server on 127.0.0.1, port 0 (unless `options` says otherwise), with an
// IoPool of `threads` threads of its own, calling `handler` for every request. Listens in
// the constructor and does not fail the test itself: a test asserts on listen_status()
// where it matters. Destruction stops accepting, then stops the threads (exchanges still
// open are dropped with their contexts).
class LoopbackServer {
 public:
  explicit LoopbackServer(http::Handler handler, http::ServerOptions options = {}, int threads = 1);
  ~LoopbackServer();
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  // What Listen() returned.
  const Status& listen_status() const { return listen_status_; }
  uint16_t port() const { return server_->port(); }
  std::string address() const { return LoopbackAddress(port()); }
  const http::ServerStats& stats() const { return server_->stats(); }
  // The server's event loop `i`: post work that must run on the server's thread.
  boost::asio::io_context& context(int i = 0) { return pool_.context(i); }

  // New connections are refused from now on; open ones stay.
  void StopAccepting() { server_->StopAccepting(); }
  // Stops accepting and joins the threads; handlers not yet run never run. Idempotent.
  void Stop();

 private:
  http::IoPool pool_;  // declared first: destroyed after the server
  std::unique_ptr<http::Server> server_;
  Status listen_status_;
};

// A scripted upstream that looks like a vLLM replica to the router and the scraper.
//
// GET /metrics answers `metrics` (status 200, `metrics_type`) until ServeMetrics changes
// it, optionally after a delay; metrics_requests() counts these requests. Every other
// request is handled according to the Mode. Listening is expected to succeed (checked with
// EXPECT in the constructor).
class StubUpstream {
 public:
  enum class Mode {
    kOk,            // 200 {"stub":true} at once
    kNeverAnswer,   // read, then held without an answer until the stub is destroyed
    kDieMidStream,  // a 200 event stream with one partial SSE chunk, then the connection
                    // is closed (the client sees a reset mid-stream)
    kFlood,         // a 200 stream of kFloodChunks chunks of kFloodChunk bytes ('a'..'z'
                    // in turn), each sent once the previous one was written: flushed()
                    // counts what the peer's socket accepted
    kFail503,       // 503 with an OpenAI-shaped "engine is restarting" body at once (a
                    // replica during a deploy) while /metrics says it is idle
  };
  static constexpr std::size_t kFloodChunk = 64u << 10;
  static constexpr std::size_t kFloodChunks = 1024;  // 64 MiB in all

  // An idle vLLM: nothing running or waiting, KV cache empty.
  static constexpr const char* kIdleVllmMetrics =
      "vllm:num_requests_running 0.0\nvllm:num_requests_waiting 0.0\n"
      "vllm:kv_cache_usage_perc 0.0\n";

  explicit StubUpstream(Mode mode = Mode::kOk, std::string metrics = kIdleVllmMetrics,
                        std::string metrics_type = "text/plain");
  ~StubUpstream();
  StubUpstream(const StubUpstream&) = delete;
  StubUpstream& operator=(const StubUpstream&) = delete;

  uint16_t port() const { return server_->port(); }
  std::string address() const { return server_->address(); }
  // New connections are refused from now on (open ones stay): a replica that went away.
  void StopAccepting() { server_->StopAccepting(); }

  // From now on GET /metrics is answered with `status` and `body` (same content type),
  // `delay` after the request arrived (0: at once). Thread: any.
  void ServeMetrics(int status, std::string body,
                    std::chrono::milliseconds delay = std::chrono::milliseconds(0));
  // GET /metrics requests received so far.
  int metrics_requests() const { return metrics_requests_.load(); }
  // kFlood: bytes of the stream written to the socket so far.
  uint64_t flushed() const { return flushed_.load(); }

 private:
  void Handle(std::shared_ptr<http::Exchange> ex);
  void HandleMetrics(std::shared_ptr<http::Exchange> ex);
  void Flood(std::shared_ptr<http::Exchange> ex, std::size_t i);

  const Mode mode_;
  const std::string metrics_type_;
  std::atomic<int> metrics_requests_{0};
  std::atomic<uint64_t> flushed_{0};
  std::mutex mu_;  // guards the three below
  int metrics_status_ = 200;
  std::string metrics_;
  std::chrono::milliseconds metrics_delay_{0};
  // kNeverAnswer's exchanges; touched on the server's single thread only.
  std::vector<std::shared_ptr<http::Exchange>> held_;
  std::unique_ptr<LoopbackServer> server_;  // last: built once the members above exist
};

// An upstream that looks idle to the scraper (until ServeMetrics sets another /metrics
// body), records every other request (method, target, body, X-Request-Id and every header
// field, names lower-cased) and answers each with `answer` (200, JSON). Thread: seen() and
// ServeMetrics from any.
class RecordingUpstream {
 public:
  struct Seen {
    std::string target, body, request_id;
    std::map<std::string, std::string> headers;
    std::string method;
    std::string Header(const std::string& name) const {
      auto it = headers.find(name);
      return it == headers.end() ? std::string() : it->second;
    }
  };
  // `options`: e.g. options.tls for a replica behind HTTPS.
  explicit RecordingUpstream(std::string answer, http::ServerOptions options = {})
      : answer_(std::move(answer)),
        server_([this](std::shared_ptr<http::Exchange> ex) { Handle(std::move(ex)); }, std::move(options)) {}
  // Extra header fields on every answer but /metrics's, from now on.
  void AnswerHeaders(http::Fields fields) {
    std::lock_guard<std::mutex> lock(mu_);
    answer_headers_ = std::move(fields);
  }
  uint16_t port() const { return server_.port(); }
  std::string address() const { return server_.address(); }
  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  // GET /metrics requests received so far.
  int metrics_requests() const { return metrics_requests_.load(); }
  // GET /metrics answers `body` (200, text/plain) from now on.
  void ServeMetrics(std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_ = std::move(body);
  }

 private:
  void Handle(std::shared_ptr<http::Exchange> ex) {
    const auto& req = ex->request();
    if (req.target() == "/metrics") {
      ++metrics_requests_;
      std::string body;
      {
        std::lock_guard<std::mutex> lock(mu_);
        body = metrics_;
      }
      ex->Respond(200, std::move(body), "text/plain");
      return;
    }
    Seen s;
    s.target = std::string(req.target());
    s.body = req.body();
    for (const auto& f : req) {
      std::string name(f.name_string());
      for (char& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
      s.headers[name] = std::string(f.value());
    }
    s.request_id = s.Header("x-request-id");
    s.method = std::string(req.method_string());
    http::Fields extra;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(std::move(s));
      extra = answer_headers_;
    }
    ex->Respond(200, answer_, "application/json", extra);
  }
  const std::string answer_;
  http::Fields answer_headers_;
  std::mutex mu_;
  std::vector<Seen> seen_;
  std::string metrics_ = StubUpstream::kIdleVllmMetrics;
  std::atomic<int> metrics_requests_{0};
  LoopbackServer server_;  // last: handlers may run once it exists
};

}  // namespace kvroute::test_support
