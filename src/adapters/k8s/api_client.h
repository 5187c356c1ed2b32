// An HTTPS client for the Kubernetes API server: GET (a list, or one object) and WATCH
// (a chunked stream of newline-delimited JSON events), over Boost.Beast and OpenSSL, with
// the credentials of a ClusterAccess (kubeconfig.h). It moves bytes only: bodies and
// event lines are handed to callbacks as they are; decoding them (pods, InferencePools)
// is src/adapters/k8s/objects's job.
//
// TLS: the server certificate is verified against access.ca_pem (the system's CAs when
// empty) and against the host name or IP (access.tls_server_name if set, else the host),
// sent as SNI when it is a name; insecure_skip_tls_verify turns verification off. A
// client certificate and key are presented when the access has them. The bearer token is
// taken from access.token at each request, so a rotated token file is picked up.
//
// One connection per request (the client makes a list now and then and holds one watch
// open; pooling would buy nothing). Every failure is one ApiError kind, counted in
// stats(), with a message naming what failed and where, for the log line.
//
// Threads: an ApiClient belongs to one io_context; call it, and get every callback, on
// that context's thread. Callbacks never run before the starting call returns.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/common/status.h"
#include "adapters/k8s/backoff.h"
#include "adapters/k8s/kubeconfig.h"

namespace kvroute::k8s {

enum class ApiError : uint8_t {
  kNone,          // a complete 2xx response (a watch: the server ended the stream cleanly)
  kConnect,       // name resolution, TCP connect, or the connection lost mid-exchange
  kTls,           // TLS set-up or handshake, certificate verification included
  kTimeout,       // connect, request, or a watch silent for watch_idle_timeout
  kHttpStatus,    // a non-2xx status other than 401, 403 and 410
  kUnauthorized,  // 401 or 403: the token or certificate is wrong, or RBAC forbids
  kGone,          // 410, or a watch ERROR event with code 410: the resourceVersion is too old
  kProtocol,      // a malformed response, or one larger than the limits
  kCancelled,     // ApiRequest::Cancel or WatchLoop::Stop
};
inline constexpr size_t kApiErrorKinds = 9;

// "none", "connect", "tls", "timeout", "http_status", "unauthorized", "gone", "protocol",
// "cancelled" (metric labels).
std::string_view ApiErrorName(ApiError e);

// The StatusCode a failure of kind `e` is reported with: kOk for kNone, kDeadlineExceeded
// for kTimeout, kFailedPrecondition for kUnauthorized and kGone (the credentials or the
// resourceVersion must change first), kUnavailable for the others.
StatusCode ApiErrorCode(ApiError e);

struct ApiClientOptions {
  std::chrono::milliseconds connect_timeout{5000};  // resolve + TCP connect, then TLS handshake
  std::chrono::milliseconds request_timeout{30000};  // a GET, from sending to the last byte
  // A watch with no bytes for this long is dead (the API server sends a bookmark about
  // once a minute when asked for bookmarks).
  std::chrono::milliseconds watch_idle_timeout{120000};
  size_t max_body_bytes = 64u << 20;  // a GET body, or a non-2xx body of a watch
  size_t max_line_bytes = 16u << 20;  // one watch event
};

struct ApiResult {
  ApiError error = ApiError::kNone;
  int http_status = 0;  // 0 when no response head arrived
  std::string body;     // a GET's body; for a non-2xx response, its (Kubernetes Status) body
  // Ok on success; else ApiErrorCode(error) and a message naming what failed and where,
  // e.g. "GET /api/v1/...: HTTP 401: Unauthorized".
  Status status;
  bool ok() const { return error == ApiError::kNone; }
};

struct ApiStats {
  uint64_t requests = 0;
  uint64_t watch_lines = 0;
  std::array<uint64_t, kApiErrorKinds> failures{};  // by ApiError (kNone stays 0)
  uint64_t failures_of(ApiError e) const { return failures[static_cast<size_t>(e)]; }
};

struct WatchCallbacks {
  // The response head arrived with status 200: the watch is established.
  std::function<void()> on_open;
  // One event (a line without its '\n'; empty lines are skipped). The view is valid only
  // during the call.
  std::function<void(std::string_view line)> on_line;
  // Exactly once, last. kGone when an ERROR event with code 410 was delivered (that line
  // went to on_line first) or the status was 410.
  std::function<void(ApiResult&&)> on_done;
};

// A handle on a request in flight; empty when default-constructed.
class ApiRequest {
 public:
  struct Session;
  ApiRequest() = default;
  explicit ApiRequest(std::shared_ptr<Session> s) : session_(std::move(s)) {}
  // Closes the connection and runs on_done(kCancelled) before returning, unless the
  // request already finished.
  void Cancel();

 private:
  std::shared_ptr<Session> session_;
};

class ApiClient {
 public:
  // `ctx` must outlive the client and its requests. A CA or client certificate that
  // OpenSSL rejects makes init_status() InvalidArgument and every request fail with kTls.
  ApiClient(boost::asio::io_context& ctx, ClusterAccess access, ApiClientOptions options = {});
  ~ApiClient();
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  // GET `target` (path and query, e.g. "/api/v1/namespaces/ns/pods?labelSelector=app%3Dv").
  ApiRequest Get(std::string target, std::function<void(ApiResult&&)> on_done);
  // GET `target` as a watch (the caller writes watch=1&resourceVersion=...): the body is
  // delivered line by line as it arrives, until the server ends it or a failure.
  ApiRequest Watch(std::string target, WatchCallbacks callbacks);

  // Ok when the TLS setup succeeded, else InvalidArgument naming the rejected CA or client
  // certificate and where it came from.
  const Status& init_status() const;
  const ApiStats& stats() const;
  const ClusterAccess& access() const;
  boost::asio::io_context& context() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// A watch kept open: reconnects when it ends or fails, after Backoff's delay (a watch
// that stayed open reset_after reconnects after `initial`). `target` is called before
// every connection, so the owner resumes from the last resourceVersion it saw (or, after
// kGone, from a fresh list's). Stop cancels; no callback runs after Stop or destruction.
// `client` must outlive the loop. Thread: the client's.
class WatchLoop {
 public:
  struct Callbacks {
    std::function<std::string()> target;
    std::function<void()> on_open;
    std::function<void(std::string_view line)> on_line;
    // After each connection ended (never for Stop), with the delay before the next one.
    std::function<void(const ApiResult&, std::chrono::milliseconds next_delay)> on_end;
  };
  WatchLoop(ApiClient& client, Callbacks callbacks, BackoffPolicy policy = {}, uint64_t seed = 1);
  ~WatchLoop();  // Stop()
  void Start();
  void Stop();
  uint64_t connections() const;  // watch requests started

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kvroute::k8s
