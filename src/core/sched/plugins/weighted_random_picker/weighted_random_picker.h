// weighted-random-picker (registry.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// Samples without replacement with probability proportional to the total score; uniform
// among the rest when their totals are all 0.
class WeightedRandomPicker : public Picker {
 public:
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override;
};

// No parameters.
PluginFactory WeightedRandomPickerFactory();

}  // namespace kvroute::sched
