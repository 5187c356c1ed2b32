// max-score-picker: the default picker (registry.h).
#pragma once

#include <memory>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// Ranks by total score, best first, ties broken uniformly at random (RankByMaxScore,
// plugin.h). A profile without a picker gets one (MakeMaxScorePicker).
std::unique_ptr<Picker> MakeMaxScorePicker();

// No parameters.
PluginFactory MaxScorePickerFactory();

}  // namespace kvroute::sched
