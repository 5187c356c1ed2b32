#include "core/sched/plugins/max_score_picker/max_score_picker.h"

namespace kvroute::sched {

void MaxScorePicker::Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
                          std::span<const double> totals, size_t max_ranked,
                          std::vector<uint32_t>& ranked) {
  RankByMaxScore(totals, max_ranked, *ctx.rng, ctx.scratch->u32_b, ctx.scratch->u64, ranked);
}

PluginFactory MaxScorePickerFactory() {
  return {PluginKind::kPicker, {}, [](const PluginParams&) {
            return std::unique_ptr<Plugin>(new MaxScorePicker());
          }};
}

}  // namespace kvroute::sched
