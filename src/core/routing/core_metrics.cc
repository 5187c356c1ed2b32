// RoutingCore: the router's own Prometheus exposition (AppendMetrics), section by section.
#include "core/routing/routing_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "core/metrics/prom_writer.h"
#include "core/sched/plugin.h"
#include "core/routing/core_state.h"
#include "core/routing/kv_event_input.h"

namespace kvroute::routing {

using metrics::AppendCounter;
using metrics::AppendGauge;
using metrics::AppendHeader;
using metrics::AppendSample;
using metrics::Label;
using metrics::MetricType;

void RoutingCore::AppendMetrics(std::string& out, double now_s) const {
  auto table = table_.load();
  AppendRequestMetrics(out, *table);
  AppendLatencyMetrics(out);
  AppendPickMetrics(out, now_s);
  AppendLocalityMetrics(out);
  AppendPdMetrics(out);
  AppendEndpointMetrics(out, *table, now_s);
  if (events_->active()) events_->AppendMetrics(out, *table, now_s);
}

// Requests by endpoint and code, upstream errors, retries.
void RoutingCore::AppendRequestMetrics(std::string& out, const EndpointTable& table) const {
  const Counters& c = *counters_;
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
  requests("", c.no_endpoint);
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
                GetU(c.retries));
}

// The latency model (issue 24) and each plugin's time per call.
void RoutingCore::AppendLatencyMetrics(std::string& out) const {
  const Counters& c = *counters_;
  {
    // The latency model (issue 24): what it learned from and how far its predictions were
    // from what came back; mean absolute error = rate(abs_error) / rate(scored).
    const LatencyStats lat = latency_stats();
    const struct {
      const char* kind;
      uint64_t samples;
      const sched::LatencyTrainer::Errors* e;
    } kinds[] = {{"ttft", lat.ttft_samples, &lat.ttft_errors},
                 {"tpot", lat.tpot_samples, &lat.tpot_errors}};
    auto family = [&](const char* name, const char* help, auto value) {
      AppendHeader(out, name, help, MetricType::kCounter);
      for (const auto& k : kinds) {
        Label labels[] = {{"kind", k.kind}};
        AppendSample(out, name, labels, value(k));
      }
    };
    family("kvroute_latency_model_samples_total",
           "Observed TTFT (dispatch to first token) and TPOT samples the latency model learned from.",
           [](const auto& k) { return static_cast<double>(k.samples); });
    family("kvroute_latency_predictions_scored_total",
           "Dispatched requests whose predicted TTFT or TPOT was compared with the observed one.",
           [](const auto& k) { return static_cast<double>(k.e->n); });
    family("kvroute_latency_prediction_abs_error_seconds_total",
           "Sum of |predicted - observed| over the scored predictions, in seconds.",
           [](const auto& k) { return k.e->abs_s; });
    family("kvroute_latency_prediction_abs_relative_error_total",
           "Sum of |predicted - observed| / observed over the scored predictions.",
           [](const auto& k) { return k.e->abs_rel; });
    const sched::LatencyTrainer::SloCounts* slo[] = {&lat.ttft_slo, &lat.tpot_slo};
    AppendHeader(out, "kvroute_slo_requests_total",
                 "Requests with a TTFT or TPOT objective (headers or scheduling.slo) whose "
                 "observed value was measured.", MetricType::kCounter);
    for (size_t k = 0; k < 2; ++k) {
      Label labels[] = {{"type", kinds[k].kind}};
      AppendSample(out, "kvroute_slo_requests_total", labels, static_cast<double>(slo[k]->observed));
    }
    AppendHeader(out, "kvroute_slo_violations_total",
                 "Of those, requests whose observed TTFT or TPOT exceeded the objective.",
                 MetricType::kCounter);
    for (size_t k = 0; k < 2; ++k) {
      Label labels[] = {{"type", kinds[k].kind}};
      AppendSample(out, "kvroute_slo_violations_total", labels, static_cast<double>(slo[k]->violated));
    }
    // The same under llm-d Router v1.0's names (REFERENCE section 17), for its dashboards:
    // the predictions made at dispatch, and the violations.
    auto predicted = [&](const char* name, const char* help, const auto& h) {
      AppendHeader(out, name, help, MetricType::kHistogram);
      std::array<uint64_t, std::tuple_size_v<std::decay_t<decltype(h.counts)>>> counts;
      for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = GetU(h.counts[i]);
      metrics::AppendHistogramSeries(out, name, {}, h.bounds, counts, Get(h.sum));
    };
    predicted("llm_d_epp_request_predicted_ttft_seconds",
              "TTFT the latency model predicted for each dispatched request (one with samples).",
              c.predicted_ttft);
    predicted("llm_d_epp_request_predicted_tpot_seconds",
              "TPOT the latency model predicted for each dispatched request (one with samples).",
              c.predicted_tpot);
    AppendHeader(out, "llm_d_epp_request_slo_violation_total",
                 "Requests whose observed TTFT or TPOT exceeded their objective "
                 "(kvroute_slo_violations_total).", MetricType::kCounter);
    for (size_t k = 0; k < 2; ++k) {
      Label labels[] = {{"type", kinds[k].kind}};
      AppendSample(out, "llm_d_epp_request_slo_violation_total", labels,
                   static_cast<double>(slo[k]->violated));
    }
  }
  {
    // Each plugin's time per call of the current scheduler's profile, under llm-d Router
    // v1.0's name and the Gateway API Inference Extension's (REFERENCE section 17); only
    // picks with a timer (set_pick_timer) are counted; a reload starts the counts over.
    thread_local std::vector<sched::Scheduler::TimedPlugin> timed;
    timed.clear();
    std::shared_lock<RwSpinLock> lock(sched_mu_);
    if (sched_->scheduler) sched_->scheduler->TimedPlugins(timed);
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
}

// Retries, ejections and pick failures; sessions; scheduling time and scores; reloads.
void RoutingCore::AppendPickMetrics(std::string& out, double now_s) const {
  const Counters& c = *counters_;
  AppendCounter(out, "kvroute_retries_free_total",
                "Retries after a connect failure (no engine work lost; not charged to the budget).",
                {}, GetU(c.retries_free));
  AppendCounter(out, "kvroute_retries_denied_total",
                "Failed attempts not retried because the retry budget was spent.", {},
                GetU(c.retries_denied));
  AppendCounter(out, "kvroute_ejections_skipped_total",
                "Outlier ejections not made because of the panic threshold (max_ejection_percent).",
                {}, GetU(c.ejections_skipped));
  AppendCounter(out, "kvroute_pick_failures_total", "Picks that found no usable endpoint.", {},
                GetU(c.picks_failed));
  // Sessions (docs/POLICIES.md "Sessions").
  sessions_->Sweep(now_s);
  AppendGauge(out, "kvroute_sessions",
              "Session ids bound to an endpoint (x-session-id), idle less than the TTL.", {},
              static_cast<double>(sessions_->size()));
  AppendHeader(out, "kvroute_session_picks_total",
               "Picks of requests with a session id or token, by outcome (bound: stayed on "
               "the session's endpoint; new: first binding; moved_gone, moved_saturated: "
               "rebound to the policy's pick; token: routed by the session token).",
               MetricType::kCounter);
  for (std::size_t i = 1; i < kNumSessionOutcomes; ++i) {
    Label labels[] = {{"outcome", SessionOutcomeName(static_cast<SessionOutcome>(i))}};
    AppendSample(out, "kvroute_session_picks_total", labels, GetU(c.session_picks[i]));
  }
  AppendCounter(out, "kvroute_sessions_evicted_total",
                "Session bindings dropped to stay within sessions.max_sessions (idle longest "
                "first).",
                {}, static_cast<double>(sessions_->evicted()));
  AppendHeader(out, "kvroute_scheduling_duration_seconds",
               "Time spent in Scheduler::Pick (health refresh excluded).", MetricType::kHistogram);
  {
    std::array<uint64_t, AtomicHistogram::kBounds.size() + 1> counts;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      counts[i] = c.sched_seconds.counts[i].load(std::memory_order_relaxed);
    }
    metrics::AppendHistogramSeries(out, "kvroute_scheduling_duration_seconds", {},
                                   AtomicHistogram::kBounds, counts, Get(c.sched_seconds.sum));
  }
  AppendHeader(out, "kvroute_plugin_score", "Raw score (0..1) each scorer gave the chosen endpoint.",
               MetricType::kSummary);
  {
    std::lock_guard<std::mutex> lock(counters_->scores_mu);
    for (const auto& [name, s] : c.scores) {
      Label labels[] = {{"plugin", name}};
      AppendSample(out, "kvroute_plugin_score_count", labels, GetU(s->count));
      AppendSample(out, "kvroute_plugin_score_sum", labels, Get(s->sum));
    }
  }
  const double hits = GetU(c.prefix_hit.count);
  AppendGauge(out, "kvroute_prefix_estimated_hit_ratio",
              "Mean prefix-scorer score of the chosen endpoint: the share of each prompt's "
              "blocks the router expects cached there.",
              {}, hits > 0 ? Get(c.prefix_hit.sum) / hits : 0.0);
  AppendCounter(out, "kvroute_config_reloads_total", "Successful configuration reloads.", {},
                static_cast<double>(reloads_ok_.load(std::memory_order_relaxed)));
  AppendCounter(out, "kvroute_config_reload_failures_total",
                "Rejected configuration reloads (the old configuration stayed).", {},
                GetU(c.reloads_failed));
}

void RoutingCore::AppendLocalityMetrics(std::string& out) const {
  const Counters& c = *counters_;
  auto options = options_.load();
  // Locality (docs/REGIONS.md, "Live router").
  AppendHeader(out, "kvroute_locality_picks_total",
               "Committed picks by locality decision (off: no router region or no "
               "locality-filter).",
               MetricType::kCounter);
  double picks = 0, spilled = 0;
  for (std::size_t i = 0; i < sched::kLocalityReasons; ++i) {
    const auto l = static_cast<sched::Locality>(i);
    const double n = GetU(c.locality_picks[i]);
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
              c.spilling.load(std::memory_order_relaxed) ? 1.0 : 0.0);
  AppendCounter(out, "kvroute_locality_spills_started_total",
                "Times the locality-filter's spill mode turned on.", {}, GetU(c.spills_started));
  AppendHeader(out, "kvroute_locality_requests_total",
               "Requests answered, by the region of the endpoint that answered (empty: the "
               "endpoint has no region label and counts as local).",
               MetricType::kCounter);
  {
    std::lock_guard<std::mutex> lock(counters_->regions_mu);
    for (const auto& [region, n] : c.region_requests) {
      Label labels[] = {{"region", region}};
      AppendSample(out, "kvroute_locality_requests_total", labels, GetU(*n));
    }
  }
  AppendHeader(out, "kvroute_locality_rtt_seconds",
               "Round trip to a region: configured (locality.rtt, used) or measured (scrape "
               "round trips, smoothed; used where none is configured).",
               MetricType::kGauge);
  for (const auto& [region, seconds] : options->region_rtt_s) {
    Label labels[] = {{"region", region}, {"source", "configured"}};
    AppendSample(out, "kvroute_locality_rtt_seconds", labels, seconds);
  }
  for (const auto& [region, seconds] : *measured_rtt_.load()) {
    Label labels[] = {{"region", region}, {"source", "measured"}};
    AppendSample(out, "kvroute_locality_rtt_seconds", labels, seconds);
  }
}

void RoutingCore::AppendPdMetrics(std::string& out) const {
  const Counters& c = *counters_;
  // Prefill/decode disaggregation (issue 25).
  AppendHeader(out, "kvroute_pd_decisions_total",
               "Picks in a pool with prefill endpoints, by decision: disaggregate (a prefill "
               "endpoint computes the prompt, the picked one decodes), short_prompt and "
               "cached (below scheduling.pd's prompt_tokens or non_cached_tokens: decode "
               "alone), no_prefill (would disaggregate, no prefill endpoint ready).",
               MetricType::kCounter);
  for (std::size_t i = 1; i < kNumPdDecisions; ++i) {
    Label labels[] = {{"decision", PdDecisionName(static_cast<PdDecision>(i))}};
    AppendSample(out, "kvroute_pd_decisions_total", labels, GetU(c.pd_decisions[i]));
  }
  {
    std::shared_lock<RwSpinLock> lock(sched_mu_);
    const SchedState& s = *sched_;
    auto name = [&](uint32_t id) -> std::string_view {
      const Endpoint* ep = s.table ? s.table->Find(id) : nullptr;
      return ep ? std::string_view(ep->spec.name) : std::string_view();
    };
    AppendHeader(out, "kvroute_pd_pairs_total",
                 "Disaggregated requests (prefill legs sent, retries included) by the pair "
                 "of endpoints: prefill and decode.",
                 MetricType::kCounter);
    for (const auto& [pair, n] : s.pd_pairs) {
      const std::string_view p = name(pair.first), d = name(pair.second);
      if (p.empty() || d.empty()) continue;
      Label labels[] = {{"prefill", p}, {"decode", d}};
      AppendSample(out, "kvroute_pd_pairs_total", labels, static_cast<double>(n));
    }
    AppendHeader(out, "kvroute_pd_prefill_queued_tokens",
                 "Prompt tokens the router sent to a prefill-capable endpoint as prefill "
                 "legs and has not seen answered (the prefill pick's queue term).",
                 MetricType::kGauge);
    for (uint32_t id = 0; id < s.roles.size() && id < s.pd_queued.size(); ++id) {
      if (s.vacant[id] || !PrefillCapable(s.roles[id]) || !s.pd_active) continue;
      const std::string_view n = name(id);
      if (n.empty()) continue;
      Label labels[] = {{"endpoint", n}};
      AppendSample(out, "kvroute_pd_prefill_queued_tokens", labels, s.pd_queued[id]);
    }
  }
}

// Per endpoint: scraped and adjusted load, health, ejections, scrapes, prefix entries.
void RoutingCore::AppendEndpointMetrics(std::string& out, const EndpointTable& table, double now_s) const {
  auto slots = slots_.load();
  auto options = options_.load();
  struct Row {
    const Endpoint* ep;
    health::Verdict v;
    metrics::EngineMetrics m;
    double age;
  };
  std::vector<Row> rows;
  rows.reserve(table.by_id.size());
  for (const auto& ep : table.by_id) {
    if (!ep || ep->id >= slots->size()) continue;
    const Slot& slot = *(*slots)[ep->id];
    Row r{ep.get(), {}, {}, -1.0};
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      r.v = AssessSlot(slot, now_s, options->health);
      r.m = slot.health.last();
      if (slot.health.scraped_at_s() >= 0) r.age = now_s - slot.health.scraped_at_s();
    }
    rows.push_back(r);
  }
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
