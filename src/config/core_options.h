// The routing core's options from a router configuration: what `kvroute serve` and
// `kvroute epp` configure their RoutingCore with, and what `kvroute simulate` runs its
// core with (a default RouterConfig, so virtual time sees the defaults users run).
#pragma once

#include "config/router_config.h"
#include "core/routing/routing_core.h"

namespace kvroute::config {

// Scheduling, staleness and stale policy, outlier ejection, retry budget, locality.
routing::CoreOptions CoreOptionsFrom(const RouterConfig& config);

}  // namespace kvroute::config
