// UpstreamClient against an in-process http::Server on loopback: streaming pieces arrive
// one by one, keep-alive reuse, and each error kind.
#include "adapters/http/client.h"

#include <gtest/gtest.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <future>
#include <mutex>
#include <thread>

#include "adapters/http/io_pool.h"
#include "support/stub_server.h"

namespace kvroute::http {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using kvroute::test_support::ClosedPort;
using kvroute::test_support::LoopbackServer;

struct Outcome {
  int head_status = 0;
  std::vector<std::string> pieces;
  std::vector<std::chrono::steady_clock::time_point> piece_times;
  UpstreamResult result;
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_pool_.Start();
    server_ =
        std::make_unique<LoopbackServer>([this](std::shared_ptr<Exchange> ex) { Handle(ex); });
    ASSERT_EQ(server_->listen_status().ToString(), "OK");
    client_ = std::make_unique<UpstreamClient>(client_pool_.context(0));
  }
  void TearDown() override {
    OnClient([this] { client_.reset(); });
    server_->StopAccepting();
    asio::post(server_->context(), [this] { held_.clear(); });
    client_pool_.Stop();
    server_->Stop();
  }

  void Handle(std::shared_ptr<Exchange> ex) {
    std::string target(ex->request().target());
    if (target == "/full") {
      ex->Respond(200, "hello", "text/plain");
    } else if (target == "/stream") {
      ex->BeginStream(200);
      ex->SendChunk("data: 1\n\n");
      auto timer = std::make_shared<asio::steady_timer>(ex->executor(), 150ms);
      timer->async_wait([ex, timer](auto) {
        ex->SendChunk("data: 2\n\n");
        ex->EndStream();
      });
    } else if (target == "/stuck") {
      held_.push_back(ex);  // never answers
    } else if (target == "/stall") {
      ex->BeginStream(200);
      ex->SendChunk("x");
      held_.push_back(ex);
    } else if (target == "/reset") {
      ex->BeginStream(200);
      ex->SendChunk("x");
      // Dropping a started stream makes the server close the connection.
    } else if (target == "/echo") {
      ex->Respond(200, ex->request().body(), "text/plain");
    } else if (target == "/watch") {
      ex->BeginStream(200);
      ex->SendChunk("x");
      ex->OnClientGone([this] { client_gone_.set_value(); });
      held_.push_back(ex);
    } else {
      ex->RespondError(404, "no");
    }
  }

  template <typename F>
  void OnClient(F f) {
    std::promise<void> p;
    asio::post(client_pool_.context(0), [&] {
      f();
      p.set_value();
    });
    ASSERT_EQ(p.get_future().wait_for(5s), std::future_status::ready);
  }

  Outcome Run(uint16_t port, std::string_view target, UpstreamRequest req = {},
              bool cancel_after_first_piece = false) {
    auto out = std::make_shared<Outcome>();
    auto done = std::make_shared<std::promise<void>>();
    std::string tgt(target);
    asio::post(client_pool_.context(0), [&, out, done, tgt, req]() mutable {
      req.target = tgt;
      auto call = std::make_shared<UpstreamCall>();
      UpstreamCallbacks cb;
      cb.on_head = [out](const ResponseHead& h) { out->head_status = h.status; };
      cb.on_data = [out, call, cancel_after_first_piece](std::string_view d) {
        out->pieces.emplace_back(d);
        out->piece_times.push_back(std::chrono::steady_clock::now());
        if (cancel_after_first_piece) call->Cancel();
      };
      cb.on_done = [out, done](UpstreamResult&& r) {
        out->result = std::move(r);
        done->set_value();
      };
      *call = client_->Start("127.0.0.1", port, req, std::move(cb));
    });
    EXPECT_EQ(done->get_future().wait_for(10s), std::future_status::ready);
    return *out;
  }

  IoPool client_pool_{1};
  std::unique_ptr<LoopbackServer> server_;
  std::unique_ptr<UpstreamClient> client_;
  std::vector<std::shared_ptr<Exchange>> held_;
  std::promise<void> client_gone_;
};

TEST_F(ClientTest, CompleteResponseAndReuse) {
  Outcome a = Run(server_->port(), "/full");
  ASSERT_TRUE(a.result.ok()) << a.result.message;
  EXPECT_EQ(a.head_status, 200);
  EXPECT_EQ(a.result.status, 200);
  EXPECT_FALSE(a.result.reused_connection);
  std::string body;
  for (auto& p : a.pieces) body += p;
  EXPECT_EQ(body, "hello");
  Outcome b = Run(server_->port(), "/full");
  ASSERT_TRUE(b.result.ok());
  EXPECT_TRUE(b.result.reused_connection);
  OnClient([this] {
    EXPECT_EQ(client_->stats().connections_opened, 1u);
    EXPECT_EQ(client_->stats().connections_reused, 1u);
    EXPECT_EQ(client_->idle_connections(), 1u);
  });
}

TEST_F(ClientTest, PostBodyIsSent) {
  UpstreamRequest req;
  req.method = boost::beast::http::verb::post;
  std::string body(100000, 'z');
  body[5] = 'a';
  req.body = body;
  Outcome a = Run(server_->port(), "/echo", req);
  ASSERT_TRUE(a.result.ok()) << a.result.message;
  std::string got;
  for (auto& p : a.pieces) got += p;
  EXPECT_EQ(got, body);
}

TEST_F(ClientTest, StreamedPiecesArriveSeparately) {
  Outcome a = Run(server_->port(), "/stream");
  ASSERT_TRUE(a.result.ok()) << a.result.message;
  ASSERT_EQ(a.pieces.size(), 2u);
  EXPECT_EQ(a.pieces[0], "data: 1\n\n");
  EXPECT_EQ(a.pieces[1], "data: 2\n\n");
  EXPECT_EQ(a.result.body_bytes, 18u);
}

TEST_F(ClientTest, ConnectRefused) {
  Outcome a = Run(ClosedPort(), "/full");
  EXPECT_EQ(a.result.error, UpstreamError::kConnectRefused);
  EXPECT_FALSE(a.result.head_received);
  EXPECT_TRUE(IsConnectError(a.result.error));
}

TEST_F(ClientTest, FirstByteTimeout) {
  UpstreamRequest req;
  req.first_byte_timeout = 100ms;
  Outcome a = Run(server_->port(), "/stuck", req);
  EXPECT_EQ(a.result.error, UpstreamError::kFirstByteTimeout);
  EXPECT_FALSE(a.result.head_received);
}

TEST_F(ClientTest, IdleTimeoutBetweenPieces) {
  UpstreamRequest req;
  req.idle_timeout = 100ms;
  Outcome a = Run(server_->port(), "/stall", req);
  EXPECT_EQ(a.result.error, UpstreamError::kIdleTimeout);
  EXPECT_TRUE(a.result.head_received);
  ASSERT_EQ(a.pieces.size(), 1u);
  EXPECT_EQ(a.pieces[0], "x");
}

TEST_F(ClientTest, ResetMidStream) {
  Outcome a = Run(server_->port(), "/reset");
  EXPECT_EQ(a.result.error, UpstreamError::kReset);
  EXPECT_TRUE(a.result.head_received);
  OnClient([this] { EXPECT_EQ(client_->idle_connections(), 0u); });
}

TEST_F(ClientTest, CancelClosesTheUpstreamConnection) {
  Outcome a = Run(server_->port(), "/watch", {}, /*cancel_after_first_piece=*/true);
  EXPECT_EQ(a.result.error, UpstreamError::kCancelled);
  EXPECT_EQ(client_gone_.get_future().wait_for(5s), std::future_status::ready);
  OnClient([this] { EXPECT_EQ(client_->idle_connections(), 0u); });
}

TEST_F(ClientTest, PooledConnectionClosedByPeerIsNotReused) {
  ServerOptions o;
  o.keepalive_idle = 100ms;  // closes idle keep-alive connections quickly
  LoopbackServer quick([this](std::shared_ptr<Exchange> ex) { Handle(ex); }, o);
  ASSERT_EQ(quick.listen_status().ToString(), "OK");
  ASSERT_TRUE(Run(quick.port(), "/full").result.ok());
  std::this_thread::sleep_for(400ms);  // the server closes the pooled connection meanwhile
  Outcome b = Run(quick.port(), "/full");
  ASSERT_TRUE(b.result.ok()) << b.result.message;
  EXPECT_FALSE(b.result.reused_connection);
  // Idle for less than the peek threshold: taken from the pool unchecked, found dead on
  // the first read, and the request re-sent once on a fresh connection.
  OnClient([this] {
    EXPECT_EQ(client_->stats().connections_opened, 2u);
    EXPECT_EQ(client_->stats().stale_retries, 1u);
  });
  quick.StopAccepting();
}

}  // namespace
}  // namespace kvroute::http
