// RoutingCore: scrapes in, health out. Published scrape state per endpoint, the sync that
// folds it into the scheduler's view, verdicts, passive outlier ejection and the retry
// budget, and the health-only views (AnyUp, Health, Ready).
#include "core/routing/routing_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "core/routing/core_metrics.h"
#include "core/routing/core_state.h"
#include "core/routing/kv_event_input.h"
#include "core/routing/latency_feed.h"
#include "core/routing/pd_coordinator.h"

namespace kvroute::routing {

void RoutingCore::OnScrape(uint32_t id, const ScrapeResult& result, double now_s) {
  auto slots = slots_.load();
  if (id >= slots->size() || !(*slots)[id]) return;
  Slot& slot = *(*slots)[id];
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (result.ok) {
      // A counter going down means the process restarted (a restarted vLLM starts its
      // counters at zero): whatever the router assumed cached there is gone.
      using F = metrics::EngineMetrics;
      const F& was = slot.health.last();
      const F& now = result.metrics;
      auto fell = [&](F::Field f, double a, double b) { return was.Has(f) && now.Has(f) && b < a; };
      if (fell(F::kPrefixQueries, was.prefix_queries, now.prefix_queries) ||
          fell(F::kPrefixHits, was.prefix_hits, now.prefix_hits) ||
          fell(F::kPreemptions, was.preemptions, now.preemptions)) {
        slot.restarted.store(true, std::memory_order_release);
      }
      slot.health.OnScrape(result.metrics, result.sent_at_s);
    } else {
      slot.health.OnScrapeFailed(result.sent_at_s, result.connect_failed);
    }
  }
  Bump(result.ok ? slot.stats->scrapes_ok : slot.stats->scrapes_failed);
  MarkDirty(id, slot);
}

void RoutingCore::MarkDirty(uint32_t id, Slot& slot) {
  if (!slot.dirty.exchange(true, std::memory_order_acq_rel)) {
    std::lock_guard<std::mutex> lock(dirty_mu_);
    dirty_.push_back(id);
  }
  scrape_epoch_.fetch_add(1, std::memory_order_release);
}

health::Verdict RoutingCore::AssessSlot(const Slot& slot, double now_s,
                                        const health::HealthOptions& h) {
  health::Verdict v = slot.health.Assess(now_s, h);
  if (slot.ejection.Active(now_s)) {
    v.ejected = true;
    v.treatment = health::Treatment::kDown;
  }
  return v;
}

// Folds scrapes that arrived since the last pick into the scheduler's view, and re-judges
// health where something changed or a deadline passed. Caller holds sched_mu_.
void RoutingCore::SyncLocked(double now_s, std::vector<std::string>* logs) {
  SchedState& s = *sched_;
  const uint64_t epoch = scrape_epoch_.load(std::memory_order_acquire);
  const bool time_due = now_s >= s.next_change.load(std::memory_order_relaxed);
  if (epoch == s.seen_epoch.load(std::memory_order_relaxed) && !time_due) return;
  s.seen_epoch.store(epoch, std::memory_order_relaxed);
  s.changed.clear();
  {
    std::lock_guard<std::mutex> lock(dirty_mu_);
    s.changed.swap(dirty_);
  }
  for (uint32_t id : s.changed) {
    if (id >= s.states.size() || s.vacant[id]) continue;
    Slot& slot = *(*s.slots)[id];
    slot.dirty.store(false, std::memory_order_release);
    double scraped_at;
    sched::EndpointState& st = s.states[id];
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      const health::EndpointHealth& h = slot.health;
      st.kv_usage = h.kv_usage();
      st.waiting = h.waiting();
      st.running = h.running();
      st.num_gpu_blocks = h.num_gpu_blocks();
      st.block_size = h.block_size();
      st.engine = h.last();
      st.scrape_ok = h.last_attempt_ok();
      scraped_at = h.scraped_at_s();
    }
    if (scraped_at > st.scraped_at_s) s.scheduler->OnMetricsUpdated(id, scraped_at);
    st.scraped_at_s = scraped_at;
    if (slot.restarted.exchange(false, std::memory_order_acq_rel)) {
      // Forget the prefix model's entries (and released-block estimates) for it; requests
      // in flight there keep their handles until they finish.
      const int64_t dropped = s.scheduler->PrefixEntries(id);
      s.scheduler->OnEndpointRemoved(id);
      latency_->ForgetEndpoint(id);
      Bump(slot.stats->restarts);
      if (logs) {
        logs->push_back("endpoint " + st.name +
                        " restarted (its counters went down): dropped " +
                        std::to_string(std::max<int64_t>(0, dropped)) +
                        " prefix-index entries, its cache is empty");
      }
    }
  }
  // Time-based event states (stale, end of a resync) and expired speculative entries.
  if (events_->active()) events_->Tick(now_s, *s.table, logs);
  // Health depends on every endpoint (last-resort ones are used only when no normal one
  // is left), so re-judge all of them; O(endpoints), once per batch of scrapes.
  RefreshHealthLocked(now_s, logs);
  // Published after the verdicts: which signals are known decides NaN or a value (an
  // endpoint's first scrape would otherwise publish NaN until its next change).
  for (uint32_t id : s.changed) UpdateStatsLocked(id);
}

void RoutingCore::RefreshHealthLocked(double now_s, std::vector<std::string>* logs) {
  SchedState& s = *sched_;
  const std::size_t n = s.states.size();
  std::size_t normal = 0;
  double next = kInf;
  // The engine fields the policy reads (its plugins declare them): hidden while stale.
  const uint32_t consumed = s.scheduler ? s.scheduler->consumed_fields() : 0;
  for (uint32_t id = 0; id < n; ++id) {
    if (s.vacant[id]) continue;
    Slot& slot = *(*s.slots)[id];
    health::Verdict v;
    sched::EndpointState& st = s.states[id];
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      v = AssessSlot(slot, now_s, s.health);
      // Only future moments: a deadline already passed (stale now) must not make every
      // pick re-judge health.
      const double change = slot.health.NextChange(s.health);
      if (change >= now_s) next = std::min(next, change);
      if (slot.ejection.Active(now_s)) next = std::min(next, slot.ejection.until_s());
      // Raw values again: a previous pass may have overwritten them as saturated.
      st.kv_usage = slot.health.kv_usage();
      st.waiting = slot.health.waiting();
      st.running = slot.health.running();
      // Likewise the engine fields a previous pass hid as stale, when st.engine holds the
      // same scrape (a newer one is copied whole by the next sync).
      if (st.scraped_at_s == slot.health.scraped_at_s()) {
        st.engine.present = (st.engine.present & ~consumed) | (slot.health.last().present & consumed);
      }
    }
    if (v.treatment == health::Treatment::kNormal) ++normal;
    if (v != s.verdicts[id] && logs) {
      const health::Verdict& old = s.verdicts[id];
      std::string line = "endpoint " + st.name + ": " + std::string(ConditionName(v.condition));
      if (v.ejected != old.ejected) line += v.ejected ? ", ejected" : ", ejection over";
      for (int k = 0; k < health::kNumSignals; ++k) {
        if (v.known[k] != old.known[k] || (!v.known[k] && v.condition != old.condition)) {
          line += std::string(", ") +
                  std::string(health::SignalName(static_cast<health::Signal>(k))) +
                  (v.known[k] ? " known" : " unknown (missing, NaN, Inf or out of range)");
        }
      }
      line += ", treated as " + std::string(TreatmentName(v.treatment));
      if (v.treatment != old.treatment || v.condition != old.condition || v.ejected != old.ejected ||
          v.Known(health::Signal::kKvUsage) != old.Known(health::Signal::kKvUsage) ||
          v.Known(health::Signal::kWaiting) != old.Known(health::Signal::kWaiting)) {
        logs->push_back(std::move(line));
      }
    }
    s.verdicts[id] = v;
  }
  s.next_change.store(next, std::memory_order_relaxed);
  std::size_t usable = 0;
  for (uint32_t id = 0; id < n; ++id) {
    sched::EndpointState& st = s.states[id];
    if (s.vacant[id]) {
      st.healthy = false;
      continue;
    }
    const health::Verdict& v = s.verdicts[id];
    const bool fresh = v.condition == health::Condition::kUp;
    // A stale scrape's values are not today's: every engine field the policy reads from it
    // (Scheduler::consumed_fields: the adapter lists, the latency model's load features) is
    // unknown, like a stale load, whatever the field. No per-signal rule.
    if (!fresh) st.engine.present &= ~consumed;
    switch (v.treatment) {
      case health::Treatment::kNormal:
        st.healthy = true;
        break;
      case health::Treatment::kDown:
        st.healthy = false;
        break;
      case health::Treatment::kSaturated:
      case health::Treatment::kLastResort:
        st.healthy = v.treatment == health::Treatment::kSaturated || normal == 0;
        // Unknown or stale load counts as full: never attractive.
        if (!fresh || !v.Known(health::Signal::kKvUsage)) st.kv_usage = 1.0;
        if (!fresh || !v.Known(health::Signal::kWaiting)) {
          st.waiting = std::max(st.waiting, health::kSaturatedWaiting);
        }
        break;
    }
    // With prefill endpoints in the pool, a prefill-only one is never a pick's candidate
    // (the decode endpoint is picked; PdCoordinator chooses the prefill one).
    if (pd_->ExcludedFromPicks(id)) st.healthy = false;
    if (st.healthy) ++usable;
  }
  if (usable > 0) return;
  // Panic: nothing else is usable, so ejected endpoints that still accept connections
  // serve as a last resort (full load, never attractive) rather than refusing everything.
  for (uint32_t id = 0; id < n; ++id) {
    const health::Verdict& v = s.verdicts[id];
    if (s.vacant[id] || !v.ejected || v.condition == health::Condition::kDown) continue;
    if (pd_->ExcludedFromPicks(id)) continue;
    sched::EndpointState& st = s.states[id];
    st.healthy = true;
    st.kv_usage = 1.0;
    st.waiting = std::max(st.waiting, health::kSaturatedWaiting);
  }
}

void RoutingCore::UpdateStatsLocked(uint32_t id) {
  SchedState& s = *sched_;
  if (id >= s.states.size() || s.vacant[id]) return;
  const sched::EndpointState& st = s.states[id];
  const sched::InflightTracker& t = s.scheduler->inflight();
  EndpointStats& stats = *(*s.slots)[id]->stats;
  const double capacity = st.num_gpu_blocks > 0
                              ? static_cast<double>(st.num_gpu_blocks)
                              : static_cast<double>(sched::SchedulerOptions{}.default_num_gpu_blocks);
  sched::EndpointLoad adj = t.Load(st, capacity, true);
  const health::Verdict& v = s.verdicts[id];
  Set(stats.kv_adjusted, v.Known(health::Signal::kKvUsage) ? adj.kv_usage : kNaN);
  Set(stats.waiting_adjusted, v.Known(health::Signal::kWaiting) ? adj.waiting : kNaN);
  Set(stats.inflight, static_cast<double>(adj.inflight));
  Set(stats.prefix_entries, static_cast<double>(s.scheduler->PrefixEntries(id)));
  stats.adapter_bound.store(metrics::AdapterBound(st.engine), std::memory_order_relaxed);
}

void RoutingCore::OnUpstreamFailure(uint32_t endpoint_id, const UpstreamFailure& failure,
                                    double now_s) {
  auto slots = slots_.load();
  if (endpoint_id >= slots->size() || !(*slots)[endpoint_id]) return;
  Slot& slot = *(*slots)[endpoint_id];
  {
    std::lock_guard<std::mutex> lock(slot.stats->errors_mu);
    auto it = slot.stats->errors.find(failure.kind);
    if (it == slot.stats->errors.end()) it = slot.stats->errors.emplace(std::string(failure.kind), 0).first;
    ++it->second;
  }
  if (failure.connect_failed) {
    std::lock_guard<std::mutex> lock(slot.mu);
    slot.health.OnConnectFailed(now_s);
  }
  auto options = options_.load();
  const int threshold = options->outlier.consecutive_failures;
  const uint32_t failures = slot.consecutive_failures.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (threshold > 0 && failures >= static_cast<uint32_t>(threshold)) {
    MaybeEject(endpoint_id, slot, failure.kind, now_s);
  }
  if (failure.connect_failed) MarkDirty(endpoint_id, slot);
}

void RoutingCore::MaybeEject(uint32_t id, Slot& slot, std::string_view kind, double now_s) {
  auto options = options_.load();
  auto slots = slots_.load();
  auto table = table_.load();
  std::string line;
  {
    std::lock_guard<std::mutex> eject_lock(eject_mu_);
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      if (slot.ejection.Active(now_s)) return;  // already out; failures of old attempts
    }
    std::size_t pool = 0, ejected = 0;
    for (const auto& ep : table->by_id) {
      if (!ep || ep->id >= slots->size() || !(*slots)[ep->id]) continue;
      ++pool;
      const Slot& other = *(*slots)[ep->id];
      std::lock_guard<std::mutex> lock(other.mu);
      if (other.ejection.Active(now_s)) ++ejected;
    }
    const Endpoint* ep = table->Find(id);
    const std::string name = ep ? ep->spec.name : std::to_string(id);
    const uint32_t failures = slot.consecutive_failures.load(std::memory_order_acquire);
    if (!health::EjectionAllowed(ejected, pool, options->outlier)) {
      // Counted once per threshold crossing: start the count over so the next skip is
      // another run of failures, not every failure from here on.
      slot.consecutive_failures.store(0, std::memory_order_release);
      metrics_->CountEjectionSkipped();
      line = "endpoint " + name + ": " + std::to_string(failures) +
             " consecutive failures (last " + std::string(kind) + "), not ejected: " +
             std::to_string(ejected) + " of " + std::to_string(pool) +
             " endpoints already are (max_ejection_percent)";
    } else {
      double until;
      uint64_t count;
      {
        std::lock_guard<std::mutex> lock(slot.mu);
        until = slot.ejection.Eject(now_s, options->outlier);
        count = slot.ejection.count();
      }
      slot.consecutive_failures.store(0, std::memory_order_release);
      Bump(slot.stats->ejections);
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.3g", until - now_s);
      line = "endpoint " + name + ": ejected for " + secs + " s after " +
             std::to_string(failures) + " consecutive failures (last " + std::string(kind) +
             "), ejection #" + std::to_string(count);
    }
  }
  MarkDirty(id, slot);
  if (log_) log_(line);
}

void RoutingCore::OnAttemptSucceeded(uint32_t endpoint_id) {
  auto slots = slots_.load();
  if (endpoint_id >= slots->size() || !(*slots)[endpoint_id]) return;
  std::atomic<uint32_t>& c = (*slots)[endpoint_id]->consecutive_failures;
  if (c.load(std::memory_order_relaxed) != 0) c.store(0, std::memory_order_relaxed);
}

bool RoutingCore::AllowRetry(double now_s, bool free) {
  if (free) {
    metrics_->CountRetry(true);
    return true;
  }
  bool ok;
  {
    std::unique_lock<RwSpinLock> lock(sched_mu_);
    ok = sched_->budget.TryRetry(now_s, sched_->budget_options);
  }
  if (ok) {
    metrics_->CountRetry(false);
  } else {
    metrics_->CountRetryDenied();
  }
  return ok;
}

std::size_t RoutingCore::AnyUsable(double now_s, uint32_t* out, std::size_t max) {
  std::vector<std::string> logs;
  std::size_t k = 0;
  {
    std::unique_lock<RwSpinLock> lock(sched_mu_);
    SchedState& s = *sched_;
    SyncLocked(now_s, &logs);
    const std::size_t n = s.states.size();
    const std::size_t first = n ? models_rr_.fetch_add(1, std::memory_order_relaxed) % n : 0;
    for (std::size_t j = 0; j < n && k < max; ++j) {
      std::size_t id = (first + j) % n;
      if (s.states[id].healthy) out[k++] = static_cast<uint32_t>(id);
    }
  }
  if (!logs.empty()) Log(logs);
  return k;
}

uint32_t RoutingCore::AnyUp(double now_s) const {
  auto table = table_.load();
  const std::size_t n = table->by_id.size();
  if (n == 0) return kNoEndpoint;
  const std::size_t first = models_rr_.fetch_add(1, std::memory_order_relaxed) % n;
  for (std::size_t j = 0; j < n; ++j) {
    const uint32_t id = static_cast<uint32_t>((first + j) % n);
    if (table->Find(id) && Health(id, now_s).treatment != health::Treatment::kDown) return id;
  }
  return kNoEndpoint;
}

health::Verdict RoutingCore::Health(uint32_t id, double now_s) const {
  auto slots = slots_.load();
  auto options = options_.load();
  if (id >= slots->size() || !(*slots)[id]) {
    health::Verdict v;
    v.condition = health::Condition::kDown;
    v.treatment = health::Treatment::kDown;
    return v;
  }
  const Slot& slot = *(*slots)[id];
  std::lock_guard<std::mutex> lock(slot.mu);
  return AssessSlot(slot, now_s, options->health);
}

bool RoutingCore::Ready(double now_s) const {
  auto table = table_.load();
  for (const auto& ep : table->by_id) {
    if (ep && Health(ep->id, now_s).condition == health::Condition::kUp) return true;
  }
  return false;
}

}  // namespace kvroute::routing
