// An asynchronous HTTP/1.1 upstream client for the router, the scraper and the load
// generator: a keep-alive connection pool per endpoint, and requests whose responses are
// streamed (the head, then each piece of body as it arrives, then one completion), so
// Server-Sent Events pass through chunk by chunk and are never buffered whole.
//
// Threads: an UpstreamClient belongs to one io_context (typically one per IoPool worker)
// and every call on it, on its UpstreamCall handles, and every callback, happens on that
// context's thread. The pool is therefore touched by one thread only: no locks on the
// request path. Give each worker its own client.
//
// Connection reuse: a connection goes back to the pool only after a response completed
// cleanly (fully read, keep-alive, nothing extra on the wire, not cancelled). Idle pooled
// connections are dropped after ClientOptions::pool_idle_timeout (servers such as uvicorn
// close idle keep-alive connections after 5 s) and checked for a peer close when taken.
// If a reused connection turns out to be dead before any response byte arrived (the
// server closed it while idle), the request is sent once more on a fresh connection.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/verb.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace boost::asio::ssl {
class context;
}

namespace kvroute::http {

// How an upstream exchange ended.
enum class UpstreamError : uint8_t {
  kNone,              // complete response received
  kConnectRefused,    // TCP connect refused (nothing listening)
  kConnectFailed,     // other connect failure (unreachable, resolution failed, ...)
  kConnectTimeout,    // connect did not complete within connect_timeout
  kSendFailed,        // the request could not be written
  kFirstByteTimeout,  // no response head within first_byte_timeout of sending
  kIdleTimeout,       // no body bytes for idle_timeout after the head or the last bytes
  kReset,             // connection closed or reset before the response was complete
  kProtocol,          // malformed response
  kCancelled,         // UpstreamCall::Cancel
};

// "none", "connect_refused", "connect_failed", "connect_timeout", "send_failed",
// "first_byte_timeout", "idle_timeout", "reset", "protocol", "cancelled" (metric labels).
std::string_view UpstreamErrorName(UpstreamError e);

// True for the errors that happen before the request reached the upstream application
// (connect refused/failed/timeout): always safe to retry elsewhere.
bool IsConnectError(UpstreamError e);

struct ClientOptions {
  // Defaults for requests that do not set their own.
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds first_byte_timeout{120000};
  std::chrono::milliseconds idle_timeout{60000};
  // Pooled connections idle longer than this are closed instead of reused.
  std::chrono::milliseconds pool_idle_timeout{4000};
  // At most this many idle connections are kept per endpoint; extra ones are closed.
  std::size_t max_idle_per_endpoint = 256;
  // Response status line + headers larger than this fail with kProtocol.
  std::size_t max_response_header_bytes = 64u << 10;
  // The TLS context of requests to https endpoints (UpstreamRequest::tls): trust,
  // verification, client certificate (adapters/http/tls.h MakeClientTls). Null: one trusting the
  // system's store, made on first use. The TLS handshake counts against connect_timeout;
  // its failure is kConnectFailed.
  std::shared_ptr<boost::asio::ssl::context> tls;
};

struct UpstreamRequest {
  // HTTPS: TLS to host:port (ClientOptions::tls). Pooled apart from plain connections.
  bool tls = false;
  boost::beast::http::verb method = boost::beast::http::verb::get;
  std::string_view target = "/";
  // Sent with Content-Length when non-empty or when the method is POST/PUT.
  // NOT copied: must stay valid until on_done has run (a stale pooled connection may
  // need the request sent again).
  std::string_view body;
  std::string_view content_type = "application/json";  // only with a body
  // Extra header fields, serialised during Start (need not outlive it). Host,
  // Content-Length and Content-Type are written by the client; do not repeat them.
  const std::vector<std::pair<std::string, std::string>>* headers = nullptr;
  // Zero: the client's default.
  std::chrono::milliseconds connect_timeout{0};
  std::chrono::milliseconds first_byte_timeout{0};
  std::chrono::milliseconds idle_timeout{0};
};

// The response status line and headers. Valid only during the on_head callback.
struct ResponseHead {
  int status = 0;
  std::string_view content_type;
  std::optional<uint64_t> content_length;
  bool chunked = false;
  const boost::beast::http::fields* fields = nullptr;  // every header field
};

struct UpstreamResult {
  UpstreamError error = UpstreamError::kNone;
  bool head_received = false;   // on_head ran (so bytes may have reached the caller's client)
  int status = 0;               // response status when head_received
  uint64_t body_bytes = 0;      // decoded body bytes handed to on_data
  bool reused_connection = false;  // the (final) attempt used a pooled connection
  std::string message;          // empty on success; else a description for logs
  bool ok() const { return error == UpstreamError::kNone; }
};

// Callbacks of one request, all on the client's thread. on_head runs at most once, before
// any on_data; on_data runs for each piece of decoded body (chunked framing removed) as it
// arrives, the view valid only during the call; on_done runs exactly once, last. Any
// callback may call UpstreamCall::Cancel (then on_done(kCancelled) follows at once unless
// the request already finished).
struct UpstreamCallbacks {
  std::function<void(const ResponseHead&)> on_head;
  std::function<void(std::string_view)> on_data;
  std::function<void(UpstreamResult&&)> on_done;
  // Held until on_done has run, then released. Lets the callbacks capture a plain
  // pointer to their owner (small captures are stored without allocating) while this
  // keeps the owner alive.
  std::shared_ptr<void> owner;
};

class UpstreamClient;
namespace detail {
struct ClientPool;
}

// A handle on one request in flight. Cheap to copy; a default-constructed handle is empty.
// Dropping every handle does not cancel the request.
class UpstreamCall {
 public:
  UpstreamCall() = default;
  // Aborts the request: closes its connection (the upstream sees the client leave and
  // can abort the generation) and runs on_done with kCancelled synchronously, before
  // returning. No-op if the request already finished or the handle is empty.
  void Cancel();
  // True once on_done has run (or the handle is empty).
  bool done() const;
  // Back-pressure: stops reading the response (no more on_data, and no idle timeout,
  // until Resume) after the piece being delivered now and what is already buffered.
  // Resume reads on. Both are no-ops once done.
  void Pause();
  void Resume();

  struct State;  // implementation detail

 private:
  friend class UpstreamClient;
  explicit UpstreamCall(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

struct ClientStats {
  uint64_t requests = 0;
  uint64_t connections_opened = 0;
  uint64_t connections_reused = 0;
  uint64_t stale_retries = 0;  // reused connections found dead, request re-sent
};

class UpstreamClient {
 public:
  // `ctx` must outlive the client and every request it started.
  explicit UpstreamClient(boost::asio::io_context& ctx, ClientOptions options = {});
  // Closes idle connections. Requests still in flight continue (their connections are
  // closed instead of pooled when they end); cancel them first for a quick stop.
  ~UpstreamClient();
  UpstreamClient(const UpstreamClient&) = delete;
  UpstreamClient& operator=(const UpstreamClient&) = delete;

  // Starts `request` to host:port. Never calls a callback before returning (failures
  // are reported asynchronously). `host` is an IP address or a name; names are
  // resolved (blocking) the first time an endpoint is used and cached.
  UpstreamCall Start(std::string_view host, uint16_t port, const UpstreamRequest& request,
                     UpstreamCallbacks callbacks);

  // The TLS context for connections opened from now on (pooled ones keep theirs).
  void set_tls(std::shared_ptr<boost::asio::ssl::context> tls);
  // Closes every idle pooled connection.
  void CloseIdle();
  std::size_t idle_connections() const;
  const ClientStats& stats() const;
  const ClientOptions& options() const;

 private:
  std::shared_ptr<detail::ClientPool> pool_;
};

}  // namespace kvroute::http
