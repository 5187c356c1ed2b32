// An HTTP/1.1 server for the simulator and the router: keep-alive, in-order pipelining,
// hard limits (open connections, header bytes and count, body bytes, time to receive a
// request, keep-alive idle time), complete and streamed (chunked, flushed per chunk)
// responses, and notification when the client goes away mid-response.
//
// Threads: the server runs on io_contexts it is given (see IoPool). The acceptor lives
// on the first context; accepted connections are handed to the contexts round-robin
// and never move. A connection's handler calls and every Exchange call happen on that
// connection's context thread.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/optional.hpp>
#include <array>
#include <atomic>
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

#include "core/common/status.h"
#include "adapters/http/tls.h"

namespace kvroute::http {

// Spare bytes a request body is guaranteed to have allocated after its end (readable,
// contents unspecified): lets a JSON parser such as simdjson read it in place.
inline constexpr std::size_t kRequestBodyPadding = 64;

namespace detail {
// Request-body buffers recycled per thread: a finished exchange gives its body's storage
// back (~Exchange), the next request body read on that thread reuses it instead of a
// fresh allocation. Bodies of a few KB (prompts) are past malloc's per-thread caches, so
// each one cost a slow malloc and free (callgrind: ~750 instructions per 4 KB request).
// TakeBodyBuffer: if a recycled buffer of at least `capacity` bytes is kept, moves it into
// `body` (emptied) and returns true. Thread: any; the pool is the calling thread's.
bool TakeBodyBuffer(std::string& body, std::size_t capacity);
// Keeps `body`'s storage for a later TakeBodyBuffer on this thread (bounded in count and
// size; larger or surplus buffers are simply freed).
void RecycleBodyBuffer(std::string&& body);
}  // namespace detail

// A request body held as a std::string, like Beast's string_body, but appended without
// zero-filling first and always followed by kRequestBodyPadding allocated bytes
// (capacity() >= size() + kRequestBodyPadding). Storage comes from the thread's recycled
// body buffers when one is big enough.
struct PaddedStringBody {
  using value_type = std::string;
  static std::uint64_t size(const value_type& body) { return body.size(); }

  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(boost::beast::http::header<isRequest, Fields>&, value_type& body) : body_(body) {}
    void init(const boost::optional<std::uint64_t>& length, boost::system::error_code& ec) {
      ec = {};
      if (length) {
        if (*length > body_.max_size() - kRequestBodyPadding) {
          ec = boost::beast::http::error::buffer_overflow;
          return;
        }
        const std::size_t want = static_cast<std::size_t>(*length) + kRequestBodyPadding;
        if (body_.capacity() < want && !detail::TakeBodyBuffer(body_, want)) body_.reserve(want);
      }
    }
    template <class ConstBufferSequence>
    std::size_t put(const ConstBufferSequence& buffers, boost::system::error_code& ec) {
      ec = {};
      std::size_t n = 0;
      for (auto it = boost::asio::buffer_sequence_begin(buffers);
           it != boost::asio::buffer_sequence_end(buffers); ++it) {
        boost::asio::const_buffer b = *it;
        body_.append(static_cast<const char*>(b.data()), b.size());
        n += b.size();
      }
      return n;
    }
    void finish(boost::system::error_code& ec) {
      ec = {};
      if (body_.capacity() < body_.size() + kRequestBodyPadding) {
        body_.reserve(body_.size() + kRequestBodyPadding);
      }
    }

   private:
    value_type& body_;
  };
};

using Request = boost::beast::http::request<PaddedStringBody>;
// Extra response header fields (name, value), written in order.
using Fields = std::vector<std::pair<std::string, std::string>>;

// Builds the body of an error response the server itself sends (400, 413, 431, 500...).
// Called on a connection thread; must be thread-safe. The body is sent as
// application/json. The shape is the API's, so the front end gives it (serve, epp and sim
// pass OpenAI's, api::ErrorBodyFor); without one the message goes as text/plain.
using ErrorBodyFn = std::function<std::string(int status, std::string_view message)>;

// A response the front end gives as soon as a request's header is in, before its body is
// read (a request that will be refused whatever its body: a missing API key).
struct EarlyAnswer {
  int status = 0;
  std::string body;
  std::string content_type = "application/json";
  Fields extra;
};
// Called on the connection's thread once a request's header has arrived while its body
// has not (a request read whole goes to the handler as usual), with the connection's
// worker index. nullopt: read on. An answer is sent at once, with `connection: close`;
// the body is not read (the connection lingers briefly so the answer is not lost to a
// reset).
using HeaderCheck = std::function<std::optional<EarlyAnswer>(const Request& head, int worker)>;

// Every response the server sends on its own (a limit or a malformed request) has an
// error_body body, `connection: close`, and is followed by closing the connection.
struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: the kernel picks; read it back with Server::port()
  // Open client connections at most; 0 = unlimited. A connection accepted past the
  // limit is answered 503 at once, without reading its request, and closed.
  std::size_t max_connections = 0;
  std::size_t max_body_bytes = 16u << 20;     // larger body -> 413
  std::size_t max_header_bytes = 16u << 10;   // request line + headers; larger -> 431
  std::size_t max_header_count = 100;         // more fields -> 431
  // A request must be fully read (head and body) within this, counted from its first
  // byte on a kept-alive connection and from the accept on a new one. Expiry with part
  // of a request read: 408 (slow sender). A new connection that sent nothing by then is
  // closed silently.
  std::chrono::milliseconds read_timeout{30000};
  // A kept-alive connection on which no byte of a next request arrived within this
  // after the last response is closed silently.
  std::chrono::milliseconds keepalive_idle{60000};
  // Bound on each socket write; a client that stops reading is disconnected.
  std::chrono::milliseconds write_timeout{30000};
  // While a response is in progress the server keeps reading (to notice a
  // disconnect); it buffers at most this many bytes of pipelined requests meanwhile.
  std::size_t max_pipelined_bytes = 1u << 20;
  ErrorBodyFn error_body;  // empty: the message itself, as text/plain
  // Set: the listener speaks HTTPS. Each connection is served with the context current at
  // its accept (ServerTls::Update swaps it for later ones); its handshake must complete
  // within read_timeout, like a first request. Over max_connections a TLS connection is
  // closed without the 503 (it could not read it before a handshake).
  std::shared_ptr<ServerTls> tls;
  HeaderCheck header_check;  // empty: none
  // Warnings the server cannot answer on a connection (accept failing for lack of
  // descriptors: logged once per burst). Called on the acceptor's thread; empty: none.
  std::function<void(std::string_view)> log;
};

// Why the server itself answered a request with an error and closed its connection.
enum class RejectReason {
  kHeaderTooLarge,  // 431, max_header_bytes
  kTooManyHeaders,  // 431, max_header_count
  kBodyTooLarge,    // 413, max_body_bytes
  kRequestTimeout,  // 408, read_timeout
  kBadRequest,      // 400, malformed
};
inline constexpr std::size_t kRejectReasons = 5;
// "header_too_large", "too_many_headers", "body_too_large", "request_timeout",
// "bad_request".
std::string_view RejectReasonName(RejectReason reason);

// What the server has done, as counters that any thread may read at any time (relaxed
// atomics, each read on its own: the fields are not a consistent snapshot). Written by
// the acceptor once per connection and by connection threads once per rejection; never
// per request.
struct ServerStats {
  std::atomic<int64_t> open_connections{0};        // accepted, socket not closed yet
  std::atomic<uint64_t> connections_accepted{0};   // served (the rejected excluded)
  std::atomic<uint64_t> connections_rejected{0};   // over max_connections: 503
  std::atomic<uint64_t> accept_errors{0};          // accept failed (EMFILE...), retried
  std::atomic<uint64_t> idle_closed{0};            // closed silently (keepalive_idle...)
  std::atomic<uint64_t> tls_handshake_failures{0}; // TLS handshake failed or timed out
  std::array<std::atomic<uint64_t>, kRejectReasons> requests_rejected{};  // by RejectReason
  uint64_t rejected(RejectReason r) const {
    return requests_rejected[static_cast<std::size_t>(r)].load(std::memory_order_relaxed);
  }
};

class Connection;

// One request and its response. The handler receives it as a shared_ptr and may keep
// it as long as it likes (e.g. across timers); once the connection is gone every call
// is a harmless no-op and client_gone() is true. The response is written either
// complete (Respond) or streamed (BeginStream, SendChunk..., EndStream).
// If the last reference is dropped before a response is complete, the server sends
// 500 (nothing sent yet) or closes the connection (stream started) so the client is
// never left waiting.
// Thread: all calls on the connection's context thread (executor()). Lifetime: release
// every Exchange before the io_contexts are destroyed (it pins its connection's socket).
class Exchange {
 public:
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  const Request& request() const { return request_; }
  // Mutable access, e.g. to move the body into an upstream request.
  Request& mutable_request() { return request_; }

  // Index of the io_context (in the server's list) this exchange lives on; lets a
  // handler keep per-worker state without locks.
  int worker() const { return worker_; }
  // The connection's executor: post follow-up work here.
  const boost::asio::any_io_executor& executor() const { return executor_; }

  // True once the client has disconnected (or the connection failed) before the
  // response completed.
  bool client_gone() const { return gone_; }
  // `cb` runs once, on the connection thread, if the client goes away before the
  // response is complete. Never runs after the response completed. Replaces any
  // earlier callback. If the client is already gone, `cb` is not called.
  void OnClientGone(std::function<void()> cb) { on_gone_ = std::move(cb); }

  // Sends a complete response with Content-Length. Returns false (and sends nothing)
  // if a response was already started or the client is gone.
  bool Respond(int status, std::string body, std::string_view content_type = "application/json",
               const Fields& extra = {});
  // Sends an error response whose body comes from the server's ErrorBodyFn.
  bool RespondError(int status, std::string_view message);

  // Starts a chunked response: writes the status line and headers now. Returns false
  // if a response was already started or the client is gone.
  bool BeginStream(int status, std::string_view content_type = "text/event-stream",
                   const Fields& extra = {});
  // Queues `data` as one chunk and starts writing it at once (no buffering beyond
  // what the socket accepts). Empty data is ignored. `done`, if set, is called when
  // this chunk has been written (true) or dropped because the connection failed
  // (false); useful for back-pressure. Returns false if no stream is open or the
  // client is gone.
  bool SendChunk(std::string data, std::function<void(bool)> done = {});
  // Writes the terminating chunk; the exchange is complete once it is flushed.
  // Returns false if no stream is open or the client is gone.
  bool EndStream();

  // Closes the connection now, without a response or the rest of one (a stream ends
  // without its terminating chunk; queued bytes are dropped): what a client of a crashed
  // or reset server sees. The exchange is complete afterwards (every call a no-op; the
  // OnClientGone callback does not run). For fault injection.
  void Abort();

  // Bytes queued on this connection but not yet written to the socket.
  std::size_t pending_write_bytes() const;

  // Only the server creates exchanges (the key's constructor is private to it); public
  // so that it can use make_shared (one allocation).
  class Key {
    friend class Connection;
    Key() = default;
  };
  Exchange(Key, std::shared_ptr<Connection> conn, Request request, int worker,
           boost::asio::any_io_executor executor);

 private:
  friend class Connection;
  enum class State { kNew, kStreaming, kDone };
  void NotifyGone();

  // Held until the response is complete so the connection outlives the handler's
  // work even when no socket operation is pending; released when done.
  std::shared_ptr<Connection> conn_;
  Request request_;
  int worker_;
  boost::asio::any_io_executor executor_;
  State state_ = State::kNew;
  bool gone_ = false;
  std::function<void()> on_gone_;
};

// Called once per request on the connection's thread. Must eventually complete the
// response through the Exchange (or drop it, which yields a 500).
using Handler = std::function<void(std::shared_ptr<Exchange>)>;

class Server {
 public:
  // `contexts` (non-empty, not owned) must outlive the server and be running (or be
  // run later) by the caller, e.g. IoPool::contexts(). Connections are spread across
  // them round-robin; the acceptor uses contexts[0].
  Server(std::vector<boost::asio::io_context*> contexts, ServerOptions options, Handler handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens, then starts accepting on contexts[0]. Returns ok, or Unavailable
  // with a description of the failure ("bind 0.0.0.0:8080: Address already in use").
  // Thread: any, once.
  Status Listen();
  // The bound port (valid after a successful Listen()).
  uint16_t port() const { return port_; }
  // Live counters; valid as long as the server. Thread: any.
  const ServerStats& stats() const;

  // Stops accepting. Open connections are not closed; they end with their contexts.
  // Thread: any; blocks until the acceptor is closed if its context is running.
  void StopAccepting();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace kvroute::http
