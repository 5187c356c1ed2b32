// The locality-filter (issue 10): keeps picks in the router's own region and spills to a
// remote region only when the local candidates are saturated, when waiting locally is
// expected to take longer than the remote round trip plus the remote wait, or (issue 24)
// when the router's latency model predicts every local replica misses the request's TTFT
// objective even with its prompt cached while a remote one meets it with the round trip
// even with nothing cached. Rules,
// parameters and how the decision is reported: docs/POLICIES.md, "Locality".
//
// The router's region and the round trips come from SchedulerOptions (region,
// region_rtt_s) and Scheduler::SetRegionRtt; endpoints' regions from
// EndpointState::region (EndpointState::SetLabels). Without a router region the filter
// passes every candidate and reports Locality::kOff.
//
// Threads: Apply only reads the learned state (spill mode, sticky table, round trips) and
// writes its decision into the pick's scratch, so it may run on several threads at once
// (concurrent Rank). OnCommit, OnDispatched, Configure and SetRegionRtt change that state
// and need exclusive access, as every other scheduler call. No clock reads: times are the
// pick's now_s.
//
// The profile scheduler finds its locality-filters by class (they need the router's region,
// the round trips and the commit hook), not by type name.
#pragma once

#include <cassert>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// locality-filter's parameters (each comment names its spec key). Defaults: the saturation
// detector of RoutingCore::Load (waiting >= 5 or KV >= 0.8).
struct LocalityParams {
  double kv_threshold = 0.8;             // kvThreshold: saturated at kv >= this
  double queue_threshold = 5;            // queueThreshold: ... or waiting >= this
  double recover_kv_threshold = 0.7;     // recoverKvThreshold: while spilling, a local
  double recover_queue_threshold = 2;    // recoverQueueThreshold: endpoint has room only
                                         // at kv <= and waiting <= these
  double min_spill_s = 1.0;              // minSpillSeconds: a spill lasts at least this
  double stale_after_s = 1.0;            // staleAfterSeconds: older metrics are unknown
  double seconds_per_queued = 0.02;      // secondsPerQueuedRequest: expected wait =
                                         // waiting x this; 0 turns the wait rule off
  double recover_wait_ratio = 0.5;       // recoverWaitRatio: a wait spill holds while
                                         // local wait > ratio x (rtt + remote wait)
  double default_rtt_s = std::numeric_limits<double>::infinity();  // defaultRttSeconds:
                                         // regions with no round trip; inf: never a target
  double sticky_s = 1.0;                 // stickySeconds: a spilled prefix keeps its
                                         // remote replica this long (0: no sticky table)
  size_t sticky_capacity = 4096;         // stickyCapacity: entries at most
  size_t block_chars = 64;               // blockSize: the prefix key is the hash of the
                                         // prompt's first block of this many characters
};

class LocalityFilter : public Configured<Filter, LocalityParams> {
 public:
  using Configured::Configured;

  // kWaiting, kRunning and kKvUsage of EndpointState::engine: the features of the latency
  // model's predictions for the predicted-miss spill (PredictedMissTarget), read only when
  // the request has a model and a TTFT objective. Its saturation and wait rules read the
  // load view (PickContext::loads).
  uint32_t consumed_fields() const override;

  // The router's region ("" = locality off) and the configured round trips.
  void Configure(std::string region, std::span<const std::pair<std::string, double>> rtt_s);
  // See Scheduler::SetRegionRtt.
  void SetRegionRtt(std::string_view region, double seconds);
  bool Saturated(const EndpointLoad& l) const {
    return l.waiting >= p_.queue_threshold || l.kv_usage >= p_.kv_threshold;
  }
  // An endpoint of the region to spill to by predicted miss (see Apply), or null. Marks
  // the remote candidates that can take the request in `cls` (the Apply pass's classes).
  const EndpointState* PredictedMissTarget(const PickContext& ctx,
                                           std::span<const uint32_t> candidates,
                                           std::vector<uint32_t>& cls) const;
  // The round trip used for `region`: the set one, else defaultRttSeconds (maybe +inf).
  double RttOf(std::string_view region) const;
  const std::string& region() const { return region_; }
  bool IsLocal(const EndpointState& e) const {
    // SetLabels keeps region_key in step with region; a key set and then a region assigned
    // directly would be misread.
    assert(e.region_key == 0 || e.region_key == RegionKey(e.region));
    if (e.region_key != 0) return e.region_key == region_key_;
    return e.region.empty() || e.region == region_;
  }

  void Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) override;
  // The pick in `scratch` was committed: counts its reason, moves the spill mode and notes
  // which ranked endpoints are remote (for OnDispatched).
  void OnCommit(const PickScratch& scratch, std::span<const EndpointState> endpoints);
  // A dispatch to a remote endpoint makes (or keeps) the prompt's sticky entry; one to a
  // local endpoint drops it.
  int64_t OnDispatched(const PendingRequest& req, const EndpointState& endpoint,
                       double now_s) override;
  // Takes the previous filter's spill mode, sticky table and counters (not its round
  // trips: a reload starts from the configured ones; feed measured values again).
  void AdoptStateFrom(Plugin& previous) override;

  const LocalityStats& stats() const { return stats_; }
  // The remote endpoint id the prefix key `key` sticks to at `now_s`, or -1.
  int64_t StickyTarget(uint64_t key, double now_s) const;

 private:
  struct StickyEntry {
    uint64_t key = 0;
    uint32_t endpoint = 0;
    double expires_s = -std::numeric_limits<double>::infinity();  // <= now: free
  };
  static constexpr size_t kProbe = 8;
  void StickyPut(uint64_t key, uint32_t endpoint, double now_s);
  void StickyDrop(uint64_t key);

  std::string region_;
  uint64_t region_key_ = 0;  // RegionKey(region_)
  std::vector<std::pair<std::string, double>> rtt_s_;
  // Spill mode (hysteresis).
  bool spilling_ = false;
  double spill_since_s_ = 0.0;
  Locality spill_reason_ = Locality::kSpillSaturated;
  // Prefix key -> remote endpoint: open addressing, a power of two >= sticky_capacity,
  // allocated at the first spill; an entry lives kProbe slots from its home at most.
  std::vector<StickyEntry> sticky_;
  // No entry lives at or after this time: picks before it look the table up, later ones
  // skip hashing the prompt unless they spill.
  double sticky_live_until_s_ = -std::numeric_limits<double>::infinity();
  std::vector<uint8_t> remote_;  // by endpoint id: remote when last ranked
  LocalityStats stats_;
};

// Parameters kvThreshold, queueThreshold, recoverKvThreshold, recoverQueueThreshold,
// minSpillSeconds, staleAfterSeconds, secondsPerQueuedRequest, recoverWaitRatio,
// defaultRttSeconds, stickySeconds, stickyCapacity and blockSize (defaults: Params).
PluginFactory LocalityFilterFactory();

}  // namespace kvroute::sched
