#include "core/sched/plugins/load_aware_scorer/load_aware_scorer.h"

#include <algorithm>

namespace kvroute::sched {

void LoadAwareScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                            std::span<double> out) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double q = ctx.loads[candidates[i]].waiting;
    out[i] = q >= threshold_ ? 0.0 : std::clamp(0.5 * (1.0 - q / threshold_), 0.0, 1.0);
  }
}

PluginFactory LoadAwareScorerFactory() {
  return {PluginKind::kScorer,
          {{"queueThreshold", 1e-9, kParamUnbounded, false}},
          [](const PluginParams& p) -> std::unique_ptr<Plugin> {
            return std::make_unique<LoadAwareScorer>(p.Get("queueThreshold", 128));
          }};
}

}  // namespace kvroute::sched
