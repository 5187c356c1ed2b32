// Flow control over loopback, shared by the tests of `kvroute serve` (router/flow_test.cc)
// and `kvroute epp` (epp/epp_flow_test.cc): a fleet that one request can saturate, the
// configuration that turns flow control on in front of it, and the signals the tests read
// and wait for.
//
// The fleet is one simulated replica, r0, with a small KV cache (kFlowKvBlocks blocks of
// 16 tokens) running in real time (time_scale 1, ~6 ms a token), so requests stay in
// flight. One long request with a BigPrompt fills most of the cache, so the routing core's
// saturation detector (KV usage >= kSaturatedKvUsage) calls the pool saturated while it
// runs. TTLs in these tests are short real times: the front ends read a monotonic clock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "metrics/metric_sum.h"
#include "apps/sim/fleet.h"
#include "support/sim_replica.h"
#include "support/wait.h"

namespace kvroute::test_support {

inline constexpr int kFlowKvBlocks = 128;  // of 16 tokens: 2,048 tokens of KV cache
// The routing core's saturation threshold on (adjusted) KV usage.
inline constexpr double kSaturatedKvUsage = 0.8;

// ~1,700 tokens (about 4 characters a token): 107 of 128 blocks, 84% of the cache. A
// different `c` per request, so no two share a cached prefix.
inline std::string BigPrompt(char c) { return std::string(6800, c); }

// The saturable fleet (one replica, r0), not started yet.
inline std::unique_ptr<sim::Fleet> SaturableFleet() {
  return std::make_unique<sim::Fleet>(
      std::vector<sim::ReplicaConfig>{
          SimReplica({.name = "r0", .kv_blocks = kFlowKvBlocks, .time_scale = 1.0})},
      1);
}

// The pool.endpoints entry of the saturable fleet's replica listening on `port`.
inline std::string FlowEndpoint(uint16_t port) {
  return "    - {address: 127.0.0.1:" + std::to_string(port) + ", name: r0}\n";
}

// A front end's configuration for the flow tests: the pool `endpoints` (pool.endpoints
// entries, as FlowEndpoint writes them) scraped every 20 ms and stale after 1 s,
// round-robin picks, and a flow section with `enabled` followed by the `flow` keys
// (indented under flow:); `extra` is more top-level YAML, appended last.
inline std::string FlowConfigYaml(const std::string& endpoints, bool enabled,
                                  const std::string& flow, const std::string& extra = "") {
  return "pool:\n  scrape_interval: 20ms\n  staleness: 1s\n  endpoints:\n" + endpoints +
         "scheduling:\n  policy: round-robin\nflow:\n  enabled: " +
         (enabled ? "true" : "false") + "\n" + flow + extra;
}

// The flow signals a fixture reads from its front end's metrics exposition. A fixture
// derives from this and says, in Metrics(), where the exposition comes from.
class FlowSignals {
 public:
  virtual ~FlowSignals() = default;

  // The front end's Prometheus exposition now.
  virtual std::string Metrics() = 0;

  // The sum of the samples of `name` whose labels include `want`.
  double Metric(std::string_view name, const std::map<std::string, std::string>& want = {}) {
    return metrics::testing::MetricSum(Metrics(), name, want);
  }
  // Requests waiting in the flow queue, every priority.
  double Waiting() { return Metric("kvroute_flow_waiting_requests"); }
  // Waits (bounded, WaitFor's default limit) until the routing core counts the pool
  // saturated: adjusted KV usage, summed over the endpoints (here the one), at least
  // kSaturatedKvUsage. Returns whether it did.
  bool WaitSaturated() {
    return WaitFor([&] { return Metric("kvroute_endpoint_kv_usage_adjusted") >= kSaturatedKvUsage; });
  }
};

}  // namespace kvroute::test_support
