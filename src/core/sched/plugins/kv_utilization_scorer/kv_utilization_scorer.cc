#include "core/sched/plugins/kv_utilization_scorer/kv_utilization_scorer.h"

#include <algorithm>

namespace kvroute::sched {

void KvUtilizationScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                                std::span<double> out) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    out[i] = std::clamp(1.0 - ctx.loads[candidates[i]].kv_usage, 0.0, 1.0);
  }
}

PluginFactory KvUtilizationScorerFactory() {
  return FactoryWithoutParams<KvUtilizationScorer>(PluginKind::kScorer);
}

}  // namespace kvroute::sched
