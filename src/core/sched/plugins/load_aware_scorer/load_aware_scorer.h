// load-aware-scorer (registry.h for parameters, docs/POLICIES.md).
#pragma once

#include <cstdint>
#include <span>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// 0.5 * (1 - waiting / threshold), 0 at or above the threshold. Waiting from the load view
// (PickContext::loads), nothing from EndpointState::engine. Role kLoad.
class LoadAwareScorer : public Scorer {
 public:
  explicit LoadAwareScorer(double threshold) : threshold_(threshold) {}
  ScorerRole role() const override { return ScorerRole::kLoad; }
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;

 private:
  double threshold_;
};

// Parameter queueThreshold (128).
PluginFactory LoadAwareScorerFactory();

}  // namespace kvroute::sched
