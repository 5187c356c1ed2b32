// The scheduler: picks the endpoint for each request and learns from what the router did
// with the pick. One interface, several complete policies (see registry.h and
// docs/POLICIES.md).
//
// Lifecycle of one request, as the router (or the simulator) drives it:
//   PickResult r = s.Pick(req, endpoints, now);          // ranked endpoint ids, a handle
//   s.OnDispatched(r.handle, r.ranked[0], now);          // sent there (or to a fallback)
//   s.OnFirstToken(r.handle, now);                        // first byte/token came back
//   s.OnTokens(r.handle, generated, now);                 // optional, as tokens stream
//   s.OnFinished(r.handle, now);                          // done, failed or cancelled
// and, independently, s.OnMetricsUpdated(id, scraped_at) after each scrape of endpoint id
// (after updating that endpoint's EndpointState).
//
// Threads: a Scheduler keeps mutable state (prefix index, in-flight accounting, reused
// buffers, RNG), so calls on one instance must be serialised, with one exception: a
// scheduler whose concurrent_picks() is true lets several threads run Rank at once (see
// below). No call blocks, reads a clock or does I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/sched/inflight_tracker.h"
#include "core/sched/types.h"

namespace kvroute::sched {

class Plugin;

struct PickScratch;  // plugin.h

enum class PickStatus {
  kOk,
  kNoHealthyEndpoint,  // the span was empty or every endpoint was unhealthy
  kAllFiltered,        // filters removed every healthy endpoint
};

// Knobs that are not part of a policy's definition.
struct SchedulerOptions {
  uint64_t seed = 1;           // seeds the scheduler's Rng (tie-breaks, random policies)
  size_t max_ranked = 4;       // length of PickResult::ranked (best + fallbacks); 0 = all
  // In-flight accounting (InflightTracker) estimates.
  int64_t default_output_tokens = 256;   // expected output when max_tokens is unknown
  int64_t max_expected_output_tokens = 2048;  // cap on max_tokens as an output estimate
  int64_t default_block_size = 16;       // when the endpoint's block_size is unknown
  int64_t default_num_gpu_blocks = 26304;  // when num_gpu_blocks is unknown (8B on H100)

  // Locality (docs/POLICIES.md, "Locality"). The router's own region; empty: none, and then
  // locality is off (the kvroute policy has no locality-filter, and a locality-filter in a
  // custom profile passes every candidate, reporting Locality::kOff). An endpoint is local
  // when its EndpointState::region is empty or equal to this.
  std::string region;
  // Round-trip seconds to remote regions, as configured (region, seconds; finite, >= 0).
  // Regions missing here are unknown until Scheduler::SetRegionRtt names them.
  std::vector<std::pair<std::string, double>> region_rtt_s;
};

// The answer to one Pick. Spans point into the scheduler's reused buffers: they stay valid
// until the next call to Pick on the same scheduler.
struct PickResult {
  PickStatus status = PickStatus::kNoHealthyEndpoint;
  // Valid when ok(): pass it to OnDispatched/OnFirstToken/OnFinished. Every handle must
  // eventually get OnFinished (also when the router gives up without dispatching),
  // otherwise its bookkeeping stays allocated.
  RequestHandle handle = kNoHandle;
  // Endpoint ids, best first, at most SchedulerOptions::max_ranked. The router tries them
  // in order. Empty unless ok().
  std::span<const uint32_t> ranked;

  // Observability. `candidates` are the ids that passed filters (in input order);
  // `scores` is row-major [scorer][candidate]: each scorer's raw score in [0,1] before its
  // weight; `totals[c]` = sum over scorers of weight * score. Policies that are not
  // weighted-scorer based (sglang-cache-aware, dynamo-cost, ...) report one row of their
  // own (documented per policy), with weight 1.
  std::span<const uint32_t> candidates;
  std::span<const std::string> scorer_names;
  std::span<const double> weights;
  std::span<const double> scores;
  std::span<const double> totals;
  // Where the pick went relative to the router's region, and why (kOff without a
  // locality-filter or a router region). Ranked ids are all local for kLocal and
  // kLocalSaturated; for the spill reasons they are remote, except that kSpillSticky's
  // fallbacks after ranked[0] are local.
  Locality locality = Locality::kOff;

  bool ok() const { return status == PickStatus::kOk; }
  double Score(size_t scorer, size_t candidate) const {
    return scores[scorer * candidates.size() + candidate];
  }
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // The policy name ("kvroute", "gie-default", ..., or "custom" for a plugin profile).
  virtual std::string_view policy() const = 0;

  // Ranks `endpoints` for `req` at time `now_s`. Never fails other than by status: no
  // exceptions, no allocation in steady state (buffers are reused). Unhealthy endpoints
  // are never returned. `endpoints` ids must be distinct.
  virtual PickResult Pick(const SchedRequest& req, std::span<const EndpointState> endpoints,
                          double now_s) = 0;

  // ---- concurrent picks ----
  // When concurrent_picks() is true, a pick may be split in two so that several threads
  // rank at once: Rank reads the learned state (prefix index, in-flight accounting) and
  // writes only into `scratch` (one per thread), so Rank calls may run concurrently with
  // each other, but with no other call on this scheduler; Commit then takes the handle
  // (exclusive access, like every other call). The result's spans point into `scratch`
  // and stay valid until its next use. Rank returns handle kNoHandle; Commit fills it
  // in for a successful Rank (Pick == Rank into an own scratch + Commit).
  // Schedulers whose ranking itself changes state (sglang-cache-aware inserts into its
  // tree at selection time) return false and must be driven through Pick.
  virtual bool concurrent_picks() const { return false; }
  virtual PickResult Rank(const SchedRequest& req, std::span<const EndpointState> endpoints,
                          double now_s, PickScratch& scratch);
  virtual RequestHandle Commit(PickScratch& scratch, std::span<const EndpointState> endpoints);

  // The request behind `handle` was sent to `endpoint_id` (normally ranked[0]; a fallback
  // after a failed attempt). Records its prefix there and adds its in-flight accounting.
  // Calling it again for the same handle moves the accounting to the new endpoint.
  // Unknown or finished handles are ignored.
  virtual void OnDispatched(RequestHandle handle, uint32_t endpoint_id, double now_s) = 0;
  // The endpoint started answering (first token): the request is no longer queued there.
  virtual void OnFirstToken(RequestHandle handle, double now_s) = 0;
  // The request has produced `generated_tokens` output tokens so far (cumulative, as the
  // response stream shows them; call it as tokens arrive, e.g. once per engine step or
  // streamed chunk; the first may come just before or after OnFirstToken). Optional: only
  // policies that follow generation (dynamo-cost-output-blocks) use it; the default
  // ignores it. Allocates nothing.
  virtual void OnTokens(RequestHandle handle, int64_t generated_tokens, double now_s) {}
  // The request ended (any outcome). Releases its accounting and the handle.
  virtual void OnFinished(RequestHandle handle, double now_s) = 0;
  // Endpoint `endpoint_id`'s EndpointState now holds metrics taken at `scraped_at_s`:
  // requests dispatched there before that time are now counted by the scrape itself.
  virtual void OnMetricsUpdated(uint32_t endpoint_id, double scraped_at_s) = 0;
  // The endpoint left the pool: forget its prefix state. In-flight requests on it keep
  // their handles until OnFinished.
  virtual void OnEndpointRemoved(uint32_t endpoint_id) = 0;

  // The router's own accounting (in-flight counts and estimated blocks per endpoint).
  virtual const InflightTracker& inflight() const = 0;

  // ---- reload ----

  // Takes over what `previous` learned, so that a configuration reload (new weights, new
  // plugin parameters, even another policy) keeps the router's affinity and accounting:
  // every handle `previous` issued stays valid here (OnFirstToken/OnFinished on this
  // scheduler), in-flight accounting carries over, and prefix state moves where both
  // sides model it the same way (the same plugin type with the same hashing parameters,
  // or the same dedicated policy). `previous` is left empty and must not be used again
  // except to be destroyed. Endpoint ids must mean the same endpoints in both.
  // Returns false (and takes nothing) when `previous` is not a built-in scheduler.
  virtual bool AdoptStateFrom(Scheduler& previous) = 0;

  // ---- prefix probe (flow control's late binding: core/flow, core/flow/flow_gate.h) ----

  // The request's prefix chain as this policy cuts its prompt (block hashes, into `out`,
  // cleared first), computed once when a request starts waiting; empty when the policy
  // keeps no hashed prefix model. Then HeldBlocks: how many leading blocks of such a chain
  // `endpoint_id` holds by what the policy has learned (0 for an empty chain or an
  // unknown endpoint). Both only read learned state and allocate nothing in steady state
  // (PrefixKey reuses `out`), so they may run wherever Rank may (concurrently with Rank
  // calls, under the router's shared lock).
  virtual void PrefixKey(const SchedRequest& req, std::vector<uint64_t>& out) const { out.clear(); }
  virtual size_t HeldBlocks(std::span<const uint64_t> key, uint32_t endpoint_id) const { return 0; }
  // The policy's own count of prefill tokens dispatched to the endpoint and not yet past
  // their first token (Dynamo's router queue reads it: core/flow/peer_admission.h); -1
  // when the policy keeps none. Read like HeldBlocks.
  virtual int64_t ActivePrefillTokens(uint32_t endpoint_id) const { return -1; }

  // ---- locality (docs/POLICIES.md, "Locality") ----

  // Sets the round trip to remote `region` (seconds; a configured value, or a measured and
  // smoothed one), used from the next pick on. A negative or non-finite value forgets the
  // region: it is unknown again (the locality-filter's defaultRttSeconds, else never a
  // spill target). Call it between picks, with exclusive access like OnDispatched (not
  // concurrently with Rank). No-op for policies without a locality-filter.
  virtual void SetRegionRtt(std::string_view region, double seconds) {}
  // The locality-filter's counters (picks by reason, spill mode); all zero without one.
  // Exclusive access, like SetRegionRtt.
  virtual LocalityStats locality_stats() const { return {}; }

  // ---- observability ----

  // Prompt blocks the scheduler's prefix model assumes cached on the endpoint, or -1 when
  // the policy keeps no prefix model (round-robin, least-request, ...).
  virtual int64_t PrefixEntries(uint32_t endpoint_id) const { return -1; }

  // What each row of PickResult::scorer_names measures, in the same order (types.h).
  using ScorerRole = sched::ScorerRole;
  virtual std::span<const ScorerRole> scorer_roles() const = 0;

  // The metrics::EngineMetrics::Field bits whose values this scheduler reads from
  // EndpointState::engine on a pick (for a plugin profile, the union of its plugins'
  // Plugin::consumed_fields). The routing core may hide such a field it no longer trusts
  // (a stale scrape's) by clearing its `present` bit; fields outside this set are never
  // read, so hiding them changes nothing. EndpointState's own load members (kv_usage,
  // waiting, running, num_gpu_blocks, block_size) are not `engine` and not counted here.
  // Fixed for the scheduler's lifetime; shared access. Default: reads nothing from
  // `engine`.
  virtual uint32_t consumed_fields() const { return 0; }

  // Times each plugin call of a pick (Filter::Apply, Scorer::Score, Picker::Rank) with
  // `*seconds`, a clock in seconds, when it is set; null or empty: untimed. The function
  // outlives the scheduler. Set with exclusive access. No-op for policies that are no
  // plugin profile.
  virtual void set_plugin_timer(const std::function<double()>* seconds) {}
  // The plugins whose calls are timed, with their extension point ("Filter", "Scorer",
  // "Picker", llm-d's spelling), for llm_d_epp_plugin_duration_seconds. Shared access.
  struct TimedPlugin {
    std::string_view extension_point;
    const Plugin* plugin = nullptr;
  };
  virtual void TimedPlugins(std::vector<TimedPlugin>& out) const {}
};

}  // namespace kvroute::sched
