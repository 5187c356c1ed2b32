// RoutingCore: views of the pool from published state (the picker's load and gauges),
// flow control's probes (prefix chain, held blocks, the TTFT objective's wait budget), and
// the /metrics exposition: the sections in their order, each written by the component
// that owns its figures (CoreMetrics for the core's own).
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
#include "core/routing/session_affinity.h"

namespace kvroute::routing {

namespace {

// Calls fn(endpoint, its slot) for every endpoint of `table` that has a slot in `slots`.
template <typename Table, typename Slots, typename Fn>
void ForEachSlot(const Table& table, const Slots& slots, Fn&& fn) {
  for (const auto& ep : table.by_id) {
    if (!ep || ep->id >= slots.size() || !slots[ep->id]) continue;
    fn(ep.get(), *slots[ep->id]);
  }
}

}  // namespace

double RoutingCore::Moments::StdDev() const {
  if (n < 2) return 0.0;
  const double mean = Mean();
  return std::sqrt(std::max(0.0, sum_sq / static_cast<double>(n) - mean * mean));
}

RoutingCore::PoolGauges RoutingCore::Gauges(double now_s) {
  const PoolLoad load = Load(now_s);  // folds in pending scrapes, as the other pool figures do
  PoolGauges g;
  g.saturated = load.saturated;
  auto table = table_.load();
  auto slots = slots_.load();
  auto options = options_.load();
  ForEachSlot(*table, *slots, [&](const Endpoint* ep, const Slot& slot) {
    health::Verdict v;
    metrics::EngineMetrics m;
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      v = AssessSlot(slot, now_s, options->health);
      m = slot.health.last();
    }
    if (v.condition != health::Condition::kUp || v.ejected || v.treatment == health::Treatment::kDown) return;
    ++g.ready;
    const double kv = Get(ep->stats->kv_adjusted);
    const double waiting = Get(ep->stats->waiting_adjusted);
    const bool waiting_known = v.Known(health::Signal::kWaiting) && std::isfinite(waiting);
    if (v.Known(health::Signal::kKvUsage) && std::isfinite(kv)) g.kv_usage.Add(kv);
    if (waiting_known) g.waiting.Add(waiting);
    if (v.Known(health::Signal::kRunning) && std::isfinite(m.running)) g.running.Add(m.running);
    g.queues.push_back({ep->spec.name, ep->spec.address, waiting_known ? waiting : kNaN});
  });
  return g;
}

void RoutingCore::FoldPendingScrapes(double now_s) {
  if (!SyncDue(now_s)) return;
  std::vector<std::string> logs;
  {
    std::unique_lock<RwSpinLock> lock(sched_mu_);
    SyncLocked(now_s, &logs);
  }
  if (!logs.empty()) Log(logs);
}

RoutingCore::PoolLoad RoutingCore::Load(double now_s) {
  // Fold in the scrapes since the last pick first, as a pick would: the adjusted loads
  // read below are published by that sync.
  FoldPendingScrapes(now_s);
  PoolLoad load;
  auto table = table_.load();
  for (const auto& ep : table->by_id) {
    if (!ep) continue;
    ++load.endpoints;
    const health::Verdict v = Health(ep->id, now_s);
    if (v.condition != health::Condition::kUp || v.ejected ||
        v.treatment == health::Treatment::kDown) {
      continue;
    }
    ++load.ready;
    const double kv = Get(ep->stats->kv_adjusted);
    const double waiting = Get(ep->stats->waiting_adjusted);
    bool saturated = false;
    if (v.Known(health::Signal::kKvUsage) && std::isfinite(kv)) {
      load.kv_usage_sum += kv;
      ++load.kv_known;
      saturated = saturated || kv >= 0.8;
    }
    // A queue of requests waiting for an adapter slot is not saturation: the engine takes
    // one more as a slot frees (room 1, as for an unknown queue).
    const bool adapter_bound = ep->stats->adapter_bound.load(std::memory_order_relaxed);
    const bool queue_known = v.Known(health::Signal::kWaiting) && std::isfinite(waiting);
    if (queue_known) {
      load.waiting_sum += waiting;
      ++load.waiting_known;
      saturated = saturated || (waiting >= 5.0 && !adapter_bound);
    }
    if (saturated) {
      ++load.saturated;
    } else {
      const int64_t r = queue_known && !(adapter_bound && waiting >= 5.0)
                            ? static_cast<int64_t>(std::ceil(5.0 - waiting))
                            : 1;
      load.room += r;
      if (r > load.max_room) {
        load.max_room = r;
        load.roomiest = ep->id;
      }
    }
  }
  return load;
}

void RoutingCore::PeerSignals(double now_s, std::vector<PeerSignal>& out) {
  out.clear();
  FoldPendingScrapes(now_s);
  auto table = table_.load();
  auto slots = slots_.load();
  auto options = options_.load();
  ForEachSlot(*table, *slots, [&](const Endpoint* ep, const Slot& slot) {
    PeerSignal p;
    p.id = ep->id;
    health::Verdict v;
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      v = AssessSlot(slot, now_s, options->health);
      p.scraped_at_s = slot.health.scraped_at_s();
      p.kv_known = v.Known(health::Signal::kKvUsage);
      p.waiting_known = v.Known(health::Signal::kWaiting);
      p.kv_usage = slot.health.kv_usage();
      p.waiting = slot.health.waiting();
    }
    if (v.ejected || v.treatment == health::Treatment::kDown) return;
    out.push_back(p);
  });
  std::shared_lock<RwSpinLock> lock(sched_mu_);
  if (sched_->scheduler == nullptr) return;
  for (PeerSignal& p : out) p.active_prefill_tokens = sched_->scheduler->ActivePrefillTokens(p.id);
}

void RoutingCore::PrefixKey(const sched::SchedRequest& request, std::vector<uint64_t>& out) const {
  std::shared_lock<RwSpinLock> lock(sched_mu_);
  if (sched_->scheduler == nullptr) {
    out.clear();
    return;
  }
  sched_->scheduler->PrefixKey(request, out);
}

std::size_t RoutingCore::HeldBlocks(std::span<const uint64_t> key, uint32_t endpoint_id) const {
  if (key.empty()) return 0;
  std::shared_lock<RwSpinLock> lock(sched_mu_);
  return sched_->scheduler == nullptr ? 0 : sched_->scheduler->HeldBlocks(key, endpoint_id);
}

std::optional<RoutingCore::SloBudget> RoutingCore::SloWaitBudget(const sched::SchedRequest& request,
                                                 std::span<const uint64_t> key) const {
  std::shared_lock<RwSpinLock> lock(sched_mu_);
  const SchedState& s = *sched_;
  const double objective = request.slo_ttft_s > 0 ? request.slo_ttft_s : latency_->default_ttft_s();
  if (!(objective > 0) || !std::isfinite(objective)) return std::nullopt;
  // The ready endpoint holding most of the chain: where the policy's pick likely lands.
  uint32_t best = kNoEndpoint;
  std::size_t best_held = 0;
  uint32_t best_queued = 0;
  for (uint32_t id = 0; id < s.states.size(); ++id) {
    if (id < s.vacant.size() && s.vacant[id]) continue;
    if (id >= s.verdicts.size()) continue;
    const health::Verdict& v = s.verdicts[id];
    if (v.condition != health::Condition::kUp || v.ejected ||
        v.treatment == health::Treatment::kDown) {
      continue;
    }
    const std::size_t held =
        key.empty() || s.scheduler == nullptr ? 0 : s.scheduler->HeldBlocks(key, id);
    const uint32_t queued = latency_->trainer().QueuedRequests(id);
    if (best == kNoEndpoint || held > best_held || (held == best_held && queued < best_queued)) {
      best = id;
      best_held = held;
      best_queued = queued;
    }
  }
  double predicted = 0.0;
  bool known = false;
  if (best != kNoEndpoint) {
    const double cached = key.empty() ? 0.0 : static_cast<double>(best_held) / key.size();
    const auto p = latency_->trainer().PredictTtft(
        sched::LatencyTrainer::DispatchOf(request, s.states[best], cached));
    if (p && std::isfinite(*p) && *p >= 0) {
      predicted = *p;
      known = true;
    }
  }
  return SloBudget{std::max(0.0, objective - predicted), known, objective};
}

void RoutingCore::AppendMetrics(std::string& out, double now_s) const {
  auto table = table_.load();
  metrics_->AppendRequests(out, *table);
  latency_->AppendMetrics(out);
  {
    std::shared_lock<RwSpinLock> lock(sched_mu_);
    metrics_->AppendPluginTimings(out, sched_->scheduler.get());
  }
  metrics_->AppendFailures(out);
  sessions_->AppendMetrics(out, now_s);  // sweeps expired sessions first
  metrics_->AppendScoring(out);
  metrics_->AppendLocality(out, options_.load()->region_rtt_s, *measured_rtt_.load());
  pd_->AppendDecisionMetrics(out);
  {
    std::shared_lock<RwSpinLock> lock(sched_mu_);
    pd_->AppendPairMetrics(out, sched_->view());
  }
  AppendEndpointMetrics(out, *table, now_s);
  if (events_->active()) events_->AppendMetrics(out, *table, now_s);
}

void RoutingCore::AppendEndpointMetrics(std::string& out, const EndpointTable& table, double now_s) const {
  auto slots = slots_.load();
  auto options = options_.load();
  std::vector<CoreMetrics::EndpointRow> rows;
  rows.reserve(table.by_id.size());
  for (const auto& ep : table.by_id) {
    if (!ep || ep->id >= slots->size()) continue;
    const Slot& slot = *(*slots)[ep->id];
    CoreMetrics::EndpointRow r{ep.get(), {}, {}, -1.0};
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      r.v = AssessSlot(slot, now_s, options->health);
      r.m = slot.health.last();
      if (slot.health.scraped_at_s() >= 0) r.age = now_s - slot.health.scraped_at_s();
    }
    rows.push_back(r);
  }
  metrics_->AppendEndpoints(out, rows);
}

}  // namespace kvroute::routing
