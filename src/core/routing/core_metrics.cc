#include "core/routing/core_metrics.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/metrics/prom_writer.h"
#include "core/sched/plugin.h"

namespace kvroute::routing {

using core_detail::AtomicHistogram;
using core_detail::Bump;
using core_detail::CodeCounts;
using core_detail::Get;
using core_detail::GetU;
using core_detail::kNaN;
using core_detail::ScoreSummary;
using metrics::AppendCounter;
using metrics::AppendGauge;
using metrics::AppendHeader;
using metrics::AppendSample;
using metrics::Label;
using metrics::MetricType;

// ---- counting ----

void CoreMetrics::CountFinished(const Endpoint& ep, int code) {
  ep.stats->requests.Add(code);
  if (std::atomic<uint64_t>* c = ep.stats->region_requests.load(std::memory_order_acquire)) Bump(*c);
}

void CoreMetrics::CountRetry(bool free) {
  Bump(retries_);
  if (free) Bump(retries_free_);
}

void CoreMetrics::CountRetryDenied() { Bump(retries_denied_); }
void CoreMetrics::CountEjectionSkipped() { Bump(ejections_skipped_); }
void CoreMetrics::CountPickFailed() { Bump(picks_failed_); }
void CoreMetrics::CountReload() { Bump(reloads_ok_); }
void CoreMetrics::CountReloadFailed() { Bump(reloads_failed_); }

void CoreMetrics::BindRegions(const EndpointTable& table) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  for (const auto& ep : table.by_id) {
    if (!ep) continue;
    auto& counter = region_requests_[std::string(sched::RegionOf(ep->spec.labels))];
    if (!counter) counter = std::make_unique<std::atomic<uint64_t>>(0);
    ep->stats->region_requests.store(counter.get(), std::memory_order_release);
  }
}

void CoreMetrics::RecordPick(const sched::Scheduler& scheduler, const sched::PickResult& r,
                             double pick_s) {
  if (pick_s >= 0) sched_seconds_.Observe(pick_s);
  if (r.ranked.empty()) return;
  std::size_t c = 0;
  while (c < r.candidates.size() && r.candidates[c] != r.ranked[0]) ++c;
  if (c == r.candidates.size()) return;
  if (score_slots_.size() != r.scorer_names.size()) {
    // First pick of this scheduler: resolve each row's summary once (allocates once).
    auto roles = scheduler.scorer_roles();
    std::lock_guard<std::mutex> lock(scores_mu_);
    score_slots_.clear();
    for (std::size_t i = 0; i < r.scorer_names.size(); ++i) {
      auto it = scores_.find(r.scorer_names[i]);
      if (it == scores_.end()) {
        it = scores_.emplace(r.scorer_names[i], std::make_unique<ScoreSummary>()).first;
      }
      bool prefix = i < roles.size() && roles[i] == sched::Scheduler::ScorerRole::kPrefix;
      score_slots_.emplace_back(it->second.get(), prefix);
    }
  }
  for (std::size_t i = 0; i < score_slots_.size(); ++i) {
    double v = r.Score(i, c);
    score_slots_[i].first->Add(v);
    if (score_slots_[i].second) prefix_hit_.Add(v);
  }
}

void CoreMetrics::CountLocality(const sched::Scheduler& scheduler, const sched::PickResult& r) {
  if (!r.ok()) return;
  Bump(locality_picks_[static_cast<std::size_t>(r.locality)]);
  if (r.locality == sched::Locality::kOff) return;
  const sched::LocalityStats st = scheduler.locality_stats();
  spills_started_.store(st.spills_started, std::memory_order_relaxed);
  spilling_.store(st.spilling, std::memory_order_relaxed);
}

// ---- the exposition's sections ----

void CoreMetrics::AppendRequests(std::string& out, const EndpointTable& table) const {
  AppendHeader(out, "kvroute_requests_total",
               "Requests answered, by endpoint used (empty: none) and HTTP status.",
               MetricType::kCounter);
  auto requests = [&](std::string_view endpoint, const CodeCounts& counts) {
    counts.ForEach([&](int code, uint64_t n) {
      std::string code_s = std::to_string(code);
      Label labels[] = {{"endpoint", endpoint}, {"code", code_s}};
      AppendSample(out, "kvroute_requests_total", labels, static_cast<double>(n));
    });
  };
  requests("", no_endpoint_);
  for (const auto& ep : table.by_id) {
    if (ep) requests(ep->spec.name, ep->stats->requests);
  }
  AppendHeader(out, "kvroute_upstream_errors_total", "Failed upstream attempts, by endpoint and kind.",
               MetricType::kCounter);
  for (const auto& ep : table.by_id) {
    if (!ep) continue;
    std::lock_guard<std::mutex> lock(ep->stats->errors_mu);
    for (const auto& [kind, n] : ep->stats->errors) {
      Label labels[] = {{"endpoint", ep->spec.name}, {"kind", kind}};
      AppendSample(out, "kvroute_upstream_errors_total", labels, static_cast<double>(n));
    }
  }
  AppendCounter(out, "kvroute_retries_total", "Attempts sent to a fallback endpoint.", {},
                GetU(retries_));
}

// Each plugin's time per call of the current scheduler's profile, under llm-d Router v1.0's
// name and the Gateway API Inference Extension's (REFERENCE section 17); only picks with a
// timer (set_pick_timer) are counted; a reload starts the counts over.
void CoreMetrics::AppendPluginTimings(std::string& out, const sched::Scheduler* scheduler) const {
  thread_local std::vector<sched::Scheduler::TimedPlugin> timed;
  timed.clear();
  if (scheduler) scheduler->TimedPlugins(timed);
  for (std::string_view name :
       {"llm_d_epp_plugin_duration_seconds", "inference_extension_plugin_duration_seconds"}) {
    AppendHeader(out, name, "Time one plugin call of a pick took, by extension point, plugin type and name.",
                 MetricType::kHistogram);
    for (const auto& t : timed) {
      const sched::PluginTiming& pt = t.plugin->timing();
      std::array<uint64_t, sched::PluginTiming::kBounds.size() + 1> counts;
      for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = pt.counts[i].load(std::memory_order_relaxed);
      Label labels[] = {{"extension_point", t.extension_point},
                        {"plugin_type", t.plugin->type()},
                        {"plugin_name", t.plugin->name()}};
      metrics::AppendHistogramSeries(out, name, labels, sched::PluginTiming::kBounds, counts,
                                     pt.sum.load(std::memory_order_relaxed));
    }
  }
}

void CoreMetrics::AppendFailures(std::string& out) const {
  AppendCounter(out, "kvroute_retries_free_total",
                "Retries after a connect failure (no engine work lost; not charged to the budget).",
                {}, GetU(retries_free_));
  AppendCounter(out, "kvroute_retries_denied_total",
                "Failed attempts not retried because the retry budget was spent.", {},
                GetU(retries_denied_));
  AppendCounter(out, "kvroute_ejections_skipped_total",
                "Outlier ejections not made because of the panic threshold (max_ejection_percent).",
                {}, GetU(ejections_skipped_));
  AppendCounter(out, "kvroute_pick_failures_total", "Picks that found no usable endpoint.", {},
                GetU(picks_failed_));
}

void CoreMetrics::AppendScoring(std::string& out) const {
  AppendHeader(out, "kvroute_scheduling_duration_seconds",
               "Time spent in Scheduler::Pick (health refresh excluded).", MetricType::kHistogram);
  {
    std::array<uint64_t, AtomicHistogram::kBounds.size() + 1> counts;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      counts[i] = sched_seconds_.counts[i].load(std::memory_order_relaxed);
    }
    metrics::AppendHistogramSeries(out, "kvroute_scheduling_duration_seconds", {},
                                   AtomicHistogram::kBounds, counts, Get(sched_seconds_.sum));
  }
  AppendHeader(out, "kvroute_plugin_score", "Raw score (0..1) each scorer gave the chosen endpoint.",
               MetricType::kSummary);
  {
    std::lock_guard<std::mutex> lock(scores_mu_);
    for (const auto& [name, s] : scores_) {
      Label labels[] = {{"plugin", name}};
      AppendSample(out, "kvroute_plugin_score_count", labels, GetU(s->count));
      AppendSample(out, "kvroute_plugin_score_sum", labels, Get(s->sum));
    }
  }
  const double hits = GetU(prefix_hit_.count);
  AppendGauge(out, "kvroute_prefix_estimated_hit_ratio",
              "Mean prefix-scorer score of the chosen endpoint: the share of each prompt's "
              "blocks the router expects cached there.",
              {}, hits > 0 ? Get(prefix_hit_.sum) / hits : 0.0);
  AppendCounter(out, "kvroute_config_reloads_total", "Successful configuration reloads.", {},
                static_cast<double>(reloads()));
  AppendCounter(out, "kvroute_config_reload_failures_total",
                "Rejected configuration reloads (the old configuration stayed).", {},
                GetU(reloads_failed_));
}

// Locality (docs/REGIONS.md, "Live router").
void CoreMetrics::AppendLocality(std::string& out,
                                 std::span<const std::pair<std::string, double>> configured_rtt,
                                 std::span<const std::pair<std::string, double>> measured_rtt) const {
  AppendHeader(out, "kvroute_locality_picks_total",
               "Committed picks by locality decision (off: no router region or no "
               "locality-filter).",
               MetricType::kCounter);
  double picks = 0, spilled = 0;
  for (std::size_t i = 0; i < sched::kLocalityReasons; ++i) {
    const auto l = static_cast<sched::Locality>(i);
    const double n = GetU(locality_picks_[i]);
    picks += n;
    if (sched::IsRemote(l)) spilled += n;
    Label labels[] = {{"decision", sched::LocalityName(l)}};
    AppendSample(out, "kvroute_locality_picks_total", labels, n);
  }
  AppendGauge(out, "kvroute_locality_spill_ratio",
              "Share of all committed picks since start that went to a remote region "
              "(decisions spill_saturated, spill_wait, spill_sticky, no_local); 0 before the "
              "first pick.",
              {}, picks > 0 ? spilled / picks : 0.0);
  AppendGauge(out, "kvroute_locality_spilling",
              "1 while the locality-filter's spill mode is on (as of the last pick).", {},
              spilling_.load(std::memory_order_relaxed) ? 1.0 : 0.0);
  AppendCounter(out, "kvroute_locality_spills_started_total",
                "Times the locality-filter's spill mode turned on.", {}, GetU(spills_started_));
  AppendHeader(out, "kvroute_locality_requests_total",
               "Requests answered, by the region of the endpoint that answered (empty: the "
               "endpoint has no region label and counts as local).",
               MetricType::kCounter);
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    for (const auto& [region, n] : region_requests_) {
      Label labels[] = {{"region", region}};
      AppendSample(out, "kvroute_locality_requests_total", labels, GetU(*n));
    }
  }
  AppendHeader(out, "kvroute_locality_rtt_seconds",
               "Round trip to a region: configured (locality.rtt, used) or measured (scrape "
               "round trips, smoothed; used where none is configured).",
               MetricType::kGauge);
  for (const auto& [region, seconds] : configured_rtt) {
    Label labels[] = {{"region", region}, {"source", "configured"}};
    AppendSample(out, "kvroute_locality_rtt_seconds", labels, seconds);
  }
  for (const auto& [region, seconds] : measured_rtt) {
    Label labels[] = {{"region", region}, {"source", "measured"}};
    AppendSample(out, "kvroute_locality_rtt_seconds", labels, seconds);
  }
}

// Per endpoint: scraped and adjusted load, health, ejections, scrapes, prefix entries.
void CoreMetrics::AppendEndpoints(std::string& out, std::span<const EndpointRow> rows) const {
  using Row = EndpointRow;
  auto family = [&](std::string_view name, std::string_view help, MetricType type, auto value) {
    AppendHeader(out, name, help, type);
    for (const Row& r : rows) {
      Label labels[] = {{"endpoint", r.ep->spec.name}};
      AppendSample(out, name, labels, value(r));
    }
  };
  using health::Signal;
  auto known = [](const Row& r, Signal s) { return r.v.Known(s); };
  family("kvroute_endpoint_kv_usage", "KV-cache usage as last scraped (0..1; NaN: unknown).",
         MetricType::kGauge, [&](const Row& r) { return known(r, Signal::kKvUsage) ? r.m.kv_usage : kNaN; });
  family("kvroute_endpoint_kv_usage_adjusted",
         "KV-cache usage plus the router's in-flight estimate since the scrape (NaN: unknown).",
         MetricType::kGauge, [&](const Row& r) { return Get(r.ep->stats->kv_adjusted); });
  family("kvroute_endpoint_waiting", "Queued requests as last scraped (NaN: unknown).", MetricType::kGauge,
         [&](const Row& r) { return known(r, Signal::kWaiting) ? r.m.waiting : kNaN; });
  family("kvroute_endpoint_waiting_adjusted", "Queued requests plus dispatched-not-started ones (NaN: unknown).",
         MetricType::kGauge, [&](const Row& r) { return Get(r.ep->stats->waiting_adjusted); });
  family("kvroute_endpoint_running", "Running requests as last scraped (NaN: unknown).", MetricType::kGauge,
         [&](const Row& r) { return known(r, Signal::kRunning) ? r.m.running : kNaN; });
  family("kvroute_endpoint_inflight", "Requests the router has in flight there.", MetricType::kGauge,
         [&](const Row& r) { return Get(r.ep->stats->inflight); });
  family("kvroute_endpoint_scrape_age_seconds",
         "Seconds since the last successful scrape was sent (-1: never).", MetricType::kGauge,
         [&](const Row& r) { return r.age; });
  family("kvroute_endpoint_up", "1 unless the endpoint refused connections since its last good scrape.",
         MetricType::kGauge, [&](const Row& r) { return r.v.condition == health::Condition::kDown ? 0.0 : 1.0; });
  family("kvroute_endpoint_metrics_fresh", "1 when the endpoint's metrics are within pool.staleness.",
         MetricType::kGauge, [&](const Row& r) { return r.v.condition == health::Condition::kUp ? 1.0 : 0.0; });
  AppendHeader(out, "kvroute_endpoint_signal_known",
               "1 when the endpoint's last scrape gave a usable value for the signal; 0 when it "
               "was missing, NaN, Inf, negative or out of range (the signal is then unknown, "
               "handled as pool.stale_policy says, never as 0).",
               MetricType::kGauge);
  for (const Row& r : rows) {
    for (int k = 0; k < health::kNumSignals; ++k) {
      Label labels[] = {{"endpoint", r.ep->spec.name},
                        {"signal", health::SignalName(static_cast<Signal>(k))}};
      AppendSample(out, "kvroute_endpoint_signal_known", labels, r.v.known[k] ? 1.0 : 0.0);
    }
  }
  AppendHeader(out, "kvroute_endpoint_treatment",
               "How the scheduler treats the endpoint now (1 on the current treatment): "
               "normal, saturated (stale_policy saturated), last_resort (stale_policy exclude) "
               "or down.",
               MetricType::kGauge);
  for (const Row& r : rows) {
    for (auto t : {health::Treatment::kNormal, health::Treatment::kSaturated,
                   health::Treatment::kLastResort, health::Treatment::kDown}) {
      Label labels[] = {{"endpoint", r.ep->spec.name}, {"treatment", health::TreatmentName(t)}};
      AppendSample(out, "kvroute_endpoint_treatment", labels, r.v.treatment == t ? 1.0 : 0.0);
    }
  }
  family("kvroute_endpoint_ejected",
         "1 while passive outlier detection keeps the endpoint out (consecutive failures).",
         MetricType::kGauge, [&](const Row& r) { return r.v.ejected ? 1.0 : 0.0; });
  family("kvroute_endpoint_ejections_total", "Outlier ejections of the endpoint.",
         MetricType::kCounter, [&](const Row& r) { return GetU(r.ep->stats->ejections); });
  family("kvroute_endpoint_restarts_total",
         "Restarts seen in scrapes (counters went down; prefix-index entries dropped).",
         MetricType::kCounter, [&](const Row& r) { return GetU(r.ep->stats->restarts); });
  family("kvroute_endpoint_scrapes_ok_total", "Successful scrapes.", MetricType::kCounter,
         [&](const Row& r) { return GetU(r.ep->stats->scrapes_ok); });
  family("kvroute_endpoint_scrapes_failed_total", "Failed scrapes.", MetricType::kCounter,
         [&](const Row& r) { return GetU(r.ep->stats->scrapes_failed); });
  bool any_prefix = false;
  for (const Row& r : rows) any_prefix = any_prefix || Get(r.ep->stats->prefix_entries) >= 0;
  if (any_prefix) {
    family("kvroute_prefix_index_entries",
           "Prompt blocks the router's prefix model assumes cached on the endpoint.",
           MetricType::kGauge, [&](const Row& r) { return Get(r.ep->stats->prefix_entries); });
  }
}

}  // namespace kvroute::routing
