#include "core/sched/plugins/saturation_filter/saturation_filter.h"

namespace kvroute::sched {

bool SaturationFilter::Saturated(const PickContext& ctx, uint32_t pos) const {
  const EndpointState& e = ctx.endpoints[pos];
  if (!e.MetricsFresh(ctx.now_s, p_.stale_after_s)) return true;
  const EndpointLoad& l = ctx.loads[pos];
  return l.kv_usage > p_.kv_threshold || l.waiting > p_.queue_threshold;
}

void SaturationFilter::Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) {
  bool any_ok = false;
  for (uint32_t pos : candidates) {
    if (!Saturated(ctx, pos)) {
      any_ok = true;
      break;
    }
  }
  // Dropping every endpoint would turn overload into errors; better to queue somewhere.
  if (!any_ok) return;
  std::erase_if(candidates, [&](uint32_t pos) { return Saturated(ctx, pos); });
}

PluginFactory SaturationFilterFactory() {
  using P = SaturationFilter::Params;
  return ParamsFactory<SaturationFilter>(
      PluginKind::kFilter, {{{"kvThreshold", 0, kParamUnbounded, false}, &P::kv_threshold},
                            {{"queueThreshold", 0, kParamUnbounded, false}, &P::queue_threshold},
                            {{"staleAfterSeconds", 0, kParamUnbounded, false}, &P::stale_after_s}});
}

}  // namespace kvroute::sched
