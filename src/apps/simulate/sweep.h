// Rate sweeps for `kvroute simulate --rates`: the same scenario at several constant
// arrival rates, and the arithmetic that turns the results into "throughput at equal p99
// TTFT": per policy, the highest swept rate it sustains under a p99-TTFT bound and the
// throughput it delivers there. Pure: results in, numbers and text out.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "simkit/report/summary.h"
#include "config/scenario_config.h"

namespace kvroute::simulate {

// `scenario` with its arrivals replaced by one constant-rate stage of `rate` requests/s
// (same process and burstiness). The request count is kept; a scenario limited only by
// durations (stages) gets the number of requests its stages would send on average, so
// every rate of a sweep serves the same amount of work.
config::Scenario WithRate(const config::Scenario& scenario, double rate);

// Throughput in steady state, without the warm-up and the drain tail a fixed request count
// brings: output tokens (and requests) of the succeeded requests that finish inside the
// window [first send + warmup_fraction x arrival span, last send], divided by the window's
// length (arrival span = last send - first send). A request is counted when it finishes,
// all its tokens at once; over a window several times longer than one answer that is the
// rate the fleet turns out tokens while the offered load lasts. Zeros when the window is
// empty (fewer than two sends, or warmup_fraction >= 1).
struct SteadyThroughput {
  double window_s = 0.0;
  double output_tokens_per_s = 0.0;
  double requests_per_s = 0.0;
};
inline constexpr double kSteadyWarmupFraction = 0.25;
SteadyThroughput MeasureSteadyThroughput(std::span<const report::RequestRecord> records,
                                         double warmup_fraction = kSteadyWarmupFraction);

struct SweepPoint {
  double rate = 0.0;  // offered requests/s
  report::PolicyReport report;
  SteadyThroughput steady;  // from the run's records (zeros when not measured)
};

// One policy's runs, in ascending rate order.
struct PolicySweep {
  std::string policy;
  std::vector<SweepPoint> points;
};

// Whether a run meets the bound: every request succeeded and TTFT p99 <= bound.
bool MeetsTtftBound(const report::PolicyReport& r, double ttft_p99_bound_s);

struct SweepSummary {
  std::string policy;
  // The highest swept rate at which the policy meets the bound at that rate and at every
  // lower swept rate (a policy that fails and recovers does not count as sustaining the
  // higher rate); -1 when it fails at the lowest rate.
  double max_rate = -1.0;
  // Measured at max_rate (0 when max_rate < 0).
  double output_tokens_per_s = 0.0;
  double requests_per_s = 0.0;
  double goodput_requests_per_s = 0.0;
  double ttft_p99_s = 0.0;
  SteadyThroughput steady;
};
SweepSummary SummarizeSweep(const PolicySweep& sweep, double ttft_p99_bound_s);

// The highest throughput over every swept rate, whatever the TTFT (what the llm-d guides
// report as a policy's peak): over the run's span and in steady state, each with the rate
// it was measured at (-1 when the sweep is empty), and the TTFT p90 at the highest rate.
struct SweepPeak {
  double output_tokens_per_s = 0.0;
  double rate = -1.0;
  double steady_output_tokens_per_s = 0.0;
  double steady_rate = -1.0;
  double top_rate = -1.0;
  double ttft_p90_at_top_s = 0.0;
};
SweepPeak PeakOfSweep(const PolicySweep& sweep);

// The lowest swept rate at which `sweep` misses the bound (where it saturates), or -1.
double FirstFailingRate(const PolicySweep& sweep, double ttft_p99_bound_s);

// The point of `sweep` at `rate` (exact match), or nullptr.
const SweepPoint* PointAt(const PolicySweep& sweep, double rate);

// Markdown: one table of every (policy, rate) run, then the summary table (max rate under
// the bound, output tok/s there over the span and in steady state, their ratios to
// `baseline`'s, and each policy's TTFT p99 at
// the rate where `baseline` first misses the bound, with its ratio to baseline's), then the
// peak table (PeakOfSweep, with ratios to `baseline`'s peaks).
std::string SweepMarkdown(const std::string& scenario, std::span<const PolicySweep> sweeps,
                          double ttft_p99_bound_s, const std::string& baseline = "round-robin");
// The same as JSON: {"scenario", "ttft_p99_bound_s", "baseline", "baseline_saturation_rate",
// "policies": [{"policy", "max_rate", "output_tokens_per_s", ..., "vs_baseline",
// "peak": {"output_tokens_per_s", "rate", "steady_output_tokens_per_s", "steady_rate",
// "vs_baseline", "steady_vs_baseline", "ttft_p90_at_top_s"},
// "points": [{"rate", "requests_per_s", ...}]}]}.
std::string SweepJson(const std::string& scenario, std::span<const PolicySweep> sweeps,
                      double ttft_p99_bound_s, const std::string& baseline = "round-robin");

}  // namespace kvroute::simulate
