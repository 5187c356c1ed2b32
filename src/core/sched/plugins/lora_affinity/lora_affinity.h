// The LoRA adapter affinity plugins (issue 26): lora-affinity-scorer and
// lora-affinity-filter. One folder: they share their parameter (staleAfterSeconds) and the
// rule they apply (core/sched/lora.h: AdapterRequestKey, LoraKnown, LoraAffinity).
// Both consume metrics::EngineMetrics::kLora from EndpointState::engine: the adapter lists,
// max_lora and the base model's key.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// The parameter of both LoRA plugins.
struct LoraAffinityParams {
  double stale_after_s = 2.0;  // pool.staleness' default
};

// LoRA adapter affinity (llm-d's lora-affinity-scorer): for a request naming an adapter
// (AdapterRequestKey, lora.h), 1.0 where the adapter has running requests, else 0.8
// where the engine has room to load it (running + waiting adapters < max_lora), else 0.6
// where it has waiting requests, else 0 (LoraAffinity). An endpoint whose LoRA state is
// unknown (not reported, invalid, or scraped more than stale_after_s ago) scores 0. A
// base-model request, or any request in a fleet that reports no LoRA state, scores 0
// everywhere: the totals, and so the picks, are exactly those without this scorer.
class LoraAffinityScorer : public Configured<Scorer, LoraAffinityParams> {
 public:
  using Configured::Configured;
  uint32_t consumed_fields() const override { return metrics::EngineMetrics::kLora; }
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
};

// For a request naming a LoRA adapter (AdapterRequestKey): keeps the endpoints where it can
// be batched without waiting for another adapter's requests to finish: the adapter runs or
// waits there, or the engine has room to load it (LoraAffinity > 0; unknown LoRA state
// counts as neither). When no candidate qualifies it keeps them all (load decides), and a
// base-model request is never filtered. A scorer alone lets load outweigh "no room", and a
// request sent where max_loras is reached waits behind requests that may run for minutes.
class LoraAffinityFilter : public Configured<Filter, LoraAffinityParams> {
 public:
  using Configured::Configured;
  uint32_t consumed_fields() const override { return metrics::EngineMetrics::kLora; }
  void Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) override;
};

// Parameter staleAfterSeconds (2), for either.
PluginFactory LoraAffinityScorerFactory();
PluginFactory LoraAffinityFilterFactory();

}  // namespace kvroute::sched
