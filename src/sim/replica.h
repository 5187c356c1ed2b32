// One simulated vLLM replica: an Engine driven in (scaled) real time by Asio timers, and
// the OpenAI-compatible HTTP API and /metrics in front of it.
//
// Event-driven: no thread per request. While the engine has work, the replica runs
// Step(now) -> duration d -> timer of d * time_scale wall seconds -> delivers that step's
// outputs (one SSE chunk per step per streaming request) -> next step. An idle engine
// has no timer armed; a new request starts the loop again.
//
// Thread: everything (Handle, timers, metrics) runs on the io_context given to the
// constructor; the replica takes no locks.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/engine/engine.h"
#include "http/server.h"
#include "config/fleet_config.h"

namespace kvroute::sim {

// The sim reads its replicas from config/fleet_config.h; the name is the sim's too.
using config::ReplicaConfig;

// A Prometheus histogram with fixed upper bounds (per-bucket counts, last = overflow).
struct Histogram {
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}
  void Observe(double v);
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  double sum = 0.0;
  uint64_t count = 0;
};

// vLLM's bucket bounds (REFERENCE.md section 1).
const std::vector<double>& TtftBuckets();
const std::vector<double>& InterTokenBuckets();
const std::vector<double>& RequestLatencyBuckets();

class Replica {
 public:
  // `index` tags response ids. The config must be valid (ValidateReplica).
  Replica(boost::asio::io_context& ctx, ReplicaConfig config, int index);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // The HTTP handler for this replica's server.
  void Handle(std::shared_ptr<http::Exchange> ex);

  // The /metrics exposition (vLLM's names and format).
  std::string MetricsText() const;
  engine::EngineStats Stats() const { return engine_.Stats(); }
  // Requests accepted and not yet finished (including those still in network delay).
  int live_requests() const { return static_cast<int>(live_.size()); }
  const ReplicaConfig& config() const { return config_; }

  // Stops timers and drops every in-flight exchange (their clients see the connection
  // close). Call on the replica's thread, or after its io_context stopped.
  void Shutdown();

 private:
  struct Live;
  using Clock = std::chrono::steady_clock;

  void HandleGenerate(std::shared_ptr<http::Exchange> ex, bool chat);
  void Admit(const std::shared_ptr<Live>& live);
  void OnClientGone(uint64_t id);
  void Kick();
  void RunStep();
  void Deliver();
  void Finish(Live& l, const engine::RequestOutput& o);
  double EngineNow() const;

  // JSON pieces.
  void AppendChunkHead(std::string& out, const Live& l) const;
  void AppendUsage(std::string& out, const engine::RequestOutput& o) const;
  std::string ModelsBody() const;

  boost::asio::io_context& ctx_;
  ReplicaConfig config_;
  int index_;
  engine::Engine engine_;
  std::string model_json_;  // the served model name as a JSON string literal
  boost::asio::steady_timer step_timer_;
  Clock::time_point start_;
  double last_step_end_ = 0.0;  // engine seconds
  bool stepping_ = false;       // a step is in flight (timer armed or posted)
  bool shut_down_ = false;
  engine::StepResult step_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<Live>> live_;

  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  Histogram queue_;
};

}  // namespace kvroute::sim
