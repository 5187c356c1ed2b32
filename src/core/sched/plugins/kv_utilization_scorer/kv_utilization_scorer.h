// kv-cache-utilization-scorer (docs/POLICIES.md).
#pragma once

#include <cstdint>
#include <span>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// 1 - kv usage (the candidate's load view, PickContext::loads; nothing from
// EndpointState::engine). Role kKvCache.
class KvUtilizationScorer : public Scorer {
 public:
  ScorerRole role() const override { return ScorerRole::kKvCache; }
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
};

// No parameters.
PluginFactory KvUtilizationScorerFactory();

}  // namespace kvroute::sched
