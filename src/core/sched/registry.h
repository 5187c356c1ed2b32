// Building schedulers from a SchedulingSpec: validation with line-accurate errors, the
// table of plugin types (filled by one explicit function, no static initialisers, from
// the factories in plugins/<name>/), and the named complete policies.
//
// Plugin types (parameters in parentheses, see docs/POLICIES.md for formulas):
//   prefix-cache-scorer          (blockSize 64, maxPrefixBlocksToMatch 256,
//                                 lruCapacityPerServer: auto from the endpoint's KV size,
//                                 else 31250, preciseEvents 0)
//   precise-prefix-cache-scorer  the same with preciseEvents 1: endpoints whose KV-cache
//                                events are live scored by what they report they cache
//   kv-cache-utilization-scorer  1 - kv usage
//   queue-depth-scorer, queue-scorer  min-max normalised waiting (1 when all equal)
//   running-requests-scorer      min-max normalised running
//   least-request-scorer         min-max normalised router in-flight count
//   soft-load-scorer             (minSpread 4, relativeSpread 0) 1 - (x - min) /
//                                (max - min + minSpread + relativeSpread * mean), x =
//                                max(in-flight, waiting + running)
//   recent-load-scorer           (halfLifeSeconds 10, minSpread 2) 1 - (c - min) /
//                                (max - min + minSpread), c = requests dispatched there,
//                                each counting 2^(-age / halfLife)
//   lora-affinity-scorer         (staleAfterSeconds 2) for an adapter request (lora.h):
//                                1 adapter running there, else 0.8 room to load it, else
//                                0.6 waiting there, else 0; unknown LoRA state 0; a
//                                base-model request 0 everywhere
//   load-aware-scorer            (queueThreshold 128) 0.5 * (1 - waiting/threshold)
//   saturation-filter            (kvThreshold 0.8, queueThreshold 5, staleAfterSeconds 0.2)
//   locality-filter              the router's region first; spill to a remote region when
//                                the local one is saturated or slower
//                                (plugins/locality_filter/locality_filter.h)
//   inflight-accounting          turns on in-flight adjustment of kv/waiting/running for
//                                every plugin of the scheduler (no score, no weight needed)
//   max-score-picker             default picker; random tie-break
//   weighted-random-picker       sample proportional to total score (uniform if all 0)
//   random-picker                uniform, ignores scores
//   round-robin-picker           cycles over the candidates
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/sched/profile_spec.h"
#include "core/sched/scheduler.h"

namespace kvroute::sched {

// A configuration error. `line` is the PluginSpec/ProfileSpec/ProfilePluginRef line (0 when
// unknown); `field` a path such as "plugins[2].parameters.blockSize" or
// "schedulingProfiles[0].plugins[1].pluginRef".
struct SpecError {
  int line = 0;
  std::string field;
  std::string message;
};

// Checks `spec` without building anything: unknown policy, policy mixed with plugins,
// unknown plugin type, duplicate plugin name, bad parameter (unknown name, wrong type,
// out of range), more than one profile, dangling pluginRef, negative or non-finite weight,
// more than one picker. Returns the first error in file order, or nullopt.
std::optional<SpecError> ValidateSchedulingSpec(const SchedulingSpec& spec);

struct BuildResult {
  std::unique_ptr<Scheduler> scheduler;  // set on success
  std::optional<SpecError> error;        // set on failure
  bool ok() const { return scheduler != nullptr; }
};

// Validates then builds. An empty spec (no policy, no plugins) builds the "kvroute" policy.
BuildResult BuildScheduler(const SchedulingSpec& spec, const SchedulerOptions& options = {});

// Shorthand for a spec holding only `policy`.
BuildResult BuildPolicy(std::string_view policy, const SchedulerOptions& options = {});

// Every registered plugin type, in registration order.
std::span<const std::string_view> PluginTypes();
// Every complete policy name: round-robin, random, least-request, gie-default,
// sglang-cache-aware, dynamo-cost, dynamo-kv, llm-d-sticky, llm-d-precise, kvroute.
std::span<const std::string_view> PolicyNames();
// True for the policies defined by the engines' KV-cache events (llm-d-precise, dynamo-kv):
// without events they fall back to their approximate mode, so a comparison runs them with
// events on (kvroute simulate does).
bool PolicyNeedsEvents(std::string_view policy);

// The plugins+profile equivalent of a plugin-based policy (round-robin, random,
// least-request, gie-default, kvroute); nullopt for the others (sglang-cache-aware,
// dynamo-cost, dynamo-kv, llm-d-sticky and llm-d-precise are dedicated schedulers) and
// unknown names.
std::optional<SchedulingSpec> PolicyAsSpec(std::string_view policy);
// The spec BuildPolicy(policy, options) builds: as above, except that "kvroute" with
// options.region set starts with a locality-filter (default parameters).
// "kvroute-region-blind" (accepted, not in PolicyNames) is kvroute without it, always;
// "kvroute-slo" (accepted, not in PolicyNames) is kvroute with the slo-headroom-picker
// (issue 24), the locality-filter as kvroute's; "kvroute-lora-blind" (accepted, not in
// PolicyNames) is kvroute without its lora-affinity-scorer (issue 26), likewise.
std::optional<SchedulingSpec> PolicyAsSpec(std::string_view policy,
                                           const SchedulerOptions& options);

// The seed article's profile: prefix-cache-scorer 3, kv-cache-utilization-scorer 2,
// queue-depth-scorer 1, max-score picker.
SchedulingSpec SeedArticleSpec();

}  // namespace kvroute::sched
