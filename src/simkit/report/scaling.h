// The scaling story (the seed article's "from 2 replicas to 8, throughput up 30%"): one
// run per (policy, fleet size) at a load that reaches capacity, and what each policy gains
// from its smallest fleet to its largest. Pure: points in, numbers and text out.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace kvroute::report {

struct ScalingPoint {
  std::string policy;
  int replicas = 0;
  double offered_rate = 0.0;         // requests/s sent
  int64_t requests = 0;
  double output_tokens_per_s = 0.0;  // what the fleet turned out (at capacity: its capacity)
  double ttft_p50_s = 0.0, ttft_p99_s = 0.0;
  double prefix_hit_rate = 0.0;      // engine counters, 0..1
  double goodput_requests_per_s = 0.0;
};

// Per policy (in order of first appearance): throughput at its largest fleet over its
// smallest. `ratio` is 0 when the smallest fleet's throughput is 0 or the policy has a
// single fleet size.
struct ScalingGain {
  std::string policy;
  int from_replicas = 0, to_replicas = 0;
  double from_tokens_per_s = 0.0, to_tokens_per_s = 0.0;
  double ratio = 0.0;
};
std::vector<ScalingGain> ScalingGains(std::span<const ScalingPoint> points);

// Fixed-width text: one row per point, in the given order, then one "gain" line per
// policy ("round-robin: 2 -> 8 replicas, 3,120 -> 9,870 out tok/s (x3.16)"). Trailing
// newline.
std::string ScalingText(std::span<const ScalingPoint> points);

// The same as a Markdown table and a list of gains. Trailing newline.
std::string ScalingMarkdown(std::span<const ScalingPoint> points);

// The same as a JSON object {"points": [{policy, replicas, offered_rate, requests,
// output_tokens_per_s, ttft_p50_s, ttft_p99_s, prefix_hit_rate, goodput_requests_per_s}],
// "gains": [{policy, from_replicas, to_replicas, from_tokens_per_s, to_tokens_per_s,
// ratio}]}, on one line, no trailing newline. Non-finite numbers are null.
std::string ScalingJson(std::span<const ScalingPoint> points);

}  // namespace kvroute::report
