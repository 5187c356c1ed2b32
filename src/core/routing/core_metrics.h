// The routing core's own series as a component: the counters that belong to no other
// component and no endpoint (requests answered without an endpoint, retries, ejections
// skipped, failed picks, reloads, the scheduling-time histogram, each scorer's score of the
// chosen endpoint, locality decisions and requests by region), and the writing of the
// exposition's sections that are not a component's own (requests and errors by endpoint,
// plugin timings, scoring, reloads, locality, per-endpoint load and health).
// RoutingCore::AppendMetrics calls the sections in their order, between those of the other
// components (LatencyFeed, SessionAffinity, PdCoordinator, KvEventInput); the core's
// sources count through the Count* calls.
//
// Threads: every method may be called from any thread unless it says otherwise. Counters
// are atomics; the scorers' and regions' maps have a mutex each, held to add an entry or to
// write them (never on a pick's path once the scheduler's rows are resolved). RecordPick,
// CountLocality and OnSchedulerChanged run under the core's scheduler lock held
// exclusively (the per-scheduler score rows are guarded by it); AppendPluginTimings under
// either side.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/health/endpoint_health.h"
#include "core/metrics/engine_metrics.h"
#include "core/routing/core_counters.h"
#include "core/routing/endpoint_table.h"
#include "core/sched/scheduler.h"

namespace kvroute::routing {

class CoreMetrics {
 public:
  // One endpoint's row of the per-endpoint section, as the core copied it from its slot.
  struct EndpointRow {
    const Endpoint* ep = nullptr;
    health::Verdict v;          // at the exposition's time, ejection applied
    metrics::EngineMetrics m;   // its last good scrape, raw
    double age = -1.0;          // seconds since that scrape was sent; -1: never
  };

  // A request answered without an endpoint, with `code`.
  void CountNoEndpoint(int code) { no_endpoint_.Add(code); }
  // A request answered by `ep` with `code`: by endpoint and code, and by its region.
  static void CountFinished(const Endpoint& ep, int code);
  // A retry allowed (`free`: after a connect failure, not charged to the budget), or denied.
  void CountRetry(bool free);
  void CountRetryDenied();
  void CountEjectionSkipped();
  void CountPickFailed();
  void CountReload();
  void CountReloadFailed();
  uint64_t reloads() const { return reloads_ok_.load(std::memory_order_relaxed); }

  // Points each endpoint of `table` (not yet published) at its region's requests counter,
  // adding the region's counter when it is new. Regions are never removed (a handful per
  // router), so the pointers stay valid.
  void BindRegions(const EndpointTable& table);

  // A new scheduler: its score rows are resolved again at its first pick.
  void OnSchedulerChanged() { score_slots_.clear(); }
  // A committed pick of `scheduler`: its time (< 0: not timed) and each scorer's score of
  // the chosen endpoint.
  void RecordPick(const sched::Scheduler& scheduler, const sched::PickResult& r, double pick_s);
  // A committed pick's locality decision, and the filter's spill mode as of this pick.
  void CountLocality(const sched::Scheduler& scheduler, const sched::PickResult& r);

  // The exposition's sections, in the order RoutingCore::AppendMetrics writes them.
  // kvroute_requests_total, kvroute_upstream_errors_total, kvroute_retries_total.
  void AppendRequests(std::string& out, const EndpointTable& table) const;
  // Each plugin's time per call of `scheduler`'s profile (may be null).
  void AppendPluginTimings(std::string& out, const sched::Scheduler* scheduler) const;
  // Free and denied retries, ejections skipped, failed picks.
  void AppendFailures(std::string& out) const;
  // The scheduling-time histogram, scorer summaries, the prefix hit ratio, reloads.
  void AppendScoring(std::string& out) const;
  // kvroute_locality_*: decisions, spill mode, requests by region, and the round trips
  // configured and measured.
  void AppendLocality(std::string& out, std::span<const std::pair<std::string, double>> configured_rtt,
                      std::span<const std::pair<std::string, double>> measured_rtt) const;
  // Per endpoint: scraped and adjusted load, health, ejections, scrapes, prefix entries.
  void AppendEndpoints(std::string& out, std::span<const EndpointRow> rows) const;

 private:
  core_detail::CodeCounts no_endpoint_;  // requests answered without an endpoint
  std::atomic<uint64_t> retries_{0}, retries_free_{0}, retries_denied_{0}, picks_failed_{0},
      reloads_ok_{0}, reloads_failed_{0}, ejections_skipped_{0};
  core_detail::AtomicHistogram sched_seconds_;
  core_detail::ScoreSummary prefix_hit_;
  mutable std::mutex scores_mu_;  // guards the map's shape (RecordPick adds, Append reads)
  std::map<std::string, std::unique_ptr<core_detail::ScoreSummary>, std::less<>> scores_;
  // Per scorer row of the current scheduler: its summary, and whether it is a prefix role
  // (guarded by the core's scheduler lock).
  std::vector<std::pair<core_detail::ScoreSummary*, bool>> score_slots_;
  // Committed picks by locality decision (index = sched::Locality), and the filter's spill
  // mode as of the last commit.
  std::array<std::atomic<uint64_t>, sched::kLocalityReasons> locality_picks_{};
  std::atomic<uint64_t> spills_started_{0};
  std::atomic<bool> spilling_{false};
  // Answered requests by the region of the endpoint that answered ("" = no region).
  mutable std::mutex regions_mu_;  // guards the map's shape (BindRegions adds, Append reads)
  std::map<std::string, std::unique_ptr<std::atomic<uint64_t>>, std::less<>> region_requests_;
};

}  // namespace kvroute::routing
