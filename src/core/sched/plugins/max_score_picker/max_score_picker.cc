#include "core/sched/plugins/max_score_picker/max_score_picker.h"

namespace kvroute::sched {

namespace {

void RankByTotals(const PickContext& ctx, std::span<const uint32_t> candidates,
                  std::span<const double> totals, size_t max_ranked,
                  std::vector<uint32_t>& ranked) {
  RankByMaxScore(totals, max_ranked, *ctx.rng, ctx.scratch->u32_b, ctx.scratch->u64, ranked);
}

}  // namespace

std::unique_ptr<Picker> MakeMaxScorePicker() {
  return std::make_unique<FunctionPicker<&RankByTotals>>();
}

PluginFactory MaxScorePickerFactory() { return FunctionPickerFactory<&RankByTotals>(); }

}  // namespace kvroute::sched
