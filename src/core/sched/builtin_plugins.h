// The built-in filters, scorers and pickers (see registry.h for names and parameters and
// docs/POLICIES.md for formulas). Candidates are positions into PickContext::endpoints.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/prefix_model.h"

namespace kvroute::sched {

// Prefix affinity (GIE prefix-cache-scorer): longest matched prefix blocks / total blocks
// (0 when the prompt is shorter than one block), by the approximate model of what this
// router sent where. With `precise` (precise-prefix-cache-scorer, and the kvroute policy),
// an endpoint whose KV-cache events are live is scored instead by what it reports it
// caches: its tier-weighted leading blocks of the request's token-id keys / their number
// (kvevents::EventIndex::Match); endpoints without live events keep the approximate score.
class PrefixCacheScorer : public Scorer {
 public:
  struct Params {
    size_t block_chars = 64;
    size_t max_blocks = 256;
    size_t lru_capacity = 0;  // 0: auto from the endpoint's KV size, else kDefaultCapacity
    // Score endpoints whose KV-cache events are live by what they report they cache
    // (SchedRequest::events), the others by the approximate model. Off: approximate only
    // (the Gateway API Inference Extension's scorer, as gie-default models it).
    bool precise = false;
  };
  static constexpr size_t kDefaultCapacity = 31250;
  explicit PrefixCacheScorer(const Params& p) : p_(p), model_(MakeApproxPrefixModel()) {}


  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
  // Records the chain under the endpoint; returns the characters of its leading blocks
  // that were already recorded there.
  int64_t OnDispatched(const PendingRequest& req, const EndpointState& endpoint,
                       double now_s) override;
  void OnEndpointRemoved(uint32_t endpoint_id) override { model_->RemoveEndpoint(endpoint_id); }
  // An endpoint's reported cache change, keyed by this scorer's chains.
  void OnCacheUpdate(uint32_t endpoint_id, const CacheUpdate& update, double now_s) override {
    model_->Apply(endpoint_id, update, now_s);
  }
  // Takes the previous scorer's index when it hashed the same way (block_chars and
  // max_blocks equal); a new LRU capacity applies from the next dispatch.
  void AdoptStateFrom(Plugin& previous) override;

  // LRU capacity (in blocks of block_chars) used for `e`.
  size_t CapacityFor(const EndpointState& e) const;
  const PrefixModel& prefix_model() const { return *model_; }
  const Params& params() const { return p_; }

 private:
  // The approximate model's scores of `hashes` (the prompt's character chain).
  void ApproxScores(const PickContext& ctx, std::span<const uint32_t> candidates,
                    std::span<const uint64_t> hashes, std::span<double> out) const;

  Params p_;
  std::unique_ptr<PrefixModel> model_;
};

// 1 - kv usage.
class KvUtilizationScorer : public Scorer {
 public:
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
};

// Which load field a MinMaxScorer reads.
enum class LoadField { kWaiting, kRunning, kInflight };

// (max - x) / (max - min) over the candidates; 1 for all when max == min.
// queue-depth-scorer/queue-scorer (waiting), running-requests-scorer, least-request-scorer.
class MinMaxScorer : public Scorer {
 public:
  explicit MinMaxScorer(LoadField f) : field_(f) {}
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;

 private:
  LoadField field_;
};

// Load balance that acts before saturation without letting one request of difference
// swamp the other scorers. A candidate's load is x = max(router in-flight count,
// waiting + running) (the router's own count is current; the scrape also sees other
// clients' requests). Score = 1 - (x - min) / (max - min + min_spread + relative_spread *
// mean), over the candidates: the least loaded scores 1, and a gap of d requests costs
// d / (d + spread) of the weight, so small differences cost little and large ones
// almost all of it. (min-max alone charges the full weight for a single request.)
class SoftLoadScorer : public Scorer {
 public:
  struct Params {
    double min_spread = 4.0;
    double relative_spread = 0.0;
  };
  explicit SoftLoadScorer(const Params& p) : p_(p) {}
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
  static double LoadOf(const EndpointLoad& l);

 private:
  Params p_;
};

// Traffic over the last several seconds, not only at this instant: an exponentially
// decayed count of the requests dispatched to each endpoint (halving every half_life_s).
// Score = 1 - (c - min) / (max - min + min_spread) over the candidates.
// Why: prefix affinity keeps a prompt group on the replica it first went to, and a group
// seen for the first time matches nowhere. Between bursts a replica that already serves
// five groups looks as idle as one serving one (vLLM's KV usage leaves out the cached
// blocks of finished requests, and nothing is in flight), so the random tie-break kept
// handing new groups to it; later several of its groups' long answers ran at once, filled
// its KV, and requests queued there for seconds (kvroute demo: TTFT p99 2.5 s, issue 12).
// The decayed count remembers which replica the recent traffic went to, so new groups go
// to the least-used one; it is small against a real prefix match.
class RecentLoadScorer : public Scorer {
 public:
  struct Params {
    double half_life_s = 10.0;
    double min_spread = 2.0;
  };
  explicit RecentLoadScorer(const Params& p) : p_(p) {}
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
  int64_t OnDispatched(const PendingRequest& req, const EndpointState& endpoint,
                       double now_s) override;
  void OnEndpointRemoved(uint32_t endpoint_id) override;
  void AdoptStateFrom(Plugin& previous) override;
  // Endpoint `id`'s decayed count at `now_s` (0 for one never dispatched to).
  double CountAt(uint32_t id, double now_s) const;

 private:
  struct Count {
    double value = 0.0;
    double at_s = 0.0;
  };
  Params p_;
  std::vector<Count> counts_;  // by endpoint id
};

// LoRA adapter affinity (llm-d's lora-affinity-scorer; issue 26): for a request naming an
// adapter (AdapterRequestKey, lora.h), 1.0 where the adapter has running requests, else 0.8
// where the engine has room to load it (running + waiting adapters < max_lora), else 0.6
// where it has waiting requests, else 0 (LoraAffinity). An endpoint whose LoRA state is
// unknown (not reported, invalid, or scraped more than stale_after_s ago) scores 0. A
// base-model request, or any request in a fleet that reports no LoRA state, scores 0
// everywhere: the totals, and so the picks, are exactly those without this scorer.
class LoraAffinityScorer : public Scorer {
 public:
  struct Params {
    double stale_after_s = 2.0;  // pool.staleness' default
  };
  explicit LoraAffinityScorer(const Params& p) : p_(p) {}
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;

 private:
  Params p_;
};

// For a request naming a LoRA adapter (AdapterRequestKey): keeps the endpoints where it can
// be batched without waiting for another adapter's requests to finish: the adapter runs or
// waits there, or the engine has room to load it (LoraAffinity > 0; unknown LoRA state
// counts as neither). When no candidate qualifies it keeps them all (load decides), and a
// base-model request is never filtered. A scorer alone lets load outweigh "no room", and a
// request sent where max_loras is reached waits behind requests that may run for minutes.
class LoraAffinityFilter : public Filter {
 public:
  explicit LoraAffinityFilter(const LoraAffinityScorer::Params& p) : p_(p) {}
  void Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) override;

 private:
  LoraAffinityScorer::Params p_;
};

// 0.5 * (1 - waiting / threshold), 0 at or above the threshold.
class LoadAwareScorer : public Scorer {
 public:
  explicit LoadAwareScorer(double threshold) : threshold_(threshold) {}
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;

 private:
  double threshold_;
};

// Drops saturated endpoints (kv > kvThreshold, waiting > queueThreshold, or metrics not
// fresh) unless every candidate is saturated, in which case it keeps them all.
class SaturationFilter : public Filter {
 public:
  struct Params {
    double kv_threshold = 0.8;
    double queue_threshold = 5;
    double stale_after_s = 0.2;
  };
  explicit SaturationFilter(const Params& p) : p_(p) {}
  void Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) override;
  bool Saturated(const PickContext& ctx, uint32_t pos) const;

 private:
  Params p_;
};

// Marker: its presence turns on in-flight adjustment of the loads every plugin reads.
class InflightAccounting : public Plugin {};

class MaxScorePicker : public Picker {
 public:
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override;
};

// Samples without replacement with probability proportional to the total score; uniform
// among the rest when their totals are all 0.
class WeightedRandomPicker : public Picker {
 public:
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override;
};

// Uniform random order, scores ignored.
class RandomPicker : public Picker {
 public:
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override;
};

// Cycles through the candidates: the n-th pick starts at candidate n mod count and
// continues in order. Scores ignored.
class RoundRobinPicker : public Picker {
 public:
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override;

 private:
  std::atomic<uint64_t> next_{0};
};

// Picks by predicted latency against the request's objectives (issue 24; docs/POLICIES.md
// "Picking by predicted latency"). The latency model (SchedRequest::latency) predicts, for
// each candidate, TTFT from the prompt tokens not cached there (by the profile's prefix
// scorer) and the queue ahead of it, and optionally TPOT. The picker keeps the weighted
// blend's choice unless that endpoint is predicted to miss the objective and another is
// predicted to meet it with room (at most fit_fraction of it, and holding as much of the
// prompt within max_cached_loss); then the endpoints with room come first, each group by
// the blend. With no model, no objective, or no prediction
// for the blend's choice, it ranks as max-score-picker does: a cold start picks exactly as
// the blend, and an endpoint without a prediction is never chosen for it.
//
// Why so conservative (measured in docs/BENCHMARKS.md, issue 24): moving a request off
// its prefix holder costs the fleet the prefill of its cached tokens, and the model errs
// most (MAPE 70% in bursts) where the move would matter; ranking every predicted fit
// first and every miss by its predicted violation, as first built, lost up to 12% goodput
// against the blend; moves to colder replicas won 8% on one burst and lost 31% on
// another; and TPOT predictions (MAPE 50-100% in overload) moved requests off prefix-warm
// replicas for nothing.
class SloHeadroomPicker : public Picker {
 public:
  struct Params {
    // Another endpoint is taken over the blend's choice only when its prediction is at
    // most this fraction of the objective (room for the model's error).
    double fit_fraction = 0.25;
    // Judge the TPOT objective too (off: TTFT only; the TPOT model is not good enough).
    bool use_tpot = false;
    // An endpoint with room must hold at least the blend choice's cached share of the
    // prompt minus this (0..1): by default, no colder replica (a move to one makes the
    // fleet prefill the prompt again; measured, docs/BENCHMARKS.md).
    double max_cached_loss = 0.0;
  };
  SloHeadroomPicker() = default;
  explicit SloHeadroomPicker(const Params& p) : p_(p) {}
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override;
  const Params& params() const { return p_; }

 private:
  Params p_;
};

}  // namespace kvroute::sched
