// round-robin-picker (registry.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// Cycles through the candidates: the n-th pick starts at candidate n mod count and
// continues in order. Scores ignored.
class RoundRobinPicker : public Picker {
 public:
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override;

 private:
  std::atomic<uint64_t> next_{0};
};

// No parameters.
PluginFactory RoundRobinPickerFactory();

}  // namespace kvroute::sched
