// tpot-guard-filter (issue 43; registry.h for parameters, docs/POLICIES.md "Slow
// replicas and the TPOT guard").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// tpot-guard-filter's parameters.
struct TpotGuardParams {
  // An endpoint is failing the objective when its recent measured TPOT is above this
  // fraction of the request's TPOT objective.
  double fraction = 0.9;
  // Measurements older than this (no request finished there since) are unknown.
  double max_age_s = 2.0;
  // Fewer finished requests than this: unknown.
  size_t min_samples = 4;
};

// Drops the endpoints whose requests lately decoded slower than the request's TPOT
// objective allows (LatencyTrainer::RecentTpot: measured, not predicted), unless every
// candidate is failing it, in which case it keeps them all. A replica that decodes
// slowly (throttled, older hardware, a noisy neighbour) then gets requests only while
// its batch is small enough to meet the objective: its finishing requests bring its
// TPOT down, and it is a candidate again. An endpoint with no recent measurement is
// unknown and kept: only evidence of misses removes one (an endpoint that was removed and
// finished everything is unknown again after maxAgeSeconds, and tried again).
// Does nothing for a request without a TPOT objective or without the latency model.
// Reads nothing from EndpointState::engine.
class TpotGuardFilter : public Configured<Filter, TpotGuardParams> {
 public:
  using Configured::Configured;
  void Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) override;
  // Whether candidate `pos` is failing the request's TPOT objective (see above).
  bool Failing(const PickContext& ctx, uint32_t pos) const;
};

// Parameters fraction (0.9), maxAgeSeconds (2) and minSamples (4).
PluginFactory TpotGuardFilterFactory();

}  // namespace kvroute::sched
