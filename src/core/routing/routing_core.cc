#include "core/routing/routing_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <unordered_map>

#include "core/sched/lora.h"
#include "core/sched/plugin.h"
#include "core/sched/registry.h"
#include "core/metrics/prom_writer.h"
#include "core/routing/core_metrics.h"
#include "core/routing/core_state.h"
#include "core/routing/kv_event_input.h"
#include "core/routing/latency_feed.h"
#include "core/routing/pd_coordinator.h"
#include "core/routing/session_affinity.h"

namespace kvroute::routing {


namespace {

bool Configured(const CoreOptions& options, std::string_view region) {
  return std::any_of(options.region_rtt_s.begin(), options.region_rtt_s.end(),
                     [&](const auto& r) { return r.first == region; });
}

}  // namespace

RoutingCore::RoutingCore(std::function<void(std::string_view)> log)
    : log_(std::move(log)), sched_(std::make_unique<SchedState>()),
      scratch_(std::make_unique<ScratchPool>()) {
  table_.store(std::make_shared<const EndpointTable>());
  slots_.store(std::make_shared<const std::vector<std::shared_ptr<Slot>>>());
  options_.store(std::make_shared<const CoreOptions>());
  measured_rtt_.store(std::make_shared<const std::vector<std::pair<std::string, double>>>());
  events_ = std::make_unique<KvEventInput>();
  pd_ = std::make_unique<PdCoordinator>();
  sessions_ = std::make_unique<SessionAffinity>();
  latency_ = std::make_unique<LatencyFeed>();
  metrics_ = std::make_unique<CoreMetrics>();
}

RoutingCore::~RoutingCore() = default;

// ---- the components' figures ----

uint64_t RoutingCore::session_picks(SessionOutcome outcome) const { return sessions_->picks(outcome); }
std::size_t RoutingCore::sessions() const { return sessions_->size(); }
LatencyStats RoutingCore::latency_stats() const { return latency_->stats(); }
uint64_t RoutingCore::reloads() const { return metrics_->reloads(); }

void RoutingCore::Log(std::vector<std::string>& logs) {
  if (log_) {
    for (const std::string& l : logs) log_(l);
  }
  logs.clear();
}

std::string_view RoutingCore::policy() const {
  std::shared_lock<RwSpinLock> lock(sched_mu_);
  return sched_->scheduler ? sched_->scheduler->policy() : std::string_view();
}

// ---- configuration ----

// Configure's endpoint table before it is published: ids assigned, slots kept or made.
struct RoutingCore::NewTable {
  std::shared_ptr<EndpointTable> table;
  std::shared_ptr<std::vector<std::shared_ptr<Slot>>> slots;
  std::vector<uint8_t> taken;  // by id: an endpoint of the new set holds it
};

// Surviving addresses keep their ids (and slots, stats, prefix entries, accounting); new
// endpoints take vacant ids with nothing in flight, else new ones.
RoutingCore::NewTable RoutingCore::AssignIds(std::vector<EndpointSpec> endpoints,
                                             const EndpointTable& old_table_ref) {
  const EndpointTable* old_table = &old_table_ref;
  auto old_slots = slots_.load();
  std::unordered_map<std::string, uint32_t> old_ids;
  for (const auto& ep : old_table->by_id) {
    if (ep) old_ids.emplace(ep->spec.address, ep->id);
  }
  auto table = std::make_shared<EndpointTable>();
  table->version = old_table->version + 1;
  auto slots = std::make_shared<std::vector<std::shared_ptr<Slot>>>();
  std::vector<uint8_t> taken;
  std::vector<std::size_t> fresh;  // positions in `endpoints` needing an id
  std::vector<uint32_t> ids(endpoints.size());
  auto grow = [&](std::size_t n) {
    if (table->by_id.size() < n) {
      table->by_id.resize(n);
      slots->resize(n);
      taken.resize(n, 0);
    }
  };
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    auto it = old_ids.find(endpoints[i].address);
    if (it == old_ids.end()) {
      fresh.push_back(i);
      continue;
    }
    ids[i] = it->second;
    grow(ids[i] + 1);
    taken[ids[i]] = 1;
    (*slots)[ids[i]] = (*old_slots)[ids[i]];
  }
  uint32_t next_free = 0;
  for (std::size_t i : fresh) {
    uint32_t id = next_free;
    for (;; ++id) {
      if (id < taken.size() && taken[id]) continue;
      const Endpoint* prev = old_table->Find(id);
      bool busy = prev && old_ids.count(prev->spec.address) == 0 &&
                  Get(prev->stats->inflight) > 0;  // removed, still finishing requests
      if (!busy) break;
    }
    next_free = id + 1;
    ids[i] = id;
    grow(id + 1);
    taken[id] = 1;
    (*slots)[id] = std::make_shared<Slot>();
  }
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    auto ep = std::make_shared<Endpoint>();
    ep->id = ids[i];
    ep->stats = (*slots)[ids[i]]->stats;
    ep->spec = std::move(endpoints[i]);
    table->by_id[ids[i]] = std::move(ep);
  }
  metrics_->BindRegions(*table);

  return NewTable{std::move(table), std::move(slots), std::move(taken)};
}

Status RoutingCore::Configure(const CoreOptions& options, std::vector<EndpointSpec> endpoints,
                              double now_s) {
  std::lock_guard<std::mutex> config_lock(config_mu_);
  sched::SchedulerOptions so;
  so.seed = options.seed;
  so.max_ranked = std::clamp<std::size_t>(options.max_ranked, 1, kMaxRanked);
  so.region = options.region;
  so.region_rtt_s = options.region_rtt_s;
  sched::BuildResult built;
  if (options.scheduler_factory) {
    built.scheduler = options.scheduler_factory(so);
  } else {
    built = sched::BuildScheduler(options.scheduling, so);
  }
  if (!built.ok()) {
    return Status::InvalidArgument(built.error ? built.error->field + ": " + built.error->message
                                               : "scheduling: cannot build the scheduler");
  }
  std::unordered_map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    EndpointSpec& e = endpoints[i];
    if (e.name.empty()) e.name = e.address;
    if (!seen.emplace(e.address, i).second) {
      return Status::InvalidArgument("pool.endpoints[" + std::to_string(i) + "]: address " +
                                     e.address + " is listed twice");
    }
  }

  auto old_table = table_.load();
  NewTable next = AssignIds(std::move(endpoints), *old_table);
  const std::shared_ptr<EndpointTable>& table = next.table;
  const std::shared_ptr<std::vector<std::shared_ptr<Slot>>>& slots = next.slots;
  const std::vector<uint8_t>& taken = next.taken;
  std::unique_ptr<sched::Scheduler> old_scheduler;
  std::vector<std::string> logs;
  {
    std::unique_lock<RwSpinLock> lock(sched_mu_);
    SchedState& s = *sched_;
    if (s.scheduler) {
      built.scheduler->AdoptStateFrom(*s.scheduler);
      for (uint32_t id = 0; id < s.states.size(); ++id) {
        if (id < s.vacant.size() && s.vacant[id]) continue;
        const Endpoint* prev = old_table->Find(id);
        bool survives = prev && id < taken.size() && taken[id] && table->by_id[id] &&
                        table->by_id[id]->spec.address == prev->spec.address;
        if (prev && !survives) {
          built.scheduler->OnEndpointRemoved(id);
          latency_->ForgetEndpoint(id);
        }
      }
    }
    old_scheduler = std::move(s.scheduler);
    s.scheduler = std::move(built.scheduler);
    s.scheduler->set_plugin_timer(&s.timer);
    // The concurrent picks' tie-breaks follow the configured seed (a reload with the same
    // seed keeps their streams going).
    if (scratch_->seed != options.seed) scratch_->Reseed(options.seed);
    // AdoptStateFrom keeps no round trip set by SetRegionRtt: measured values again,
    // except for regions the configuration names (configured wins).
    for (const auto& [region, seconds] : *measured_rtt_.load()) {
      if (!Configured(options, region)) s.scheduler->SetRegionRtt(region, seconds);
    }
    const std::size_t n = table->by_id.size();
    s.states.resize(n);
    s.verdicts.resize(n);
    s.vacant.assign(n, 1);
    for (uint32_t id = 0; id < n; ++id) {
      sched::EndpointState& st = s.states[id];
      const Endpoint* ep = table->Find(id);
      if (!ep) {
        st = sched::EndpointState();
        st.id = id;
        st.healthy = false;
        continue;
      }
      s.vacant[id] = 0;
      const Endpoint* prev = old_table->Find(id);
      if (!prev || prev->spec.address != ep->spec.address) {
        st = sched::EndpointState();
        s.verdicts[id] = health::Verdict();
        // Fold its (empty) health in at the next sync. On the dirty list too: a flag set
        // without the list entry would stop every later scrape of it being folded in
        // (OnScrape lists an id only when it sets the flag).
        if (!(*slots)[id]->dirty.exchange(true)) {
          std::lock_guard<std::mutex> dirty_lock(dirty_mu_);
          dirty_.push_back(id);
        }
      }
      st.id = id;
      st.name = ep->spec.name;
      st.SetLabels(ep->spec.labels);
    }
    pd_->Configure(options.pd, *table, *old_table);
    s.table = table;
    s.slots = slots;
    s.health = options.health;
    s.budget_options = options.retry_budget;
    latency_->SetObjectives(options.default_slo_ttft_s, options.default_slo_tpot_s);
    s.max_ranked = so.max_ranked;
    s.next_change.store(-kInf);  // full health pass at the next pick
    s.seen_epoch.store(~uint64_t{0});
    ++s.generation;
    metrics_->OnSchedulerChanged();
    table_.store(table);
    slots_.store(slots);
    options_.store(std::make_shared<const CoreOptions>(options));
    // Bindings survive: an id keeps its endpoint id while its address survives.
    sessions_->Configure(options.sessions);
    for (uint32_t id = 0; id < n; ++id) {
      if (!s.vacant[id]) UpdateStatsLocked(id);
    }
  }
  events_->Configure(options.kv_events, *table, *old_table, now_s, logs);
  if (old_scheduler) {
    metrics_->CountReload();
    logs.push_back("configuration applied: " + std::to_string(table->by_id.size()) +
                   " endpoint ids, policy " + std::string(policy()));
  }
  Log(logs);
  return Status::Ok();
}

// ---- picks ----

namespace {

std::string_view Trim(std::string_view v) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return v;
}

}  // namespace

bool RoutingCore::SyncDue(double now_s) const {
  const SchedState& s = *sched_;
  return scrape_epoch_.load(std::memory_order_acquire) !=
             s.seen_epoch.load(std::memory_order_relaxed) ||
         now_s >= s.next_change.load(std::memory_order_relaxed);
}

std::size_t RoutingCore::RankLocked(const PickRequest& request, const sched::PickResult& r,
                                    PickResult& out) const {
  const SchedState& s = *sched_;
  const std::size_t limit = s.max_ranked;
  auto add = [&](uint32_t id) {
    for (std::size_t k = 0; k < out.n_ranked; ++k) {
      if (out.ranked[k] == id) return;
    }
    out.ranked[out.n_ranked++] = id;
  };
  std::string_view hint = request.hint;
  while (!hint.empty() && out.n_ranked < limit) {
    std::size_t comma = hint.find(',');
    std::string_view item = Trim(hint.substr(0, comma));
    hint = comma == std::string_view::npos ? std::string_view() : hint.substr(comma + 1);
    for (uint32_t id = 0; id < s.states.size() && out.n_ranked < limit; ++id) {
      const Endpoint* ep = s.table->Find(id);
      if (!ep || s.verdicts[id].treatment == health::Treatment::kDown) continue;
      if (ep->spec.address == item || ep->spec.name == item) add(id);
    }
  }
  const std::size_t hinted = out.n_ranked;
  for (uint32_t id : r.ranked) {
    if (out.n_ranked == limit) break;
    add(id);
  }
  return hinted;
}

PickResult RoutingCore::Pick(const PickRequest& request, double now_s) {
  PickResult out;
  std::vector<std::string> logs;  // stays empty (no allocation) unless health changed
  if (SyncDue(now_s)) {
    std::unique_lock<RwSpinLock> lock(sched_mu_);
    SyncLocked(now_s, &logs);
  }
  ScratchLease lease(*scratch_);
  sched::PickScratch& sc = lease.get();
  sched::PickStatus status = sched::PickStatus::kNoHealthyEndpoint;
  bool concurrent = false;
  bool configured = false;
  uint64_t generation = 0;
  sched::PickResult r;
  double pick_s = -1.0;
  // The request as the scheduler sees it: with the precise index and its keys when
  // events are configured and the front end tokenized the prompt.
  sched::SchedRequest req = request.request;
  // The session's binding and token, read before any scheduler lock (the table has its own).
  SessionAffinity::Lookup session;
  sessions_->LookUp(request, now_s, session);
  std::size_t hinted = 0;
  // A request with a cache_salt shares no block with unsalted ones in the engine (the
  // salt is in its first block's hash), and the events do not carry salts: precise state
  // would over-predict, so such requests use the approximate model (its keys hold the salt).
  const bool precise = !req.token_ids.empty() && req.cache_salt.empty() &&
                       events_->active();
  sc.event_keys.clear();
  std::shared_lock<RwSpinLock> events_lock = events_->DeferredLock();
  // An adapter request's keys are rooted in the adapter's name, as vLLM's block hashes
  // carry it in their extra keys and the index roots reported chains in lora_name; a
  // base-model request's in "" (sched::AdapterRequestKey decides, as the
  // lora-affinity-scorer does).
  auto with_events = [&](const SchedState& s, std::span<const sched::EndpointState> states) {
    if (!precise) return;
    const bool adapter =
        sched::AdapterRequestKey(req.model, states, now_s, s.health.staleness_s) != 0;
    req.events = events_->KeysForPick(events_lock, adapter ? req.model : std::string_view(),
                                      req.token_ids, &sc.event_keys);
    req.event_keys = sc.event_keys;
  };
  // The latency model and the request's objectives (the pool default where it states
  // none), for pickers that use predictions; under sched_mu_, shared or exclusive.
  auto with_latency = [&]() { latency_->Prepare(req); };
  {
    // Rank concurrently with other picks when the policy allows it.
    std::shared_lock<RwSpinLock> lock(sched_mu_);
    const SchedState& s = *sched_;
    configured = s.scheduler != nullptr;
    if (configured && s.scheduler->concurrent_picks() && request.only.empty()) {
      concurrent = true;
      generation = s.generation;
      out.table = s.table;
      with_events(s, s.states);
      with_latency();
      const double t0 = s.timer ? s.timer() : 0.0;
      r = s.scheduler->Rank(req, s.states, now_s, sc);
      if (events_lock.owns_lock()) events_lock.unlock();
      if (s.timer) pick_s = s.timer() - t0;
      status = r.status;
      if (r.ok()) hinted = RankLocked(request, r, out);
    }
  }
  if (!configured) {
    out.status = Status::Unavailable("no endpoint is configured");
    return out;
  }
  {
    std::unique_lock<RwSpinLock> lock(sched_mu_);
    SchedState& s = *sched_;
    if (concurrent) {
      if (s.generation != generation) {
        // A reload swapped the scheduler while this pick ranked: commit to the new one
        // (it adopted the old one's requests), without the old plugin layout's hashes.
        for (auto& h : sc.pending.hashes) h.clear();
      }
      if (r.ok()) out.handle = s.scheduler->Commit(sc, s.states);
      metrics_->CountLocality(*s.scheduler, r);
      if (s.generation == generation) metrics_->RecordPick(*s.scheduler, r, pick_s);
    } else {
      SyncLocked(now_s, &logs);
      out.table = s.table;
      std::span<const sched::EndpointState> states = s.states;
      // A subset pick sees only the subset's states (ids stay distinct; the scheduler's
      // per-id tables are indexed by EndpointState::id, not by position).
      thread_local std::vector<sched::EndpointState> subset;
      if (!request.only.empty()) {
        subset.clear();
        for (uint32_t id : request.only) {
          if (id >= s.states.size() || (id < s.vacant.size() && s.vacant[id])) continue;
          bool dup = false;
          for (const sched::EndpointState& e : subset) dup = dup || e.id == id;
          if (!dup) subset.push_back(s.states[id]);
        }
        states = subset;
      }
      with_events(s, states);
      with_latency();
      const double t0 = s.timer ? s.timer() : 0.0;
      r = s.scheduler->Pick(req, states, now_s);
      if (s.timer) pick_s = s.timer() - t0;
      if (events_lock.owns_lock()) events_lock.unlock();
      status = r.status;
      if (r.ok()) {
        out.handle = r.handle;
        hinted = RankLocked(request, r, out);
      }
      metrics_->CountLocality(*s.scheduler, r);
      metrics_->RecordPick(*s.scheduler, r, pick_s);
    }
    s.budget.OnRequest(now_s, s.budget_options);
    if (session.active && status == sched::PickStatus::kOk && out.n_ranked > 0) {
      sessions_->Place(request, r, hinted, s.view(), session, out);
    }
    if (pd_->active() && req.disaggregable && status == sched::PickStatus::kOk && out.n_ranked > 0) {
      PdLocked(req, r, out);
    }
    if (status != sched::PickStatus::kOk) {
      metrics_->CountPickFailed();
    } else if (request.dispatch_first && out.n_ranked > 0) {
      DispatchFirstLocked(req, r, out, now_s);
    }
  }
  if (out.dispatched && !sc.event_keys.empty()) {
    out.predicted_cached_tokens = events_->OnDispatched(sc.event_keys, req.token_ids.size(), out.ranked[0], now_s);
  }
  if (session.active && !request.session_id.empty() && out.n_ranked > 0 && status == sched::PickStatus::kOk) {
    sessions_->Bind(session, now_s);
  }
  if (!logs.empty()) Log(logs);
  out.locality = r.locality;
  if (status == sched::PickStatus::kOk) return out;
  out.status = Status::Unavailable(status == sched::PickStatus::kAllFiltered
                                       ? "every endpoint is saturated or filtered out"
                                       : "no healthy endpoint is available");
  return out;
}

void RoutingCore::DispatchFirstLocked(const sched::SchedRequest& req, const sched::PickResult& r,
                                      PickResult& out, double now_s) {
  SchedState& s = *sched_;
  s.scheduler->OnDispatched(out.handle, out.ranked[0], now_s);
  UpdateStatsLocked(out.ranked[0]);
  out.dispatched = true;
  const LatencyFeed::PrefillLeg leg{out.prefill, out.prefill_tokens};
  const LatencyFeed::Predicted p =
      latency_->OnPickDispatched(req, out.handle, s.states, out.ranked[0], CachedShareLocked(r, out.ranked[0]),
                                 out.disaggregated() ? &leg : nullptr, now_s);
  out.predicted_ttft_s = p.ttft_s;
  out.predicted_tpot_s = p.tpot_s;
}

void RoutingCore::OnDispatched(sched::RequestHandle handle, uint32_t endpoint_id, double now_s) {
  if (handle == sched::kNoHandle) return;
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  SchedState& s = *sched_;
  s.scheduler->OnDispatched(handle, endpoint_id, now_s);
  UpdateStatsLocked(endpoint_id);
  latency_->OnRedispatched(handle, endpoint_id, now_s);
  // A re-dispatch moved the request off another endpoint: refresh that one's published
  // gauges too (found by comparing counts: the scheduler does not say where it was).
  const sched::InflightTracker& t = s.scheduler->inflight();
  for (uint32_t id = 0; id < s.states.size(); ++id) {
    if (id == endpoint_id || (id < s.vacant.size() && s.vacant[id])) continue;
    if (static_cast<double>(t.InFlight(id)) != Get((*s.slots)[id]->stats->inflight)) UpdateStatsLocked(id);
  }
}

void RoutingCore::OnFirstToken(sched::RequestHandle handle, double now_s) {
  if (handle == sched::kNoHandle) return;
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  sched_->scheduler->OnFirstToken(handle, now_s);
  latency_->OnFirstToken(handle, now_s);
}

void RoutingCore::OnTokens(sched::RequestHandle handle, int64_t generated_tokens, double now_s) {
  if (handle == sched::kNoHandle) return;
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  sched_->scheduler->OnTokens(handle, generated_tokens, now_s);
  latency_->OnTokens(handle, generated_tokens, now_s);
}

void RoutingCore::OnFinished(sched::RequestHandle handle, uint32_t endpoint_id, int code,
                             double now_s, int64_t generated_tokens) {
  if (endpoint_id == kNoEndpoint) {
    if (handle != sched::kNoHandle) {
      std::unique_lock<RwSpinLock> lock(sched_mu_);
      sched_->scheduler->OnFinished(handle, now_s);
      latency_->OnFinished(handle, generated_tokens, now_s);
    }
    metrics_->CountNoEndpoint(code);
    return;
  }
  if (handle != sched::kNoHandle) {
    std::unique_lock<RwSpinLock> lock(sched_mu_);
    SchedState& s = *sched_;
    s.scheduler->OnFinished(handle, now_s);
    latency_->OnFinished(handle, generated_tokens, now_s);
    UpdateStatsLocked(endpoint_id);
    if (const Endpoint* ep = s.table->Find(endpoint_id)) CoreMetrics::CountFinished(*ep, code);
    return;
  }
  auto table = table_.load();
  if (const Endpoint* ep = table->Find(endpoint_id)) CoreMetrics::CountFinished(*ep, code);
}

double RoutingCore::CachedShareLocked(const sched::PickResult& r, uint32_t id) const {
  const SchedState& s = *sched_;
  const auto roles = s.scheduler->scorer_roles();
  for (size_t row = 0; row < roles.size() && row < r.scorer_names.size(); ++row) {
    if (roles[row] != sched::Scheduler::ScorerRole::kPrefix) continue;
    for (size_t c = 0; c < r.candidates.size(); ++c) {
      if (r.candidates[c] == id) {
        const double v = r.Score(row, c);
        return std::isfinite(v) ? std::clamp(v, 0.0, 1.0) : 0.0;
      }
    }
    break;
  }
  return 0.0;
}

void RoutingCore::SetRegionRtt(std::string_view region, double seconds) {
  const bool forget = !(seconds >= 0) || !std::isfinite(seconds);
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  auto next = std::make_shared<std::vector<std::pair<std::string, double>>>(*measured_rtt_.load());
  auto it = std::lower_bound(next->begin(), next->end(), region,
                             [](const auto& e, std::string_view r) { return e.first < r; });
  const bool found = it != next->end() && it->first == region;
  if (forget) {
    if (!found) return;
    next->erase(it);
  } else if (found) {
    it->second = seconds;
  } else {
    next->emplace(it, std::string(region), seconds);
  }
  measured_rtt_.store(std::move(next));
  // The configured value stays in force; forgetting a measurement must not forget it.
  if (sched_->scheduler && !Configured(*options_.load(), region)) {
    sched_->scheduler->SetRegionRtt(region, forget ? -1.0 : seconds);
  }
}

std::vector<std::pair<std::string, double>> RoutingCore::measured_rtt() const {
  return *measured_rtt_.load();
}

void RoutingCore::set_pick_timer(std::function<double()> seconds) {
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  sched_->timer = std::move(seconds);
  if (sched_->scheduler) sched_->scheduler->set_plugin_timer(&sched_->timer);
}

void RoutingCore::OnReloadFailed() { metrics_->CountReloadFailed(); }

}  // namespace kvroute::routing
