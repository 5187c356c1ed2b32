// The endpoint picker's own counters, in the reference picker's metric names where they
// mean the same thing (REFERENCE.md 6 and 17): requests and errors per model, tokens per
// model, the pick's end-to-end duration, and the pool gauges rendered from
// RoutingCore::Gauges.
//
// Threads: every method may be called from any thread. Per-model counters sit behind
// one mutex taken once per request (a map lookup); the histogram is atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "core/routing/routing_core.h"

namespace kvroute::extproc {

class EppStats {
 public:
  // Upper bounds (seconds) of inference_extension_scheduler_e2e_duration_seconds.
  static constexpr std::array<double, 14> kBounds = {
      0.00001, 0.000025, 0.00005, 0.0001, 0.0002, 0.0005, 0.001,
      0.002,   0.005,    0.01,    0.02,   0.05,   0.1,    1.0};

  // A request reached the pick (whatever its outcome), for `model` ("" when unknown).
  void OnRequest(std::string_view model);
  // A request answered with an ImmediateResponse `code`.
  void OnError(std::string_view model, int code);
  // Tokens a response reported (negative values are ignored).
  void OnUsage(std::string_view model, int64_t prompt_tokens, int64_t completion_tokens);
  // One pick took `seconds` (Pick call, the subset and shedding checks included).
  void OnPickDuration(double seconds);

  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  uint64_t picks_timed() const;

  // Appends the series, each under llm-d Router v1.0's name (llm_d_epp_*) and, where the
  // reference picker has one, its older name (inference_objective_*, inference_pool_*,
  // inference_extension_*), so dashboards for either read them (REFERENCE.md 17). `pool`
  // names the pool in the `name` label; `gauges` is RoutingCore::Gauges at rendering.
  void AppendMetrics(std::string& out, std::string_view pool,
                     const routing::RoutingCore::PoolGauges& gauges) const;

 private:
  struct PerModel {
    uint64_t requests = 0;
    std::map<int, uint64_t> errors;
    uint64_t prompt_tokens = 0, completion_tokens = 0, usage_reports = 0;
  };
  mutable std::mutex mu_;
  std::map<std::string, PerModel, std::less<>> models_;  // guarded by mu_
  std::atomic<uint64_t> requests_{0};
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<double> sum_{0.0};
};

}  // namespace kvroute::extproc
