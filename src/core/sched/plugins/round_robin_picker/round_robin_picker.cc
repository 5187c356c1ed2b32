#include "core/sched/plugins/round_robin_picker/round_robin_picker.h"

namespace kvroute::sched {

void RoundRobinPicker::Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
                            std::span<const double> totals, size_t max_ranked,
                            std::vector<uint32_t>& ranked) {
  const size_t n = candidates.size();
  const size_t k = (max_ranked == 0 || max_ranked > n) ? n : max_ranked;
  const size_t start = static_cast<size_t>(next_.fetch_add(1, std::memory_order_relaxed) % n);
  ranked.clear();
  for (size_t i = 0; i < k; ++i) ranked.push_back(static_cast<uint32_t>((start + i) % n));
}

PluginFactory RoundRobinPickerFactory() {
  return {PluginKind::kPicker, {}, [](const PluginParams&) {
            return std::unique_ptr<Plugin>(new RoundRobinPicker());
          }};
}

}  // namespace kvroute::sched
