// Trains the latency model (latency_model.h) from the lifecycle of the requests a front end
// routes, and measures how well it predicts (issue 24). Driven by the routing core under
// its exclusive lock, with the handles the scheduler issued:
//   OnDispatched  the request was sent: its features at that moment, and the predictions
//                 for it (kept to score them against what comes back)
//   OnFirstToken  TTFT = now - dispatch: a TTFT sample (and its prediction error)
//   OnTokens      generated tokens so far, as the stream shows them
//   OnFinished    TPOT = (now - first token) / (generated - 1): a TPOT sample, when the
//                 request produced at least two tokens and the front end reported them
// The clock starts at dispatch, so time a request waits in the router is not in TTFT.
// It also keeps, per endpoint, the uncached prompt tokens sent there that have no first
// token yet (the prefill queued ahead of the next request: a TTFT feature).
//
// Pure logic, no clock, no allocation once the request slots and endpoints have been seen.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/sched/latency_model.h"
#include "core/sched/types.h"

namespace kvroute::sched {

class LatencyTrainer {
 public:
  // What the router knows at dispatch. Unknown values are NaN (then nothing is learned
  // from the request, and nothing is predicted for it).
  struct Dispatch {
    uint32_t endpoint = 0;
    double prompt_tokens = 0.0;
    double uncached_tokens = 0.0;  // by the policy's prefix model
    double waiting = 0.0;
    double running = 0.0;
    double kv_usage = 0.0;
    double capacity_tokens = 0.0;  // the endpoint's KV cache (blocks x block size); 0 unknown
    double slo_ttft_s = 0.0;       // the request's objectives; <= 0: none
    double slo_tpot_s = 0.0;
    double queued_s = 0.0;         // already waited in the router's queue (SchedRequest)
    // The answer streams (SchedRequest::streaming): first token and cadence observable.
    // Otherwise the first byte is the whole answer: no TTFT or TPOT sample, no SLO count.
    bool streaming = true;
    // Prefill/decode pair (issue 25): the prompt is prefilled on another endpoint and
    // pulled, so this endpoint computes none of it (uncached_tokens 0). Its TTFT spans both
    // legs: counted against the objective, not learned as this endpoint's (nor scored);
    // its TPOT is this endpoint's and learned.
    bool remote_prefill = false;
  };
  // Requests with an objective whose observation came back, and those that missed it.
  struct SloCounts {
    uint64_t observed = 0;
    uint64_t violated = 0;
  };
  // Prediction error counters since the trainer was built (each prediction scored when its
  // observation arrives).
  struct Errors {
    uint64_t n = 0;
    double abs_s = 0.0;     // sum of |predicted - observed|, seconds
    double abs_rel = 0.0;   // sum of |predicted - observed| / observed
    double Mape() const { return n > 0 ? abs_rel / static_cast<double>(n) : 0.0; }
  };

  explicit LatencyTrainer(LatencyModel::Options options = {}) : model_(options) {}

  void OnDispatched(RequestHandle handle, const Dispatch& d, double now_s);
  void OnFirstToken(RequestHandle handle, double now_s);
  void OnTokens(RequestHandle handle, int64_t generated_tokens, double now_s);
  // `generated_tokens` when the front end knows the final count (-1: use OnTokens's).
  void OnFinished(RequestHandle handle, int64_t generated_tokens, double now_s);
  // The endpoint left the pool or restarted: its model and its queue start again.
  void ForgetEndpoint(uint32_t endpoint);

  // Prefill legs (P/D, issue 25), kept apart from the requests (a request and its leg
  // share a handle). The leg of `handle` was sent to d.endpoint: it is queued there as a
  // request is, until OnPrefillAnswered. Its answer (one token, not streamed) arriving is a
  // TTFT sample of that endpoint; no objective is counted for it (the pair's TTFT is).
  void OnPrefillSent(RequestHandle handle, const Dispatch& d, double now_s);
  // The leg of `handle` on `endpoint` ended: answered (`ok`: learned) or not. Ignored when
  // that endpoint is not where the leg was sent (a leg moved elsewhere is not learned).
  void OnPrefillAnswered(RequestHandle handle, uint32_t endpoint, bool ok, double now_s);

  // The features the model would see for a request sent now with `d`, and its predictions.
  TtftFeatures TtftFeaturesOf(const Dispatch& d) const;
  TpotFeatures TpotFeaturesOf(const Dispatch& d) const;
  std::optional<double> PredictTtft(const Dispatch& d) const {
    return model_.PredictTtft(d.endpoint, TtftFeaturesOf(d));
  }
  std::optional<double> PredictTpot(const Dispatch& d) const {
    return model_.PredictTpot(d.endpoint, TpotFeaturesOf(d));
  }

  // Uncached prompt tokens dispatched to `endpoint` and not yet at their first token.
  double QueuedPrefill(uint32_t endpoint) const {
    return endpoint < queue_.size() ? queue_[endpoint].prefill_tokens : 0.0;
  }
  // Requests dispatched to `endpoint` and not yet at their first token (all of them,
  // whatever is known of their prompts).
  uint32_t QueuedRequests(uint32_t endpoint) const {
    return endpoint < queue_.size() ? queue_[endpoint].requests : 0;
  }
  // How much slower than the fleet `endpoint` decodes (issue 43): its observed TPOT over
  // what the fleet-wide fit predicts for the same features, smoothed (EWMA, 1/8), over the
  // same figure of the fastest quarter of endpoints; at least 1. 1 until it and the fleet
  // have kMinSlownessSamples samples (unknown is not slow: nothing is pushed off it), and 1
  // below kSlownessFloor. A
  // replica throttled to a third of its speed reads about 3, so a load counted with it
  // puts about a third of the traffic there.
  double Slowness(uint32_t endpoint) const {
    if (endpoint >= slowness_.size() || slow_ref_ <= 0) return 1.0;
    const Slow& sl = slowness_[endpoint];
    if (sl.n < kMinSlownessSamples) return 1.0;
    const double r = sl.ewma / slow_ref_;
    return r >= kSlownessFloor ? r : 1.0;
  }
  static constexpr uint32_t kMinSlownessSamples = 8;
  // The TPOT `endpoint`'s requests measured lately (EWMA, 1/4, of the streamed requests
  // that finished there with at least two tokens), when at least `min_samples` finished
  // there and the last of them at most `max_age_s` before `now_s`; otherwise unknown
  // (nullopt). What the tpot-guard-filter reads (issue 43).
  std::optional<double> RecentTpot(uint32_t endpoint, double now_s, double max_age_s,
                                   uint32_t min_samples) const {
    if (endpoint >= recent_tpot_.size()) return std::nullopt;
    const Recent& r = recent_tpot_[endpoint];
    if (r.n < min_samples || r.n == 0 || !(now_s - r.last_s <= max_age_s)) return std::nullopt;
    return r.ewma;
  }
  // Below this ratio an endpoint counts as not slow: the fit's own error between busy and
  // idle replicas of equal speed reaches it.
  static constexpr double kSlownessFloor = 1.4;
  const LatencyModel& model() const { return model_; }
  const Errors& ttft_errors() const { return ttft_errors_; }
  const Errors& tpot_errors() const { return tpot_errors_; }
  uint64_t ttft_samples() const { return ttft_samples_; }
  uint64_t tpot_samples() const { return tpot_samples_; }
  const SloCounts& ttft_slo() const { return ttft_slo_; }
  const SloCounts& tpot_slo() const { return tpot_slo_; }

  // What the router knows of a request sent to endpoint `e`, with `cached_fraction` of its
  // prompt (0..1) cached there by the policy's prefix model. Engine signals come from e's
  // last good scrape; one it did not report is NaN (unknown). The objectives are the
  // request's (the routing core has already put the pool default in).
  static Dispatch DispatchOf(const SchedRequest& req, const EndpointState& e,
                             double cached_fraction);

 private:
  struct Record {
    RequestHandle handle = kNoHandle;  // kNoHandle: slot free
    uint32_t endpoint = 0;
    bool known = false;     // features known: learn from it
    bool in_queue = false;  // counted in queue_[endpoint], with its uncached tokens
    double uncached = 0.0;  // 0 when unknown (then it adds no prefill)
    double dispatch_s = 0.0;
    double first_token_s = -1.0;
    int64_t generated = 0;
    TtftFeatures ttft;
    TpotFeatures tpot;
    double predicted_ttft = -1.0;
    double predicted_tpot = -1.0;
    double slo_ttft_s = 0.0;
    double slo_tpot_s = 0.0;
    double queued_s = 0.0;  // counted against the TTFT objective, not learned
    bool streaming = true;
    bool learn_ttft = true;  // false: Dispatch::remote_prefill
  };
  Record* Find(RequestHandle handle);
  // Fills `r` for a request or leg sent now with `d` (slot and handle already checked).
  void Arm(Record& r, RequestHandle handle, const Dispatch& d, double now_s);
  void Dequeue(Record& r);
  static void Score(Errors& e, double predicted, double observed);

  LatencyModel model_;
  std::vector<Record> records_;  // by the handle's slot (its low 32 bits)
  std::vector<Record> legs_;     // prefill legs, likewise
  // What an endpoint has been sent that has no first token yet.
  struct Queue {
    double prefill_tokens = 0.0;  // their uncached prompt tokens (where known)
    uint32_t requests = 0;
  };
  std::vector<Queue> queue_;     // by endpoint id
  Queue& QueueOf(uint32_t endpoint);
  // Observed TPOT over the fleet fit's prediction, per endpoint (Slowness).
  struct Slow {
    double ewma = 0.0;
    uint32_t n = 0;
  };
  std::vector<Slow> slowness_;  // by endpoint id
  // Measured TPOT per endpoint (RecentTpot).
  struct Recent {
    double ewma = 0.0;
    double last_s = 0.0;
    uint32_t n = 0;
  };
  std::vector<Recent> recent_tpot_;  // by endpoint id
  std::vector<double> slow_scratch_;
  double slow_ref_ = 0.0;  // the fastest quarter's ratio (its 25th percentile)
  void ObserveSlowness(uint32_t endpoint, double ratio);
  Errors ttft_errors_, tpot_errors_;
  uint64_t ttft_samples_ = 0, tpot_samples_ = 0;
  SloCounts ttft_slo_, tpot_slo_;
};

}  // namespace kvroute::sched
