#include "core/sched/plugins/lora_affinity/lora_affinity.h"

#include <algorithm>

#include "core/sched/lora.h"

namespace kvroute::sched {

void LoraAffinityScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                               std::span<double> out) {
  std::fill(out.begin(), out.end(), 0.0);
  const uint64_t adapter =
      AdapterRequestKey(ctx.request->model, ctx.endpoints, ctx.now_s, p_.stale_after_s);
  if (adapter == 0) return;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const EndpointState& e = ctx.endpoints[candidates[i]];
    if (LoraKnown(e, ctx.now_s, p_.stale_after_s)) out[i] = LoraAffinity(e.engine, adapter);
  }
}

void LoraAffinityFilter::Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) {
  const uint64_t adapter =
      AdapterRequestKey(ctx.request->model, ctx.endpoints, ctx.now_s, p_.stale_after_s);
  if (adapter == 0) return;
  auto batchable = [&](uint32_t pos) {
    const EndpointState& e = ctx.endpoints[pos];
    return LoraKnown(e, ctx.now_s, p_.stale_after_s) && LoraAffinity(e.engine, adapter) > 0.0;
  };
  if (std::none_of(candidates.begin(), candidates.end(), batchable)) return;
  std::erase_if(candidates, [&](uint32_t pos) { return !batchable(pos); });
}

namespace {
// staleAfterSeconds, the one parameter of both.
std::vector<ParamField<LoraAffinityParams>> LoraParams() {
  return {{{"staleAfterSeconds", 0, kParamUnbounded, false},
           &LoraAffinityParams::stale_after_s}};
}
}  // namespace

PluginFactory LoraAffinityScorerFactory() {
  return ParamsFactory<LoraAffinityScorer>(PluginKind::kScorer, LoraParams());
}

PluginFactory LoraAffinityFilterFactory() {
  return ParamsFactory<LoraAffinityFilter>(PluginKind::kFilter, LoraParams());
}

}  // namespace kvroute::sched
