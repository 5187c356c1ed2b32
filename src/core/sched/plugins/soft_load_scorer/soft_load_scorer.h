// soft-load-scorer (registry.h for parameters, docs/POLICIES.md).
#pragma once

#include <cstdint>
#include <span>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// soft-load-scorer's parameters.
struct SoftLoadParams {
  double min_spread = 4.0;
  double relative_spread = 0.0;
  // Count each candidate's load times its measured slowness (LatencyTrainer::Slowness:
  // a replica decoding three times slower than the fleet's fastest carries each request
  // as three), so a slow replica gets the share of traffic it can serve (issue 43).
  bool speed_aware = false;
  // Count the router's in-flight requests by their estimated work (EndpointLoad::
  // active_blocks: uncached prompt plus expected output), in units of the candidates'
  // mean request, so a replica holding three long prompts weighs more than one holding
  // three short ones (issue 43). Without blocks in flight: by count, as otherwise.
  bool token_aware = false;
};

// Load balance that acts before saturation without letting one request of difference
// swamp the other scorers. A candidate's load is x = max(router in-flight count,
// waiting + running) (the router's own count is current; the scrape also sees other
// clients' requests). Score = 1 - (x - min) / (max - min + min_spread + relative_spread *
// mean), over the candidates: the least loaded scores 1, and a gap of d requests costs
// d / (d + spread) of the weight, so small differences cost little and large ones
// almost all of it. (min-max alone charges the full weight for a single request.)
// Role kLoad; reads the load view (PickContext::loads), nothing from EndpointState::engine.
class SoftLoadScorer : public Configured<Scorer, SoftLoadParams> {
 public:
  using Configured::Configured;
  ScorerRole role() const override { return ScorerRole::kLoad; }
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
  static double LoadOf(const EndpointLoad& l);
};

// Parameters minSpread (4), relativeSpread (0), speedAware (0) and tokenAware (0).
PluginFactory SoftLoadScorerFactory();

}  // namespace kvroute::sched
