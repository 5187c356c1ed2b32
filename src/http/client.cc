#include "http/client.h"

#include <sys/socket.h>

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <cerrno>
#include <unordered_map>

namespace kvroute::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
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

constexpr std::size_t kBodyBufferBytes = 16u << 10;

// One TCP connection with what survives between requests on it. Pooled while idle.
struct Conn {
  explicit Conn(asio::io_context& ctx) : socket(ctx), timer(ctx) {}
  tcp::socket socket;
  asio::steady_timer timer;
  beast::flat_buffer buffer;  // bytes read past the end of a parsed head/body piece
  std::array<char, kBodyBufferBytes> body;
  Clock::time_point idle_since;
};

// Peer closed (or sent something unexpected) while the connection sat in the pool?
// One non-blocking peek: cheaper than keeping a read armed on every idle connection.
bool LooksAlive(tcp::socket& s) {
  char c;
  ssize_t n = ::recv(s.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

bool IsPeerClosed(const error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
         ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
}

}  // namespace

namespace detail {

struct ClientPool {
  struct Slot {
    std::string host;
    uint16_t port = 0;
    std::string host_header;  // "host:port"
    std::optional<tcp::endpoint> endpoint;
    std::string resolve_error;
    std::vector<std::unique_ptr<Conn>> idle;
  };

  ClientPool(asio::io_context& c, ClientOptions o) : ctx(c), options(std::move(o)) {}

  Slot& SlotFor(std::string_view host, uint16_t port) {
    key.assign(host);
    key.push_back(':');
    key += std::to_string(port);
    auto it = slots.find(key);
    if (it != slots.end()) return it->second;
    Slot& s = slots[key];
    s.host.assign(host);
    s.port = port;
    s.host_header = key;
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
    return s;
  }

  std::unique_ptr<Conn> TakeIdle(Slot& s) {
    Clock::time_point now = Clock::now();
    while (!s.idle.empty()) {
      std::unique_ptr<Conn> c = std::move(s.idle.back());
      s.idle.pop_back();
      if (now - c->idle_since <= options.pool_idle_timeout && LooksAlive(c->socket)) return c;
      error_code ignored;
      c->socket.close(ignored);
    }
    return nullptr;
  }

  void PutIdle(Slot& s, std::unique_ptr<Conn> c) {
    if (closed || s.idle.size() >= options.max_idle_per_endpoint) {
      error_code ignored;
      c->socket.close(ignored);
      return;
    }
    c->idle_since = Clock::now();
    s.idle.push_back(std::move(c));
  }

  asio::io_context& ctx;
  ClientOptions options;
  ClientStats stats;
  bool closed = false;
  // Node-based: Slot references stay valid while the pool lives (slots are never erased).
  std::unordered_map<std::string, Slot> slots;
  std::string key;  // scratch
};

}  // namespace detail

// One request. Every async handler holds a shared_ptr to it, so the connection (socket,
// buffers) stays alive until the last pending operation has completed, even after a
// failure; only a cleanly finished exchange hands its connection back to the pool.
struct UpstreamCall::State : std::enable_shared_from_this<UpstreamCall::State> {
  using Pool = detail::ClientPool;

  std::shared_ptr<Pool> pool;
  Pool::Slot* slot = nullptr;
  std::unique_ptr<Conn> conn;
  std::string head;
  std::string_view body;
  std::chrono::milliseconds connect_timeout{0}, first_byte_timeout{0}, idle_timeout{0};
  bool head_only = false;
  UpstreamCallbacks cb;
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser;
  UpstreamResult result;
  uint64_t timer_gen = 0;
  bool done = false;
  bool retried = false;

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
      result.reused_connection = true;
      ++pool->stats.connections_reused;
      // Posted so that no callback can run before Start returns.
      asio::post(pool->ctx, [self = shared_from_this()] {
        if (!self->done) self->Send();
      });
      return;
    }
    Connect();
  }

  void Connect() {
    conn = std::make_unique<Conn>(pool->ctx);
    result.reused_connection = false;
    ++pool->stats.connections_opened;
    ArmTimer(connect_timeout, UpstreamError::kConnectTimeout);
    conn->socket.async_connect(*slot->endpoint, [self = shared_from_this()](error_code ec) {
      if (self->done) return;
      if (ec) {
        return self->Finish(ec == asio::error::connection_refused ? UpstreamError::kConnectRefused
                                                                   : UpstreamError::kConnectFailed,
                            "connect to " + self->slot->host_header + ": " + ec.message());
      }
      error_code ignored;
      self->conn->socket.set_option(tcp::no_delay(true), ignored);
      self->Send();
    });
  }

  // A pooled connection died while idle (the peer closed it between our liveness check
  // and the send): the upstream never saw this request, so send it on a fresh one.
  bool RetryStale(const error_code& ec) {
    if (!result.reused_connection || retried || !IsPeerClosed(ec) || conn->buffer.size() != 0) {
      return false;
    }
    retried = true;
    ++pool->stats.stale_retries;
    error_code ignored;
    conn->socket.close(ignored);
    ++timer_gen;
    conn->timer.cancel();
    // The dead connection may still have a handler queued that references its buffers:
    // keep it alive until this state goes away.
    graveyard = std::move(conn);
    Connect();
    return true;
  }

  void Send() {
    ArmTimer(first_byte_timeout, UpstreamError::kFirstByteTimeout);
    std::array<asio::const_buffer, 2> bufs{asio::buffer(head), asio::buffer(body.data(), body.size())};
    asio::async_write(conn->socket, bufs, [self = shared_from_this()](error_code ec, std::size_t) {
      if (self->done) return;
      if (ec) {
        if (self->RetryStale(ec)) return;
        return self->Finish(UpstreamError::kSendFailed, "send: " + ec.message());
      }
      self->ReadHead();
    });
  }

  void ReadHead() {
    parser.emplace();
    parser->header_limit(static_cast<std::uint32_t>(
        std::min<std::size_t>(pool->options.max_response_header_bytes, UINT32_MAX)));
    parser->body_limit(boost::none);
    if (head_only) parser->skip(true);
    bhttp::async_read_header(conn->socket, conn->buffer, *parser,
                             [self = shared_from_this()](error_code ec, std::size_t) {
                               if (self->done) return;
                               if (ec) {
                                 if (self->RetryStale(ec)) return;
                                 return self->Finish(IsPeerClosed(ec) ? UpstreamError::kReset
                                                                      : UpstreamError::kProtocol,
                                                     "reading response head: " + ec.message());
                               }
                               self->OnHead();
                             });
  }

  void OnHead() {
    const auto& msg = parser->get();
    result.head_received = true;
    result.status = static_cast<int>(msg.result_int());
    if (cb.on_head) {
      ResponseHead h;
      h.status = result.status;
      auto ct = msg.find(bhttp::field::content_type);
      if (ct != msg.end()) h.content_type = std::string_view(ct->value().data(), ct->value().size());
      if (auto cl = parser->content_length()) h.content_length = *cl;
      h.chunked = parser->chunked();
      h.fields = &msg.base();
      cb.on_head(h);
      if (done) return;  // cancelled from the callback
    }
    ReadBody();
  }

  void ReadBody() {
    if (parser->is_done()) return Complete();
    auto& b = parser->get().body();
    b.data = conn->body.data();
    b.size = conn->body.size();
    b.more = true;
    ArmTimer(idle_timeout, UpstreamError::kIdleTimeout);
    bhttp::async_read_some(conn->socket, conn->buffer, *parser,
                           [self = shared_from_this()](error_code ec, std::size_t) {
                             self->OnBody(ec);
                           });
  }

  void OnBody(error_code ec) {
    if (done) return;
    if (ec == bhttp::error::need_buffer) ec = {};
    std::size_t got = conn->body.size() - parser->get().body().size;
    if (got > 0) {
      result.body_bytes += got;
      if (cb.on_data) {
        cb.on_data(std::string_view(conn->body.data(), got));
        if (done) return;
      }
    }
    if (ec) {
      return Finish(IsPeerClosed(ec) ? UpstreamError::kReset : UpstreamError::kProtocol,
                    "reading response body: " + ec.message());
    }
    ReadBody();
  }

  void Complete() {
    ++timer_gen;
    conn->timer.cancel();
    // Reuse only what is certainly clean: the whole response read, keep-alive, and no
    // stray bytes after it (which would poison the next response).
    if (parser->keep_alive() && conn->buffer.size() == 0) {
      pool->PutIdle(*slot, std::move(conn));
    }
    Finish(UpstreamError::kNone, {});
  }

  void ArmTimer(std::chrono::milliseconds d, UpstreamError kind) {
    uint64_t gen = ++timer_gen;
    conn->timer.expires_after(d);
    conn->timer.async_wait([self = shared_from_this(), gen, kind](error_code ec) {
      if (ec || self->done || gen != self->timer_gen) return;
      self->Finish(kind, std::string(UpstreamErrorName(kind)));
    });
  }

  void Finish(UpstreamError e, std::string message) {
    if (done) return;
    done = true;
    ++timer_gen;
    if (conn) {
      // Not reset: a cancelled operation may still reference its buffers.
      error_code ignored;
      conn->timer.cancel();
      conn->socket.close(ignored);
    }
    result.error = e;
    result.message = std::move(message);
    auto on_done = std::move(cb.on_done);
    // Drop the other callbacks now: they may own resources (e.g. the client exchange).
    cb = UpstreamCallbacks{};
    if (on_done) on_done(std::move(result));
  }

  std::unique_ptr<Conn> graveyard;
};

void UpstreamCall::Cancel() {
  if (state_ && !state_->done) state_->Finish(UpstreamError::kCancelled, "cancelled");
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
  s->slot = &pool_->SlotFor(host, port);
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
  h += " HTTP/1.1\r\nhost: ";
  h += s->slot->host_header;
  h += "\r\n";
  if (request.headers) {
    for (const auto& [name, value] : *request.headers) {
      h += name;
      h += ": ";
      h += value;
      h += "\r\n";
    }
  }
  if (!request.body.empty() || request.method == bhttp::verb::post ||
      request.method == bhttp::verb::put) {
    if (!request.body.empty() && !request.content_type.empty()) {
      h += "content-type: ";
      h += request.content_type;
      h += "\r\n";
    }
    h += "content-length: ";
    h += std::to_string(request.body.size());
    h += "\r\n";
  }
  h += "\r\n";

  s->Begin();
  return UpstreamCall(std::move(s));
}

void UpstreamClient::CloseIdle() {
  for (auto& [key, slot] : pool_->slots) {
    for (auto& c : slot.idle) {
      error_code ignored;
      c->socket.close(ignored);
    }
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
