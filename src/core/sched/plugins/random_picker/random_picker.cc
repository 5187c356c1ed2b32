#include "core/sched/plugins/random_picker/random_picker.h"

#include <utility>

namespace kvroute::sched {

void RandomPicker::Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
                        std::span<const double> totals, size_t max_ranked,
                        std::vector<uint32_t>& ranked) {
  const size_t n = candidates.size();
  const size_t k = (max_ranked == 0 || max_ranked > n) ? n : max_ranked;
  std::vector<uint32_t>& idx_ = ctx.scratch->u32_b;
  idx_.resize(n);
  for (uint32_t i = 0; i < n; ++i) idx_[i] = i;
  for (size_t i = 0; i < k; ++i) {
    const size_t j = i + ctx.rng->Below(n - i);
    std::swap(idx_[i], idx_[j]);
  }
  ranked.assign(idx_.begin(), idx_.begin() + k);
}

PluginFactory RandomPickerFactory() {
  return {PluginKind::kPicker, {}, [](const PluginParams&) {
            return std::unique_ptr<Plugin>(new RandomPicker());
          }};
}

}  // namespace kvroute::sched
