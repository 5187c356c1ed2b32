#include "adapters/http/client.h"

#include <sys/socket.h>

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <cerrno>
#include <unordered_map>

#include "adapters/http/lazy_timer.h"
#include "adapters/http/socket_or_tls.h"
#include "adapters/http/tls.h"

namespace kvroute::http {

using namespace std::string_view_literals;

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string_view UpstreamErrorName(UpstreamError e) {
  switch (e) {
    case UpstreamError::kNone: return "none";
    case UpstreamError::kConnectRefused: return "connect_refused";
    case UpstreamError::kConnectFailed: return "connect_failed";
    case UpstreamError::kConnectTimeout: return "connect_timeout";
    case UpstreamError::kSendFailed: return "send_failed";
    case UpstreamError::kFirstByteTimeout: return "first_byte_timeout";
    case UpstreamError::kIdleTimeout: return "idle_timeout";
    case UpstreamError::kReset: return "reset";
    case UpstreamError::kProtocol: return "protocol";
    case UpstreamError::kCancelled: return "cancelled";
  }
  return "unknown";
}

bool IsConnectError(UpstreamError e) {
  return e == UpstreamError::kConnectRefused || e == UpstreamError::kConnectFailed ||
         e == UpstreamError::kConnectTimeout;
}

namespace {

using Socket = asio::basic_stream_socket<tcp, asio::io_context::executor_type>;
struct ForwardBody;

// One TCP connection (TLS over it for an https endpoint) with what survives between
// requests on it. Pooled while idle. Shared so that a pending (lazy) timer wait can keep
// it alive; `owner` is the request using it (null while pooled), whose timeouts the timer
// enforces.
struct Conn : SocketOrTls<Socket> {
  explicit Conn(asio::io_context& ctx)
      : SocketOrTls(ctx.get_executor()), timer(ctx.get_executor(), &Conn::OnTimer) {}
  static void OnTimer(void* p);
  template <class Buffers, class Handler>
  void AsyncWrite(const Buffers& b, Handler&& h) {
    if (tls) return asio::async_write(*tls, b, std::forward<Handler>(h));
    asio::async_write(socket, b, std::forward<Handler>(h));
  }
  LazyTimer timer;
  beast::flat_buffer buffer;  // bytes received and not yet parsed
  UpstreamCall::State* owner = nullptr;
  Clock::time_point idle_since;
};

constexpr std::chrono::milliseconds kPeekAfter{1000};

// Peer closed (or sent something unexpected) while the connection sat in the pool?
// One non-blocking peek: cheaper than keeping a read armed on every idle connection.
bool LooksAlive(Socket& s) {
  char c;
  ssize_t n = ::recv(s.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

bool IsPeerClosed(const error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
         ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
}

void CloseConn(Conn& c) {
  error_code ignored;
  c.owner = nullptr;
  c.timer.Cancel();
  c.socket.close(ignored);
}

}  // namespace

namespace detail {

struct ClientPool {
  struct Slot {
    std::string host;
    uint16_t port = 0;
    bool tls = false;
    std::string host_header;  // "host:port"
    std::optional<tcp::endpoint> endpoint;
    std::string resolve_error;
    std::vector<std::shared_ptr<Conn>> idle;
  };

  ClientPool(asio::io_context& c, ClientOptions o) : ctx(c), options(std::move(o)) {}

  Slot& SlotFor(std::string_view host, uint16_t port, bool tls) {
    if (last && last->port == port && last->tls == tls && last->host == host) return *last;
    key.assign(tls ? "https://" : "");
    key += host;
    key.push_back(':');
    key += std::to_string(port);
    auto it = slots.find(key);
    if (it != slots.end()) return *(last = &it->second);
    Slot& s = slots[key];
    s.host.assign(host);
    s.port = port;
    s.tls = tls;
    s.host_header = key.substr(tls ? 8 : 0);
    error_code ec;
    auto addr = asio::ip::make_address(s.host, ec);
    if (!ec) {
      s.endpoint = tcp::endpoint(addr, port);
    } else {
      // Names are resolved once, blocking: endpoints are few and fixed by configuration.
      tcp::resolver resolver(ctx);
      auto results = resolver.resolve(s.host, std::to_string(port), ec);
      if (!ec && !results.empty()) {
        s.endpoint = results.begin()->endpoint();
      } else {
        s.resolve_error = "cannot resolve '" + s.host + "': " + ec.message();
      }
    }
    return *(last = &s);
  }

  std::shared_ptr<Conn> TakeIdle(Slot& s) {
    Clock::time_point now = Clock::now();
    while (!s.idle.empty()) {
      std::shared_ptr<Conn> c = std::move(s.idle.back());
      s.idle.pop_back();
      Clock::duration idle = now - c->idle_since;
      // The peek costs a syscall per request; a connection idle for less than
      // kPeekAfter is rarely closed by the peer, and if it was, RetryStale re-sends.
      if (idle <= options.pool_idle_timeout && (idle < kPeekAfter || LooksAlive(c->socket))) {
        return c;
      }
      CloseConn(*c);
    }
    return nullptr;
  }

  void PutIdle(Slot& s, std::shared_ptr<Conn> c) {
    c->owner = nullptr;
    c->timer.Clear();
    if (closed || s.idle.size() >= options.max_idle_per_endpoint) {
      CloseConn(*c);
      return;
    }
    c->idle_since = Clock::now();
    s.idle.push_back(std::move(c));
  }

  // The context of https endpoints: the options', or (made on first use) one trusting
  // the system's store; null with tls_error set when that failed.
  asio::ssl::context* TlsContext() {
    if (options.tls) return options.tls.get();
    if (!default_tls && tls_error.empty()) {
      auto made = MakeClientTls({});
      if (made.ok()) {
        default_tls = std::move(made).value();
      } else {
        tls_error = made.status().message();
      }
    }
    return default_tls.get();
  }

  asio::io_context& ctx;
  ClientOptions options;
  std::shared_ptr<asio::ssl::context> default_tls;
  std::string tls_error;
  ClientStats stats;
  bool closed = false;
  // Node-based: Slot references stay valid while the pool lives (slots are never erased).
  std::unordered_map<std::string, Slot> slots;
  Slot* last = nullptr;  // the slot used last (the common case: one or few endpoints)
  std::string key;  // scratch
};

}  // namespace detail

namespace {

// A Beast body type that hands each decoded piece of body straight to the request's
// on_data (no intermediate buffer, no copy).
struct ForwardBody {
  struct value_type {
    UpstreamCall::State* sink = nullptr;
  };
  struct reader {
    template <bool isRequest, class Fields>
    reader(bhttp::header<isRequest, Fields>&, value_type& v) : v_(v) {}
    void init(const boost::optional<std::uint64_t>&, error_code& ec) { ec = {}; }
    template <class ConstBufferSequence>
    std::size_t put(const ConstBufferSequence& buffers, error_code& ec);
    void finish(error_code& ec) { ec = {}; }
    value_type& v_;
  };
};

}  // namespace

// One request. Every async handler holds a shared_ptr to it (and the connection its
// buffers belong to), so they stay alive until the last pending operation has
// completed, even after a failure; only a cleanly finished exchange hands its connection
// back to the pool.
struct UpstreamCall::State : std::enable_shared_from_this<UpstreamCall::State> {
  using Pool = detail::ClientPool;

  ~State() {
    if (conn && conn->owner == this) conn->owner = nullptr;
  }

  std::shared_ptr<Pool> pool;
  Pool::Slot* slot = nullptr;
  std::shared_ptr<Conn> conn;
  std::string head;
  std::string_view body;
  std::chrono::milliseconds connect_timeout{0}, first_byte_timeout{0}, idle_timeout{0};
  UpstreamError timeout_kind = UpstreamError::kNone;  // what the armed deadline means
  bool head_only = false;
  UpstreamCallbacks cb;
  std::optional<bhttp::response_parser<ForwardBody>> parser;
  UpstreamResult result;
  bool done = false;
  bool retried = false;
  bool head_seen = false;
  bool paused = false;
  bool read_wanted = false;  // a read is due but paused

  void Begin() {
    if (!slot->endpoint) {
      std::string msg = slot->resolve_error;
      asio::post(pool->ctx, [self = shared_from_this(), msg = std::move(msg)]() mutable {
        self->Finish(UpstreamError::kConnectFailed, std::move(msg));
      });
      return;
    }
    conn = pool->TakeIdle(*slot);
    if (conn) {
      conn->owner = this;
      result.reused_connection = true;
      ++pool->stats.connections_reused;
      // Sending calls no callback (failures are reported from the event loop), so this
      // may run before Start returns.
      return Send();
    }
    Connect();
  }

  void Connect() {
    conn = std::make_shared<Conn>(pool->ctx);
    conn->owner = this;
    result.reused_connection = false;
    ++pool->stats.connections_opened;
    ArmTimer(connect_timeout, UpstreamError::kConnectTimeout);
    conn->socket.async_connect(*slot->endpoint, [self = shared_from_this(), c = conn](error_code ec) {
      if (self->done || c != self->conn) return;
      if (ec) {
        return self->Finish(ec == asio::error::connection_refused ? UpstreamError::kConnectRefused
                                                                   : UpstreamError::kConnectFailed,
                            "connect to " + self->slot->host_header + ": " + ec.message());
      }
      error_code ignored;
      self->conn->socket.set_option(tcp::no_delay(true), ignored);
      self->conn->socket.non_blocking(true, ignored);
      if (self->slot->tls) return self->Handshake();
      self->Send();
    });
  }

  // TLS over the new connection, within what is left of the connect timeout (the timer
  // armed in Connect still runs). The replica's certificate must name the endpoint's host
  // (a name, sent as SNI too, or an IP address) when the context verifies.
  void Handshake() {
    asio::ssl::context* tls = pool->TlsContext();
    if (!tls) return Finish(UpstreamError::kConnectFailed, "TLS to " + slot->host_header + ": " + pool->tls_error);
    conn->tls.emplace(conn->socket, *tls);
    error_code ec;
    asio::ip::make_address(slot->host, ec);
    if (ec) SSL_set_tlsext_host_name(conn->tls->native_handle(), slot->host.c_str());
    conn->tls->set_verify_callback(asio::ssl::host_name_verification(slot->host));
    conn->tls->async_handshake(asio::ssl::stream_base::client,
                               [self = shared_from_this(), c = conn](error_code ec) {
                                 if (self->done || c != self->conn) return;
                                 if (ec) {
                                   return self->Finish(UpstreamError::kConnectFailed,
                                                       "TLS handshake with " + self->slot->host_header +
                                                           ": " + ec.message());
                                 }
                                 self->Send();
                               });
  }

  // A pooled connection died while idle (the peer closed it between our liveness check
  // and the send): the upstream never saw this request, so send it on a fresh one.
  bool RetryStale(const error_code& ec) {
    if (!result.reused_connection || retried || !IsPeerClosed(ec) || head_seen ||
        conn->buffer.size() != 0) {
      return false;
    }
    retried = true;
    ++pool->stats.stale_retries;
    CloseConn(*conn);
    parser.reset();
    Connect();
    return true;
  }

  void Send() {
    ArmTimer(first_byte_timeout, UpstreamError::kFirstByteTimeout);
    std::array<asio::const_buffer, 2> bufs{asio::buffer(head), asio::buffer(body.data(), body.size())};
    // Try at once: a request almost always fits in the socket buffer.
    error_code ec;
    std::size_t n = conn->TryWrite(bufs, ec);
    if (!ec && n == head.size() + body.size()) return Read();
    if (ec) n = 0;
    std::size_t skip_head = std::min(n, head.size());
    std::array<asio::const_buffer, 2> rest{asio::buffer(head) + skip_head,
                                           asio::buffer(body.data(), body.size()) + (n - skip_head)};
    conn->AsyncWrite(rest, [self = shared_from_this(), c = conn](error_code ec, std::size_t) {
      if (self->done || c != self->conn) return;
      if (ec) {
        if (self->RetryStale(ec)) return;
        return self->Finish(UpstreamError::kSendFailed, "send: " + ec.message());
      }
      self->Read();
    });
  }

  void Read() {
    if (paused) {
      read_wanted = true;
      conn->timer.Clear();  // the client is the slow one here, not the upstream
      return;
    }
    if (!parser) {
      parser.emplace();
      parser->header_limit(static_cast<std::uint32_t>(
          std::min<std::size_t>(pool->options.max_response_header_bytes, UINT32_MAX)));
      parser->body_limit(boost::none);
      parser->get().body().sink = this;
      if (head_only) parser->skip(true);
    }
    std::size_t want = std::max<std::size_t>(16u << 10, conn->buffer.capacity() - conn->buffer.size());
    conn->AsyncReadSome(conn->buffer.prepare(std::min<std::size_t>(want, 256u << 10)),
                                 [self = shared_from_this(), c = conn](error_code ec, std::size_t n) {
                                   if (self->done || c != self->conn) return;
                                   self->OnRead(ec, n);
                                 });
  }

  void OnRead(error_code ec, std::size_t n) {
    if (ec) {
      if (ec == asio::error::eof && parser->is_header_done() && !parser->is_done()) {
        // A body delimited by the connection's end.
        error_code pec;
        parser->put_eof(pec);
        if (!pec && parser->is_done()) return Complete();
      }
      if (!head_seen && RetryStale(ec)) return;
      return Finish(IsPeerClosed(ec) ? UpstreamError::kReset : UpstreamError::kProtocol,
                    std::string(head_seen ? "reading response body: " : "reading response head: ") +
                        ec.message());
    }
    conn->buffer.commit(n);
    auto self = shared_from_this();  // a callback may drop the last other reference
    while (conn->buffer.size() > 0) {
      error_code pec;
      std::size_t used = parser->put(conn->buffer.data(), pec);
      if (done) return;  // cancelled from on_data
      conn->buffer.consume(used);
      if (pec == bhttp::error::need_more) break;
      if (pec) {
        return Finish(UpstreamError::kProtocol, std::string(head_seen ? "reading response body: "
                                                                      : "reading response head: ") +
                                                    pec.message());
      }
      if (parser->is_header_done() && !head_seen) {
        OnHead();
        if (done) return;
      }
      if (parser->is_done()) return Complete();
      if (used == 0) break;
    }
    if (parser->is_header_done() && !head_seen) {
      OnHead();
      if (done) return;
      if (parser->is_done()) return Complete();
    }
    Read();
  }

  void OnHead() {
    head_seen = true;
    const auto& msg = parser->get();
    result.head_received = true;
    result.status = static_cast<int>(msg.result_int());
    ArmTimer(idle_timeout, UpstreamError::kIdleTimeout);
    if (cb.on_head) {
      ResponseHead h;
      h.status = result.status;
      // A scan of the few fields by their parsed enum: find(field) compares names as
      // case-insensitive strings through the field set (~400 instructions a response).
      for (const auto& f : msg) {
        if (f.name() == bhttp::field::content_type) {
          h.content_type = std::string_view(f.value().data(), f.value().size());
          break;
        }
      }
      if (auto cl = parser->content_length()) h.content_length = *cl;
      h.chunked = parser->chunked();
      h.fields = &msg.base();
      cb.on_head(h);
    }
  }

  // A piece of decoded body (from ForwardBody's reader, inside parser->put).
  void OnPiece(std::string_view piece) {
    if (done || piece.empty()) return;
    if (!head_seen) {
      // The parser handed over body bytes in the same call that completed the head.
      OnHead();
      if (done) return;
    }
    result.body_bytes += piece.size();
    ArmTimer(idle_timeout, UpstreamError::kIdleTimeout);
    if (cb.on_data) cb.on_data(piece);
  }

  void Complete() {
    // Reuse only what is certainly clean: the whole response read, keep-alive, and no
    // stray bytes after it (which would poison the next response).
    if (parser->keep_alive() && conn->buffer.size() == 0) {
      pool->PutIdle(*slot, std::move(conn));
    }
    Finish(UpstreamError::kNone, {});
  }

  void ArmTimer(std::chrono::milliseconds d, UpstreamError kind) {
    timeout_kind = kind;
    conn->timer.Set(Clock::now() + d, conn);
  }

  void OnTimeout() {
    auto self = shared_from_this();
    Finish(timeout_kind, std::string(UpstreamErrorName(timeout_kind)));
  }

  void Finish(UpstreamError e, std::string message) {
    if (done) return;
    done = true;
    if (conn) CloseConn(*conn);  // kept (not reset): a cancelled operation may still use it
    result.error = e;
    result.message = std::move(message);
    auto on_done = std::move(cb.on_done);
    auto owner = std::move(cb.owner);  // released after on_done
    // Drop the other callbacks now: they may own resources (e.g. the client exchange).
    cb = UpstreamCallbacks{};
    if (on_done) on_done(std::move(result));
  }
};

namespace {

void Conn::OnTimer(void* p) {
  Conn* c = static_cast<Conn*>(p);
  if (c->owner) c->owner->OnTimeout();
}

template <class ConstBufferSequence>
std::size_t ForwardBody::reader::put(const ConstBufferSequence& buffers, error_code& ec) {
  ec = {};
  std::size_t n = 0;
  for (auto b : beast::buffers_range_ref(buffers)) {
    if (v_.sink) v_.sink->OnPiece(std::string_view(static_cast<const char*>(b.data()), b.size()));
    n += b.size();
  }
  return n;
}

}  // namespace

void UpstreamCall::Pause() {
  if (state_ && !state_->done) state_->paused = true;
}

void UpstreamCall::Resume() {
  if (!state_ || state_->done || !state_->paused) return;
  state_->paused = false;
  if (!state_->read_wanted) return;
  state_->read_wanted = false;
  state_->ArmTimer(state_->idle_timeout, UpstreamError::kIdleTimeout);
  state_->Read();
}

void UpstreamCall::Cancel() {
  if (!state_ || state_->done) return;
  auto s = state_;  // on_done may drop this handle
  s->Finish(UpstreamError::kCancelled, "cancelled");
}

bool UpstreamCall::done() const { return !state_ || state_->done; }

UpstreamClient::UpstreamClient(asio::io_context& ctx, ClientOptions options)
    : pool_(std::make_shared<detail::ClientPool>(ctx, std::move(options))) {}

UpstreamClient::~UpstreamClient() {
  pool_->closed = true;
  CloseIdle();
}

UpstreamCall UpstreamClient::Start(std::string_view host, uint16_t port,
                                   const UpstreamRequest& request, UpstreamCallbacks callbacks) {
  auto s = std::make_shared<UpstreamCall::State>();
  ++pool_->stats.requests;
  s->pool = pool_;
  s->slot = &pool_->SlotFor(host, port, request.tls);
  const ClientOptions& o = pool_->options;
  s->connect_timeout = request.connect_timeout.count() > 0 ? request.connect_timeout : o.connect_timeout;
  s->first_byte_timeout =
      request.first_byte_timeout.count() > 0 ? request.first_byte_timeout : o.first_byte_timeout;
  s->idle_timeout = request.idle_timeout.count() > 0 ? request.idle_timeout : o.idle_timeout;
  s->head_only = request.method == bhttp::verb::head;
  s->body = request.body;
  s->cb = std::move(callbacks);

  std::string& h = s->head;
  h.reserve(160 + request.target.size());
  std::string_view method = bhttp::to_string(request.method);
  h.append(method.data(), method.size());
  h.push_back(' ');
  h += request.target;
  h += " HTTP/1.1\r\nhost: "sv;
  h += s->slot->host_header;
  h += "\r\n"sv;
  if (request.headers) {
    for (const auto& [name, value] : *request.headers) {
      h += name;
      h += ": "sv;
      h += value;
      h += "\r\n"sv;
    }
  }
  if (!request.body.empty() || request.method == bhttp::verb::post ||
      request.method == bhttp::verb::put) {
    if (!request.body.empty() && !request.content_type.empty()) {
      h += "content-type: "sv;
      h += request.content_type;
      h += "\r\n"sv;
    }
    h += "content-length: "sv;
    h += std::to_string(request.body.size());
    h += "\r\n"sv;
  }
  h += "\r\n"sv;

  s->Begin();
  return UpstreamCall(std::move(s));
}

void UpstreamClient::set_tls(std::shared_ptr<asio::ssl::context> tls) {
  pool_->options.tls = std::move(tls);
}

void UpstreamClient::CloseIdle() {
  for (auto& [key, slot] : pool_->slots) {
    for (auto& c : slot.idle) CloseConn(*c);
    slot.idle.clear();
  }
}

std::size_t UpstreamClient::idle_connections() const {
  std::size_t n = 0;
  for (const auto& [key, slot] : pool_->slots) n += slot.idle.size();
  return n;
}

const ClientStats& UpstreamClient::stats() const { return pool_->stats; }
const ClientOptions& UpstreamClient::options() const { return pool_->options; }

}  // namespace kvroute::http
