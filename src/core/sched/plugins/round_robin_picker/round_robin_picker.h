// round-robin-picker (registry.h).
#pragma once

#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// Cycles through the candidates: the n-th pick starts at candidate n mod count and
// continues in order. Scores ignored. No parameters.
PluginFactory RoundRobinPickerFactory();

}  // namespace kvroute::sched
