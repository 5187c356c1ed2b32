#include "core/sched/plugins/random_picker/random_picker.h"

#include <utility>

namespace kvroute::sched {

namespace {

void RankUniformly(const PickContext& ctx, std::span<const uint32_t> candidates,
                   std::span<const double> totals, size_t max_ranked,
                   std::vector<uint32_t>& ranked) {
  std::vector<uint32_t>& idx = ctx.scratch->u32_b;
  idx.resize(candidates.size());
  for (uint32_t i = 0; i < idx.size(); ++i) idx[i] = i;
  const size_t k = RankCount(max_ranked, idx.size());
  for (size_t i = 0; i < k; ++i) {
    const size_t j = i + ctx.rng->Below(idx.size() - i);
    std::swap(idx[i], idx[j]);
  }
  ranked.assign(idx.begin(), idx.begin() + k);
}

}  // namespace

PluginFactory RandomPickerFactory() { return FunctionPickerFactory<&RankUniformly>(); }

}  // namespace kvroute::sched
