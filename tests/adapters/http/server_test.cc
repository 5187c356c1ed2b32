// Loopback tests of the HTTP server: limits, keep-alive, pipelining, streaming and
// disconnect detection. Every wait is bounded (TestClient timeouts, future wait_for).
#include "adapters/http/server.h"

#include "core/api/openai.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "adapters/http/io_pool.h"
#include "adapters/http/test_client.h"
#include "support/stub_server.h"
#include "support/wait.h"

namespace kvroute::http {
namespace {

using namespace std::chrono_literals;

// A server on port 0 with its own pool.
using TestServer = kvroute::test_support::LoopbackServer;

// Answers 200 with "<method> <target> <body>".
void Echo(std::shared_ptr<Exchange> ex) {
  const Request& r = ex->request();
  std::string body = std::string(r.method_string()) + " " + std::string(r.target()) + " " + r.body();
  ex->Respond(200, std::move(body), "text/plain");
}

TEST(ServerTest, BindsPortZeroAndAnswers) {
  TestServer s(Echo);
  ASSERT_EQ(s.listen_status().ToString(), "OK");
  ASSERT_NE(s.port(), 0);
  auto r = Fetch("127.0.0.1", s.port(), "POST", "/x", "hello");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /x hello");
  EXPECT_EQ(r->Header("content-type"), "text/plain");
  EXPECT_EQ(r->Header("content-length"), "13");
}

TEST(ServerTest, RequestBodiesArePaddedForInPlaceParsing) {
  // Answers "<body size> <spare capacity >= padding>".
  TestServer s([](std::shared_ptr<Exchange> ex) {
    const std::string& b = ex->request().body();
    bool padded = b.capacity() >= b.size() + kRequestBodyPadding;
    ex->Respond(200, std::to_string(b.size()) + (padded ? " padded" : " bare"), "text/plain");
  });
  TestClient c("127.0.0.1", s.port());
  ASSERT_TRUE(c.Connect());
  for (std::size_t n : {0u, 1u, 100u, 300000u}) {
    auto r = c.Roundtrip("POST", "/p", std::string(n, 'x'));
    ASSERT_TRUE(r.has_value()) << c.error();
    EXPECT_EQ(r->body, std::to_string(n) + " padded");
  }
  // Chunked: the length is not known in advance.
  ASSERT_TRUE(c.SendRaw("POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                        "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"));
  ClientResponse r;
  ASSERT_TRUE(c.ReadHead(&r)) << c.error();
  ASSERT_TRUE(c.ReadBody(&r)) << c.error();
  EXPECT_EQ(r.body, "11 padded");
}

TEST(ServerTest, KeepAliveServesManyRequestsOnOneConnection) {
  TestServer s(Echo);
  TestClient c("127.0.0.1", s.port());
  ASSERT_TRUE(c.Connect());
  for (int i = 0; i < 5; ++i) {
    auto r = c.Roundtrip("GET", "/n" + std::to_string(i));
    ASSERT_TRUE(r.has_value()) << c.error();
    EXPECT_EQ(r->body, "GET /n" + std::to_string(i) + " ");
    EXPECT_EQ(r->Header("connection"), "");
  }
}

TEST(ServerTest, ConnectionCloseIsHonoured) {
  TestServer s(Echo);
  TestClient c("127.0.0.1", s.port());
  auto r = c.Roundtrip("GET", "/", {}, {{"connection", "close"}});
  ASSERT_TRUE(r.has_value()) << c.error();
  EXPECT_EQ(r->Header("connection"), "close");
  EXPECT_TRUE(c.WaitForClose());
}

TEST(ServerTest, PipelinedRequestsAnswerInOrderEvenIfTheFirstIsSlow) {
  // "/slow" answers after a timer; "/fast" at once. Responses must keep request order.
  TestServer s([](std::shared_ptr<Exchange> ex) {
    if (ex->request().target() == "/slow") {
      auto timer = std::make_shared<boost::asio::steady_timer>(ex->executor(), 30ms);
      timer->async_wait([ex, timer](boost::system::error_code) { Echo(ex); });
      return;
    }
    Echo(ex);
  });
  TestClient c("127.0.0.1", s.port());
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRaw(
      "GET /slow HTTP/1.1\r\nhost: a\r\n\r\nGET /fast HTTP/1.1\r\nhost: a\r\n\r\n"
      "POST /third HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\nabc"));
  std::vector<std::string> bodies;
  for (int i = 0; i < 3; ++i) {
    ClientResponse r;
    ASSERT_TRUE(c.ReadHead(&r)) << c.error();
    ASSERT_TRUE(c.ReadBody(&r)) << c.error();
    bodies.push_back(r.body);
  }
  EXPECT_EQ(bodies, (std::vector<std::string>{"GET /slow ", "GET /fast ", "POST /third abc"}));
}

TEST(ServerTest, StreamedChunksArriveBeforeTheStreamEnds) {
  // The handler sends one chunk and parks the exchange; the test reads that chunk and
  // only then asks for the rest. If the server buffered, the first read would time out.
  std::promise<std::shared_ptr<Exchange>> parked;
  TestServer s([&parked](std::shared_ptr<Exchange> ex) {
    if (ex->request().target() != "/stream") return Echo(ex);
    ASSERT_TRUE(ex->BeginStream(200, "text/event-stream", {{"cache-control", "no-cache"}}));
    ASSERT_TRUE(ex->SendChunk("data: one\n\n"));
    parked.set_value(ex);
  });
  TestClient c("127.0.0.1", s.port(), 2000ms);
  ASSERT_TRUE(c.SendRequest("GET", "/stream"));
  ClientResponse head;
  ASSERT_TRUE(c.ReadHead(&head)) << c.error();
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.chunked);
  EXPECT_EQ(head.Header("content-type"), "text/event-stream");
  EXPECT_EQ(head.Header("cache-control"), "no-cache");
  auto first = c.ReadChunk();
  ASSERT_TRUE(first.has_value()) << c.error();
  EXPECT_EQ(first->data, "data: one\n\n");

  auto fut = parked.get_future();
  ASSERT_EQ(fut.wait_for(2s), std::future_status::ready);
  auto ex = fut.get();
  std::promise<void> sent;
  boost::asio::post(ex->executor(), [&] {
    EXPECT_TRUE(ex->SendChunk("data: two\n\n"));
    EXPECT_TRUE(ex->SendChunk("data: [DONE]\n\n"));
    EXPECT_TRUE(ex->EndStream());
    EXPECT_FALSE(ex->SendChunk("late"));  // nothing after the end
    ex.reset();
    sent.set_value();
  });
  ASSERT_EQ(sent.get_future().wait_for(2s), std::future_status::ready);
  auto second = c.ReadChunk();
  ASSERT_TRUE(second.has_value()) << c.error();
  EXPECT_EQ(second->data, "data: two\n\n");
  auto third = c.ReadChunk();
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->data, "data: [DONE]\n\n");
  EXPECT_FALSE(c.ReadChunk().has_value());
  EXPECT_TRUE(c.ended());
  // The connection stays usable after a stream.
  auto again = c.Roundtrip("GET", "/after");
  ASSERT_TRUE(again.has_value()) << c.error();
  EXPECT_EQ(again->body, "GET /after ");
}

TEST(ServerTest, ClientDisconnectMidStreamIsReportedAndLaterCallsAreSafe) {
  std::promise<void> gone;
  std::promise<std::shared_ptr<Exchange>> parked;
  TestServer s([&](std::shared_ptr<Exchange> ex) {
    if (ex->request().target() != "/v1/completions") return Echo(ex);
    ex->OnClientGone([&gone] { gone.set_value(); });
    ex->BeginStream(200);
    ex->SendChunk("data: x\n\n");
    parked.set_value(ex);
  });
  {
    TestClient c("127.0.0.1", s.port(), 2000ms);
    ASSERT_TRUE(c.SendRequest("POST", "/v1/completions", "{}"));
    ClientResponse head;
    ASSERT_TRUE(c.ReadHead(&head));
    ASSERT_TRUE(c.ReadChunk().has_value());
  }  // closes the socket
  ASSERT_EQ(gone.get_future().wait_for(2s), std::future_status::ready);
  auto ex = parked.get_future().get();
  std::promise<bool> result;
  boost::asio::post(ex->executor(), [&] {
    bool ok = ex->client_gone() && !ex->SendChunk("data: y\n\n") && !ex->EndStream();
    ex.reset();  // last reference: must not resurrect or crash the dead connection
    result.set_value(ok);
  });
  auto f = result.get_future();
  ASSERT_EQ(f.wait_for(2s), std::future_status::ready);
  EXPECT_TRUE(f.get());
  // The server still works.
  auto r = Fetch("127.0.0.1", s.port(), "GET", "/");
  ASSERT_TRUE(r.has_value());
}

TEST(ServerTest, ChunkWriteCallbacksReportCompletion) {
  std::promise<int> written;
  TestServer s([&](std::shared_ptr<Exchange> ex) {
    ex->BeginStream(200, "text/plain");
    auto count = std::make_shared<int>(0);
    for (int i = 0; i < 3; ++i) {
      ex->SendChunk("abc", [count, &written](bool ok) {
        if (ok && ++*count == 3) written.set_value(*count);
      });
    }
    ex->EndStream();
  });
  auto r = Fetch("127.0.0.1", s.port(), "GET", "/");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "abcabcabc");
  auto f = written.get_future();
  ASSERT_EQ(f.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(f.get(), 3);
}

// Error bodies come from the pluggable callback.
std::string TaggedError(int status, std::string_view message) {
  return "{\"status\":" + std::to_string(status) + ",\"msg\":\"" + std::string(message) + "\"}";
}

ServerOptions SmallLimits() {
  ServerOptions o;
  o.max_body_bytes = 1000;
  o.max_header_bytes = 2000;
  o.max_header_count = 20;
  o.error_body = TaggedError;
  return o;
}

void ExpectServerStillServes(uint16_t port) {
  auto ok = Fetch("127.0.0.1", port, "POST", "/ok", "fine");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "POST /ok fine");
}

TEST(ServerTest, OversizedBodyByContentLengthIs413) {
  TestServer s(Echo, SmallLimits());
  TestClient c("127.0.0.1", s.port());
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRaw("POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 1001\r\n\r\n"));
  ClientResponse r;
  ASSERT_TRUE(c.ReadHead(&r)) << c.error();
  ASSERT_TRUE(c.ReadBody(&r)) << c.error();
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.Header("content-type"), "application/json");
  EXPECT_EQ(r.body, "{\"status\":413,\"msg\":\"Request body exceeds the limit of 1000 bytes.\"}");
  EXPECT_TRUE(c.WaitForClose());
  ExpectServerStillServes(s.port());
}

TEST(ServerTest, OversizedChunkedBodyIs413) {
  TestServer s(Echo, SmallLimits());
  TestClient c("127.0.0.1", s.port());
  ASSERT_TRUE(c.Connect());
  std::string big(1200, 'x');
  char size_line[16];
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", big.size());
  ASSERT_TRUE(c.SendRaw("POST /x HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n" +
                        std::string(size_line) + big + "\r\n0\r\n\r\n"));
  ClientResponse r;
  ASSERT_TRUE(c.ReadHead(&r)) << c.error();
  EXPECT_EQ(r.status, 413);
  ExpectServerStillServes(s.port());
}

TEST(ServerTest, BodyAtTheLimitIsAccepted) {
  TestServer s(Echo, SmallLimits());
  std::string body(1000 - 8, 'b');  // Echo adds "POST /x " to what comes back
  auto r = Fetch("127.0.0.1", s.port(), "POST", "/x", body);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /x " + body);
}

TEST(ServerTest, OversizedHeadersAre431) {
  TestServer s(Echo, SmallLimits());
  auto r = Fetch("127.0.0.1", s.port(), "GET", "/", {}, {{"x-big", std::string(3000, 'h')}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 431);
  EXPECT_EQ(r->body, "{\"status\":431,\"msg\":\"Request header fields too large.\"}");
  ExpectServerStillServes(s.port());
}

TEST(ServerTest, TooManyHeaderFieldsAre431) {
  TestServer s(Echo, SmallLimits());
  std::vector<std::pair<std::string, std::string>> many;
  for (int i = 0; i < 25; ++i) many.emplace_back("x-h" + std::to_string(i), "v");
  auto r = Fetch("127.0.0.1", s.port(), "GET", "/", {}, many);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 431);
  EXPECT_EQ(r->body, "{\"status\":431,\"msg\":\"Too many request header fields.\"}");
  ExpectServerStillServes(s.port());
}

TEST(ServerTest, MalformedRequestsAre400) {
  TestServer s(Echo, SmallLimits());
  for (std::string raw : {"GARBAGE\r\n\r\n", "GET / HTTP/9.9\r\n\r\n",
                          "GET / HTTP/1.1\r\nbad header line\r\n\r\n",
                          "POST / HTTP/1.1\r\ncontent-length: abc\r\n\r\n"}) {
    TestClient c("127.0.0.1", s.port());
    ASSERT_TRUE(c.Connect());
    ASSERT_TRUE(c.SendRaw(raw));
    ClientResponse r;
    ASSERT_TRUE(c.ReadHead(&r)) << raw << ": " << c.error();
    ASSERT_TRUE(c.ReadBody(&r));
    EXPECT_EQ(r.status, 400) << raw;
    EXPECT_EQ(r.body, "{\"status\":400,\"msg\":\"Malformed HTTP request.\"}");
    EXPECT_TRUE(c.WaitForClose());
    ExpectServerStillServes(s.port());
  }
}

// Without an ErrorBodyFn the server's own answers carry the message as plain text: the
// shape of an API's errors is the front end's (serve, epp and sim pass OpenAI's).
TEST(ServerTest, WithoutAnErrorBodyTheMessageIsPlainText) {
  TestServer s([](std::shared_ptr<Exchange> ex) { ex->Respond(200, "ok"); });
  TestClient t("127.0.0.1", s.port());
  ASSERT_TRUE(t.Connect());
  ASSERT_TRUE(t.SendRaw("GET / HTTP/9.9\r\n\r\n"));
  ClientResponse r;
  ASSERT_TRUE(t.ReadHead(&r)) << t.error();
  ASSERT_TRUE(t.ReadBody(&r)) << t.error();
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.Header("content-type"), "text/plain; charset=utf-8");
  EXPECT_EQ(r.body, "Malformed HTTP request.");
}

TEST(ServerTest, IdleConnectionIsClosedAfterReadTimeout) {
  ServerOptions o;
  o.read_timeout = 100ms;
  o.keepalive_idle = 100ms;
  TestServer s(Echo, o);
  TestClient c("127.0.0.1", s.port(), 3000ms);
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRaw("GET / HTTP/1.1\r\nhost: a\r\n"));  // never finished
  EXPECT_TRUE(c.WaitForClose());
  // A kept-alive connection that goes quiet is closed as well.
  TestClient k("127.0.0.1", s.port(), 3000ms);
  ASSERT_TRUE(k.Roundtrip("GET", "/").has_value());
  EXPECT_TRUE(k.WaitForClose());
}

TEST(ServerTest, DroppedExchangeBecomes500) {
  TestServer s([](std::shared_ptr<Exchange> ex) {
    if (ex->request().target() == "/drop") return;  // forgets to answer
    Echo(ex);
  });
  auto r = Fetch("127.0.0.1", s.port(), "GET", "/drop");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 500);
  ExpectServerStillServes(s.port());
}

TEST(ServerTest, ThrowingHandlerBecomes500) {
  TestServer s([](std::shared_ptr<Exchange> ex) {
    if (ex->request().target() == "/throw") throw std::runtime_error("boom");
    Echo(ex);
  });
  auto r = Fetch("127.0.0.1", s.port(), "GET", "/throw");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 500);
  EXPECT_NE(r->body.find("boom"), std::string::npos);
  ExpectServerStillServes(s.port());
}

TEST(ServerTest, ExpectContinueGetsInterimResponse) {
  TestServer s(Echo);
  TestClient c("127.0.0.1", s.port());
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRaw(
      "POST /e HTTP/1.1\r\nhost: a\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n"));
  // The server answers "100 Continue" before reading the body; ReadHead skips it.
  ASSERT_TRUE(c.SendRaw("data"));
  ClientResponse r;
  ASSERT_TRUE(c.ReadHead(&r)) << c.error();
  ASSERT_TRUE(c.ReadBody(&r));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST /e data");
}

TEST(ServerTest, Http10StreamIsClosedInsteadOfChunked) {
  TestServer s([](std::shared_ptr<Exchange> ex) {
    ex->BeginStream(200, "text/plain");
    ex->SendChunk("abc");
    ex->SendChunk("def");
    ex->EndStream();
  });
  TestClient c("127.0.0.1", s.port());
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRaw("GET / HTTP/1.0\r\n\r\n"));
  ClientResponse r;
  ASSERT_TRUE(c.ReadHead(&r));
  EXPECT_FALSE(r.chunked);
  ASSERT_TRUE(c.ReadBody(&r));
  EXPECT_EQ(r.body, "abcdef");
}

TEST(ServerTest, ConnectionsSpreadAcrossWorkers) {
  std::mutex mu;
  std::set<int> workers;
  TestServer s(
      [&](std::shared_ptr<Exchange> ex) {
        {
          std::lock_guard<std::mutex> lock(mu);
          workers.insert(ex->worker());
        }
        Echo(ex);
      },
      ServerOptions{}, 2);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Fetch("127.0.0.1", s.port(), "GET", "/").has_value());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(workers, (std::set<int>{0, 1}));
}

// ---- hard limits ----

using kvroute::test_support::WaitFor;

// A raw loopback socket, for clients whose timing or descriptor use must be exact.
int RawConnect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything the peer sends until it closes (or `limit` passes); `first` gets the
// arrival time of the first byte.
std::string ReadUntilClose(int fd, std::chrono::milliseconds limit,
                           std::chrono::steady_clock::time_point* first = nullptr) {
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) != 1) break;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    if (out.empty() && first) *first = std::chrono::steady_clock::now();
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// The part of a raw response after its head.
std::string BodyOf(const std::string& response) {
  std::size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? std::string() : response.substr(end + 4);
}

TEST(ServerTest, ConnectionsOverTheLimitGet503AndTheFirstNAreStillServed) {
  ServerOptions o;
  o.error_body = api::ErrorBodyFor;  // a front end's OpenAI-shaped bodies
  o.max_connections = 3;
  TestServer s(Echo, o, 2);
  std::vector<std::unique_ptr<TestClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<TestClient>("127.0.0.1", s.port()));
    ASSERT_TRUE(held.back()->Roundtrip("GET", "/a").has_value()) << held.back()->error();
  }
  EXPECT_EQ(s.stats().open_connections.load(), 3);

  // The fourth is answered without sending anything, and closed.
  TestClient over("127.0.0.1", s.port());
  ASSERT_TRUE(over.Connect());
  ClientResponse r;
  ASSERT_TRUE(over.ReadHead(&r)) << over.error();
  ASSERT_TRUE(over.ReadBody(&r)) << over.error();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.Header("content-type"), "application/json");
  EXPECT_EQ(r.Header("connection"), "close");
  EXPECT_EQ(r.body, api::ErrorBodyFor(503, "Too many connections: the server's limit of 3 is "
                                          "reached; retry later."));
  EXPECT_TRUE(over.WaitForClose());

  for (auto& c : held) {
    auto again = c->Roundtrip("GET", "/b");
    ASSERT_TRUE(again.has_value()) << c->error();
    EXPECT_EQ(again->status, 200);
  }
  // One leaves: the next newcomer is served.
  held.pop_back();
  ASSERT_TRUE(WaitFor([&] { return s.stats().open_connections.load() == 2; }, 3000ms));
  TestClient next("127.0.0.1", s.port());
  auto ok = next.Roundtrip("GET", "/c");
  ASSERT_TRUE(ok.has_value()) << next.error();
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(s.stats().connections_accepted.load(), 4u);
  EXPECT_EQ(s.stats().connections_rejected.load(), 1u);
}

TEST(ServerTest, SlowSenderGets408AtTheDeadlineWhileOthersAreServed) {
  ServerOptions o;
  o.error_body = api::ErrorBodyFor;  // a front end's OpenAI-shaped bodies
  o.read_timeout = 200ms;
  TestServer s(Echo, o, 1);  // one thread: the slow client must not hold it
  int fd = RawConnect(s.port());
  ASSERT_GE(fd, 0);
  auto connected = std::chrono::steady_clock::now();
  std::atomic<bool> stop{false};
  // Drips a header one byte per 10 ms: always "making progress", never complete.
  std::thread drip([&] {
    std::string head = "GET /slow HTTP/1.1\r\nhost: a\r\nx-drip: " + std::string(1000, 'd');
    for (char ch : head) {
      if (stop.load() || ::send(fd, &ch, 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(10ms);
    }
  });
  // Meanwhile other clients are served as usual.
  std::atomic<int> served{0}, failed{0};
  std::thread normal([&] {
    TestClient c("127.0.0.1", s.port(), 1000ms);
    while (!stop.load()) {
      auto r = c.Roundtrip("POST", "/n", "x");
      (r && r->status == 200 ? served : failed)++;
      std::this_thread::sleep_for(5ms);
    }
  });
  std::chrono::steady_clock::time_point answered{};
  std::string response = ReadUntilClose(fd, 3000ms, &answered);
  stop = true;
  drip.join();
  normal.join();
  ::close(fd);

  ASSERT_EQ(response.substr(0, 13), "HTTP/1.1 408 ") << response;
  EXPECT_NE(response.find("connection: close\r\n"), std::string::npos) << response;
  EXPECT_EQ(BodyOf(response), api::ErrorBodyFor(408, "Request not received within 200 ms."));
  auto after = std::chrono::duration_cast<std::chrono::milliseconds>(answered - connected);
  EXPECT_GE(after.count(), 190);
  EXPECT_LT(after.count(), 1500);
  EXPECT_GT(served.load(), 5);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(s.stats().rejected(RejectReason::kRequestTimeout), 1u);
}

TEST(ServerTest, IdleKeepAliveIsClosedSilentlyAndARequestStartedThenHasReadTimeout) {
  ServerOptions o;
  o.read_timeout = 400ms;
  o.keepalive_idle = 150ms;
  TestServer s(Echo, o);
  {
    // Quiet after a response: closed at keepalive_idle with nothing sent.
    TestClient c("127.0.0.1", s.port(), 3000ms);
    ASSERT_TRUE(c.Roundtrip("GET", "/").has_value());
    auto t0 = std::chrono::steady_clock::now();
    ClientResponse r;
    EXPECT_FALSE(c.ReadHead(&r));
    EXPECT_EQ(r.status, 0);
    auto idle = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(idle, 140ms);
    EXPECT_LT(idle, 390ms);  // not the read timeout
    EXPECT_EQ(s.stats().idle_closed.load(), 1u);
  }
  {
    // A next request begun before keepalive_idle: the idle deadline no longer applies;
    // it gets read_timeout from its first byte, then 408.
    TestClient c("127.0.0.1", s.port(), 3000ms);
    ASSERT_TRUE(c.Roundtrip("GET", "/").has_value());
    std::this_thread::sleep_for(100ms);
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(c.SendRaw("GET /late HTTP/1.1\r\n"));
    ClientResponse r;
    ASSERT_TRUE(c.ReadHead(&r)) << c.error();
    auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(r.status, 408);
    EXPECT_GE(waited, 390ms);
    EXPECT_TRUE(c.WaitForClose());
  }
  EXPECT_EQ(s.stats().rejected(RejectReason::kRequestTimeout), 1u);
}

TEST(ServerTest, LimitResponsesAreOpenAiShapedAndCloseTheConnection) {
  ServerOptions o;
  o.error_body = api::ErrorBodyFor;  // a front end's OpenAI-shaped bodies
  o.max_body_bytes = 1000;
  o.max_header_bytes = 2000;
  o.max_header_count = 20;  // default error body
  TestServer s(Echo, o);
  std::string many;
  for (int i = 0; i < 25; ++i) many += "x-h" + std::to_string(i) + ": v\r\n";
  struct Case {
    std::string raw;
    int status;
    std::string message;
    RejectReason reason;
  };
  const Case cases[] = {
      {"GET / HTTP/1.1\r\nhost: a\r\nx-big: " + std::string(3000, 'h') + "\r\n\r\n", 431,
       "Request header fields too large.", RejectReason::kHeaderTooLarge},
      {"GET / HTTP/1.1\r\nhost: a\r\n" + many + "\r\n", 431, "Too many request header fields.",
       RejectReason::kTooManyHeaders},
      {"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1001\r\n\r\n", 413,
       "Request body exceeds the limit of 1000 bytes.", RejectReason::kBodyTooLarge},
      {"GET / HTTP/9.9\r\n\r\n", 400, "Malformed HTTP request.", RejectReason::kBadRequest},
  };
  for (const Case& c : cases) {
    TestClient t("127.0.0.1", s.port());
    ASSERT_TRUE(t.Connect());
    ASSERT_TRUE(t.SendRaw(c.raw));
    ClientResponse r;
    ASSERT_TRUE(t.ReadHead(&r)) << c.message << ": " << t.error();
    ASSERT_TRUE(t.ReadBody(&r)) << c.message << ": " << t.error();
    EXPECT_EQ(r.status, c.status);
    EXPECT_EQ(r.Header("content-type"), "application/json");
    EXPECT_EQ(r.Header("connection"), "close");
    EXPECT_EQ(r.body, api::ErrorBodyFor(c.status, c.message));
    EXPECT_NE(r.body.find("\"code\":" + std::to_string(c.status) + "}}"), std::string::npos);
    EXPECT_TRUE(t.WaitForClose()) << c.message;
    EXPECT_EQ(s.stats().rejected(c.reason), 1u) << c.message;
  }
  ExpectServerStillServes(s.port());
  EXPECT_TRUE(WaitFor([&] { return s.stats().open_connections.load() == 0; }, 3000ms));
}

TEST(ServerTest, AcceptBacksOffWhileOutOfDescriptorsAndRecovers) {
  std::mutex mu;
  std::vector<std::string> logs;
  ServerOptions o;
  o.log = [&](std::string_view line) {
    std::lock_guard<std::mutex> lock(mu);
    logs.emplace_back(line);
  };
  TestServer s(Echo, o);
  // Fill this process's descriptor table (under a lowered soft limit), leave one slot
  // for the client: the server's accept then has none.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 512);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> fillers;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
  ASSERT_FALSE(fillers.empty());
  ::close(fillers.back());
  fillers.pop_back();
  int client = RawConnect(s.port());  // the handshake completes in the kernel's backlog
  bool starved = client >= 0 && WaitFor([&] { return s.stats().accept_errors.load() >= 1; }, 2000ms);
  std::this_thread::sleep_for(300ms);
  uint64_t errors = s.stats().accept_errors.load();
  for (int fd : fillers) ::close(fd);
  ::setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_GE(client, 0);
  ASSERT_TRUE(starved);
  EXPECT_LT(errors, 20u);  // ~one try per 50 ms back-off, not a spin

  std::string req = "GET /late HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n";
  ASSERT_EQ(::send(client, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string response = ReadUntilClose(client, 3000ms);
  ::close(client);
  EXPECT_EQ(response.substr(0, 13), "HTTP/1.1 200 ") << response;
  ExpectServerStillServes(s.port());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(logs.size(), 2u);  // once per burst, and once when it ends
  EXPECT_NE(logs[0].find("accept failed"), std::string::npos) << logs[0];
  EXPECT_NE(logs[1].find("accepting connections again"), std::string::npos) << logs[1];
}

}  // namespace
}  // namespace kvroute::http
