// Fuzz target: raw bytes from a client, sent to the real http::Server over loopback.
//
// One server per process (started in LLVMFuzzerInitialize, one io thread), with small
// limits so inputs reach them: 4 KiB bodies (413), 2 KiB of header bytes and 16 fields
// (431), 8 KiB of pipelined bytes. Per input: connect, write the input, half-close, read
// until the server closes. The handler answers by the request target, so the fuzzer can
// reach each way a response is made:
//   /stream  chunked response echoing the body in two chunks
//   /later   a complete response posted to the connection's executor (the server keeps
//            reading pipelined bytes meanwhile)
//   /drop    the handler drops the exchange unanswered (the server must send 500)
//   other    200 "ok"
//
// The same handler also serves HTTPS (ServerOptions::tls, a self-signed certificate made
// at start), and every input goes there twice: as raw bytes on the TLS port (a garbage or
// truncated handshake) and, through an OpenSSL client that completed a real handshake, as
// the HTTP bytes inside the TLS stream.
//
// Invariants: the servers never crash (sanitizers) and never hang (every connection is
// answered or closed within kDeadline); whatever they send (decrypted, over TLS) starts
// with an HTTP/1.1 status line whose status is one they may send; and afterwards a
// well-formed request on a fresh connection still gets 200 "ok", on both.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <chrono>
#include <csignal>
#include <optional>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "adapters/http/io_pool.h"
#include "adapters/http/server.h"
#include "adapters/http/tls.h"
#include "adapters/tls/pki.h"

namespace {

using namespace kvroute;
using Clock = std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(5);

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

http::IoPool* g_pool = nullptr;
http::Server* g_server = nullptr;
uint16_t g_port = 0;
http::Server* g_tls_server = nullptr;
uint16_t g_tls_port = 0;
SSL_CTX* g_client_ctx = nullptr;

void Handle(std::shared_ptr<http::Exchange> ex) {
  const std::string_view target = ex->request().target();
  if (target.starts_with("/stream")) {
    ex->BeginStream(200, "text/event-stream");
    const std::string& body = ex->request().body();
    ex->SendChunk(body.substr(0, body.size() / 2));
    ex->SendChunk("data: " + body.substr(body.size() / 2) + "\n\n");
    ex->EndStream();
  } else if (target.starts_with("/later")) {
    boost::asio::post(ex->executor(), [ex] { ex->Respond(200, "later", "text/plain"); });
  } else if (target.starts_with("/drop")) {
    return;  // the last reference goes here: the server answers 500
  } else {
    ex->Respond(200, "ok", "text/plain");
  }
}

// Sends `input` on a fresh connection, half-closes, and returns what the server sent
// until it closed. Aborts when the server neither answers nor closes within kDeadline.
std::string SendRaw(std::string_view input, uint16_t port = g_port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  Check(fd >= 0, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
    std::perror("connect");
    Check(false, "cannot connect to the server");
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::string out;
  size_t sent = 0;
  bool half_closed = false;
  const auto deadline = Clock::now() + kDeadline;
  char buf[16384];
  for (;;) {
    if (sent == input.size() && !half_closed) {
      ::shutdown(fd, SHUT_WR);
      half_closed = true;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (half_closed ? 0 : POLLOUT)), 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      std::fprintf(stderr, "no close after %zu of %zu bytes sent, %zu received\n", sent,
                   input.size(), out.size());
      Check(false, "the server neither answered nor closed the connection");
    }
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    if (p.revents & POLLOUT) {
      const ssize_t n = ::send(fd, input.data() + sent, input.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        sent = input.size();  // the server closed early (after an error response): fine
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        break;  // closed (or reset after an error response)
      }
    }
  }
  ::close(fd);
  return out;
}

// `input` as the HTTP bytes of a TLS connection: handshake, write, half-close when
// `half_close` (TCP: the server reads the end without close_notify, as from a client that
// vanished; like a plaintext half-close it may end the exchange before its answer), then
// what the server sends until it closes, decrypted. Blocking with kDeadline on every socket
// operation; aborts when the server neither answers nor closes in time.
// nullopt when the handshake itself failed (`why` says how).
std::optional<std::string> SendOverTls(std::string_view input, bool half_close, std::string* why = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  Check(fd >= 0, "socket");
  timeval tv{static_cast<time_t>(kDeadline.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(g_tls_port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  Check(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "connect to the TLS port");
  SSL* ssl = SSL_new(g_client_ctx);
  SSL_set_fd(ssl, fd);
  if (SSL_connect(ssl) != 1) {
    char err[256] = "no OpenSSL error";
    if (unsigned long e = ERR_get_error()) ERR_error_string_n(e, err, sizeof err);
    if (why) *why = std::string(err) + " (errno " + std::to_string(errno) + ")";
    ERR_clear_error();
    SSL_free(ssl);
    ::close(fd);
    return std::nullopt;
  }
  size_t sent = 0;
  while (sent < input.size()) {
    const int n = SSL_write(ssl, input.data() + sent, static_cast<int>(input.size() - sent));
    if (n <= 0) break;  // the server closed early (after an error response): fine
    sent += static_cast<size_t>(n);
  }
  if (half_close) ::shutdown(fd, SHUT_WR);
  std::string out;
  char buf[16384];
  const auto deadline = Clock::now() + kDeadline;
  for (;;) {
    const int n = SSL_read(ssl, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    const int err = SSL_get_error(ssl, n);
    if ((err == SSL_ERROR_SYSCALL || err == SSL_ERROR_WANT_READ) &&
        (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Check(Clock::now() < deadline, "the TLS server neither answered nor closed the connection");
    }
    break;  // closed, reset, or a timeout (checked above)
  }
  ERR_clear_error();
  SSL_free(ssl);
  ::close(fd);
  return out;
}

void CheckStatusLine(std::string_view out) {
  if (out.empty()) return;  // closed without answering: allowed for a partial request
  constexpr std::string_view kVersion = "HTTP/1.1 ";
  Check(out.size() >= kVersion.size() + 3 && out.substr(0, kVersion.size()) == kVersion,
        "the response does not start with an HTTP/1.1 status line");
  const std::string_view status = out.substr(kVersion.size(), 3);
  for (std::string_view ok : {"100", "200", "400", "408", "413", "431", "500"}) {
    if (status == ok) return;
  }
  std::fprintf(stderr, "status %.*s\n", static_cast<int>(status.size()), status.data());
  Check(false, "a status the server should not send");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // SSL_write to a server that closed early must fail with EPIPE, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  g_pool = new http::IoPool(1);
  http::ServerOptions o;
  o.max_body_bytes = 4096;
  o.max_header_bytes = 2048;
  o.max_header_count = 16;
  o.max_pipelined_bytes = 8192;
  o.read_timeout = std::chrono::milliseconds(2000);
  o.write_timeout = std::chrono::milliseconds(2000);
  g_server = new http::Server(g_pool->contexts(), o, Handle);
  const Status st = g_server->Listen();
  if (!st.ok()) {
    std::fprintf(stderr, "listen: %s\n", st.message().c_str());
    std::abort();
  }
  g_port = g_server->port();

  Result<tls::KeyPair> pair = tls::SelfSigned("fuzz", "IP:127.0.0.1");
  Check(pair.ok(), "a self-signed certificate");
  o.tls = http::ServerTls::Create(pair->cert_pem, pair->key_pem).value();
  g_tls_server = new http::Server(g_pool->contexts(), o, Handle);
  Check(g_tls_server->Listen().ok(), "listen (TLS)");
  g_tls_port = g_tls_server->port();
  g_client_ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(g_client_ctx, SSL_VERIFY_NONE, nullptr);
  g_pool->Start();
  return 0;  // the server and its pool live until the process ends
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string out = SendRaw(std::string_view(reinterpret_cast<const char*>(data), size));
  CheckStatusLine(out);

  const std::string probe = SendRaw("GET /health HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n");
  if (!(probe.starts_with("HTTP/1.1 200 ") && probe.ends_with("\r\n\r\nok"))) {
    std::fprintf(stderr, "follow-up answer: %s\n", probe.c_str());
    Check(false, "a well-formed request after the input did not get 200 ok");
  }

  SendRaw(std::string_view(reinterpret_cast<const char*>(data), size), g_tls_port);
  // A handshake that fails for the input's connection is tolerated (a loaded machine can
  // make a 2-core box miss it); the follow-up client must get through, within 3 tries.
  if (auto out = SendOverTls(std::string_view(reinterpret_cast<const char*>(data), size), true)) {
    CheckStatusLine(*out);
  }
  std::string tls_probe, why;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto out = SendOverTls("GET /health HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n", false, &why);
    if (out) {
      tls_probe = std::move(*out);
      break;
    }
    std::fprintf(stderr, "TLS handshake for the follow-up request failed: %s\n", why.c_str());
  }
  if (!(tls_probe.starts_with("HTTP/1.1 200 ") && tls_probe.ends_with("\r\n\r\nok"))) {
    std::fprintf(stderr, "follow-up answer over TLS: %s\n", tls_probe.c_str());
    Check(false, "a well-formed request over TLS after the input did not get 200 ok");
  }
  return 0;
}
