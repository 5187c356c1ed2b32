#include "core/sched/plugins/recent_load_scorer/recent_load_scorer.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvroute::sched {

double RecentLoadScorer::CountAt(uint32_t id, double now_s) const {
  if (id >= counts_.size()) return 0.0;
  const Count& c = counts_[id];
  const double age = std::max(0.0, now_s - c.at_s);
  return p_.half_life_s > 0 ? c.value * std::exp2(-age / p_.half_life_s) : 0.0;
}

void RecentLoadScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                             std::span<double> out) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  for (uint32_t pos : candidates) {
    const double v = CountAt(ctx.endpoints[pos].id, ctx.now_s);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const double denom = hi - lo + p_.min_spread;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double d = CountAt(ctx.endpoints[candidates[i]].id, ctx.now_s) - lo;
    out[i] = denom > 0 ? 1.0 - d / denom : 1.0;
  }
}

int64_t RecentLoadScorer::OnDispatched(const PendingRequest&, const EndpointState& endpoint,
                                       double now_s) {
  if (endpoint.id >= counts_.size()) counts_.resize(endpoint.id + 1);
  counts_[endpoint.id] = {CountAt(endpoint.id, now_s) + 1.0, now_s};
  return -1;
}

void RecentLoadScorer::OnEndpointRemoved(uint32_t endpoint_id) {
  if (endpoint_id < counts_.size()) counts_[endpoint_id] = {};
}

void RecentLoadScorer::AdoptStateFrom(Plugin& previous) {
  // Same type() as this one (the scheduler matched them), so the same class.
  counts_ = std::move(static_cast<RecentLoadScorer&>(previous).counts_);
}

PluginFactory RecentLoadScorerFactory() {
  using P = RecentLoadScorer::Params;
  return ParamsFactory<RecentLoadScorer>(
      PluginKind::kScorer, {{{"halfLifeSeconds", 0, kParamUnbounded, false}, &P::half_life_s},
                            {{"minSpread", 0, kParamUnbounded, false}, &P::min_spread}});
}

}  // namespace kvroute::sched
