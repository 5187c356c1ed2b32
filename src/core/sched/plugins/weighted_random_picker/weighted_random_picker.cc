#include "core/sched/plugins/weighted_random_picker/weighted_random_picker.h"

#include <utility>

namespace kvroute::sched {

namespace {

void RankByWeight(const PickContext& ctx, std::span<const uint32_t> candidates,
                  std::span<const double> totals, size_t max_ranked,
                  std::vector<uint32_t>& ranked) {
  const size_t n = totals.size();
  const size_t k = RankCount(max_ranked, n);
  std::vector<double>& w_ = ctx.scratch->f64;
  std::vector<uint32_t>& idx_ = ctx.scratch->u32_b;
  w_.assign(totals.begin(), totals.end());
  idx_.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    idx_[i] = i;
    if (!(w_[i] > 0)) w_[i] = 0;  // negative and NaN weigh nothing
  }
  ranked.clear();
  size_t remaining = n;
  while (ranked.size() < k) {
    double sum = 0;
    for (size_t j = 0; j < remaining; ++j) sum += w_[j];
    size_t chosen;
    if (sum > 0) {
      double r = ctx.rng->Uniform() * sum;
      chosen = remaining - 1;
      for (size_t j = 0; j < remaining; ++j) {
        if (w_[j] <= 0) continue;
        if (r < w_[j]) {
          chosen = j;
          break;
        }
        r -= w_[j];
      }
      // Rounding may leave r just past the last positive weight: take that one.
      while (w_[chosen] <= 0 && chosen > 0) --chosen;
    } else {
      chosen = ctx.rng->Below(remaining);
    }
    ranked.push_back(idx_[chosen]);
    --remaining;
    std::swap(idx_[chosen], idx_[remaining]);
    std::swap(w_[chosen], w_[remaining]);
  }
}

}  // namespace

PluginFactory WeightedRandomPickerFactory() { return FunctionPickerFactory<&RankByWeight>(); }

}  // namespace kvroute::sched
