#include "core/sched/plugins/round_robin_picker/round_robin_picker.h"

#include <atomic>

namespace kvroute::sched {

namespace {

class RoundRobinPicker final : public Picker {
 public:
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override {
    const size_t n = candidates.size();
    const size_t k = RankCount(max_ranked, n);
    const size_t start = static_cast<size_t>(next_.fetch_add(1, std::memory_order_relaxed) % n);
    ranked.clear();
    for (size_t i = 0; i < k; ++i) ranked.push_back(static_cast<uint32_t>((start + i) % n));
  }

 private:
  std::atomic<uint64_t> next_{0};
};

}  // namespace

PluginFactory RoundRobinPickerFactory() {
  return FactoryWithoutParams<RoundRobinPicker>(PluginKind::kPicker);
}

}  // namespace kvroute::sched
