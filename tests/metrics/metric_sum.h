// Test helper: the sum of every sample named `name` in a Prometheus exposition whose
// labels include all of `want` (e.g. a router's /metrics). Header-only, for the loopback
// test suites that read /metrics.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "core/metrics/prom_parser.h"

namespace kvroute::metrics::testing {

inline double MetricSum(const std::string& text, std::string_view name,
                        const std::map<std::string, std::string>& want = {}) {
  double sum = 0;
  for (const OwnedSample& s : ParseAllSamples(text)) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : want) {
      bool found = false;
      for (const auto& [lk, lv] : s.labels) found = found || (lk == k && lv == v);
      match = match && found;
    }
    if (match) sum += s.value;
  }
  return sum;
}

}  // namespace kvroute::metrics::testing
