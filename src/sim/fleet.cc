#include "sim/fleet.h"

#include <boost/asio/post.hpp>
#include <future>
#include <thread>

#include "core/api/openai.h"

namespace kvroute::sim {

namespace {

int ThreadCount(int requested, std::size_t replicas) {
  if (requested > 0) return requested;
  int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, std::min(hw, static_cast<int>(replicas)));
}

// Server-level errors (413, 431, 400 on malformed HTTP) in vLLM's error shape.
std::string VllmErrorBody(int status, std::string_view message) {
  api::ApiError e = api::MakeError(status, std::string(message));
  if (status == 431) e.type = "RequestHeaderFieldsTooLarge";  // missing from the api table
  return api::ErrorBody(e);
}

}  // namespace

Fleet::Fleet(std::vector<ReplicaConfig> replicas, int threads)
    : configs_(std::move(replicas)), pool_(ThreadCount(threads, configs_.size())) {
  for (std::size_t i = 0; i < configs_.size(); ++i) {
    auto& ctx = pool_.context(static_cast<int>(i % pool_.size()));
    replicas_.push_back(std::make_unique<Replica>(ctx, configs_[i], static_cast<int>(i)));
    http::ServerOptions opts;
    opts.host = configs_[i].host;
    opts.port = configs_[i].port;
    opts.max_body_bytes = configs_[i].max_body_bytes;
    opts.error_body = VllmErrorBody;
    Replica* r = replicas_.back().get();
    servers_.push_back(std::make_unique<http::Server>(
        std::vector<boost::asio::io_context*>{&ctx}, std::move(opts),
        [r](std::shared_ptr<http::Exchange> ex) { r->Handle(std::move(ex)); }));
  }
}

Fleet::~Fleet() { Stop(); }

Status Fleet::Start() {
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    if (std::string err = servers_[i]->Listen(); !err.empty()) {
      return Status::Unavailable(configs_[i].name + ": " + err);
    }
  }
  pool_.Start();
  running_ = true;
  return Status::Ok();
}

void Fleet::Stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& s : servers_) s->StopAccepting();
  pool_.Stop();
  running_ = false;
  // Loops are stopped: the replicas' state can be torn down from here.
  for (auto& r : replicas_) r->Shutdown();
  servers_.clear();
  replicas_.clear();
}

std::optional<engine::EngineStats> Fleet::Stats(int i) {
  if (!running_ || stopped_) return std::nullopt;
  auto done = std::make_shared<std::promise<engine::EngineStats>>();
  auto fut = done->get_future();
  Replica* r = replicas_[i].get();
  boost::asio::post(pool_.context(i % pool_.size()), [r, done] { done->set_value(r->Stats()); });
  if (fut.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return std::nullopt;
  return fut.get();
}

int Fleet::LiveRequests(int i) {
  if (!running_ || stopped_) return -1;
  auto done = std::make_shared<std::promise<int>>();
  auto fut = done->get_future();
  Replica* r = replicas_[i].get();
  boost::asio::post(pool_.context(i % pool_.size()),
                    [r, done] { done->set_value(r->live_requests()); });
  if (fut.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return -1;
  return fut.get();
}

}  // namespace kvroute::sim
