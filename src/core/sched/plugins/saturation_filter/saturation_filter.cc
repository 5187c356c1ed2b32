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
  return {PluginKind::kFilter,
          {{"kvThreshold", 0, kParamUnbounded, false},
           {"queueThreshold", 0, kParamUnbounded, false},
           {"staleAfterSeconds", 0, kParamUnbounded, false}},
          [](const PluginParams& p) -> std::unique_ptr<Plugin> {
            SaturationFilter::Params q;
            q.kv_threshold = p.Get("kvThreshold", q.kv_threshold);
            q.queue_threshold = p.Get("queueThreshold", q.queue_threshold);
            q.stale_after_s = p.Get("staleAfterSeconds", q.stale_after_s);
            return std::make_unique<SaturationFilter>(q);
          }};
}

}  // namespace kvroute::sched
