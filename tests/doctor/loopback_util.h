// Loopback helpers shared by the doctor tests: a fast simulated replica, a port nobody
// listens on, and a stub server answering every request with a fixed body.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>

#include "core/engine/engine.h"
#include "http/io_pool.h"
#include "http/server.h"
#include "sim/fleet.h"

namespace kvroute::doctor::testing_util {

namespace asio = boost::asio;

inline constexpr const char* kModel = "test/model";

inline sim::ReplicaConfig Replica(int kv_blocks = 512) {
  sim::ReplicaConfig r;
  r.name = "r";
  r.engine = *engine::PresetConfig("llama3-8b-h100");
  r.engine.model_name = kModel;
  r.engine.num_gpu_blocks = kv_blocks;
  r.engine.max_model_len = 8192;
  r.time_scale = 0.0;
  return r;
}

// A port nobody listens on.
inline uint16_t ClosedPort() {
  asio::io_context ctx;
  asio::ip::tcp::acceptor acc(ctx, {asio::ip::make_address("127.0.0.1"), 0});
  const uint16_t port = acc.local_endpoint().port();
  acc.close();
  return port;
}

// Answers every request with `body` (status 200, `content_type`).
class StubServer {
 public:
  StubServer(std::string body, std::string content_type)
      : body_(std::move(body)), type_(std::move(content_type)), pool_(1) {
    pool_.Start();
    server_ = std::make_unique<http::Server>(
        pool_.contexts(), http::ServerOptions{},
        [this](std::shared_ptr<http::Exchange> ex) { ex->Respond(200, body_, type_); });
    EXPECT_EQ(server_->Listen().ToString(), "OK");
  }
  ~StubServer() {
    server_->StopAccepting();
    pool_.Stop();
  }
  uint16_t port() const { return server_->port(); }

 private:
  std::string body_, type_;
  http::IoPool pool_;
  std::unique_ptr<http::Server> server_;
};

}  // namespace kvroute::doctor::testing_util
