#include "support/stub_server.h"

#include <gtest/gtest.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <utility>

namespace kvroute::test_support {

namespace asio = boost::asio;

std::string LoopbackAddress(uint16_t port) {
  return std::string(kLoopbackHost) + ":" + std::to_string(port);
}

uint16_t ClosedPort() {
  asio::io_context ctx;
  asio::ip::tcp::acceptor acceptor(ctx, {asio::ip::make_address(kLoopbackHost), 0});
  const uint16_t port = acceptor.local_endpoint().port();
  acceptor.close();
  return port;
}

SilentListener::SilentListener(int backlog)
    : acceptor_(ctx_, {asio::ip::make_address(kLoopbackHost), 0}) {
  acceptor_.listen(backlog);
  port_ = acceptor_.local_endpoint().port();
}

LoopbackServer::LoopbackServer(http::Handler handler, http::ServerOptions options, int threads)
    : pool_(threads) {
  pool_.Start();
  server_ =
      std::make_unique<http::Server>(pool_.contexts(), std::move(options), std::move(handler));
  listen_status_ = server_->Listen();
}

LoopbackServer::~LoopbackServer() { Stop(); }

void LoopbackServer::Stop() {
  server_->StopAccepting();
  pool_.Stop();
}

StubUpstream::StubUpstream(Mode mode, std::string metrics, std::string metrics_type)
    : mode_(mode), metrics_type_(std::move(metrics_type)), metrics_(std::move(metrics)) {
  server_ = std::make_unique<LoopbackServer>(
      [this](std::shared_ptr<http::Exchange> ex) { Handle(std::move(ex)); });
  EXPECT_EQ(server_->listen_status().ToString(), "OK");
}

StubUpstream::~StubUpstream() {
  server_->Stop();
  held_.clear();  // the threads are joined; the exchanges go while their contexts exist
}

void StubUpstream::ServeMetrics(int status, std::string body, std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  metrics_status_ = status;
  metrics_ = std::move(body);
  metrics_delay_ = delay;
}

void StubUpstream::Handle(std::shared_ptr<http::Exchange> ex) {
  if (ex->request().target() == "/metrics") {
    HandleMetrics(std::move(ex));
    return;
  }
  switch (mode_) {
    case Mode::kOk:
      ex->Respond(200, "{\"stub\":true}");
      return;
    case Mode::kNeverAnswer:
      held_.push_back(std::move(ex));
      return;
    case Mode::kDieMidStream:
      ex->BeginStream(200);
      ex->SendChunk("data: {\"choices\":[{\"text\":\"par");
      return;  // dropping a started stream closes the connection
    case Mode::kFlood:
      ex->BeginStream(200);
      Flood(std::move(ex), 0);
      return;
    case Mode::kFail503:
      ex->Respond(503, "{\"error\":{\"message\":\"engine is restarting\",\"type\":"
                       "\"ServiceUnavailableError\",\"param\":null,\"code\":503}}");
      return;
  }
}

void StubUpstream::HandleMetrics(std::shared_ptr<http::Exchange> ex) {
  ++metrics_requests_;
  int status;
  std::string body;
  std::chrono::milliseconds delay;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status = metrics_status_;
    body = metrics_;
    delay = metrics_delay_;
  }
  if (delay.count() == 0) {
    ex->Respond(status, std::move(body), metrics_type_);
    return;
  }
  auto timer = std::make_shared<asio::steady_timer>(ex->executor(), delay);
  timer->async_wait([timer, ex, status, body = std::move(body),
                     type = metrics_type_](boost::system::error_code) mutable {
    ex->Respond(status, std::move(body), type);
  });
}

void StubUpstream::Flood(std::shared_ptr<http::Exchange> ex, std::size_t i) {
  if (i == kFloodChunks) {
    ex->EndStream();
    return;
  }
  std::string chunk(kFloodChunk, static_cast<char>('a' + i % 26));
  ex->SendChunk(std::move(chunk), [this, ex, i](bool ok) {
    if (!ok) return;
    flushed_ += kFloodChunk;
    // Posted: a write that completes at once calls back inline.
    asio::post(ex->executor(), [this, ex, i] { Flood(ex, i + 1); });
  });
}

}  // namespace kvroute::test_support
