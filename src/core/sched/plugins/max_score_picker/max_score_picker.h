// max-score-picker: the default picker (registry.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// Ranks by total score, best first, ties broken uniformly at random (RankByMaxScore,
// plugin.h). A profile without a picker gets one.
class MaxScorePicker : public Picker {
 public:
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override;
};

// No parameters.
PluginFactory MaxScorePickerFactory();

}  // namespace kvroute::sched
