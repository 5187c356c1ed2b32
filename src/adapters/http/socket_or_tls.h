// One connection's byte stream as the client and the server both hold it: a TCP socket,
// and TLS over it when the connection is https. Plain TCP writes can be tried at once
// (TryWrite, non-blocking); TLS writes always go through the event loop, since a
// non-blocking write cannot stop in the middle of a record. Header-only, no allocation.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <optional>
#include <utility>

namespace kvroute::http {

// For this header and the client and server that include it.
namespace asio = boost::asio;
using error_code = boost::system::error_code;

template <class Socket>
struct SocketOrTls {
  template <class... Args>
  explicit SocketOrTls(Args&&... args) : socket(std::forward<Args>(args)...) {}

  // Plain TCP: what the socket takes now, without waiting. TLS: 0 (the caller writes
  // through the event loop).
  template <class Buffers>
  std::size_t TryWrite(const Buffers& buffers, error_code& ec) {
    if (tls) {
      ec = {};
      return 0;
    }
    return socket.write_some(buffers, ec);
  }
  template <class Buffers, class Handler>
  void AsyncReadSome(const Buffers& buffers, Handler&& handler) {
    if (tls) return tls->async_read_some(buffers, std::forward<Handler>(handler));
    socket.async_read_some(buffers, std::forward<Handler>(handler));
  }

  Socket socket;
  std::optional<asio::ssl::stream<Socket&>> tls;  // over `socket`
};

}  // namespace kvroute::http
