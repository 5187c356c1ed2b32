#include "adapters/k8s/api_client.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <optional>
#include <utility>

namespace kvroute::k8s {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

std::string_view ApiErrorName(ApiError e) {
  switch (e) {
    case ApiError::kNone: return "none";
    case ApiError::kConnect: return "connect";
    case ApiError::kTls: return "tls";
    case ApiError::kTimeout: return "timeout";
    case ApiError::kHttpStatus: return "http_status";
    case ApiError::kUnauthorized: return "unauthorized";
    case ApiError::kGone: return "gone";
    case ApiError::kProtocol: return "protocol";
    case ApiError::kCancelled: return "cancelled";
  }
  return "unknown";
}

StatusCode ApiErrorCode(ApiError e) {
  switch (e) {
    case ApiError::kNone: return StatusCode::kOk;
    case ApiError::kTimeout: return StatusCode::kDeadlineExceeded;
    case ApiError::kUnauthorized:
    case ApiError::kGone: return StatusCode::kFailedPrecondition;
    case ApiError::kConnect:
    case ApiError::kTls:
    case ApiError::kHttpStatus:
    case ApiError::kProtocol:
    case ApiError::kCancelled: return StatusCode::kUnavailable;
  }
  return StatusCode::kUnavailable;
}

struct ApiClient::Impl {
  Impl(net::io_context& c, ClusterAccess a, ApiClientOptions o)
      : ctx(c), access(std::move(a)), options(o), tls(ssl::context::tls_client) {
    boost::system::error_code ec;
    tls.set_options(ssl::context::no_sslv2 | ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                    ssl::context::no_tlsv1_1);
    if (!access.ca_pem.empty()) {
      tls.add_certificate_authority(net::buffer(access.ca_pem), ec);
      if (ec) {
        init_status = Status::InvalidArgument("certificate authority of " + access.source + ": " +
                                              ec.message());
      }
    } else {
      tls.set_default_verify_paths(ec);
    }
    if (init_status.ok() && !access.client_cert_pem.empty()) {
      tls.use_certificate_chain(net::buffer(access.client_cert_pem), ec);
      if (!ec) tls.use_private_key(net::buffer(access.client_key_pem), ssl::context::pem, ec);
      if (ec) {
        init_status = Status::InvalidArgument("client certificate of " + access.source + ": " +
                                              ec.message());
      }
    }
  }
  net::io_context& ctx;
  ClusterAccess access;
  ApiClientOptions options;
  ssl::context tls;
  Status init_status;  // ok unless OpenSSL rejected the CA or the client certificate
  ApiStats stats;
};

namespace {

bool IsIpAddress(const std::string& s) {
  boost::system::error_code ec;
  net::ip::make_address(s, ec);
  return !ec;
}

// The part of a Status body worth a log line: its "message" field, found without a
// JSON parser (this layer does not decode), else the body's start.
std::string StatusMessage(const std::string& body) {
  constexpr std::string_view kKey = "\"message\":\"";
  size_t at = body.find(kKey);
  if (at != std::string::npos) {
    size_t from = at + kKey.size();
    size_t end = body.find('"', from);
    if (end != std::string::npos) return body.substr(from, end - from);
  }
  return body.substr(0, 200);
}

// A watch ERROR event with code 410 (Gone): the API server's compact JSON, sniffed only to
// count it and end the watch as kGone; the line itself still goes to the owner to decode.
bool IsGoneEvent(std::string_view line) {
  return line.find("\"type\":\"ERROR\"") != std::string_view::npos &&
         line.find("\"code\":410") != std::string_view::npos;
}

}  // namespace

struct ApiRequest::Session : std::enable_shared_from_this<ApiRequest::Session> {
  Session(std::shared_ptr<ApiClient::Impl> impl, std::string target, bool watch)
      : impl(std::move(impl)),
        target(std::move(target)),
        watch(watch),
        resolver(this->impl->ctx),
        stream(this->impl->ctx, this->impl->tls) {}

  std::shared_ptr<ApiClient::Impl> impl;
  std::string target;
  bool watch;
  tcp::resolver resolver;
  beast::ssl_stream<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  http::request<http::empty_body> req;
  std::optional<http::response_parser<http::buffer_body>> parser;
  char chunk[16384];
  std::string body, pending;
  bool head_seen = false, done = false, gone = false;
  int status = 0;
  std::function<void(ApiResult&&)> on_done;
  WatchCallbacks wcb;

  const ClusterAccess& access() const { return impl->access; }
  std::string Where() const {
    return std::string(watch ? "WATCH " : "GET ") + access().host + ":" +
           std::to_string(access().port) + target;
  }

  void Start() {
    ++impl->stats.requests;
    if (!impl->init_status.ok()) {
      net::post(impl->ctx, [self = shared_from_this()] {
        self->Finish(ApiError::kTls, self->impl->init_status.message());
      });
      return;
    }
    beast::get_lowest_layer(stream).expires_after(impl->options.connect_timeout);
    resolver.async_resolve(access().host, std::to_string(access().port),
                           [self = shared_from_this()](beast::error_code ec,
                                                       const tcp::resolver::results_type& r) {
                             self->OnResolve(ec, r);
                           });
  }

  void OnResolve(beast::error_code ec, const tcp::resolver::results_type& results) {
    if (done) return;
    if (ec) return Finish(ApiError::kConnect, "resolve " + access().host + ": " + ec.message());
    beast::get_lowest_layer(stream).expires_after(impl->options.connect_timeout);
    beast::get_lowest_layer(stream).async_connect(
        results, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
          self->OnConnect(ec);
        });
  }

  void OnConnect(beast::error_code ec) {
    if (done) return;
    if (ec == beast::error::timeout) return Finish(ApiError::kTimeout, "connect: timed out");
    if (ec) return Finish(ApiError::kConnect, "connect: " + ec.message());
    const std::string& name =
        access().tls_server_name.empty() ? access().host : access().tls_server_name;
    if (!IsIpAddress(name)) SSL_set_tlsext_host_name(stream.native_handle(), name.c_str());
    if (access().insecure_skip_tls_verify) {
      stream.set_verify_mode(ssl::verify_none);
    } else {
      stream.set_verify_mode(ssl::verify_peer);
      stream.set_verify_callback(ssl::host_name_verification(name));
    }
    beast::get_lowest_layer(stream).expires_after(impl->options.connect_timeout);
    stream.async_handshake(ssl::stream_base::client,
                           [self = shared_from_this()](beast::error_code ec) {
                             self->OnHandshake(ec);
                           });
  }

  void OnHandshake(beast::error_code ec) {
    if (done) return;
    if (ec == beast::error::timeout) return Finish(ApiError::kTimeout, "TLS handshake: timed out");
    if (ec) {
      std::string why = "TLS handshake: " + ec.message();
      long verify = SSL_get_verify_result(stream.native_handle());
      if (verify != X509_V_OK)
        why += std::string(" (") + X509_verify_cert_error_string(verify) + ")";
      return Finish(ApiError::kTls, why);
    }
    req = {};
    req.method(http::verb::get);
    req.target(access().base_path + target);
    req.version(11);
    req.set(http::field::host, access().host);
    req.set(http::field::user_agent, "kvroute");
    req.set(http::field::accept, "application/json");
    std::string token_error;
    const std::string& token = impl->access.token.Current(&token_error);
    if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    beast::get_lowest_layer(stream).expires_after(
        watch ? impl->options.watch_idle_timeout : impl->options.request_timeout);
    http::async_write(stream, req, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->OnWrite(ec);
    });
  }

  void OnWrite(beast::error_code ec) {
    if (done) return;
    if (ec == beast::error::timeout) return Finish(ApiError::kTimeout, "send: timed out");
    if (ec) return Finish(ApiError::kConnect, "send: " + ec.message());
    parser.emplace();
    parser->body_limit(boost::none);  // our own limits, per line and per body
    ReadSome();
  }

  void ReadSome() {
    parser->get().body().data = chunk;
    parser->get().body().size = sizeof chunk;
    if (watch) beast::get_lowest_layer(stream).expires_after(impl->options.watch_idle_timeout);
    http::async_read_some(stream, buffer, *parser,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            self->OnRead(ec);
                          });
  }

  void OnRead(beast::error_code ec) {
    if (done) return;
    if (ec == http::error::need_buffer) ec = {};
    size_t got = sizeof chunk - parser->get().body().size;
    if (!head_seen && parser->is_header_done()) {
      head_seen = true;
      status = parser->get().result_int();
      if (watch && status == 200 && wcb.on_open) wcb.on_open();
      if (done) return;
    }
    if (got > 0 && !Consume(std::string_view(chunk, got))) return;
    if (ec == beast::error::timeout) {
      return Finish(ApiError::kTimeout, watch ? "watch: no bytes for " +
                                                    std::to_string(impl->options.watch_idle_timeout.count()) + " ms"
                                              : "response: timed out");
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == ssl::error::stream_truncated || ec == net::error::connection_reset) {
      return Finish(ApiError::kConnect, "connection closed before the response was complete");
    }
    if (ec) return Finish(ApiError::kProtocol, "response: " + ec.message());
    if (parser->is_done()) return Complete();
    ReadSome();
  }

  // False when it finished the request.
  bool Consume(std::string_view data) {
    if (!watch || status != 200) {
      if (body.size() + data.size() > impl->options.max_body_bytes) {
        Finish(ApiError::kProtocol, "response body larger than " +
                                        std::to_string(impl->options.max_body_bytes) + " bytes");
        return false;
      }
      body.append(data);
      return true;
    }
    pending.append(data);
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(pending.data() + start, nl - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (!Deliver(line)) return false;
    }
    pending.erase(0, start);
    if (pending.size() > impl->options.max_line_bytes) {
      Finish(ApiError::kProtocol, "watch event longer than " +
                                      std::to_string(impl->options.max_line_bytes) + " bytes");
      return false;
    }
    return true;
  }

  bool Deliver(std::string_view line) {
    if (line.empty()) return true;
    ++impl->stats.watch_lines;
    if (IsGoneEvent(line)) gone = true;
    if (wcb.on_line) wcb.on_line(line);
    return !done;  // the callback may have cancelled
  }

  void Complete() {
    if (status >= 200 && status < 300) {
      if (watch && !pending.empty()) {
        std::string last = std::move(pending);
        if (!Deliver(last)) return;
      }
      if (gone) return Finish(ApiError::kGone, "watch: ERROR event 410 (resourceVersion too old)");
      return Finish(ApiError::kNone, "");
    }
    std::string why = "HTTP " + std::to_string(status) + ": " + StatusMessage(body);
    if (status == 401 || status == 403) return Finish(ApiError::kUnauthorized, why);
    if (status == 410) return Finish(ApiError::kGone, why);
    Finish(ApiError::kHttpStatus, why);
  }

  void Finish(ApiError error, const std::string& why) {
    if (done) return;
    done = true;
    if (error != ApiError::kNone) ++impl->stats.failures[static_cast<size_t>(error)];
    beast::error_code ignored;
    resolver.cancel();
    beast::get_lowest_layer(stream).socket().close(ignored);
    ApiResult r;
    r.error = error;
    r.http_status = status;
    r.body = std::move(body);
    if (error != ApiError::kNone) r.status = Status(ApiErrorCode(error), Where() + ": " + why);
    auto cb = watch ? std::move(wcb.on_done) : std::move(on_done);
    wcb = {};
    if (cb) cb(std::move(r));
  }
};

void ApiRequest::Cancel() {
  if (session_) session_->Finish(ApiError::kCancelled, "cancelled");
}

ApiClient::ApiClient(net::io_context& ctx, ClusterAccess access, ApiClientOptions options)
    : impl_(std::make_shared<Impl>(ctx, std::move(access), options)) {}
ApiClient::~ApiClient() = default;

ApiRequest ApiClient::Get(std::string target, std::function<void(ApiResult&&)> on_done) {
  auto s = std::make_shared<ApiRequest::Session>(impl_, std::move(target), false);
  s->on_done = std::move(on_done);
  s->Start();
  return ApiRequest(s);
}

ApiRequest ApiClient::Watch(std::string target, WatchCallbacks callbacks) {
  auto s = std::make_shared<ApiRequest::Session>(impl_, std::move(target), true);
  s->wcb = std::move(callbacks);
  s->Start();
  return ApiRequest(s);
}

const Status& ApiClient::init_status() const { return impl_->init_status; }
const ApiStats& ApiClient::stats() const { return impl_->stats; }
const ClusterAccess& ApiClient::access() const { return impl_->access; }
net::io_context& ApiClient::context() const { return impl_->ctx; }

struct WatchLoop::State : std::enable_shared_from_this<WatchLoop::State> {
  State(ApiClient& c, Callbacks cb, BackoffPolicy p, uint64_t seed)
      : client(c), callbacks(std::move(cb)), backoff(p, seed), timer(c.context()) {}
  ApiClient& client;
  Callbacks callbacks;
  Backoff backoff;
  net::steady_timer timer;
  ApiRequest current;
  bool running = false;
  uint64_t connections = 0;

  void Connect() {
    if (!running) return;
    ++connections;
    WatchCallbacks w;
    std::weak_ptr<State> weak = weak_from_this();
    w.on_open = [weak] {
      auto self = weak.lock();
      if (!self) return;
      self->backoff.OnSuccess(std::chrono::steady_clock::now());
      if (self->callbacks.on_open) self->callbacks.on_open();
    };
    w.on_line = [weak](std::string_view line) {
      auto self = weak.lock();
      if (self && self->callbacks.on_line) self->callbacks.on_line(line);
    };
    w.on_done = [weak](ApiResult&& r) {
      auto self = weak.lock();
      if (!self || !self->running || r.error == ApiError::kCancelled) return;
      auto delay = self->backoff.OnFailure(std::chrono::steady_clock::now());
      if (self->callbacks.on_end) self->callbacks.on_end(r, delay);
      if (!self->running) return;
      self->timer.expires_after(delay);
      self->timer.async_wait([weak](beast::error_code ec) {
        auto self = weak.lock();
        if (!ec && self) self->Connect();
      });
    };
    current = client.Watch(callbacks.target ? callbacks.target() : std::string("/"), std::move(w));
  }
};

WatchLoop::WatchLoop(ApiClient& client, Callbacks callbacks, BackoffPolicy policy, uint64_t seed)
    : state_(std::make_shared<State>(client, std::move(callbacks), policy, seed)) {}
WatchLoop::~WatchLoop() { Stop(); }

void WatchLoop::Start() {
  if (state_->running) return;
  state_->running = true;
  state_->Connect();
}

void WatchLoop::Stop() {
  if (!state_->running) return;
  state_->running = false;
  state_->timer.cancel();
  state_->current.Cancel();
}

uint64_t WatchLoop::connections() const { return state_->connections; }

}  // namespace kvroute::k8s
