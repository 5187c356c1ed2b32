// `kvroute doctor --trace FILE`: the closed loop (issue 42). Captured traffic (serve's or
// epp's `capture:`) or a public trace is replayed by simulate, on the routing core serve
// and epp ship, on a fleet shaped like the live one (replica count and KV blocks from
// their /metrics, or --fleet YAML), under every policy; the table says what each would
// have given against what the fleet got (the capture's own status, TTFT and cached-token
// fields) and which policy doctor would pick.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apps/doctor/diagnosis/doctor.h"
#include "simkit/report/summary.h"

namespace kvroute::doctor {

// What the fleet got, from a capture's extra fields (docs/TRACES.md "Capture"). Figures
// are unknown (nullopt) when no line carries them (a public trace carries none).
struct TraceObserved {
  int64_t requests = 0;
  std::optional<int64_t> ok;                  // lines with "status": 200
  double span_s = 0.0;                        // first to last timestamp
  std::optional<double> hit_rate;             // sum cached_tokens / sum input_length, over
                                              //   the lines that report cached tokens
  std::optional<double> ttft_p50_s, ttft_p99_s;  // over the lines with ttft_ms
};
TraceObserved ObserveTrace(std::string_view jsonl);

// The simulated fleet: the replicas' count and KV blocks as their /metrics say
// (vllm:cache_config_info's num_gpu_blocks; the smallest when they differ).
struct FleetShape {
  int replicas = 0;
  int64_t kv_blocks = 0;    // in 16-token blocks (the simulated engine's), the smallest replica's
  int64_t block_size = 0;   // tokens per KV block the replicas report; 0: not said
  std::string note;        // how it was read, for the table's header
};
// From the newest usable scrape of each replica. nullopt with `why` when no replica says
// its KV capacity.
std::optional<FleetShape> ShapeFromScrapes(const std::vector<ReplicaHistory>& histories,
                                           std::string* why);

// The scenario simulate runs: the trace as its workload, then the fleet (a `fleet:` block
// from the shape, or the --fleet file's text as given).
std::string TraceScenarioYaml(const std::string& trace_path, std::string_view format,
                              int64_t block_size, double time_scale, const FleetShape* shape,
                              std::string_view fleet_yaml);

// The comparison as a Markdown table, the observed row first, and the pick: among the
// policies within 0.5% of the most goodput, the one with the lowest TTFT p99.
std::string RenderTraceComparison(const TraceObserved& observed,
                                  const std::vector<report::PolicyReport>& reports,
                                  std::string_view header);
// The pick RenderTraceComparison names ("" when there are no reports).
std::string BestPolicy(const std::vector<report::PolicyReport>& reports);

}  // namespace kvroute::doctor
