// saturation-filter (registry.h for parameters, docs/POLICIES.md).
#pragma once

#include <cstdint>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// saturation-filter's parameters.
struct SaturationParams {
  double kv_threshold = 0.8;
  double queue_threshold = 5;
  double stale_after_s = 0.2;
};

// Drops saturated endpoints (kv > kvThreshold, waiting > queueThreshold, or metrics not
// fresh) unless every candidate is saturated, in which case it keeps them all. Reads the
// load view (PickContext::loads) and the scrape time, nothing from EndpointState::engine.
class SaturationFilter : public Configured<Filter, SaturationParams> {
 public:
  using Configured::Configured;
  void Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) override;
  bool Saturated(const PickContext& ctx, uint32_t pos) const;
};

// Parameters kvThreshold (0.8), queueThreshold (5) and staleAfterSeconds (0.2).
PluginFactory SaturationFilterFactory();

}  // namespace kvroute::sched
