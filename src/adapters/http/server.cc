#include "adapters/http/server.h"


#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/parser.hpp>
#include <array>
#include <charconv>
#include <atomic>
#include <deque>
#include <future>
#include <optional>

#include "adapters/http/lazy_timer.h"
#include "adapters/http/socket_or_tls.h"
#include "adapters/http/tls.h"

namespace kvroute::http {

using namespace std::string_view_literals;

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr std::string_view kCrlf = "\r\n";
constexpr std::string_view kLastChunk = "0\r\n\r\n";

// Appends the status line, Content-Type and the caller's fields to `head`; the caller
// appends framing headers and the blank line.
void AppendStatusHead(std::string& head, int status, std::string_view content_type,
                      const Fields& extra, bool keep_alive) {
  head += "HTTP/1.1 "sv;
  head += std::to_string(status);
  head.push_back(' ');
  std::string_view reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  head += reason.empty() ? std::string_view("Unknown") : reason;
  head += kCrlf;
  if (!content_type.empty()) {
    head += "content-type: "sv;
    head += content_type;
    head += kCrlf;
  }
  for (const auto& [name, value] : extra) {
    head += name;
    head += ": "sv;
    head += value;
    head += kCrlf;
  }
  if (!keep_alive) head += "connection: close\r\n"sv;
}

std::string StatusHead(int status, std::string_view content_type, const Fields& extra,
                       bool keep_alive) {
  std::string head;
  head.reserve(128);
  AppendStatusHead(head, status, content_type, extra, keep_alive);
  return head;
}

void AppendContentLength(std::string& head, std::size_t n) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), n);
  head += "content-length: "sv;
  head.append(digits, end);
  head += "\r\n\r\n"sv;
}

std::string ChunkSizeLine(std::size_t n) {
  char buf[24];
  int len = std::snprintf(buf, sizeof(buf), "%zx\r\n", n);
  return std::string(buf, static_cast<std::size_t>(len));
}

}  // namespace

namespace detail {
namespace {
// A few buffers per thread cover the bodies in flight between one exchange's end and the
// next body's start; only sizes worth saving a malloc for (past the small-size caches)
// and not so large that keeping them idle would matter.
constexpr std::size_t kRecycledBodies = 8;
constexpr std::size_t kMinRecycledBody = 1u << 10;
constexpr std::size_t kMaxRecycledBody = 256u << 10;
struct BodyPool {
  std::array<std::string, kRecycledBodies> free;
  std::size_t n = 0;
};
thread_local BodyPool t_bodies;
}  // namespace

bool TakeBodyBuffer(std::string& body, std::size_t capacity) {
  BodyPool& p = t_bodies;
  // Newest first (warm in cache); any big enough buffer will do.
  for (std::size_t i = p.n; i-- > 0;) {
    if (p.free[i].capacity() < capacity) continue;
    body.swap(p.free[i]);
    body.clear();
    p.free[i].swap(p.free[--p.n]);
    p.free[p.n] = std::string();  // releases what `body` held before, if anything
    return true;
  }
  return false;
}

void RecycleBodyBuffer(std::string&& body) {
  BodyPool& p = t_bodies;
  if (body.capacity() < kMinRecycledBody || body.capacity() > kMaxRecycledBody ||
      p.n == kRecycledBodies) {
    return;
  }
  p.free[p.n++].swap(body);
}
}  // namespace detail

std::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kHeaderTooLarge: return "header_too_large";
    case RejectReason::kTooManyHeaders: return "too_many_headers";
    case RejectReason::kBodyTooLarge: return "body_too_large";
    case RejectReason::kRequestTimeout: return "request_timeout";
    case RejectReason::kBadRequest: return "bad_request";
  }
  return "unknown";
}

// Settings every connection of one server shares (immutable after Listen), and the
// counters they all write (atomics: connections of several threads share them).
struct ServerShared {
  // A constructor, not aggregate init: make_shared's parenthesised aggregate init is
  // C++20 that clang 14 lacks (the fuzz build), and the atomics forbid a moved temporary.
  ServerShared(ServerOptions o, Handler h) : options(std::move(o)), handler(std::move(h)) {}
  ServerOptions options;
  Handler handler;
  mutable ServerStats stats;
  std::string ErrorBody(int status, std::string_view message) const {
    return options.error_body ? options.error_body(status, message) : std::string(message);
  }
  std::string_view ErrorContentType() const {
    return options.error_body ? "application/json" : "text/plain; charset=utf-8";
  }
  void Count(RejectReason r) const {
    stats.requests_rejected[static_cast<std::size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  }
};

using Socket = asio::basic_stream_socket<tcp, asio::io_context::executor_type>;

// A connection's byte stream: the TCP socket, or TLS over it. Plain TCP writes are tried
// at once (non-blocking write_some) and only wait for the socket when it is full; TLS
// writes always go through the event loop (a non-blocking write cannot be retried in the
// middle of a TLS record), gathered into one buffer so a response is one record.
class Transport {
 public:
  explicit Transport(Socket socket) : stream_(std::move(socket)) {}
  void EnableTls(std::shared_ptr<asio::ssl::context> ctx) {
    context_ = std::move(ctx);
    stream_.tls.emplace(stream_.socket, *context_);
  }
  bool tls() const { return stream_.tls.has_value(); }
  Socket& socket() { return stream_.socket; }

  template <class Handler>
  void AsyncHandshake(Handler&& handler) {
    stream_.tls->async_handshake(asio::ssl::stream_base::server, std::forward<Handler>(handler));
  }
  template <class Buffers, class Handler>
  void AsyncReadSome(const Buffers& buffers, Handler&& handler) {
    stream_.AsyncReadSome(buffers, std::forward<Handler>(handler));
  }
  // Writes what the socket takes now without waiting (plain TCP); 0 with TLS.
  template <class Buffers>
  std::size_t TryWrite(const Buffers& buffers, error_code& ec) {
    return stream_.TryWrite(buffers, ec);
  }
  template <class Buffers, class Handler>
  void AsyncWrite(const Buffers& buffers, Handler&& handler) {
    if (!stream_.tls) {
      return asio::async_write(stream_.socket, buffers, std::forward<Handler>(handler));
    }
    gathered_.clear();
    for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers); ++it) {
      asio::const_buffer b = *it;
      gathered_.append(static_cast<const char*>(b.data()), b.size());
    }
    asio::async_write(*stream_.tls, asio::buffer(gathered_), std::forward<Handler>(handler));
  }
  void ShutdownSend() {
    error_code ignored;
    stream_.socket.shutdown(tcp::socket::shutdown_send, ignored);
  }
  void Close() {
    error_code ignored;
    stream_.socket.close(ignored);
  }

 private:
  std::shared_ptr<asio::ssl::context> context_;  // the one current at the accept
  SocketOrTls<Socket> stream_;
  std::string gathered_;  // a TLS write's bytes, alive until it completes
};

// One accepted socket. Reads a request, hands it to the handler, writes the response,
// then parses the next (so pipelined requests are answered in order). One read is kept
// pending for the connection's whole life: while a response is in progress it notices a
// disconnect, and bytes it gets are kept for the next request; once the response is done
// the same read delivers the next request, so nothing is cancelled or re-armed between
// requests. Parsing is synchronous on the buffered bytes, writes are tried at once
// (non-blocking) and only wait for the socket when it is full, and the read/write
// timeouts are lazy: a keep-alive request costs no timer or handler churn.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Socket socket, std::shared_ptr<const ServerShared> shared, int worker,
             std::shared_ptr<asio::ssl::context> tls)
      : executor_(socket.get_executor()),
        read_timer_(socket.get_executor(), &Connection::OnReadTimeout),
        write_timer_(socket.get_executor(), &Connection::OnWriteTimeout),
        socket_(std::move(socket)),
        shared_(std::move(shared)),
        worker_(worker) {
    if (tls) socket_.EnableTls(std::move(tls));
  }
  // The acceptor counted this connection open; a socket never closed by Close() (its
  // context ended first) is closed here.
  ~Connection() {
    if (!closed_) shared_->stats.open_connections.fetch_sub(1, std::memory_order_relaxed);
  }

  void Start() {
    error_code ignored;
    socket_.socket().set_option(tcp::no_delay(true), ignored);
    socket_.socket().non_blocking(true, ignored);
    if (!socket_.tls()) return BeginRequest();
    // The handshake has read_timeout, like a first request: a client that stalls in it
    // (or never starts it) is cut then.
    handshaking_ = true;
    read_timer_.Set(LazyTimer::Clock::now() + shared_->options.read_timeout, this);
    socket_.AsyncHandshake([self = shared_from_this()](error_code ec) {
      self->handshaking_ = false;
      if (self->closed_) return;
      if (ec) {
        self->shared_->stats.tls_handshake_failures.fetch_add(1, std::memory_order_relaxed);
        return self->Close();
      }
      self->BeginRequest();
    });
  }

  bool closed() const { return closed_; }
  std::string ErrorBodyFor(int status, std::string_view message) const {
    return shared_->ErrorBody(status, message);
  }
  std::size_t pending_write_bytes() const { return pending_bytes_; }
  bool keep_alive() const { return keep_alive_; }
  bool chunked() const { return chunked_; }
  bool head_only() const { return head_only_; }

  // Queues output. `last` marks the end of the current response.
  void Enqueue(std::string a, std::string b, std::string_view tail, bool last,
               std::function<void(bool)> done) {
    if (closed_) {
      if (done) done(false);
      return;
    }
    pending_bytes_ += a.size() + b.size() + tail.size();
    out_.push_back(Out{std::move(a), std::move(b), tail, last, std::move(done)});
    if (!writing_) DoWrite();
  }

  // Scratch for building a response head (keeps its capacity: no allocation per response).
  std::string& head_scratch() { return head_scratch_; }

  // A complete response (head and body) when nothing is queued or being written, the usual
  // case: written at once, straight from the caller's buffers, without queueing; only bytes
  // the socket does not take now are copied into the queue. Same effect as
  // Enqueue(head, body, {}, true, {}). Returns false (nothing done) when output is queued
  // or the connection is closed: then Enqueue.
  bool WriteResponse(std::string_view head, std::string_view body) {
    if (closed_ || writing_ || !out_.empty()) return false;
    std::array<asio::const_buffer, 2> bufs{asio::buffer(head.data(), head.size()),
                                           asio::buffer(body.data(), body.size())};
    error_code ec;
    std::size_t n = socket_.TryWrite(bufs, ec);
    if (!ec && n == head.size() + body.size()) {
      OnResponseDone();
      return true;
    }
    if (ec) n = 0;  // full, or failed: the queued write waits for the socket or reports it
    std::size_t from_head = std::min(n, head.size());
    Enqueue(std::string(head.substr(from_head)), std::string(body.substr(n - from_head)), {}, true, {});
    return true;
  }

  // The handler dropped its Exchange without finishing the response.
  void OnAbandoned(bool stream_started) {
    if (closed_) return;
    if (stream_started) return Close();
    keep_alive_ = false;
    SendError(500, "The request handler did not produce a response.");
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    shared_->stats.open_connections.fetch_sub(1, std::memory_order_relaxed);
    error_code ignored;
    read_timer_.Cancel();
    write_timer_.Cancel();
    socket_.Close();
    std::deque<Out> dropped;
    dropped.swap(out_);
    pending_bytes_ = 0;
    if (auto ex = exchange_.lock()) ex->NotifyGone();
    exchange_.reset();
    for (Out& o : dropped) {
      if (o.done) o.done(false);
    }
  }

 private:
  struct Out {
    std::string a;
    std::string b;
    std::string_view tail;
    bool last;
    std::function<void(bool)> done;
  };

  static void OnReadTimeout(void* p) { static_cast<Connection*>(p)->ReadTimedOut(); }

  // The read deadline passed: a slow sender (part of a request read) is told so; an idle
  // connection, or one lingering after its last response, just closed.
  void ReadTimedOut() {
    if (closed_) return;
    if (handshaking_) {
      shared_->stats.tls_handshake_failures.fetch_add(1, std::memory_order_relaxed);
      return Close();
    }
    if (!lingering_ && !in_response_ && request_bytes_seen_) {
      return Reject(RejectReason::kRequestTimeout, 408,
                    "Request not received within " +
                        std::to_string(shared_->options.read_timeout.count()) + " ms.");
    }
    if (!lingering_) shared_->stats.idle_closed.fetch_add(1, std::memory_order_relaxed);
    Close();
  }

  // First bytes of a request on a kept-alive connection: from now on it has read_timeout
  // to arrive whole (on a new connection that clock started at the accept).
  void OnRequestBytes() {
    request_bytes_seen_ = true;
    if (requests_ > 0) {
      read_timer_.Set(LazyTimer::Clock::now() + shared_->options.read_timeout, this);
    }
  }
  static void OnWriteTimeout(void* p) { static_cast<Connection*>(p)->Close(); }

  // Waits for the next request (a kept-alive connection, or a new one).
  void BeginRequest() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(
        std::min<std::size_t>(shared_->options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(shared_->options.max_body_bytes);
    parser_->eager(true);
    header_checked_ = false;
    request_bytes_seen_ = false;
    // A new connection has read_timeout for its first request from the accept; a
    // kept-alive one may idle for keepalive_idle, then read_timeout once bytes come.
    const ServerOptions& o = shared_->options;
    read_timer_.Set(LazyTimer::Clock::now() + (requests_ == 0 ? o.read_timeout : o.keepalive_idle),
                    this);
    if (buffer_.size() > 0) {  // pipelined bytes
      OnRequestBytes();
      return Parse();
    }
    Read();
  }

  // Keeps one read pending (unless one already is, or the pipelining bound is hit).
  void Read() {
    if (reading_ || closed_) return;
    if (in_response_ && buffer_.size() >= shared_->options.max_pipelined_bytes) return;
    reading_ = true;
    // At least kMinRead: a request with a few KB of prompt then arrives in one recv (with
    // 4 KB, head and body took two, and the second, completing at once, was posted through
    // the event loop: an extra queue pass and epoll_wait per request).
    std::size_t want = std::max<std::size_t>(kMinRead, std::min<std::size_t>(buffer_.capacity() - buffer_.size(), 65536));
    if (!in_response_ && parser_ && parser_->is_header_done()) {
      // A long body: read the rest in one go (one allocation, few syscalls).
      if (auto left = parser_->content_length_remaining()) {
        want = std::max<std::size_t>(want, std::min<uint64_t>(*left, 1u << 20));
      }
    }
    socket_.AsyncReadSome(buffer_.prepare(want),
                            [self = shared_from_this()](error_code ec, std::size_t n) {
                              self->OnRead(ec, n);
                            });
  }

  void OnRead(error_code ec, std::size_t n) {
    reading_ = false;
    if (closed_) return;
    if (lingering_) {
      buffer_.clear();
      if (ec) return Close();
      return Read();
    }
    if (ec) {
      if (in_response_) return Close();  // the client went away before we finished
      return FailRead(ec);
    }
    buffer_.commit(n);
    if (in_response_) return Read();  // keep watching; the bytes wait for their turn
    if (!request_bytes_seen_ && n > 0) OnRequestBytes();
    Parse();
  }

  // Feeds the buffered bytes to the parser; dispatches the request once complete.
  void Parse() {
    error_code ec;
    while (buffer_.size() > 0) {
      std::size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec == bhttp::error::need_more) {
        ec = {};
        break;
      }
      if (ec) return FailRead(ec);
      if (parser_->is_header_done() && !header_checked_) {
        header_checked_ = true;
        if (!CheckHeader()) return;
      }
      if (parser_->is_done()) return OnRequest();
      if (used == 0) break;
    }
    if (parser_->is_header_done() && !header_checked_) {
      header_checked_ = true;
      if (!CheckHeader()) return;
      if (parser_->is_done()) return OnRequest();
    }
    Read();
  }

  // Header complete: field count limit and Expect: 100-continue. False if a response
  // was already sent.
  bool CheckHeader() {
    const Request& req = parser_->get();
    std::size_t count = 0;
    for (auto it = req.begin(); it != req.end(); ++it) ++count;
    if (count > shared_->options.max_header_count) {
      Reject(RejectReason::kTooManyHeaders, 431, "Too many request header fields.");
      return false;
    }
    if (!parser_->is_done() && shared_->options.header_check) {
      if (std::optional<EarlyAnswer> a = shared_->options.header_check(req, worker_)) {
        SendEarly(std::move(*a));
        return false;
      }
    }
    if (!parser_->is_done() && buffer_.size() == 0) {
      auto expect = req[bhttp::field::expect];
      if (beast::iequals(expect, "100-continue")) {
        Enqueue(std::string("HTTP/1.1 100 Continue\r\n\r\n"), {}, {}, false, {});
      }
    }
    return true;
  }

  // Maps a read error to the response it deserves, or just closes the connection
  // (timeout, peer gone, nothing received).
  void FailRead(error_code ec) {
    if (closed_) return;
    if (ec == bhttp::error::body_limit) {
      return Reject(RejectReason::kBodyTooLarge, 413,
                    "Request body exceeds the limit of " +
                        std::to_string(shared_->options.max_body_bytes) + " bytes.");
    }
    if (ec == bhttp::error::header_limit) {
      return Reject(RejectReason::kHeaderTooLarge, 431, "Request header fields too large.");
    }
    if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
        ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted || ec.category() == asio::error::get_system_category()) {
      return Close();
    }
    Reject(RejectReason::kBadRequest, 400, "Malformed HTTP request.");
  }

  void OnRequest() {
    read_timer_.Clear();
    ++requests_;
    keep_alive_ = parser_->get().keep_alive();
    chunked_ = parser_->get().version() >= 11;
    head_only_ = parser_->get().method() == bhttp::verb::head;
    in_response_ = true;
    auto ex = std::make_shared<Exchange>(Exchange::Key(), shared_from_this(), parser_->release(),
                                         worker_, executor_);
    parser_.reset();
    exchange_ = ex;
    Read();  // watch for a disconnect while the handler works
    // A handler must not throw; if one does, answer instead of losing the client. `ex`
    // stays referenced here so the catch can still use it.
    try {
      shared_->handler(ex);
    } catch (const std::exception& e) {
      ex->RespondError(500, e.what());
    } catch (...) {
      ex->RespondError(500, "internal error");
    }
  }

  void Reject(RejectReason reason, int status, const std::string& message) {
    shared_->Count(reason);
    SendError(status, message);
  }

  void SendEarly(EarlyAnswer a) {
    read_timer_.Clear();
    keep_alive_ = false;
    chunked_ = true;
    head_only_ = false;
    in_response_ = true;
    std::string head = StatusHead(a.status, a.content_type, a.extra, false);
    AppendContentLength(head, a.body.size());
    Enqueue(std::move(head), std::move(a.body), {}, true, {});
  }

  void SendError(int status, const std::string& message) {
    read_timer_.Clear();
    keep_alive_ = false;
    chunked_ = true;
    head_only_ = false;
    in_response_ = true;
    std::string body = shared_->ErrorBody(status, message);
    std::string head = StatusHead(status, shared_->ErrorContentType(), {}, false);
    head += "content-length: "sv;
    head += std::to_string(body.size());
    head += "\r\n\r\n"sv;
    Enqueue(std::move(head), std::move(body), {}, true, {});
  }

  // Writes the queue, trying each batch at once (non-blocking): the socket almost always
  // has room, and this saves a trip through the event loop (and its wakeup) per response
  // or chunk. Only a full socket waits for the event loop.
  void DoWrite() {
    while (!out_.empty() && !closed_) {
      writing_ = true;
      wbufs_.clear();
      in_flight_ = 0;
      std::size_t total = 0;
      for (const Out& o : out_) {
        if (in_flight_ == kMaxGather) break;
        if (!o.a.empty()) wbufs_.emplace_back(o.a.data(), o.a.size());
        if (!o.b.empty()) wbufs_.emplace_back(o.b.data(), o.b.size());
        if (!o.tail.empty()) wbufs_.emplace_back(o.tail.data(), o.tail.size());
        total += o.a.size() + o.b.size() + o.tail.size();
        ++in_flight_;
      }
      error_code ec;
      std::size_t n = socket_.TryWrite(wbufs_, ec);
      if (!ec && n == total) {
        if (!Flushed()) return;
        continue;
      }
      // Full (or failed): wait for the rest; a failure is reported there.
      if (ec) n = 0;
      std::size_t skip = 0;
      while (skip < wbufs_.size() && n >= wbufs_[skip].size()) n -= wbufs_[skip++].size();
      wbufs_.erase(wbufs_.begin(), wbufs_.begin() + static_cast<std::ptrdiff_t>(skip));
      if (!wbufs_.empty()) wbufs_[0] += n;
      write_timer_.Set(LazyTimer::Clock::now() + shared_->options.write_timeout, this);
      socket_.AsyncWrite(wbufs_, [self = shared_from_this()](error_code ec, std::size_t) {
        self->OnWrite(ec);
      });
      return;
    }
    writing_ = false;
  }

  void OnWrite(error_code ec) {
    write_timer_.Clear();
    if (closed_) return;
    if (ec) return Close();
    if (Flushed()) DoWrite();
  }

  // The first in_flight_ queued items were written: drops them and runs their callbacks
  // (writing_ stays set meanwhile, so a callback that queues more cannot start a nested
  // write over items not yet dropped). Returns true if the caller should keep writing.
  bool Flushed() {
    bool finished = false;
    dones_.clear();
    for (std::size_t i = 0; i < in_flight_; ++i) {
      Out& o = out_.front();
      pending_bytes_ -= o.a.size() + o.b.size() + o.tail.size();
      if (o.last) finished = true;
      if (o.done) dones_.push_back(std::move(o.done));
      out_.pop_front();
    }
    in_flight_ = 0;
    for (std::size_t i = 0; i < dones_.size() && !closed_; ++i) {
      auto done = std::move(dones_[i]);
      done(true);
    }
    if (closed_) return false;  // a callback may have failed the connection
    writing_ = false;
    if (finished) {
      OnResponseDone();
      return false;
    }
    return true;
  }

  void OnResponseDone() {
    in_response_ = false;
    exchange_.reset();
    if (!keep_alive_) return Linger();
    if (!out_.empty()) return DoWrite();  // cannot happen: one response at a time
    if (buffer_.size() > 0) {
      // Pipelined request already here: parse it from the event loop, not from inside
      // the handler's Respond call (no recursion through a burst of requests).
      asio::post(executor_, [self = shared_from_this()] { self->BeginRequest(); });
      return;
    }
    BeginRequest();
  }

  // Half-closes and drains what the client still sends for a short while, so an
  // unread request body does not turn our response into a connection reset.
  void Linger() {
    lingering_ = true;
    socket_.ShutdownSend();
    buffer_.clear();
    read_timer_.Set(LazyTimer::Clock::now() + std::chrono::seconds(1), this);
    Read();
  }

  static constexpr std::size_t kMaxGather = 64;
  static constexpr std::size_t kMinRead = 16u << 10;

  asio::any_io_executor executor_;
  LazyTimer read_timer_;
  LazyTimer write_timer_;
  Transport socket_;
  std::shared_ptr<const ServerShared> shared_;
  int worker_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<PaddedStringBody>> parser_;
  std::weak_ptr<Exchange> exchange_;
  std::deque<Out> out_;
  std::vector<asio::const_buffer> wbufs_;
  std::size_t in_flight_ = 0;
  std::size_t pending_bytes_ = 0;
  std::vector<std::function<void(bool)>> dones_;  // scratch for Flushed
  std::string head_scratch_;
  bool closed_ = false;
  bool writing_ = false;
  bool reading_ = false;
  bool header_checked_ = false;
  bool request_bytes_seen_ = false;  // bytes of the request being read have arrived
  uint64_t requests_ = 0;            // requests dispatched on this connection
  bool in_response_ = false;
  bool keep_alive_ = true;
  bool chunked_ = true;
  bool head_only_ = false;
  bool lingering_ = false;
  bool handshaking_ = false;
};

// ---- Exchange ----

Exchange::Exchange(Key, std::shared_ptr<Connection> conn, Request request, int worker,
                   boost::asio::any_io_executor executor)
    : conn_(std::move(conn)),
      request_(std::move(request)),
      worker_(worker),
      executor_(std::move(executor)) {}

Exchange::~Exchange() {
  detail::RecycleBodyBuffer(std::move(request_.body()));
  if (state_ == State::kDone || gone_) return;
  auto conn = conn_;
  if (!conn) return;
  bool started = state_ == State::kStreaming;
  // Posted, not called: the destructor may run inside one of the connection's own
  // callbacks.
  asio::post(executor_, [conn, started] { conn->OnAbandoned(started); });
}

void Exchange::NotifyGone() {
  if (state_ == State::kDone || gone_) return;
  gone_ = true;
  auto cb = std::move(on_gone_);
  on_gone_ = nullptr;
  if (cb) cb();
}

std::size_t Exchange::pending_write_bytes() const {
  return conn_ ? conn_->pending_write_bytes() : 0;
}

bool Exchange::Respond(int status, std::string body, std::string_view content_type,
                       const Fields& extra) {
  if (state_ != State::kNew || gone_) return false;
  auto conn = conn_;
  if (!conn || conn->closed()) return false;
  state_ = State::kDone;
  on_gone_ = nullptr;
  std::string& head = conn->head_scratch();
  head.clear();
  AppendStatusHead(head, status, content_type, extra, conn->keep_alive());
  AppendContentLength(head, body.size());
  if (conn->head_only()) body.clear();
  conn_.reset();  // done: do not pin the connection any longer (`conn` still does here)
  if (!conn->WriteResponse(head, body)) conn->Enqueue(std::string(head), std::move(body), {}, true, {});
  return true;
}

bool Exchange::RespondError(int status, std::string_view message) {
  if (!conn_) return false;
  return Respond(status, conn_->ErrorBodyFor(status, message));
}

bool Exchange::BeginStream(int status, std::string_view content_type, const Fields& extra) {
  if (state_ != State::kNew || gone_) return false;
  auto conn = conn_;
  if (!conn || conn->closed()) return false;
  state_ = State::kStreaming;
  std::string head = StatusHead(status, content_type, extra, conn->keep_alive() && conn->chunked());
  if (conn->chunked()) head += "transfer-encoding: chunked\r\n"sv;
  head += kCrlf;
  conn->Enqueue(std::move(head), {}, {}, false, {});
  return true;
}

bool Exchange::SendChunk(std::string data, std::function<void(bool)> done) {
  if (state_ != State::kStreaming || gone_) return false;
  auto conn = conn_;
  if (!conn || conn->closed()) return false;
  if (data.empty()) {
    if (done) done(true);
    return true;
  }
  if (conn->head_only()) {
    if (done) done(true);
    return true;
  }
  if (conn->chunked()) {
    std::string size_line = ChunkSizeLine(data.size());  // before `data` is moved from
    conn->Enqueue(std::move(size_line), std::move(data), kCrlf, false, std::move(done));
  } else {
    conn->Enqueue({}, std::move(data), {}, false, std::move(done));
  }
  return true;
}

bool Exchange::EndStream() {
  if (state_ != State::kStreaming || gone_) return false;
  auto conn = conn_;
  if (!conn || conn->closed()) return false;
  state_ = State::kDone;
  on_gone_ = nullptr;
  if (conn->chunked() && !conn->head_only()) {
    conn->Enqueue({}, {}, kLastChunk, true, {});
  } else {
    conn->Enqueue({}, {}, {}, true, {});
  }
  conn_.reset();
  return true;
}

void Exchange::Abort() {
  if (state_ == State::kDone || gone_) return;
  state_ = State::kDone;
  on_gone_ = nullptr;
  auto conn = std::move(conn_);
  if (conn) conn->Close();
}

// ---- Server ----

namespace {
// Accept failures that concern one pending connection (it was reset before we took it,
// or a firewall refused it): the next one can be taken at once. Any other failure (out
// of descriptors or memory) would fail again immediately: back off instead of spinning.
bool IsPerConnectionAcceptError(const error_code& ec) {
  return ec == asio::error::connection_aborted || ec == asio::error::connection_reset ||
         ec == asio::error::interrupted || ec == asio::error::try_again ||
         ec == asio::error::would_block ||
         ec == error_code(EPROTO, asio::error::get_system_category()) ||
         ec == error_code(EPERM, asio::error::get_system_category());
}
constexpr std::chrono::milliseconds kAcceptBackoff{50};
}  // namespace

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  std::vector<asio::io_context*> contexts;
  std::shared_ptr<ServerShared> shared;
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::size_t next = 0;
  std::string over_limit_response;  // the whole 503, built once
  uint64_t failing_accepts = 0;     // consecutive accept failures (a burst), acceptor thread

  Impl(std::vector<asio::io_context*> ctxs, ServerOptions options, Handler handler)
      : contexts(std::move(ctxs)),
        shared(std::make_shared<ServerShared>(std::move(options), std::move(handler))),
        acceptor(*contexts[0]),
        retry_timer(*contexts[0]) {
    std::string body = shared->ErrorBody(
        503, "Too many connections: the server's limit of " +
                 std::to_string(shared->options.max_connections) + " is reached; retry later.");
    over_limit_response = StatusHead(503, shared->ErrorContentType(), {}, false);
    AppendContentLength(over_limit_response, body.size());
    over_limit_response += body;
  }

  void Log(const std::string& line) const {
    if (shared->options.log) shared->options.log(line);
  }

  void Accept() {
    std::size_t idx = next++ % contexts.size();
    acceptor.async_accept(*contexts[idx], [self = shared_from_this(), idx](
                                              error_code ec, Socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (ec) return self->OnAcceptError(ec);
      if (self->failing_accepts > 0) {
        self->Log("accepting connections again after " + std::to_string(self->failing_accepts) +
                  " failed accepts");
        self->failing_accepts = 0;
      }
      ServerStats& stats = self->shared->stats;
      const std::size_t limit = self->shared->options.max_connections;
      // Only this thread increments, so the check cannot overshoot; closes elsewhere
      // only make it conservative.
      if (limit > 0 && stats.open_connections.load(std::memory_order_relaxed) >=
                           static_cast<int64_t>(limit)) {
        stats.connections_rejected.fetch_add(1, std::memory_order_relaxed);
        self->RejectOverLimit(socket, self->shared->options.tls != nullptr);
        return self->Accept();
      }
      stats.open_connections.fetch_add(1, std::memory_order_relaxed);
      stats.connections_accepted.fetch_add(1, std::memory_order_relaxed);
      std::shared_ptr<asio::ssl::context> tls;
      if (self->shared->options.tls) tls = self->shared->options.tls->context();
      auto conn = std::make_shared<Connection>(std::move(socket), self->shared,
                                               static_cast<int>(idx), std::move(tls));
      asio::post(*self->contexts[idx], [conn] { conn->Start(); });
      self->Accept();
    });
  }

  void OnAcceptError(const error_code& ec) {
    shared->stats.accept_errors.fetch_add(1, std::memory_order_relaxed);
    if (IsPerConnectionAcceptError(ec)) return Accept();
    if (failing_accepts++ == 0) {
      Log("accept failed (" + ec.message() + "); retrying every " +
          std::to_string(kAcceptBackoff.count()) + " ms until it succeeds (logged once per burst)");
    }
    retry_timer.expires_after(kAcceptBackoff);
    retry_timer.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec && self->acceptor.is_open()) self->Accept();
    });
  }

  // Over max_connections: the 503 goes out at once, without waiting for the request (a
  // connection not served costs no read, timer or memory), then the socket is closed.
  // Bytes the client already sent are drained first, so that closing does not turn into
  // a reset that could discard the 503 before the client reads it. Non-blocking
  // throughout; a client whose socket cannot take ~200 bytes just loses the body. A TLS
  // client cannot read a plaintext answer before a handshake: it is just closed.
  void RejectOverLimit(Socket& socket, bool tls) {
    error_code ec;
    if (tls) {
      socket.close(ec);
      return;
    }
    socket.non_blocking(true, ec);
    std::array<char, 4096> sink;
    for (int i = 0; i < 16 && !ec; ++i) socket.read_some(asio::buffer(sink), ec);
    socket.write_some(asio::buffer(over_limit_response), ec);
    socket.shutdown(tcp::socket::shutdown_send, ec);
    socket.close(ec);
  }
};

Server::Server(std::vector<boost::asio::io_context*> contexts, ServerOptions options,
               Handler handler)
    : impl_(std::make_shared<Impl>(std::move(contexts), std::move(options), std::move(handler))) {}

Server::~Server() { StopAccepting(); }

const ServerStats& Server::stats() const { return impl_->shared->stats; }

Status Server::Listen() {
  const ServerOptions& o = impl_->shared->options;
  error_code ec;
  tcp::endpoint endpoint;
  auto addr = asio::ip::make_address(o.host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(addr, o.port);
  } else {
    tcp::resolver resolver(*impl_->contexts[0]);
    auto results = resolver.resolve(o.host, std::to_string(o.port), ec);
    if (ec || results.empty()) {
      return Status::Unavailable("cannot resolve host '" + o.host + "': " + ec.message());
    }
    endpoint = results.begin()->endpoint();
  }
  tcp::acceptor& acc = impl_->acceptor;
  acc.open(endpoint.protocol(), ec);
  if (ec) return Status::Unavailable("open: " + ec.message());
  acc.set_option(asio::socket_base::reuse_address(true), ec);
  acc.bind(endpoint, ec);
  if (ec) {
    error_code ignored;
    acc.close(ignored);
    return Status::Unavailable("bind " + o.host + ":" + std::to_string(o.port) + ": " +
                               ec.message());
  }
  acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::Unavailable("listen: " + ec.message());
  port_ = acc.local_endpoint(ec).port();
  asio::post(*impl_->contexts[0], [impl = impl_] { impl->Accept(); });
  return Status::Ok();
}

void Server::StopAccepting() {
  if (!impl_) return;
  asio::io_context& ctx = *impl_->contexts[0];
  auto close = [impl = impl_] {
    error_code ignored;
    impl->acceptor.close(ignored);
    impl->retry_timer.cancel();
  };
  if (ctx.stopped() || ctx.get_executor().running_in_this_thread()) {
    close();
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  asio::post(ctx, [close, done] {
    close();
    done->set_value();
  });
  // Bounded: if the context is not being run, fall back to closing from here.
  if (fut.wait_for(std::chrono::seconds(2)) != std::future_status::ready) close();
}

}  // namespace kvroute::http
