// Loopback tests of the HTTP server: limits, keep-alive, pipelining, streaming and
// disconnect detection. Every wait is bounded (TestClient timeouts, future wait_for).
#include "http/server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <future>
#include <mutex>
#include <set>

#include "http/io_pool.h"
#include "http/test_client.h"

namespace kvroute::http {
namespace {

using namespace std::chrono_literals;

// A server on port 0 with its own pool. Members are destroyed server first, then the
// pool (the acceptor must die before its io_context).
class TestServer {
 public:
  TestServer(Handler handler, ServerOptions options = {}, int threads = 1) : pool_(threads) {
    server_ = std::make_unique<Server>(pool_.contexts(), std::move(options), std::move(handler));
    error_ = server_->Listen();
    pool_.Start();
  }
  ~TestServer() {
    server_->StopAccepting();
    pool_.Stop();
    server_.reset();
  }
  uint16_t port() const { return server_->port(); }
  const std::string& error() const { return error_; }
  IoPool& pool() { return pool_; }

 private:
  IoPool pool_;
  std::unique_ptr<Server> server_;
  std::string error_;
};

// Answers 200 with "<method> <target> <body>".
void Echo(std::shared_ptr<Exchange> ex) {
  const Request& r = ex->request();
  std::string body = std::string(r.method_string()) + " " + std::string(r.target()) + " " + r.body();
  ex->Respond(200, std::move(body), "text/plain");
}

TEST(ServerTest, BindsPortZeroAndAnswers) {
  TestServer s(Echo);
  ASSERT_EQ(s.error(), "");
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

TEST(ServerTest, DefaultErrorBodyIsOpenAiShaped) {
  EXPECT_EQ(DefaultErrorBody(413, "too \"big\""),
            "{\"error\":{\"message\":\"too \\\"big\\\"\",\"type\":\"RequestEntityTooLarge\","
            "\"param\":null,\"code\":413}}");
}

TEST(ServerTest, IdleConnectionIsClosedAfterReadTimeout) {
  ServerOptions o;
  o.read_timeout = 100ms;
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

}  // namespace
}  // namespace kvroute::http
