// weighted-random-picker (registry.h).
#pragma once

#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// Samples without replacement with probability proportional to the total score; uniform
// among the rest when their totals are all 0. No parameters.
PluginFactory WeightedRandomPickerFactory();

}  // namespace kvroute::sched
