// The demo's first act, in virtual time: the seed article's "we went from 2 replicas to
// 8" under round-robin and under kvroute, with `kvroute simulate`'s simulator (the same
// engine and scheduler code the live fleet and router run), at a load that reaches each
// fleet's capacity.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "config/scenario_config.h"
#include "simkit/report/scaling.h"

namespace kvroute::demo {

struct ScalingOptions {
  std::vector<int> fleet_sizes = {2, 4, 8};
  std::vector<std::string> policies = {"round-robin", "kvroute"};
  // Offered load per replica: the rate scales with the fleet, as traffic does when a queue
  // backing up is what made someone add replicas. 5 req/s per replica is above what
  // round-robin serves on seed-8x (about 1.5 per replica under a 2 s TTFT p99) and above
  // kvroute's (about 3.4): every run is at its capacity, so its output tokens/s measure
  // what the fleet can do, not what was asked of it. (TTFT then measures the queue that
  // builds while arrivals outpace the fleet: tens of seconds at the p99 for both.)
  double rate_per_replica = 5.0;
  // Requests per replica: the same virtual duration (about 100 s of arrivals) at every
  // fleet size. Long enough that the steady window (after a warm-up quarter) is past the
  // first long answers; at 250 the 2-replica runs still ramped up inside it and their
  // throughput read 10-20% low.
  int64_t requests_per_replica = 500;
};

// Runs `scenario` (a flat fleet) once per (policy, fleet size), policy-major, fleet sizes
// ascending as given: fleet.replicas = N, one constant-rate stage of
// rate_per_replica x N, requests_per_replica x N requests. Output tokens/s is the steady
// state (simulate::MeasureSteadyThroughput: finishing inside the arrival window after a
// warm-up quarter), TTFT over every succeeded request. Sets `*error` (and returns what
// ran) when the scenario has fleet groups or a policy cannot be built. `progress` (may be
// empty) gets a line per run.
std::vector<report::ScalingPoint> RunScaling(const config::Scenario& scenario,
                                             const ScalingOptions& options, std::string* error,
                                             const std::function<void(const std::string&)>& progress);

}  // namespace kvroute::demo
