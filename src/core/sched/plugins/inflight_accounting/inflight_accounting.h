// inflight-accounting (registry.h).
#pragma once

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// Marker: its presence turns on in-flight adjustment of the loads every plugin reads
// (declared in the spec, referenced by the profile or not).
class InflightAccounting : public Plugin {};

// No parameters; kind kMarker.
PluginFactory InflightAccountingFactory();

}  // namespace kvroute::sched
