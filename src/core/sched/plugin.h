// The plugin framework behind weighted-scorer policies (the Gateway API Inference
// Extension's shape): filters narrow the candidates, each scorer gives every candidate a
// score in [0,1] that is multiplied by its weight and summed, and one picker ranks the
// candidates. Plugins are built by name from a PluginSpec (registry.h).
//
// Threads: plugins belong to one Scheduler. Filter::Apply, Scorer::Score and Picker::Rank
// may run on several threads at once (concurrent Rank calls, see scheduler.h): they read
// the plugin's learned state and write only into the PickContext's scratch. Every other
// hook runs with exclusive access.
//
// The built-in plugins live in a folder each under plugins/ (the class and its factory,
// plugin_factory.h); registry.cc registers them by type name in one function.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/sched/cache_view.h"
#include "core/sched/inflight_tracker.h"
#include "core/sched/types.h"

namespace kvroute::sched {

// Request-level data that lives from Pick to OnFinished. Pooled by the scheduler: buffers
// keep their capacity from one request to the next.
struct PendingRequest {
  uint32_t slot = 0;
  int64_t prompt_tokens = 0;          // estimated
  int64_t expected_output_tokens = 0;
  size_t prompt_chars = 0;
  // One hash chain per plugin that asks for it (indexed by Plugin::index()); empty when
  // unused. Kept for OnDispatched so a prompt is hashed once.
  std::vector<std::vector<uint64_t>> hashes;
};

// The buffers one pick works in, owned by whoever runs it: the scheduler itself for
// Scheduler::Pick, or the caller (one per thread) for the concurrent Rank/Commit path.
// Nothing in it outlives the pick but capacity, so steady-state picks allocate nothing.
struct PickScratch {
  explicit PickScratch(uint64_t seed = 1) : rng(seed) {}
  PendingRequest pending;  // the request being ranked; plugins fill its hash rows
  Rng rng;                 // tie-breaks and random pickers of picks in this scratch
  std::vector<uint32_t> candidates;     // positions into the endpoint span
  std::vector<EndpointLoad> loads;      // by position
  std::vector<uint32_t> order;          // indexes into candidates, best first
  std::vector<uint32_t> ranked_ids;
  std::vector<uint32_t> candidate_ids;
  std::vector<double> scores;           // [scorer][candidate]
  std::vector<double> totals;
  // Set during a pick by the profile scheduler (now_s) and a locality-filter (the rest);
  // read back at Commit. `pinned` is a position into the endpoint span that a filter asks
  // to rank first (the coherent spill's remote replica), kNoPin for none: the scheduler
  // moves it to the front of the ranking when it is still a candidate after every filter.
  static constexpr uint32_t kNoPin = 0xffffffffu;
  double now_s = 0.0;
  Locality locality = Locality::kOff;
  uint32_t pinned = kNoPin;
  // The request's keys in the precise index (filled by the routing core for one pick).
  std::vector<uint64_t> event_keys;
  // For plugins, one call at a time: contents do not persist between plugin calls.
  std::vector<uint32_t> u32_a, u32_b;
  std::vector<uint64_t> u64;
  std::vector<double> f64;
  CacheView cache;  // the prefix scorers' (cache_view.h)
};

// Everything a plugin reads during one Pick. Candidates are positions into `endpoints`
// (not ids); `loads` is indexed by position as well.
struct PickContext {
  const SchedRequest* request = nullptr;
  double now_s = 0.0;
  std::span<const EndpointState> endpoints;
  std::span<const EndpointLoad> loads;
  const InflightTracker* inflight = nullptr;
  PendingRequest* pending = nullptr;
  Rng* rng = nullptr;
  PickScratch* scratch = nullptr;  // never null in a pick
  // The row of scratch->scores holding the first prefix scorer's scores (the share of the
  // prompt cached on each candidate), or -1 when the profile has none. Pickers read it.
  int prefix_row = -1;
};

// Time spent in one plugin's calls (llm_d_epp_plugin_duration_seconds): per-bucket
// counts and the sum, atomics, written by concurrent picks without a lock.
struct PluginTiming {
  // Upper bounds, seconds.
  static constexpr std::array<double, 14> kBounds = {
      0.000001, 0.0000025, 0.000005, 0.00001, 0.000025, 0.00005, 0.0001,
      0.00025,  0.0005,    0.001,    0.0025,  0.005,    0.01,    0.1};
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> counts{};
  std::atomic<double> sum{0.0};
  void Observe(double seconds);
  uint64_t total() const;
};

class Plugin {
 public:
  virtual ~Plugin() = default;
  const std::string& type() const { return type_; }
  const std::string& name() const { return name_; }
  // Position of this plugin in its scheduler (for PendingRequest::hashes).
  size_t index() const { return index_; }

  // What this plugin declares about itself, fixed for its lifetime; read when its
  // scheduler is built, never on the pick path.
  // The role of its row of scores when it is a scorer (Scheduler::scorer_roles): the
  // scheduler finds the prefix row and its prefix scorer by it. Default kOther (and for
  // filters, pickers and markers).
  virtual ScorerRole role() const { return ScorerRole::kOther; }
  // The metrics::EngineMetrics::Field bits whose values it reads from
  // EndpointState::engine (Scheduler::consumed_fields). Default 0: it reads at most
  // EndpointState's own members (the load view kv_usage/waiting/running, capacity,
  // scrape time, region) and the PickContext's loads.
  virtual uint32_t consumed_fields() const { return 0; }

  // Lifecycle hooks; default no-op. `endpoint` is the state last seen in a Pick.
  // OnDispatched returns how many prompt characters the endpoint probably had cached
  // before this request (for in-flight block estimates), or -1 for "no opinion".
  virtual int64_t OnDispatched(const PendingRequest& req, const EndpointState& endpoint,
                               double now_s) {
    return -1;
  }
  virtual void OnEndpointRemoved(uint32_t endpoint_id) {}
  // Reload: takes the learned state of `previous`, a plugin of the same type() from the
  // scheduler being replaced, when its parameters make that state valid here. Default:
  // nothing to take.
  virtual void AdoptStateFrom(Plugin& previous) {}

  // Its Apply/Score/Rank calls, when the scheduler has a timer (Scheduler::set_plugin_timer).
  const PluginTiming& timing() const { return timing_; }
  PluginTiming& timing() { return timing_; }

 private:
  friend class ProfileScheduler;
  friend struct PluginAccess;
  std::string type_;
  std::string name_;
  size_t index_ = 0;
  PluginTiming timing_;
};

class Filter : public Plugin {
 public:
  // Removes candidates (positions) in place; keeps the order of the rest. May leave it
  // empty (the scheduler then reports kAllFiltered).
  virtual void Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) = 0;
};

class Scorer : public Plugin {
 public:
  // Writes out[i] in [0,1] for candidates[i] (the scheduler clamps anyway).
  virtual void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                     std::span<double> out) = 0;
};

class Picker : public Plugin {
 public:
  // Writes into `ranked` up to `max_ranked` indexes into `candidates` (0 = all), best first.
  // `totals[i]` is candidate i's weighted score sum.
  virtual void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
                    std::span<const double> totals, size_t max_ranked,
                    std::vector<uint32_t>& ranked) = 0;
};

// How many of `n` candidates a picker ranks: `max_ranked`, or all of them when it is 0
// (unbounded) or more than `n`.
inline size_t RankCount(size_t max_ranked, size_t n) {
  return (max_ranked == 0 || max_ranked > n) ? n : max_ranked;
}

// The max-score ranking on its own, for reuse and for tests: indexes of `totals` ordered by
// total descending, ties broken uniformly at random by `rng`; at most `max_ranked` (0 = all).
void RankByMaxScore(std::span<const double> totals, size_t max_ranked, Rng& rng,
                    std::vector<uint32_t>& scratch, std::vector<uint64_t>& tiebreak,
                    std::vector<uint32_t>& ranked);

}  // namespace kvroute::sched
