#include "adapters/http/test_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvroute::http {

namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

int MillisLeft(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

}  // namespace

std::string ClientResponse::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return {};
}

TestClient::TestClient(std::string host, uint16_t port, std::chrono::milliseconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {}

TestClient::~TestClient() { Close(); }

std::chrono::steady_clock::time_point TestClient::Deadline() const {
  return std::chrono::steady_clock::now() + timeout_;
}

void TestClient::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  rbuf_.clear();
  rpos_ = 0;
  peer_closed_ = false;
}

bool TestClient::Connect() {
  Close();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port = std::to_string(port_);
  if (getaddrinfo(host_.c_str(), port.c_str(), &hints, &res) != 0 || !res) {
    error_ = "resolve failed";
    return false;
  }
  int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(res);
    error_ = "socket failed";
    return false;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 && errno != EINPROGRESS) {
    ::close(fd);
    error_ = std::string("connect: ") + std::strerror(errno);
    return false;
  }
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, static_cast<int>(timeout_.count())) != 1) {
    ::close(fd);
    error_ = "connect timeout";
    return false;
  }
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    ::close(fd);
    error_ = std::string("connect: ") + std::strerror(err);
    return false;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fd_ = fd;
  return true;
}

bool TestClient::SendRaw(std::string_view bytes) {
  if (fd_ < 0) {
    error_ = "not connected";
    return false;
  }
  auto deadline = Deadline();
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, MillisLeft(deadline)) != 1) {
        error_ = "send timeout";
        return false;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    error_ = std::string("send: ") + std::strerror(errno);
    return false;
  }
  return true;
}

bool TestClient::SendRequest(std::string_view method, std::string_view target,
                             std::string_view body,
                             const std::vector<std::pair<std::string, std::string>>& headers) {
  if (fd_ < 0 && !Connect()) return false;
  std::string req;
  req.reserve(256 + body.size());
  req.append(method).append(" ").append(target).append(" HTTP/1.1\r\nhost: ");
  req.append(host_).append(":").append(std::to_string(port_)).append("\r\n");
  bool has_type = false;
  for (const auto& [n, v] : headers) {
    if (Lower(n) == "content-type") has_type = true;
    req.append(n).append(": ").append(v).append("\r\n");
  }
  if (!body.empty() || method == "POST") {
    if (!has_type) req.append("content-type: application/json\r\n");
    req.append("content-length: ").append(std::to_string(body.size())).append("\r\n");
  }
  req.append("\r\n");
  req.append(body);
  return SendRaw(req);
}

bool TestClient::Fill(std::chrono::steady_clock::time_point deadline) {
  if (fd_ < 0) {
    error_ = "not connected";
    return false;
  }
  if (peer_closed_) {
    error_ = "connection closed by server";
    return false;
  }
  if (rpos_ > 0 && rpos_ == rbuf_.size()) {
    rbuf_.clear();
    rpos_ = 0;
  }
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, MillisLeft(deadline));
    if (rc == 0) {
      error_ = "read timeout";
      return false;
    }
    if (rc < 0) {
      if (errno == EINTR) continue;
      error_ = "poll failed";
      return false;
    }
    char buf[16384];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      rbuf_.append(buf, static_cast<std::size_t>(n));
      return true;
    }
    if (n == 0) {
      peer_closed_ = true;
      error_ = "connection closed by server";
      return false;
    }
    if (errno == EAGAIN || errno == EINTR) continue;
    peer_closed_ = true;
    error_ = std::string("recv: ") + std::strerror(errno);
    return false;
  }
}

bool TestClient::ReadLine(std::string* line, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto pos = rbuf_.find("\r\n", rpos_);
    if (pos != std::string::npos) {
      line->assign(rbuf_, rpos_, pos - rpos_);
      rpos_ = pos + 2;
      return true;
    }
    if (!Fill(deadline)) return false;
  }
}

bool TestClient::ReadExact(std::size_t n, std::string* out,
                           std::chrono::steady_clock::time_point deadline) {
  while (rbuf_.size() - rpos_ < n) {
    if (!Fill(deadline)) return false;
  }
  out->append(rbuf_, rpos_, n);
  rpos_ += n;
  return true;
}

bool TestClient::ReadHead(ClientResponse* out) {
  auto deadline = Deadline();
  *out = ClientResponse{};
  ended_ = false;
  content_length_.reset();
  chunked_ = false;
  for (;;) {
    std::string line;
    if (!ReadLine(&line, deadline)) return false;
    // "HTTP/1.1 200 OK"
    if (line.size() < 12 || line.compare(0, 5, "HTTP/") != 0) {
      error_ = "malformed status line: " + line;
      return false;
    }
    out->status = std::atoi(line.c_str() + 9);
    out->headers.clear();
    for (;;) {
      if (!ReadLine(&line, deadline)) return false;
      if (line.empty()) break;
      auto colon = line.find(':');
      if (colon == std::string::npos) {
        error_ = "malformed header: " + line;
        return false;
      }
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      out->headers.emplace_back(Lower(line.substr(0, colon)), std::move(value));
    }
    if (out->status >= 100 && out->status < 200) continue;  // 100 Continue
    break;
  }
  std::string te = Lower(out->Header("transfer-encoding"));
  chunked_ = te.find("chunked") != std::string::npos;
  out->chunked = chunked_;
  std::string cl = out->Header("content-length");
  if (!cl.empty()) content_length_ = std::strtoull(cl.c_str(), nullptr, 10);
  return true;
}

std::optional<TimedChunk> TestClient::ReadChunk() {
  if (!chunked_ || ended_) return std::nullopt;
  auto deadline = Deadline();
  std::string line;
  if (!ReadLine(&line, deadline)) return std::nullopt;
  std::size_t size = std::strtoull(line.c_str(), nullptr, 16);
  if (size == 0) {
    // Trailers (none expected) end with an empty line.
    do {
      if (!ReadLine(&line, deadline)) return std::nullopt;
    } while (!line.empty());
    ended_ = true;
    return std::nullopt;
  }
  TimedChunk chunk;
  if (!ReadExact(size, &chunk.data, deadline)) return std::nullopt;
  chunk.arrived = std::chrono::steady_clock::now();
  if (!ReadLine(&line, deadline) || !line.empty()) {
    error_ = "malformed chunk trailer";
    return std::nullopt;
  }
  return chunk;
}

bool TestClient::ReadBody(ClientResponse* out) {
  if (chunked_) {
    while (auto c = ReadChunk()) out->body += c->data;
    return ended_;
  }
  auto deadline = Deadline();
  if (content_length_) return ReadExact(*content_length_, &out->body, deadline);
  if (out->status == 204 || out->status == 304) return true;
  // Neither: the body runs until the server closes.
  while (Fill(deadline)) {
  }
  if (!peer_closed_) return false;
  out->body.append(rbuf_, rpos_, std::string::npos);
  rpos_ = rbuf_.size();
  return true;
}

std::optional<ClientResponse> TestClient::Roundtrip(
    std::string_view method, std::string_view target, std::string_view body,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  ClientResponse r;
  if (!SendRequest(method, target, body, headers) || !ReadHead(&r) || !ReadBody(&r)) {
    return std::nullopt;
  }
  return r;
}

bool TestClient::WaitForClose() {
  auto deadline = Deadline();
  while (!peer_closed_) {
    rpos_ = rbuf_.size();
    if (!Fill(deadline) && !peer_closed_) return false;
  }
  return true;
}

std::optional<ClientResponse> Fetch(std::string_view host, uint16_t port, std::string_view method,
                                    std::string_view target, std::string_view body,
                                    const std::vector<std::pair<std::string, std::string>>& headers,
                                    std::chrono::milliseconds timeout) {
  TestClient c{std::string(host), port, timeout};
  if (!c.Connect()) return std::nullopt;
  return c.Roundtrip(method, target, body, headers);
}

}  // namespace kvroute::http
