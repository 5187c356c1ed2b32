// A small blocking HTTP/1.1 client for tests and tools: one TCP connection, explicit
// steps (send, read the head, read chunks one by one with their arrival times), and a
// bound on every wait so a test can never hang. Not for production traffic.
// Thread: one object per thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvroute::http {

struct ClientResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;       // the whole body (chunks concatenated)
  bool chunked = false;
  // Value of the first header named `name` (lower-case), or "" if absent.
  std::string Header(std::string_view name) const;
};

struct TimedChunk {
  std::string data;
  std::chrono::steady_clock::time_point arrived;
};

class TestClient {
 public:
  // `timeout` bounds each call (connect, each read, each send).
  TestClient(std::string host, uint16_t port,
             std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));
  ~TestClient();
  TestClient(const TestClient&) = delete;
  TestClient& operator=(const TestClient&) = delete;

  bool Connect();
  bool connected() const { return fd_ >= 0; }
  void Close();

  // Sends bytes as they are (for malformed or pipelined requests).
  bool SendRaw(std::string_view bytes);
  // Sends a well-formed HTTP/1.1 request with Host and, when `body` is non-empty or
  // the method is POST, Content-Length.
  bool SendRequest(std::string_view method, std::string_view target, std::string_view body = {},
                   const std::vector<std::pair<std::string, std::string>>& headers = {});

  // Reads the status line and headers (skipping 1xx responses). False on timeout,
  // close or malformed input (see error()).
  bool ReadHead(ClientResponse* out);
  // After ReadHead of a chunked response: the next chunk, stamped with the time its
  // last byte arrived; nullopt after the terminating chunk (ended() true) or on error.
  std::optional<TimedChunk> ReadChunk();
  bool ended() const { return ended_; }
  // After ReadHead: reads the rest of the body (Content-Length, chunked, or until the
  // server closes) into out->body.
  bool ReadBody(ClientResponse* out);

  // SendRequest + ReadHead + ReadBody.
  std::optional<ClientResponse> Roundtrip(
      std::string_view method, std::string_view target, std::string_view body = {},
      const std::vector<std::pair<std::string, std::string>>& headers = {});

  // Waits (bounded by the timeout) until the server closes the connection; true if it
  // did. Discards any bytes received meanwhile.
  bool WaitForClose();

  const std::string& error() const { return error_; }

 private:
  bool Fill(std::chrono::steady_clock::time_point deadline);
  bool ReadLine(std::string* line, std::chrono::steady_clock::time_point deadline);
  bool ReadExact(std::size_t n, std::string* out, std::chrono::steady_clock::time_point deadline);
  std::chrono::steady_clock::time_point Deadline() const;

  std::string host_;
  uint16_t port_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::string rbuf_;
  std::size_t rpos_ = 0;
  bool peer_closed_ = false;
  bool ended_ = false;
  std::optional<std::size_t> content_length_;
  bool chunked_ = false;
  std::string error_;
};

// One request on a fresh connection.
std::optional<ClientResponse> Fetch(std::string_view host, uint16_t port, std::string_view method,
                                    std::string_view target, std::string_view body = {},
                                    const std::vector<std::pair<std::string, std::string>>& headers = {},
                                    std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

}  // namespace kvroute::http
