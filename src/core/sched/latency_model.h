// The latency model behind SLO-aware picking (issue 24): predicted time to first token and
// time per output token of a request on an endpoint, learned online from what the front
// ends observe.
//
// One linear model per endpoint and per quantity, fitted by recursive least squares with
// exponential forgetting, so that a replica that slows down (drift) is followed after a
// few dozen of its own samples, and one fleet-wide model of each, fed by every sample,
// that predicts for endpoints with too few samples of their own.
//
//   TTFT ~ w . [1, uncached prompt tokens, prefill tokens queued ahead, requests queued
//                ahead, running, KV usage]
// TTFT has two fits per endpoint (and in the fleet), chosen by the engine's queue at
// dispatch: one for requests that start at once (the engine reported no waiting request),
// one for requests that queue (it reported one or more):
//   queued TTFT ~ w . [1, requests queued ahead, uncached prompt tokens]
// A queued request's TTFT is seconds where the other's is milliseconds, and it follows
// another law: the wait for the requests ahead of it to get a batch slot, about linear in
// their number (overload-many-5x: 22 ms a request ahead, from 1 to 555 of them). One fit
// over both regimes crowds the rare one out. A regime without min_samples samples (own or
// fleet) does not predict.
//   TPOT ~ w . [1, batch it joins, resident context tokens, prefill tokens in flight,
//                KV usage]
//
// Token counts enter in thousands (so every feature is of order 1 and the fit is well
// conditioned). A prediction is never negative.
//
// Unknown is not zero: a sample or a query with a non-finite or negative feature, or a
// non-finite or negative observation, is refused (Observe returns false, Predict returns
// nullopt), and so is a query on a model with fewer than min_samples samples (the caller
// falls back to its other policy). Nothing here reads a clock; samples carry no time.
//
// Pure logic, no locks, no allocation after the endpoint's first sample: the owner
// serialises writers and may let readers run concurrently with each other.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace kvroute::sched {

struct TtftFeatures {
  double uncached_tokens = 0.0;        // this request's prompt tokens not cached there
  double queued_prefill_tokens = 0.0;  // uncached prompt tokens routed there, no first token
  double queued_requests = 0.0;        // requests routed there, no first token yet
  double slot_wait_s = 0.0;            // queued requests / recent finishes a second (NaN: unknown) yet
  double waiting = 0.0;                // requests waiting in the engine
  double running = 0.0;                // requests running in the engine
  double kv_usage = 0.0;               // 0..1
};

struct TpotFeatures {
  double batch = 0.0;                  // running requests once this one joins
  double context_tokens = 0.0;         // tokens resident in the batch (this one's included)
  double prefill_tokens_inflight = 0.0;  // prefill sharing its steps (chunked prefill)
  double kv_usage = 0.0;
};

// Recursive least squares with exponential forgetting over D features (the first is the
// constant 1).
template <size_t D>
class OnlineLinearFit {
 public:
  static constexpr size_t kDims = D;
  using Vec = std::array<double, D>;

  struct Options {
    double forgetting = 0.98;       // weight of the past per sample: memory ~ 1 / (1 - f)
    double initial_variance = 1e4;  // P = this x identity at start (a weak prior at w = 0)
    double max_trace = 1e6;         // P's trace is scaled back to this (no wind-up when idle)
  };
  OnlineLinearFit() : OnlineLinearFit(Options{}) {}
  explicit OnlineLinearFit(const Options& o) : o_(o) { Reset(); }

  // Folds in one sample. Non-finite input is ignored (returns false).
  bool Update(const Vec& x, double y);
  double Predict(const Vec& x) const {
    double s = 0.0;
    for (size_t i = 0; i < D; ++i) s += w_[i] * x[i];
    return s;
  }
  uint64_t samples() const { return samples_; }
  const Vec& weights() const { return w_; }
  void Reset();

 private:
  Options o_;
  Vec w_{};
  std::array<Vec, D> p_{};
  uint64_t samples_ = 0;
};

using TtftFit = OnlineLinearFit<6>;
// TTFT of a request that queues in the engine: [1, requests queued ahead, uncached prompt
// tokens]. Few features on purpose: queued requests, queued prefill and the engine's
// waiting count move together in a queue, and a fit over all of them extrapolates wildly
// from the first seconds of a burst (measured: 46 s predicted for 10 s observed).
using QueuedTtftFit = OnlineLinearFit<3>;
using TpotFit = OnlineLinearFit<5>;

class LatencyModel {
 public:
  struct Options {
    double forgetting = 0.98;
    uint64_t min_samples = 16;  // before this, the model does not predict
  };
  LatencyModel() : LatencyModel(Options{}) {}
  explicit LatencyModel(const Options& o);

  // What was observed for a request on `endpoint` with these features at dispatch.
  bool ObserveTtft(uint32_t endpoint, const TtftFeatures& f, double ttft_s);
  bool ObserveTpot(uint32_t endpoint, const TpotFeatures& f, double tpot_s);

  // Seconds; nullopt when a feature is unknown (non-finite or negative) or neither the
  // endpoint's model nor the fleet's has min_samples samples.
  std::optional<double> PredictTtft(uint32_t endpoint, const TtftFeatures& f) const;
  std::optional<double> PredictTpot(uint32_t endpoint, const TpotFeatures& f) const;
  // The fleet-wide fit alone (what any endpoint would give, on average, with these
  // features); nullopt as above.
  std::optional<double> PredictFleetTpot(const TpotFeatures& f) const;

  uint64_t TtftSamples(uint32_t endpoint) const;
  uint64_t TpotSamples(uint32_t endpoint) const;
  // The endpoint left the pool, or restarted: its own models start again.
  void ForgetEndpoint(uint32_t endpoint);

  // The features as the fits see them (token counts in thousands, request counts in
  // hundreds); nullopt when one is unknown.
  static std::optional<TtftFit::Vec> Encode(const TtftFeatures& f);
  static std::optional<TpotFit::Vec> Encode(const TpotFeatures& f);

 private:
  struct PerEndpoint {
    TtftFit ttft;               // the engine had no waiting request at dispatch
    QueuedTtftFit ttft_queued;  // it had
    TpotFit tpot;
  };
  static std::optional<QueuedTtftFit::Vec> EncodeQueued(const TtftFeatures& f);
  // The queued fit remembers ten times longer (~500 samples): queued answers come in fast
  // bursts, and a memory of ~50 spans too narrow a range of queue lengths to fix the slope
  // (measured on overload-many-5x: mean error 4.9 s at 0.98, 3.3 s at 0.998).
  static constexpr double kQueuedForgetting = 0.998;
  static bool Queued(const TtftFeatures& f) { return f.waiting >= 1.0; }
  static PerEndpoint Fresh(double forgetting);
  PerEndpoint& At(uint32_t endpoint);
  template <typename Fit>
  std::optional<double> Predict(const Fit* own, const Fit& fleet, const typename Fit::Vec& x) const;

  Options o_;
  std::vector<PerEndpoint> endpoints_;
  PerEndpoint fleet_;  // fed by every sample
};

}  // namespace kvroute::sched
