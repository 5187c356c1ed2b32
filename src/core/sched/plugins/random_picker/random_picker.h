// random-picker (registry.h).
#pragma once

#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// Uniform random order, scores ignored. No parameters.
PluginFactory RandomPickerFactory();

}  // namespace kvroute::sched
