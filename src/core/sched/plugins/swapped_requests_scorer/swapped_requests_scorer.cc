#include "core/sched/plugins/swapped_requests_scorer/swapped_requests_scorer.h"

#include <memory>

namespace kvroute::sched {

void SwappedRequestsScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                                  std::span<double> out) {
  using F = metrics::EngineMetrics;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const F& m = ctx.endpoints[candidates[i]].engine;
    out[i] = m.Has(F::kSwapped) ? 1.0 / (1.0 + m.swapped) : 0.5;
  }
}

PluginFactory SwappedRequestsScorerFactory() {
  return FactoryWithoutParams<SwappedRequestsScorer>(PluginKind::kScorer);
}

}  // namespace kvroute::sched
