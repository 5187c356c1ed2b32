// `kvroute doctor` inside the demo: its collector (apps/doctor/collect.h) against a live
// fleet's replicas for a window, then its pure diagnosis (apps/doctor/diagnosis), as the command
// runs them. Kept apart from demo.cc so the demo's other parts do not depend on how the
// doctor gathers its scrapes.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/demo/demo.h"

namespace kvroute::demo {

struct DoctorTarget {
  std::string name;  // shown in the diagnosis ("replica-3")
  std::string host;
  uint16_t port = 0;
};

// Scrapes every target each `interval_s` for `window_s` (less if `*stop` becomes true;
// may be null), then diagnoses with the doctor's default rules. Blocking, on the calling
// thread. Never throws: unreachable replicas are findings in the result.
Diagnosis DiagnoseFleet(const std::string& policy, const std::vector<DoctorTarget>& targets,
                        double window_s, double interval_s, const std::atomic<bool>* stop);

}  // namespace kvroute::demo
