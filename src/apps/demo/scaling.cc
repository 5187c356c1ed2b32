#include "apps/demo/scaling.h"

#include <fmt/format.h>

#include <chrono>

#include "apps/simulate/simulator.h"
#include "apps/simulate/sweep.h"

namespace kvroute::demo {

std::vector<report::ScalingPoint> RunScaling(const config::Scenario& scenario,
                                             const ScalingOptions& options, std::string* error,
                                             const std::function<void(const std::string&)>& progress) {
  std::vector<report::ScalingPoint> points;
  if (!scenario.fleet.groups.empty()) {
    *error = "scaling: " + scenario.name + " has fleet.groups (the scaling runs need a flat fleet)";
    return points;
  }
  for (const std::string& policy : options.policies) {
    for (int n : options.fleet_sizes) {
      config::Scenario sc = simulate::WithRate(scenario, options.rate_per_replica * n);
      sc.fleet.replicas = n;
      sc.arrivals.num_requests = options.requests_per_replica * n;
      sc.arrivals.duration_s = 0;
      // Faults name replicas of the scenario's fleet size; the scaling story has none.
      sc.faults.clear();
      const auto t0 = std::chrono::steady_clock::now();
      simulate::SimulationResult r = simulate::RunSimulation(sc, policy, -1.0);
      if (!r.error.empty()) {
        *error = "scaling: " + policy + ": " + r.error;
        return points;
      }
      const simulate::SteadyThroughput steady = simulate::MeasureSteadyThroughput(r.records);
      report::ScalingPoint p;
      p.policy = policy;
      p.replicas = n;
      p.offered_rate = options.rate_per_replica * n;
      p.requests = r.report.requests;
      p.output_tokens_per_s = steady.output_tokens_per_s;
      p.ttft_p50_s = r.report.ttft_s.p50;
      p.ttft_p99_s = r.report.ttft_s.p99;
      p.prefix_hit_rate = r.report.prefix_hit_rate;
      p.goodput_requests_per_s = r.report.goodput_requests_per_s;
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (progress) {
        progress(fmt::format("[scaling] {} on {} replicas at {:g} req/s: {:.0f} out tok/s, TTFT "
                             "p99 {:.2f} s ({:.1f} s wall)",
                             policy, n, p.offered_rate, p.output_tokens_per_s, p.ttft_p99_s, wall));
      }
      points.push_back(std::move(p));
    }
  }
  return points;
}

}  // namespace kvroute::demo
