#include "core/sched/plugins/soft_load_scorer/soft_load_scorer.h"

#include <algorithm>
#include <limits>

#include "core/sched/latency_trainer.h"

namespace kvroute::sched {

double SoftLoadScorer::LoadOf(const EndpointLoad& l) {
  return std::max(static_cast<double>(l.inflight), l.waiting + l.running);
}

void SoftLoadScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                           std::span<double> out) {
  const LatencyTrainer* lt = p_.speed_aware ? ctx.request->latency : nullptr;
  // tokenAware: blocks per in-flight request over the candidates (0: count requests).
  double per_request = 0.0;
  if (p_.token_aware) {
    double blocks = 0.0;
    double n = 0.0;
    for (uint32_t pos : candidates) {
      blocks += ctx.loads[pos].active_blocks;
      n += ctx.loads[pos].inflight;
    }
    if (n > 0 && blocks > 0) per_request = blocks / n;
  }
  auto load = [&](uint32_t pos) {
    const EndpointLoad& l = ctx.loads[pos];
    const double v = per_request > 0
                         ? std::max(l.active_blocks / per_request, l.waiting + l.running)
                         : LoadOf(l);
    return lt != nullptr ? v * lt->Slowness(ctx.endpoints[pos].id) : v;
  };
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  double sum = 0.0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double v = load(candidates[i]);
    out[i] = v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  const double mean = candidates.empty() ? 0.0 : sum / static_cast<double>(candidates.size());
  const double denom = hi - lo + p_.min_spread + p_.relative_spread * mean;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double d = out[i] - lo;
    // denom is 0 only when every load is equal and both spreads are 0: all score 1.
    out[i] = denom > 0 ? 1.0 - d / denom : 1.0;
  }
}

PluginFactory SoftLoadScorerFactory() {
  using P = SoftLoadScorer::Params;
  return ParamsFactory<SoftLoadScorer>(
      PluginKind::kScorer, {{{"minSpread", 0, kParamUnbounded, false}, &P::min_spread},
                            {{"relativeSpread", 0, kParamUnbounded, false}, &P::relative_spread},
                            {{"speedAware", 0, 1, true}, &P::speed_aware},
                            {{"tokenAware", 0, 1, true}, &P::token_aware}});
}

}  // namespace kvroute::sched
