#include "apps/sim/fleet.h"

#include <boost/asio/post.hpp>
#include <cstdio>
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
    const int index = static_cast<int>(i);
    auto& ctx = pool_.context(index % pool_.size());
    replicas_.push_back(std::make_unique<Replica>(ctx, configs_[i], index));
    engine_ids_.push_back(configs_[i].pd.engine_id.empty()
                              ? "kvroute-sim-" + std::to_string(i) + "-" + configs_[i].name
                              : configs_[i].pd.engine_id);
    peers_.Add({engine_ids_.back(), replicas_.back().get(), &ctx});
    replicas_.back()->SetPd(&peers_, engine_ids_.back());
    replicas_.back()->SetListenControl(
        [this, index](bool listen) { return SetListening(index, listen); });
    servers_.push_back(MakeServer(index, configs_[i].port));
  }
  ports_.assign(configs_.size(), 0);
}

std::unique_ptr<http::Server> Fleet::MakeServer(int i, uint16_t port) {
  http::ServerOptions opts;
  opts.host = configs_[i].host;
  opts.port = port;
  opts.max_body_bytes = configs_[i].max_body_bytes;
  opts.error_body = VllmErrorBody;
  Replica* r = replicas_[i].get();
  return std::make_unique<http::Server>(
      std::vector<boost::asio::io_context*>{&pool_.context(i % pool_.size())}, std::move(opts),
      [r](std::shared_ptr<http::Exchange> ex) { r->Handle(std::move(ex)); });
}

bool Fleet::SetListening(int i, bool listen) {
  auto& server = servers_[i];
  if (!listen) {
    if (server) {
      server->StopAccepting();
      retired_.push_back(std::move(server));
    }
    return true;
  }
  if (server) return true;
  auto fresh = MakeServer(i, ports_[i]);
  if (Status st = fresh->Listen(); !st.ok()) {
    std::fprintf(stderr, "kvroute sim: %s: reopening the port after downtime: %s\n",
                 configs_[i].name.c_str(), st.message().c_str());
    return false;
  }
  server = std::move(fresh);
  return true;
}

bool Fleet::RunOn(int i, std::function<void()> fn) {
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  boost::asio::post(pool_.context(i % pool_.size()), [fn = std::move(fn), done] {
    fn();
    done->set_value();
  });
  return fut.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
}

Fleet::~Fleet() { Stop(); }

Status Fleet::Start() {
  for (std::size_t i = 0; i < engine_ids_.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (engine_ids_[i] == engine_ids_[j]) {
        return Status::InvalidArgument(configs_[i].name + ": kv_engine_id '" + engine_ids_[i] +
                                       "' is also " + configs_[j].name + "'s");
      }
    }
  }
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    if (Status st = servers_[i]->Listen(); !st.ok()) {
      return Status::Unavailable(configs_[i].name + ": " + st.message());
    }
    ports_[i] = servers_[i]->port();
    replicas_[i]->SetAddress(configs_[i].host, ports_[i]);  // before the loops run
  }
  kv_endpoints_.assign(servers_.size(), "");
  kv_replay_endpoints_.assign(servers_.size(), "");
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    // Before the loops run: the replica's thread owns the publisher from then on.
    if (Status st = replicas_[i]->StartKvEvents(); !st.ok()) {
      return Status::Unavailable(configs_[i].name + ": " + st.message());
    }
    kv_endpoints_[i] = replicas_[i]->kv_events_endpoint();
    kv_replay_endpoints_[i] = replicas_[i]->kv_events_replay_endpoint();
  }
  pool_.Start();
  running_ = true;
  return Status::Ok();
}

void Fleet::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // On each replica's thread: it may be closing or reopening its port right now.
  auto stop = [this](int i) {
    replicas_[i]->StopFaults();
    if (servers_[i]) servers_[i]->StopAccepting();
  };
  if (running_) {
    for (int i = 0; i < size(); ++i) RunOn(i, [stop, i] { stop(i); });
  }
  pool_.Stop();
  for (int i = 0; i < size(); ++i) stop(i);  // loops stopped: safe from here
  running_ = false;
  // Loops are stopped: the replicas' state can be torn down from here.
  for (auto& r : replicas_) r->Shutdown();
  servers_.clear();
  retired_.clear();
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

std::optional<int> Fleet::PeekCachedTokens(int i, std::vector<uint32_t> ids) {
  if (!running_ || stopped_) return std::nullopt;
  auto done = std::make_shared<std::promise<int>>();
  auto fut = done->get_future();
  Replica* r = replicas_[i].get();
  boost::asio::post(pool_.context(i % pool_.size()), [r, done, ids = std::move(ids)] {
    done->set_value(r->PeekCachedTokens(ids));
  });
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

std::string Fleet::FaultsJson(int i) {
  if (!running_ || stopped_) return {};
  auto out = std::make_shared<std::string>();
  Replica* r = replicas_[i].get();
  if (!RunOn(i, [out, r] { *out = r->faults().ToJson(0); })) return {};
  return *out;
}

}  // namespace kvroute::sim
