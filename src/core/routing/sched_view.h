// The routing core's view of the pool as its scheduler sees it, lent to the components that
// decide part of a pick under the scheduler's lock (PdCoordinator, SessionAffinity): the
// scheduler, the table, and by endpoint id its state, its health verdict and whether the id
// is vacant. Spans into the core's state: valid only while the caller holds that lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/health/endpoint_health.h"
#include "core/routing/endpoint_table.h"
#include "core/sched/scheduler.h"

namespace kvroute::routing {

struct SchedView {
  const sched::Scheduler* scheduler = nullptr;  // null before the first Configure
  const EndpointTable* table = nullptr;         // null before the first Configure
  std::span<const sched::EndpointState> states;  // by id; vacant ids unhealthy
  std::span<const health::Verdict> verdicts;     // by id, as last applied
  std::span<const uint8_t> vacant;               // by id
  std::size_t max_ranked = 0;                    // CoreOptions::max_ranked, clamped
};

}  // namespace kvroute::routing
