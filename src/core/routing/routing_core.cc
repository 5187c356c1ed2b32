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
#include "core/routing/core_state.h"
#include "core/routing/kv_event_input.h"

namespace kvroute::routing {


namespace {

bool Configured(const CoreOptions& options, std::string_view region) {
  return std::any_of(options.region_rtt_s.begin(), options.region_rtt_s.end(),
                     [&](const auto& r) { return r.first == region; });
}

}  // namespace

RoutingCore::RoutingCore(std::function<void(std::string_view)> log)
    : log_(std::move(log)), sched_(std::make_unique<SchedState>()),
      scratch_(std::make_unique<ScratchPool>()), counters_(std::make_unique<Counters>()) {
  table_.store(std::make_shared<const EndpointTable>());
  slots_.store(std::make_shared<const std::vector<std::shared_ptr<Slot>>>());
  options_.store(std::make_shared<const CoreOptions>());
  measured_rtt_.store(std::make_shared<const std::vector<std::pair<std::string, double>>>());
  events_ = std::make_unique<KvEventInput>();
  sessions_ = std::make_unique<SessionTable>();
}

uint64_t RoutingCore::session_picks(SessionOutcome outcome) const {
  return counters_->session_picks[static_cast<std::size_t>(outcome)].load(std::memory_order_relaxed);
}

std::string_view SessionOutcomeName(SessionOutcome o) {
  switch (o) {
    case SessionOutcome::kNone: return "none";
    case SessionOutcome::kBound: return "bound";
    case SessionOutcome::kNew: return "new";
    case SessionOutcome::kMovedGone: return "moved_gone";
    case SessionOutcome::kMovedSaturated: return "moved_saturated";
    case SessionOutcome::kToken: return "token";
  }
  return "none";
}

RoutingCore::~RoutingCore() = default;

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
  {
    std::lock_guard<std::mutex> lock(counters_->regions_mu);
    for (std::size_t i = 0; i < endpoints.size(); ++i) {
      auto ep = std::make_shared<Endpoint>();
      ep->id = ids[i];
      ep->stats = (*slots)[ids[i]]->stats;
      ep->spec = std::move(endpoints[i]);
      auto& counter = counters_->region_requests[std::string(sched::RegionOf(ep->spec.labels))];
      if (!counter) counter = std::make_unique<std::atomic<uint64_t>>(0);
      ep->stats->region_requests.store(counter.get(), std::memory_order_release);
      table->by_id[ids[i]] = std::move(ep);
    }
  }

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
          s.latency.ForgetEndpoint(id);
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
    s.roles.assign(n, Role::kUnset);
    s.pd_queued.resize(n, 0.0);
    s.pd_active = false;
    s.pd = options.pd;
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
          std::lock_guard<std::mutex> dirty_lock(counters_->dirty_mu);
          counters_->dirty.push_back(id);
        }
      }
      if (!prev || prev->spec.address != ep->spec.address) s.pd_queued[id] = 0.0;
      st.id = id;
      st.name = ep->spec.name;
      st.SetLabels(ep->spec.labels);
      s.roles[id] = RoleOf(ep->spec.labels);
      s.pd_active = s.pd_active || s.roles[id] == Role::kPrefill;
    }
    s.table = table;
    s.slots = slots;
    s.health = options.health;
    s.budget_options = options.retry_budget;
    s.default_slo_ttft_s = options.default_slo_ttft_s;
    s.default_slo_tpot_s = options.default_slo_tpot_s;
    s.max_ranked = so.max_ranked;
    s.next_change.store(-kInf);  // full health pass at the next pick
    s.seen_epoch.store(~uint64_t{0});
    ++s.generation;
    s.score_slots.clear();
    table_.store(table);
    slots_.store(slots);
    options_.store(std::make_shared<const CoreOptions>(options));
    // Bindings survive: an id keeps its endpoint id while its address survives.
    sessions_->SetOptions(options.sessions);
    sessions_enabled_.store(options.sessions.enabled, std::memory_order_relaxed);
    for (uint32_t id = 0; id < n; ++id) {
      if (!s.vacant[id]) UpdateStatsLocked(id);
    }
  }
  events_->Configure(options.kv_events, *table, *old_table, now_s, logs);
  if (old_scheduler) {
    reloads_ok_.fetch_add(1, std::memory_order_relaxed);
    logs.push_back("configuration applied: " + std::to_string(table->by_id.size()) +
                   " endpoint ids, policy " + std::string(policy()));
  }
  Log(logs);
  return Status::Ok();
}

// ---- picks ----

void RoutingCore::CountLocalityLocked(const sched::PickResult& r) {
  if (!r.ok()) return;
  Bump(counters_->locality_picks[static_cast<std::size_t>(r.locality)]);
  if (r.locality == sched::Locality::kOff) return;
  const sched::LocalityStats st = sched_->scheduler->locality_stats();
  counters_->spills_started.store(st.spills_started, std::memory_order_relaxed);
  counters_->spilling.store(st.spilling, std::memory_order_relaxed);
}

void RoutingCore::RecordPickLocked(const sched::PickResult& r, double pick_s) {
  SchedState& s = *sched_;
  if (pick_s >= 0) counters_->sched_seconds.Observe(pick_s);
  if (r.ranked.empty()) return;
  std::size_t c = 0;
  while (c < r.candidates.size() && r.candidates[c] != r.ranked[0]) ++c;
  if (c == r.candidates.size()) return;
  if (s.score_slots.size() != r.scorer_names.size()) {
    // First pick of this scheduler: resolve each row's summary once (allocates once).
    auto roles = s.scheduler->scorer_roles();
    std::lock_guard<std::mutex> lock(counters_->scores_mu);
    s.score_slots.clear();
    for (std::size_t i = 0; i < r.scorer_names.size(); ++i) {
      auto it = counters_->scores.find(r.scorer_names[i]);
      if (it == counters_->scores.end()) {
        it = counters_->scores.emplace(r.scorer_names[i], std::make_unique<ScoreSummary>()).first;
      }
      bool prefix = i < roles.size() && roles[i] == sched::Scheduler::ScorerRole::kPrefix;
      s.score_slots.emplace_back(it->second.get(), prefix);
    }
  }
  for (std::size_t i = 0; i < s.score_slots.size(); ++i) {
    double v = r.Score(i, c);
    s.score_slots[i].first->Add(v);
    if (s.score_slots[i].second) counters_->prefix_hit.Add(v);
  }
}

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

bool RoutingCore::SaturatedLocked(uint32_t id) const {
  const SchedState& s = *sched_;
  const health::Verdict& v = s.verdicts[id];
  if (v.treatment != health::Treatment::kNormal) return true;
  const sched::EndpointState& st = s.states[id];
  const double capacity = st.num_gpu_blocks > 0
                              ? static_cast<double>(st.num_gpu_blocks)
                              : static_cast<double>(sched::SchedulerOptions{}.default_num_gpu_blocks);
  const sched::EndpointLoad adj = s.scheduler->inflight().Load(st, capacity, true);
  return (v.Known(health::Signal::kKvUsage) && adj.kv_usage >= 0.8) ||
         (v.Known(health::Signal::kWaiting) && adj.waiting >= 5.0);
}

void RoutingCore::SessionLocked(const PickRequest& request, const sched::PickResult& r,
                                std::optional<SessionTable::Binding> bound,
                                std::optional<std::string_view> token_address, PickResult& out,
                                SessionTable::Binding& bind) const {
  const SchedState& s = *sched_;
  auto contains = [](std::span<const uint32_t> ids, uint32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  // 0: usable; 1: no longer a candidate; 2: saturated (and the policy's pick is not).
  auto assess = [&](uint32_t id) {
    if (id >= s.states.size() || s.vacant[id] || !s.states[id].healthy) return 1;
    if (!request.only.empty() && !contains(request.only, id)) return 1;
    if (id != out.ranked[0] && SaturatedLocked(id) && !SaturatedLocked(out.ranked[0])) return 2;
    // Filtered out by the policy for another reason than load (its candidates are the
    // ids that passed its filters).
    if (!r.candidates.empty() && !contains(r.candidates, id)) return SaturatedLocked(id) ? 2 : 1;
    return 0;
  };
  auto first = [&](uint32_t id) {
    std::size_t k = 0;
    while (k < out.n_ranked && out.ranked[k] != id) ++k;
    if (k == out.n_ranked) {
      if (out.n_ranked < s.max_ranked) ++out.n_ranked;
      k = out.n_ranked - 1;
    }
    for (; k > 0; --k) out.ranked[k] = out.ranked[k - 1];
    out.ranked[0] = id;
  };
  bool placed = false;
  if (token_address) {
    for (uint32_t id = 0; id < s.states.size() && !placed; ++id) {
      const Endpoint* ep = s.table->Find(id);
      if (ep == nullptr || ep->spec.address != *token_address) continue;
      if (assess(id) == 0) {
        first(id);
        out.session = SessionOutcome::kToken;
        placed = true;
      }
      break;
    }
  }
  if (!placed && bound) {
    const Endpoint* ep = s.table->Find(bound->endpoint);
    // An id a reload gave to another address is another endpoint: the session's is gone.
    const int a = ep && SessionKey(ep->spec.address) == bound->address_key ? assess(bound->endpoint) : 1;
    if (a == 0) {
      first(bound->endpoint);
      out.session = SessionOutcome::kBound;
    } else {
      out.session = a == 2 ? SessionOutcome::kMovedSaturated : SessionOutcome::kMovedGone;
    }
  } else if (!placed && !request.session_id.empty()) {
    out.session = SessionOutcome::kNew;
  }
  bind.endpoint = out.ranked[0];
  bind.address_key = SessionKey(s.table->by_id[out.ranked[0]]->spec.address);
}

void RoutingCore::LookUpSession(const PickRequest& request, double now_s, SessionLookup& out) const {
  out.active = sessions_enabled_.load(std::memory_order_relaxed) &&
               (!request.session_id.empty() || !request.session_token.empty());
  if (!out.active) return;
  if (!request.session_id.empty()) {
    out.key = SessionKey(request.session_id);
    out.bound = sessions_->Find(out.key, now_s);
  }
  if (!request.session_token.empty()) {
    out.token_address = DecodeSessionToken(request.session_token, out.token_buf);
  }
}

// A successful pick of a request with a session: the session's endpoint first when it is
// still usable (SessionLocked), unless a routing hint decided; the binding to record.
void RoutingCore::PlaceSessionLocked(const PickRequest& request, const sched::PickResult& r,
                                     std::size_t hinted, SessionLookup& session, PickResult& out) {
  if (hinted == 0) {
    SessionLocked(request, r, session.bound, session.token_address, out, session.bind);
    if (out.session != SessionOutcome::kNone) {
      Bump(counters_->session_picks[static_cast<std::size_t>(out.session)]);
    }
  } else {
    // A routing hint decided: the session follows it.
    session.bind.endpoint = out.ranked[0];
    session.bind.address_key = SessionKey(out.endpoint(0).spec.address);
  }
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
  SessionLookup session;
  LookUpSession(request, now_s, session);
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
  auto with_latency = [&](const SchedState& s) {
    if (req.slo_ttft_s <= 0) req.slo_ttft_s = s.default_slo_ttft_s;
    if (req.slo_tpot_s <= 0) req.slo_tpot_s = s.default_slo_tpot_s;
    req.latency = &s.latency;
  };
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
      with_latency(s);
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
      CountLocalityLocked(r);
      if (s.generation == generation) RecordPickLocked(r, pick_s);
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
      with_latency(s);
      const double t0 = s.timer ? s.timer() : 0.0;
      r = s.scheduler->Pick(req, states, now_s);
      if (s.timer) pick_s = s.timer() - t0;
      if (events_lock.owns_lock()) events_lock.unlock();
      status = r.status;
      if (r.ok()) {
        out.handle = r.handle;
        hinted = RankLocked(request, r, out);
      }
      CountLocalityLocked(r);
      RecordPickLocked(r, pick_s);
    }
    s.budget.OnRequest(now_s, s.budget_options);
    if (session.active && status == sched::PickStatus::kOk && out.n_ranked > 0) {
      PlaceSessionLocked(request, r, hinted, session, out);
    }
    if (s.pd_active && req.disaggregable && status == sched::PickStatus::kOk && out.n_ranked > 0) {
      PdLocked(req, r, out);
    }
    if (status != sched::PickStatus::kOk) {
      Bump(counters_->picks_failed);
    } else if (request.dispatch_first && out.n_ranked > 0) {
      DispatchFirstLocked(req, r, out, now_s);
    }
  }
  if (out.dispatched && !sc.event_keys.empty()) {
    out.predicted_cached_tokens = events_->OnDispatched(sc.event_keys, req.token_ids.size(), out.ranked[0], now_s);
  }
  if (session.active && !request.session_id.empty() && out.n_ranked > 0 && status == sched::PickStatus::kOk) {
    sessions_->Bind(session.key, session.bind, now_s);
  }
  if (!logs.empty()) Log(logs);
  out.locality = r.locality;
  if (status == sched::PickStatus::kOk) return out;
  out.status = Status::Unavailable(status == sched::PickStatus::kAllFiltered
                                       ? "every endpoint is saturated or filtered out"
                                       : "no healthy endpoint is available");
  return out;
}

// The first ranked endpoint is recorded as sent: the scheduler's accounting, and the latency
// model's prediction for it (both legs of a disaggregated pick). Caller holds sched_mu_.
void RoutingCore::DispatchFirstLocked(const sched::SchedRequest& req, const sched::PickResult& r,
                                      PickResult& out, double now_s) {
  SchedState& s = *sched_;
  s.scheduler->OnDispatched(out.handle, out.ranked[0], now_s);
  UpdateStatsLocked(out.ranked[0]);
  out.dispatched = true;
  sched::LatencyTrainer::Dispatch d = LatencyDispatchLocked(req, r, out.ranked[0]);
  std::optional<double> ttft;
  if (out.disaggregated()) {
    // Both legs: the prefill endpoint computes what it lacks of the prompt, then the
    // decode endpoint, holding it all once pulled, samples the first token.
    d = sched::LatencyTrainer::DispatchOf(req, s.states[out.ranked[0]], 1.0);
    d.remote_prefill = true;
    const double prompt = static_cast<double>(PromptTokensOf(req));
    const double share = prompt > 0 ? std::clamp(1.0 - out.prefill_tokens / prompt, 0.0, 1.0) : 0.0;
    const sched::LatencyTrainer::Dispatch leg =
        sched::LatencyTrainer::DispatchOf(req, s.states[out.prefill], share);
    const auto prefill = s.latency.PredictTtft(leg);
    const auto decode = s.latency.PredictTtft(d);
    if (prefill && decode) ttft = *prefill + *decode;
    s.latency.OnPrefillSent(out.handle, leg, now_s);
  } else {
    ttft = s.latency.PredictTtft(d);
  }
  if (ttft) {
    out.predicted_ttft_s = *ttft;
    counters_->predicted_ttft.Observe(*ttft);
  }
  if (const auto p = s.latency.PredictTpot(d)) {
    out.predicted_tpot_s = *p;
    counters_->predicted_tpot.Observe(*p);
  }
  s.latency.OnDispatched(out.handle, d, now_s);
}

void RoutingCore::OnDispatched(sched::RequestHandle handle, uint32_t endpoint_id, double now_s) {
  if (handle == sched::kNoHandle) return;
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  SchedState& s = *sched_;
  s.scheduler->OnDispatched(handle, endpoint_id, now_s);
  UpdateStatsLocked(endpoint_id);
  // A dispatch outside the pick (a retry): the prefix model's view of this endpoint for
  // the request is not at hand, so its features are unknown (nothing learned from it).
  sched::LatencyTrainer::Dispatch d;
  d.endpoint = endpoint_id;
  d.uncached_tokens = std::nan("");
  s.latency.OnDispatched(handle, d, now_s);
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
  sched_->latency.OnFirstToken(handle, now_s);
  PublishLatencyLocked();
}

void RoutingCore::OnTokens(sched::RequestHandle handle, int64_t generated_tokens, double now_s) {
  if (handle == sched::kNoHandle) return;
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  sched_->scheduler->OnTokens(handle, generated_tokens, now_s);
  sched_->latency.OnTokens(handle, generated_tokens, now_s);
}

void RoutingCore::OnFinished(sched::RequestHandle handle, uint32_t endpoint_id, int code,
                             double now_s, int64_t generated_tokens) {
  if (endpoint_id == kNoEndpoint) {
    if (handle != sched::kNoHandle) {
      std::unique_lock<RwSpinLock> lock(sched_mu_);
      sched_->scheduler->OnFinished(handle, now_s);
      sched_->latency.OnFinished(handle, generated_tokens, now_s);
      PublishLatencyLocked();
    }
    counters_->no_endpoint.Add(code);
    return;
  }
  if (handle != sched::kNoHandle) {
    std::unique_lock<RwSpinLock> lock(sched_mu_);
    SchedState& s = *sched_;
    s.scheduler->OnFinished(handle, now_s);
    s.latency.OnFinished(handle, generated_tokens, now_s);
    PublishLatencyLocked();
    UpdateStatsLocked(endpoint_id);
    if (const Endpoint* ep = s.table->Find(endpoint_id)) CountFinished(*ep, code);
    return;
  }
  auto table = table_.load();
  if (const Endpoint* ep = table->Find(endpoint_id)) CountFinished(*ep, code);
}

sched::LatencyTrainer::Dispatch RoutingCore::LatencyDispatchLocked(const sched::SchedRequest& req,
                                                                 const sched::PickResult& r,
                                                                 uint32_t id) const {
  const SchedState& s = *sched_;
  const double cached = CachedShareLocked(r, id);
  if (id < s.states.size()) return sched::LatencyTrainer::DispatchOf(req, s.states[id], cached);
  sched::LatencyTrainer::Dispatch d;  // not in the table: nothing known
  d.endpoint = id;
  d.uncached_tokens = std::nan("");
  return d;
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

void RoutingCore::PublishLatencyLocked() {
  const sched::LatencyTrainer& t = sched_->latency;
  Counters& c = *counters_;
  const sched::LatencyTrainer::Errors* errors[] = {&t.ttft_errors(), &t.tpot_errors()};
  const uint64_t samples[] = {t.ttft_samples(), t.tpot_samples()};
  for (size_t k = 0; k < 2; ++k) {
    c.latency_samples[k].store(samples[k], std::memory_order_relaxed);
    c.latency_scored[k].store(errors[k]->n, std::memory_order_relaxed);
    c.latency_abs_s[k].store(errors[k]->abs_s, std::memory_order_relaxed);
    c.latency_abs_rel[k].store(errors[k]->abs_rel, std::memory_order_relaxed);
  }
  const sched::LatencyTrainer::SloCounts* slo[] = {&t.ttft_slo(), &t.tpot_slo()};
  for (size_t k = 0; k < 2; ++k) {
    c.slo_requests[k].store(slo[k]->observed, std::memory_order_relaxed);
    c.slo_violations[k].store(slo[k]->violated, std::memory_order_relaxed);
  }
}

LatencyStats RoutingCore::latency_stats() const {
  const Counters& c = *counters_;
  LatencyStats st;
  sched::LatencyTrainer::Errors* errors[] = {&st.ttft_errors, &st.tpot_errors};
  uint64_t* samples[] = {&st.ttft_samples, &st.tpot_samples};
  for (size_t k = 0; k < 2; ++k) {
    *samples[k] = c.latency_samples[k].load(std::memory_order_relaxed);
    errors[k]->n = c.latency_scored[k].load(std::memory_order_relaxed);
    errors[k]->abs_s = c.latency_abs_s[k].load(std::memory_order_relaxed);
    errors[k]->abs_rel = c.latency_abs_rel[k].load(std::memory_order_relaxed);
  }
  st.ttft_slo.observed = c.slo_requests[0].load(std::memory_order_relaxed);
  st.ttft_slo.violated = c.slo_violations[0].load(std::memory_order_relaxed);
  st.tpot_slo.observed = c.slo_requests[1].load(std::memory_order_relaxed);
  st.tpot_slo.violated = c.slo_violations[1].load(std::memory_order_relaxed);
  return st;
}

void RoutingCore::CountFinished(const Endpoint& ep, int code) {
  ep.stats->requests.Add(code);
  if (std::atomic<uint64_t>* c = ep.stats->region_requests.load(std::memory_order_acquire)) Bump(*c);
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

void RoutingCore::OnReloadFailed() { Bump(counters_->reloads_failed); }

// ---- observability ----

}  // namespace kvroute::routing
