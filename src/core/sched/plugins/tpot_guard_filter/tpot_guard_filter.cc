#include "core/sched/plugins/tpot_guard_filter/tpot_guard_filter.h"

#include <algorithm>

#include "core/sched/latency_trainer.h"

namespace kvroute::sched {

bool TpotGuardFilter::Failing(const PickContext& ctx, uint32_t pos) const {
  const SchedRequest& req = *ctx.request;
  const std::optional<double> tpot =
      req.latency->RecentTpot(ctx.endpoints[pos].id, ctx.now_s, p_.max_age_s,
                                static_cast<uint32_t>(p_.min_samples));
  return tpot && *tpot > p_.fraction * req.slo_tpot_s;
}

void TpotGuardFilter::Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) {
  const SchedRequest& req = *ctx.request;
  if (req.latency == nullptr || !(req.slo_tpot_s > 0)) return;
  const bool any_ok = std::any_of(candidates.begin(), candidates.end(),
                                  [&](uint32_t pos) { return !Failing(ctx, pos); });
  if (!any_ok) return;  // all failing: the other plugins choose among them
  std::erase_if(candidates, [&](uint32_t pos) { return Failing(ctx, pos); });
}

PluginFactory TpotGuardFilterFactory() {
  using P = TpotGuardFilter::Params;
  return ParamsFactory<TpotGuardFilter>(
      PluginKind::kFilter, {{{"fraction", 0, kParamUnbounded, false}, &P::fraction},
                            {{"maxAgeSeconds", 0, kParamUnbounded, false}, &P::max_age_s},
                            {{"minSamples", 1, 1 << 20, true}, &P::min_samples}});
}

}  // namespace kvroute::sched
