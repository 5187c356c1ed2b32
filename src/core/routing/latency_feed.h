// The latency model's training feed (issue 24) as a component of the routing core: the
// trainer (sched::LatencyTrainer) fed from every dispatched request's lifecycle, kept
// across reloads (endpoint ids survive them) and reset per endpoint on removal and restart;
// the pool's default objectives; the predictions made at dispatch; and the trainer's
// counters, published for lock-free reads (RoutingCore::latency_stats, /metrics).
// RoutingCore owns one and calls it from its pick's dispatch, OnDispatched, OnFirstToken,
// OnTokens, OnFinished, OnPrefillDone, Configure and the sync (an endpoint removed or
// restarted); it lends the trainer to the scheduler's pick (Prepare) and to flow control's
// probe (SloWaitBudget).
//
// Threads: no lock of its own. The trainer and the objectives are guarded by the core's
// scheduler lock: the caller holds it exclusively for every update and at least shared for
// Prepare, trainer() and the objectives. stats() and AppendMetrics read atomics only.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>

#include "core/routing/core_counters.h"
#include "core/sched/latency_trainer.h"
#include "core/sched/types.h"

namespace kvroute::routing {

// The latency model's training and accuracy so far (RoutingCore::latency_stats).
struct LatencyStats {
  uint64_t ttft_samples = 0;
  uint64_t tpot_samples = 0;
  sched::LatencyTrainer::Errors ttft_errors;
  sched::LatencyTrainer::Errors tpot_errors;
  sched::LatencyTrainer::SloCounts ttft_slo;
  sched::LatencyTrainer::SloCounts tpot_slo;
};

class LatencyFeed {
 public:
  // A disaggregated request's prefill leg: its endpoint and the prompt tokens charged there.
  struct PrefillLeg {
    uint32_t endpoint = 0;
    double tokens = 0.0;
  };
  // The model's predictions for a dispatched request, seconds; -1: none (no samples yet, or
  // the endpoint's signals unknown).
  struct Predicted {
    double ttft_s = -1.0;
    double tpot_s = -1.0;
  };

  // The objectives of requests that state none (CoreOptions::default_slo_*; <= 0: none).
  void SetObjectives(double ttft_s, double tpot_s);
  double default_ttft_s() const { return default_ttft_s_; }
  // A request as the scheduler's pick sees it: its objectives (the pool default where it
  // states none) and the trainer to predict with.
  void Prepare(sched::SchedRequest& req) const;
  const sched::LatencyTrainer& trainer() const { return trainer_; }
  // The endpoint left the pool or restarted: its model and its queue start again.
  void ForgetEndpoint(uint32_t id) { trainer_.ForgetEndpoint(id); }

  // A pick's request was sent to `decode` (of whose prompt the policy's prefix model
  // believes `cached_share` cached there), after its prefill `leg` when disaggregated
  // (nullptr otherwise); `states`: the scheduler's, by id. Predicts its TTFT (both legs) and
  // TPOT, observed in the prediction histograms, and arms the trainer with the request (and
  // the leg) to learn from what comes back.
  Predicted OnPickDispatched(const sched::SchedRequest& req, sched::RequestHandle handle,
                             std::span<const sched::EndpointState> states, uint32_t decode,
                             double cached_share, const PrefillLeg* leg, double now_s);
  // A dispatch outside the pick (a retry on `endpoint`): the prefix model's view of it for
  // the request is not at hand, so its features are unknown (nothing learned from it).
  void OnRedispatched(sched::RequestHandle handle, uint32_t endpoint, double now_s);
  void OnFirstToken(sched::RequestHandle handle, double now_s);
  void OnTokens(sched::RequestHandle handle, int64_t generated_tokens, double now_s);
  void OnFinished(sched::RequestHandle handle, int64_t generated_tokens, double now_s);
  // The prefill leg of `handle` on `endpoint` ended (`answered`: a TTFT sample there).
  void OnPrefillAnswered(sched::RequestHandle handle, uint32_t endpoint, bool answered, double now_s);

  LatencyStats stats() const;
  // kvroute_latency_*, kvroute_slo_* and their llm-d names (llm_d_epp_request_*).
  void AppendMetrics(std::string& out) const;

 private:
  // Copies the trainer's counters to their atomics (after each of its updates).
  void Publish();

  sched::LatencyTrainer trainer_;
  double default_ttft_s_ = 0.0;
  double default_tpot_s_ = 0.0;
  // The trainer's counters as last published. Index 0: TTFT, 1: TPOT.
  std::array<std::atomic<uint64_t>, 2> samples_{}, scored_{};
  std::array<std::atomic<double>, 2> abs_s_{}, abs_rel_{};
  std::array<std::atomic<uint64_t>, 2> slo_requests_{}, slo_violations_{};
  core_detail::PredictionHistogram<14> predicted_ttft_{
      {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120}};
  core_detail::PredictionHistogram<12> predicted_tpot_{
      {0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1}};
};

}  // namespace kvroute::routing
