// prefix-cache-scorer and precise-prefix-cache-scorer (registry.h for parameters,
// docs/POLICIES.md for the formula).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"
#include "core/kvevents/event_index.h"
#include "core/sched/prefix_model.h"

namespace kvroute::sched {

// Prefix affinity (GIE prefix-cache-scorer): longest matched prefix blocks / total blocks
// (0 when the prompt is shorter than one block), by the approximate model of what this
// router sent where. With `precise` (precise-prefix-cache-scorer, and the kvroute policy),
// an endpoint whose KV-cache events are live is scored instead by what it reports it
// caches: its tier-weighted leading blocks of the request's token-id keys / their number
// (kvevents::EventIndex::Match); endpoints without live events keep the approximate score.
// Both are CacheView::Share (cache_view.h), read from the pick's scratch.
// Role kPrefix: its row is the request's cached share on each candidate (the profile's
// first one is the scheduler's prefix model and the pickers' PickContext::prefix_row).
// Reads nothing from EndpointState::engine (capacity from num_gpu_blocks and block_size).
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
    // The weight of a block held only by the event index's speculative entry (precise
    // only): 1 counts it as cached (kvroute, llm-d 2026); 0 sees only what the engines
    // reported (llm-d's precise scorer of 2025 kept no speculative entries).
    double speculative = 1.0;
    // llm-d's precise scorer of 2025 (inference scheduler v0.2.1): instead of the share,
    // the endpoints holding at least one leading block are scored by min-max normalised
    // held blocks among themselves (1 when they all hold as many), the others 0.
    bool min_max = false;
  };
  static constexpr size_t kDefaultCapacity = 31250;
  explicit PrefixCacheScorer(const Params& p) : p_(p), model_(MakeApproxPrefixModel()) {
    tiers_.speculative = p.speculative;
  }

  ScorerRole role() const override { return ScorerRole::kPrefix; }

  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
  // Records the chain under the endpoint; returns the characters of its leading blocks
  // that were already recorded there.
  int64_t OnDispatched(const PendingRequest& req, const EndpointState& endpoint,
                       double now_s) override;
  void OnEndpointRemoved(uint32_t endpoint_id) override { model_->RemoveEndpoint(endpoint_id); }
  // Takes the previous scorer's index when it hashed the same way (block_chars and
  // max_blocks equal); a new LRU capacity applies from the next dispatch.
  void AdoptStateFrom(Plugin& previous) override;

  // LRU capacity (in blocks of block_chars) used for `e`.
  size_t CapacityFor(const EndpointState& e) const;
  const PrefixModel& prefix_model() const { return *model_; }
  const Params& params() const { return p_; }

 private:
  Params p_;
  std::unique_ptr<PrefixModel> model_;
  kvevents::TierWeights tiers_;  // speculative from Params; the rest the index's defaults
};

// Parameters blockSize (64), maxPrefixBlocksToMatch (256), lruCapacityPerServer (auto),
// preciseEvents (`precise_default`: 0 for prefix-cache-scorer, 1 for
// precise-prefix-cache-scorer, llm-d's name), speculativeWeight (1) and minMaxNormalize
// (0; 1: the 2025 precise scorer's normalisation, Params::min_max).
PluginFactory PrefixCacheScorerFactory(bool precise_default);

}  // namespace kvroute::sched
