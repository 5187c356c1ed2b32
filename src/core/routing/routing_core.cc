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

namespace kvroute::routing {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Written by one thread at a time (under the scheduler's lock, or by the owning scrape),
// read by any: relaxed atomics are enough, and a plain store beats a CAS loop.
void Set(std::atomic<double>& a, double v) { a.store(v, std::memory_order_relaxed); }
double Get(const std::atomic<double>& a) { return a.load(std::memory_order_relaxed); }
void Bump(std::atomic<uint64_t>& a, uint64_t n = 1) { a.fetch_add(n, std::memory_order_relaxed); }
double GetU(const std::atomic<uint64_t>& a) {
  return static_cast<double>(a.load(std::memory_order_relaxed));
}

// Counts by HTTP status without a lock: a small open table whose slots are claimed by
// CAS on the code. Codes beyond its size fall into `other` (status 0 on /metrics).
struct CodeCounts {
  static constexpr std::size_t kSlots = 16;
  struct Entry {
    std::atomic<int> code{0};
    std::atomic<uint64_t> n{0};
  };
  std::array<Entry, kSlots> entries;
  std::atomic<uint64_t> other{0};

  void Add(int code) {
    for (Entry& e : entries) {
      int c = e.code.load(std::memory_order_acquire);
      if (c == 0) {
        int expected = 0;
        if (e.code.compare_exchange_strong(expected, code, std::memory_order_acq_rel)) {
          c = code;
        } else {
          c = expected;
        }
      }
      if (c == code) {
        Bump(e.n);
        return;
      }
    }
    Bump(other);
  }

  template <typename F>
  void ForEach(F&& f) const {
    std::vector<std::pair<int, uint64_t>> rows;
    for (const Entry& e : entries) {
      int c = e.code.load(std::memory_order_acquire);
      if (c != 0) rows.emplace_back(c, e.n.load(std::memory_order_relaxed));
    }
    std::sort(rows.begin(), rows.end());
    for (auto& [c, n] : rows) f(c, n);
    uint64_t o = other.load(std::memory_order_relaxed);
    if (o) f(0, o);
  }
};

// Fixed-bound histogram with atomic buckets.
struct AtomicHistogram {
  static constexpr std::array<double, 14> kBounds = {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5,
                                                    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                                                    1e-2, 2.5e-2};
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> counts{};
  std::atomic<double> sum{0.0};
  void Observe(double v) {  // single writer (under the scheduler's lock)
    std::size_t i = std::lower_bound(kBounds.begin(), kBounds.end(), v) - kBounds.begin();
    Bump(counts[i]);
    Set(sum, Get(sum) + v);
  }
};

// Predicted TTFT and TPOT at dispatch, seconds (llm_d_epp_request_predicted_*_seconds).
template <std::size_t N>
struct PredictionHistogram {
  std::array<double, N> bounds;
  std::array<std::atomic<uint64_t>, N + 1> counts{};
  std::atomic<double> sum{0.0};
  void Observe(double v) {  // single writer (under the scheduler's exclusive lock)
    std::size_t i = std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin();
    Bump(counts[i]);
    Set(sum, Get(sum) + v);
  }
};

// Route receipts: predicted against reported cached prompt tokens (many writers).
struct ReceiptStats {
  static constexpr std::array<double, 8> kBounds = {0, 16, 64, 256, 1024, 4096, 16384, 65536};
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> abs_error{};
  std::atomic<uint64_t> receipts{0}, mispredicted{0}, unreported{0}, over{0}, under{0};
  std::atomic<uint64_t> abs_error_sum{0}, predicted_sum{0}, reported_sum{0};
};

struct ScoreSummary {
  std::atomic<double> sum{0.0};
  std::atomic<uint64_t> count{0};
  void Add(double v) {  // single writer (under the scheduler's lock)
    Set(sum, Get(sum) + v);
    Bump(count);
  }
};

}  // namespace

struct EndpointStats {
  CodeCounts requests;
  std::mutex errors_mu;  // failures only: never on a successful request's path
  std::map<std::string, uint64_t, std::less<>> errors;
  std::atomic<uint64_t> scrapes_ok{0}, scrapes_failed{0};
  std::atomic<uint64_t> ejections{0}, restarts{0};
  // Published under the scheduler's lock after each change of the endpoint's accounting.
  std::atomic<double> kv_adjusted{kNaN}, waiting_adjusted{kNaN}, inflight{0}, prefix_entries{-1};
  // The requests counter of the endpoint's region (Counters::region_requests), set by
  // Configure from its labels; never null once the endpoint is published.
  std::atomic<std::atomic<uint64_t>*> region_requests{nullptr};
};

struct RoutingCore::Slot {
  std::shared_ptr<EndpointStats> stats = std::make_shared<EndpointStats>();
  // Guards health and last: the scraper writes, the next pick's sync and AppendMetrics
  // copy. Per endpoint, held for a copy: never a global lock.
  mutable std::mutex mu;
  health::EndpointHealth health;  // its last() is the last good scrape, raw
  health::Ejection ejection;    // guarded by mu
  std::atomic<bool> dirty{false};
  // Attempts failed in a row since the last success or ejection (outlier detection).
  std::atomic<uint32_t> consecutive_failures{0};
  // A scrape saw the endpoint's counters go down: it restarted, its cache is empty. The
  // next sync drops its prefix-index entries.
  std::atomic<bool> restarted{false};
};

struct RoutingCore::SchedState {
  std::unique_ptr<sched::Scheduler> scheduler;
  std::shared_ptr<const EndpointTable> table;
  std::shared_ptr<const std::vector<std::shared_ptr<Slot>>> slots;
  std::vector<sched::EndpointState> states;  // by id; vacant ids unhealthy
  std::vector<health::Verdict> verdicts;     // by id, as last applied
  std::vector<uint8_t> vacant;               // by id
  health::HealthOptions health;
  std::size_t max_ranked = kMaxRanked;
  // Written under the exclusive lock, read by SyncDue without it.
  std::atomic<uint64_t> seen_epoch{~uint64_t{0}};
  std::atomic<double> next_change{-kInf};  // a full health pass is due once now passes it
  uint64_t generation = 0;  // bumped by every Configure
  std::vector<uint32_t> changed;  // reused by SyncLocked
  // Per scorer row of the current scheduler: its summary, and whether it is a prefix role.
  std::vector<std::pair<ScoreSummary*, bool>> score_slots;
  std::function<double()> timer;
  RetryBudget budget;
  RetryBudgetOptions budget_options;
  // The latency model, trained from every dispatched request's lifecycle (issue 24);
  // kept across reloads (endpoint ids survive them), reset per endpoint on removal and
  // restart.
  sched::LatencyTrainer latency;
  double default_slo_ttft_s = 0.0;  // CoreOptions::default_slo_*
  double default_slo_tpot_s = 0.0;
  // Prefill/decode disaggregation (issue 25): roles by id, whether any endpoint is a
  // prefill one (then prefill-only endpoints are no decode candidates), the decider's
  // options, the prefill tokens sent to each endpoint and not yet answered, and the pairs
  // chosen (prefill id, decode id) -> count.
  std::vector<Role> roles;
  bool pd_active = false;
  PdOptions pd;
  std::vector<double> pd_queued;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> pd_pairs;
  std::vector<uint64_t> pd_key;  // PdLocked's prefix chain, reused
};

struct RoutingCore::Counters {
  CodeCounts no_endpoint;  // requests answered without an endpoint
  // The latency trainer's counters, copied after each of its updates (under the
  // scheduler's lock) so that latency_stats and AppendMetrics read them lock-free.
  // Index 0: TTFT, 1: TPOT.
  std::array<std::atomic<uint64_t>, 2> latency_samples{}, latency_scored{};
  std::array<std::atomic<double>, 2> latency_abs_s{}, latency_abs_rel{};
  std::array<std::atomic<uint64_t>, 2> slo_requests{}, slo_violations{};
  std::atomic<uint64_t> retries{0}, retries_free{0}, retries_denied{0}, picks_failed{0},
      reloads_failed{0}, ejections_skipped{0};
  AtomicHistogram sched_seconds;
  std::array<std::atomic<uint64_t>, kNumPdDecisions> pd_decisions{};
  PredictionHistogram<14> predicted_ttft{
      {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120}};
  PredictionHistogram<12> predicted_tpot{
      {0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1}};
  ReceiptStats receipts;
  ScoreSummary prefix_hit;
  std::mutex scores_mu;  // guards the map's shape (Configure adds, AppendMetrics reads)
  std::map<std::string, std::unique_ptr<ScoreSummary>, std::less<>> scores;
  // Ids that scraped since the last sync (each at most once: Slot::dirty).
  std::mutex dirty_mu;
  std::vector<uint32_t> dirty;
  // Locality: committed picks by decision (index = sched::Locality), the filter's spill
  // mode as of the last commit, and answered requests by the region of the endpoint
  // that answered ("" = no region). Regions are never removed (a handful per router), so
  // an endpoint's pointer into the map stays valid.
  std::array<std::atomic<uint64_t>, sched::kLocalityReasons> locality_picks{};
  std::atomic<uint64_t> spills_started{0};
  std::atomic<bool> spilling{false};
  std::mutex regions_mu;  // guards the map's shape (Configure adds, AppendMetrics reads)
  std::map<std::string, std::unique_ptr<std::atomic<uint64_t>>, std::less<>> region_requests;
  // Picks by what their session did (index = SessionOutcome; kNone not counted).
  std::array<std::atomic<uint64_t>, kNumSessionOutcomes> session_picks{};
};

// Scratch buffers for concurrent picks, leased without a lock: a pick takes the first
// free entry (single-threaded callers always get entry 0, so their tie-breaks are
// reproducible); with more concurrent picks than entries it falls back to a private one.
// Entry i draws its tie-breaks from Rng(seed + i): entry 0, the one a single-threaded
// caller always gets, draws what the scheduler's own Pick would with CoreOptions::seed.
struct RoutingCore::ScratchPool {
  static constexpr std::size_t kSize = 16;
  std::array<std::atomic<bool>, kSize> busy{};
  std::array<std::unique_ptr<sched::PickScratch>, kSize> entries;
  uint64_t seed = 1;
  ScratchPool() {
    for (std::size_t i = 0; i < kSize; ++i) entries[i] = std::make_unique<sched::PickScratch>(seed + i);
  }
  // Under the scheduler's lock held exclusively: a leased entry is used only under its
  // shared side, so no pick draws from an entry while it is reseeded.
  void Reseed(uint64_t s) {
    seed = s;
    for (std::size_t i = 0; i < kSize; ++i) entries[i]->rng = sched::Rng(s + i);
  }
};

namespace {

class ScratchLease {
 public:
  template <typename Pool>
  explicit ScratchLease(Pool& pool) : busy_(nullptr) {
    for (std::size_t i = 0; i < Pool::kSize; ++i) {
      bool expected = false;
      if (!pool.busy[i].load(std::memory_order_relaxed) &&
          pool.busy[i].compare_exchange_strong(expected, true, std::memory_order_acquire)) {
        busy_ = &pool.busy[i];
        scratch_ = pool.entries[i].get();
        return;
      }
    }
    own_ = std::make_unique<sched::PickScratch>(0x9e3779b97f4a7c15ull);
    scratch_ = own_.get();
  }
  ~ScratchLease() {
    if (busy_) busy_->store(false, std::memory_order_release);
  }
  sched::PickScratch& get() { return *scratch_; }

 private:
  std::atomic<bool>* busy_;
  sched::PickScratch* scratch_ = nullptr;
  std::unique_ptr<sched::PickScratch> own_;
};

}  // namespace

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
  events_ = std::make_unique<kvevents::EventIndex>();
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
  auto old_slots = slots_.load();
  std::unordered_map<std::string, uint32_t> old_ids;
  for (const auto& ep : old_table->by_id) {
    if (ep) old_ids.emplace(ep->spec.address, ep->id);
  }

  // Surviving addresses keep their ids (and slots, stats, prefix entries, accounting).
  // New endpoints take vacant ids with nothing in flight, else new ones.
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
  {
    // The precise index follows the table: endpoints with events configured are expected
    // (an id taken over by another address starts again), the others forgotten.
    std::unique_lock<RwSpinLock> lock(events_mu_);
    events_->SetOptions(options.kv_events);
    const std::size_t n = std::max(table->by_id.size(), old_table->by_id.size());
    for (uint32_t id = 0; id < n; ++id) {
      const Endpoint* ep = table->Find(id);
      const Endpoint* prev = old_table->Find(id);
      if (prev && (!ep || prev->spec.address != ep->spec.address)) events_->Forget(id);
      if (ep && !ep->spec.kv_events.empty()) {
        events_->Expect(id, now_s);
      } else {
        events_->Forget(id);
      }
    }
    events_active_.store(events_->active(), std::memory_order_relaxed);
    std::vector<kvevents::StateTransition> transitions;
    events_->DrainTransitions(&transitions);
    for (const auto& t : transitions) {
      if (t.to != kvevents::SourceState::kUnknown && t.to != kvevents::SourceState::kOff) {
        logs.push_back(TransitionLine(*table, t));
      }
    }
  }
  if (old_scheduler) {
    reloads_ok_.fetch_add(1, std::memory_order_relaxed);
    logs.push_back("configuration applied: " + std::to_string(table->by_id.size()) +
                   " endpoint ids, policy " + std::string(policy()));
  }
  Log(logs);
  return Status::Ok();
}

// ---- scrapes ----

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

void RoutingCore::OnCacheUpdate(uint32_t id, const sched::CacheUpdate& update, double now_s) {
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  SchedState& s = *sched_;
  if (!s.scheduler || id >= s.states.size() || s.vacant[id]) return;
  s.scheduler->OnCacheUpdate(id, update, now_s);
  UpdateStatsLocked(id);
}

// ---- KV-cache events ----

std::string RoutingCore::TransitionLine(const EndpointTable& table, const kvevents::StateTransition& t) {
  const Endpoint* ep = table.Find(t.endpoint);
  std::string name = ep ? ep->spec.name : "#" + std::to_string(t.endpoint);
  std::string line = "endpoint " + name + " KV events: " + std::string(kvevents::SourceStateName(t.from)) +
                     " -> " + std::string(kvevents::SourceStateName(t.to)) + " (" + std::string(t.reason) + ")";
  if (t.to != kvevents::SourceState::kLive) line += "; its prefix scores use the approximate model";
  return line;
}

template <typename F>
void RoutingCore::WithEvents(F&& f) {
  std::vector<kvevents::StateTransition> transitions;
  {
    std::unique_lock<RwSpinLock> lock(events_mu_);
    f(*events_);
    events_->DrainTransitions(&transitions);
  }
  if (transitions.empty() || !log_) return;
  auto table = table_.load();
  for (const auto& t : transitions) log_(TransitionLine(*table, t));
}

void RoutingCore::OnKvEvents(uint32_t id, const kvevents::KvEventBatch& batch, double now_s) {
  WithEvents([&](kvevents::EventIndex& x) { x.ApplyBatch(id, batch, now_s); });
}

void RoutingCore::OnKvEventsGap(uint32_t id, bool repaired, double now_s) {
  WithEvents([&](kvevents::EventIndex& x) { x.OnGap(id, repaired, now_s); });
}

void RoutingCore::OnKvEventsRestart(uint32_t id, double now_s) {
  WithEvents([&](kvevents::EventIndex& x) { x.OnRestart(id, now_s); });
}

void RoutingCore::OnKvEventsDecodeError(uint32_t id, double now_s) {
  WithEvents([&](kvevents::EventIndex& x) { x.OnDecodeError(id, now_s); });
}

void RoutingCore::OnRouteReceipt(uint32_t endpoint_id, int64_t predicted, int64_t reported) {
  (void)endpoint_id;
  if (predicted < 0) return;
  ReceiptStats& r = counters_->receipts;
  if (reported < 0) {
    Bump(r.unreported);
    return;
  }
  const int64_t block = std::max<int64_t>(1, options_.load()->kv_events.block_tokens);
  const uint64_t err = static_cast<uint64_t>(reported > predicted ? reported - predicted : predicted - reported);
  Bump(r.receipts);
  if (static_cast<int64_t>(err) > block) Bump(r.mispredicted);
  if (predicted > reported) Bump(r.over);
  if (predicted < reported) Bump(r.under);
  const std::size_t i = std::lower_bound(ReceiptStats::kBounds.begin(), ReceiptStats::kBounds.end(),
                                         static_cast<double>(err)) - ReceiptStats::kBounds.begin();
  Bump(r.abs_error[i]);
  Bump(r.abs_error_sum, err);
  Bump(r.predicted_sum, static_cast<uint64_t>(predicted));
  Bump(r.reported_sum, static_cast<uint64_t>(reported));
}

kvevents::EndpointEventStats RoutingCore::KvEventStats(uint32_t id, double now_s) const {
  std::shared_lock<RwSpinLock> lock(events_mu_);
  return events_->Stats(id, now_s);
}

void RoutingCore::MarkDirty(uint32_t id, Slot& slot) {
  if (!slot.dirty.exchange(true, std::memory_order_acq_rel)) {
    std::lock_guard<std::mutex> lock(counters_->dirty_mu);
    counters_->dirty.push_back(id);
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
    std::lock_guard<std::mutex> lock(counters_->dirty_mu);
    s.changed.swap(counters_->dirty);
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
      s.latency.ForgetEndpoint(id);
      Bump(slot.stats->restarts);
      if (logs) {
        logs->push_back("endpoint " + st.name +
                        " restarted (its counters went down): dropped " +
                        std::to_string(std::max<int64_t>(0, dropped)) +
                        " prefix-index entries, its cache is empty");
      }
    }
  }
  if (events_active_.load(std::memory_order_relaxed)) {
    // Time-based event states (stale, end of a resync) and expired speculative entries.
    std::vector<kvevents::StateTransition> transitions;
    {
      std::unique_lock<RwSpinLock> lock(events_mu_);
      events_->Tick(now_s);
      events_->DrainTransitions(&transitions);
    }
    for (const auto& t : transitions) {
      if (logs) logs->push_back(TransitionLine(*s.table, t));
    }
  }
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
      // Likewise the LoRA state a previous pass hid as stale, when st.engine holds the
      // same scrape (a newer one is copied whole by the next sync).
      if (st.scraped_at_s == slot.health.scraped_at_s()) {
        st.engine.present = (st.engine.present & ~metrics::EngineMetrics::kLora) |
                            (slot.health.last().present & metrics::EngineMetrics::kLora);
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
    // A stale scrape's adapter lists are not today's: unknown, like a stale load.
    if (!fresh) st.engine.present &= ~metrics::EngineMetrics::kLora;
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
    // (the decode endpoint is picked; PdLocked chooses the prefill one).
    if (s.pd_active && s.roles[id] == Role::kPrefill) st.healthy = false;
    if (st.healthy) ++usable;
  }
  if (usable > 0) return;
  // Panic: nothing else is usable, so ejected endpoints that still accept connections
  // serve as a last resort (full load, never attractive) rather than refusing everything.
  for (uint32_t id = 0; id < n; ++id) {
    const health::Verdict& v = s.verdicts[id];
    if (s.vacant[id] || !v.ejected || v.condition == health::Condition::kDown) continue;
    if (s.pd_active && s.roles[id] == Role::kPrefill) continue;
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

namespace {
int64_t PromptTokensOf(const sched::SchedRequest& req) {
  return req.token_ids.empty() ? req.EstimatedPromptTokens()
                               : static_cast<int64_t>(req.token_ids.size());
}
}  // namespace

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
  const bool sessions = sessions_enabled_.load(std::memory_order_relaxed) &&
                        (!request.session_id.empty() || !request.session_token.empty());
  uint64_t session_key = 0;
  std::optional<SessionTable::Binding> bound;
  std::optional<std::string_view> token_address;
  std::array<char, 256> token_buf;
  SessionTable::Binding bind;
  if (sessions) {
    if (!request.session_id.empty()) {
      session_key = SessionKey(request.session_id);
      bound = sessions_->Find(session_key, now_s);
    }
    if (!request.session_token.empty()) token_address = DecodeSessionToken(request.session_token, token_buf);
  }
  std::size_t hinted = 0;
  // A request with a cache_salt shares no block with unsalted ones in the engine (the
  // salt is in its first block's hash), and the events do not carry salts: precise state
  // would over-predict, so such requests use the approximate model (its keys hold the salt).
  const bool precise = !req.token_ids.empty() && req.cache_salt.empty() &&
                       events_active_.load(std::memory_order_relaxed);
  sc.event_keys.clear();
  std::shared_lock<RwSpinLock> events_lock(events_mu_, std::defer_lock);
  // An adapter request's keys are rooted in the adapter's name, as vLLM's block hashes
  // carry it in their extra keys and the index roots reported chains in lora_name; a
  // base-model request's in "" (sched::AdapterRequestKey decides, as the
  // lora-affinity-scorer does).
  auto with_events = [&](const SchedState& s, std::span<const sched::EndpointState> states) {
    if (!precise) return;
    const bool adapter =
        sched::AdapterRequestKey(req.model, states, now_s, s.health.staleness_s) != 0;
    events_lock.lock();
    events_->RequestKeys(adapter ? req.model : std::string_view(), req.token_ids,
                         &sc.event_keys);
    req.events = events_.get();
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
    if (sessions && status == sched::PickStatus::kOk && out.n_ranked > 0) {
      if (hinted == 0) {
        SessionLocked(request, r, bound, token_address, out, bind);
        if (out.session != SessionOutcome::kNone) {
          Bump(counters_->session_picks[static_cast<std::size_t>(out.session)]);
        }
      } else {
        // A routing hint decided: the session follows it.
        bind.endpoint = out.ranked[0];
        bind.address_key = SessionKey(out.endpoint(0).spec.address);
      }
    }
    if (s.pd_active && req.disaggregable && status == sched::PickStatus::kOk && out.n_ranked > 0) {
      PdLocked(req, r, out);
    }
    if (status != sched::PickStatus::kOk) {
      Bump(counters_->picks_failed);
    } else if (request.dispatch_first && out.n_ranked > 0) {
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
  }
  if (out.dispatched && !sc.event_keys.empty()) {
    // The route receipt's prediction, then speculative entries until the engine's events
    // for this request arrive, and the staleness clock when it must store blocks there.
    const uint32_t first = out.ranked[0];
    std::unique_lock<RwSpinLock> lock(events_mu_);
    const uint32_t held = events_->MatchOne(sc.event_keys, first, now_s);
    if (events_->Usable(first, now_s)) {
      // The engine computes a prompt's last token even when all of it is cached.
      const int64_t bt = events_->options().block_tokens;
      const int64_t n = static_cast<int64_t>(req.token_ids.size());
      out.predicted_cached_tokens = std::min<int64_t>(held * bt, (n - 1) / bt * bt);
    }
    if (held < sc.event_keys.size()) events_->OnWorkDispatched(first, now_s);
    events_->AddSpeculative(first, sc.event_keys, now_s);
  }
  if (sessions && !request.session_id.empty() && out.n_ranked > 0 && status == sched::PickStatus::kOk) {
    sessions_->Bind(session_key, bind, now_s);
  }
  if (!logs.empty()) Log(logs);
  out.locality = r.locality;
  if (status == sched::PickStatus::kOk) return out;
  out.status = Status::Unavailable(status == sched::PickStatus::kAllFiltered
                                       ? "every endpoint is saturated or filtered out"
                                       : "no healthy endpoint is available");
  return out;
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

void RoutingCore::PdLocked(const sched::SchedRequest& req, const sched::PickResult& r,
                           PickResult& out) {
  const uint32_t decode = out.ranked[0];
  const int64_t prompt = PromptTokensOf(req);
  // Cached on the decode endpoint, as the policy's prefix model (or the precise index
  // behind its prefix scorer) believes.
  const auto cached =
      static_cast<int64_t>(static_cast<double>(prompt) * CachedShareLocked(r, decode));
  PdDecision d = Decide(sched_->pd, prompt, cached);
  if (d == PdDecision::kDisaggregate && !ChoosePrefillLocked(req, decode, {}, out)) {
    d = PdDecision::kNoPrefill;
  }
  out.pd = d;
  Bump(counters_->pd_decisions[static_cast<std::size_t>(d)]);
}

bool RoutingCore::ChoosePrefillLocked(const sched::SchedRequest& req, uint32_t decode,
                                      std::span<const uint32_t> exclude, PickResult& out) {
  SchedState& s = *sched_;
  const int64_t prompt = PromptTokensOf(req);
  // Candidates: ready prefill-capable endpoints other than the decode one.
  thread_local std::vector<PrefillCandidate> cands;
  cands.clear();
  s.pd_key.clear();
  bool keyed = false;
  for (uint32_t id = 0; id < s.states.size(); ++id) {
    if (id == decode || s.vacant[id] || !PrefillCapable(s.roles[id])) continue;
    if (std::find(exclude.begin(), exclude.end(), id) != exclude.end()) continue;
    const health::Verdict& v = s.verdicts[id];
    if (v.condition != health::Condition::kUp || v.ejected ||
        v.treatment == health::Treatment::kDown) {
      continue;
    }
    if (!keyed && s.scheduler) {
      s.scheduler->PrefixKey(req, s.pd_key);
      keyed = true;
    }
    const std::size_t held = s.pd_key.empty() ? 0 : s.scheduler->HeldBlocks(s.pd_key, id);
    const double share =
        s.pd_key.empty() ? 0.0 : std::min(1.0, static_cast<double>(held) / s.pd_key.size());
    PrefillCandidate c;
    c.id = id;
    c.uncached_tokens = static_cast<double>(prompt) * (1.0 - share);
    c.queued_tokens = s.pd_queued[id];
    c.waiting = v.Known(health::Signal::kWaiting) ? s.states[id].waiting : -1.0;
    cands.push_back(c);
  }
  const int i = routing::PickPrefill(cands);
  if (i < 0) return false;
  const PrefillCandidate& c = cands[static_cast<std::size_t>(i)];
  out.prefill = c.id;
  out.prefill_tokens = c.uncached_tokens;
  s.pd_queued[c.id] += c.uncached_tokens;
  ++s.pd_pairs[{c.id, decode}];
  return true;
}

void RoutingCore::OnPrefillDone(uint32_t prefill_id, double tokens, sched::RequestHandle handle,
                                bool answered, double now_s) {
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  SchedState& s = *sched_;
  if (handle != sched::kNoHandle) {
    s.latency.OnPrefillAnswered(handle, prefill_id, answered, now_s);
    PublishLatencyLocked();
  }
  if (prefill_id >= s.pd_queued.size() || !std::isfinite(tokens)) return;
  s.pd_queued[prefill_id] = std::max(0.0, s.pd_queued[prefill_id] - tokens);
}

bool RoutingCore::PickPrefill(const sched::SchedRequest& request, uint32_t decode_id,
                              std::span<const uint32_t> exclude, PickResult& out) {
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  SchedState& s = *sched_;
  out.prefill = kNoEndpoint;
  out.prefill_tokens = 0.0;
  if (!s.pd_active || !s.scheduler || decode_id >= s.states.size()) return false;
  out.table = s.table;
  return ChoosePrefillLocked(request, decode_id, exclude, out);
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
      Bump(counters_->ejections_skipped);
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
    Bump(counters_->retries);
    Bump(counters_->retries_free);
    return true;
  }
  bool ok;
  {
    std::unique_lock<RwSpinLock> lock(sched_mu_);
    ok = sched_->budget.TryRetry(now_s, sched_->budget_options);
  }
  Bump(ok ? counters_->retries : counters_->retries_denied);
  return ok;
}

void RoutingCore::set_pick_timer(std::function<double()> seconds) {
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  sched_->timer = std::move(seconds);
  if (sched_->scheduler) sched_->scheduler->set_plugin_timer(&sched_->timer);
}

void RoutingCore::OnReloadFailed() { Bump(counters_->reloads_failed); }

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
  for (const auto& ep : table->by_id) {
    if (!ep || ep->id >= slots->size() || !(*slots)[ep->id]) continue;
    const Slot& slot = *(*slots)[ep->id];
    health::Verdict v;
    metrics::EngineMetrics m;
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      v = AssessSlot(slot, now_s, options->health);
      m = slot.health.last();
    }
    if (v.condition != health::Condition::kUp || v.ejected || v.treatment == health::Treatment::kDown) continue;
    ++g.ready;
    const double kv = Get(ep->stats->kv_adjusted);
    const double waiting = Get(ep->stats->waiting_adjusted);
    const bool waiting_known = v.Known(health::Signal::kWaiting) && std::isfinite(waiting);
    if (v.Known(health::Signal::kKvUsage) && std::isfinite(kv)) g.kv_usage.Add(kv);
    if (waiting_known) g.waiting.Add(waiting);
    if (v.Known(health::Signal::kRunning) && std::isfinite(m.running)) g.running.Add(m.running);
    g.queues.push_back({ep->spec.name, ep->spec.address, waiting_known ? waiting : kNaN});
  }
  return g;
}

RoutingCore::PoolLoad RoutingCore::Load(double now_s) {
  // Fold in the scrapes since the last pick first, as a pick would: the adjusted loads
  // read below are published by that sync.
  if (SyncDue(now_s)) {
    std::vector<std::string> logs;
    {
      std::unique_lock<RwSpinLock> lock(sched_mu_);
      SyncLocked(now_s, &logs);
    }
    if (!logs.empty()) Log(logs);
  }
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
    if (v.Known(health::Signal::kWaiting) && std::isfinite(waiting)) {
      load.waiting_sum += waiting;
      ++load.waiting_known;
      saturated = saturated || waiting >= 5.0;
    }
    if (saturated) {
      ++load.saturated;
    } else {
      const int64_t r = v.Known(health::Signal::kWaiting) && std::isfinite(waiting)
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
  const double objective = request.slo_ttft_s > 0 ? request.slo_ttft_s : s.default_slo_ttft_s;
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
    const uint32_t queued = s.latency.QueuedRequests(id);
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
    const auto p = s.latency.PredictTtft(
        sched::LatencyTrainer::DispatchOf(request, s.states[best], cached));
    if (p && std::isfinite(*p) && *p >= 0) {
      predicted = *p;
      known = true;
    }
  }
  return SloBudget{std::max(0.0, objective - predicted), known, objective};
}

// ---- observability ----

void RoutingCore::AppendMetrics(std::string& out, double now_s) const {
  using metrics::AppendCounter;
  using metrics::AppendGauge;
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  auto table = table_.load();
  auto slots = slots_.load();
  auto options = options_.load();
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
  for (const auto& ep : table->by_id) {
    if (ep) requests(ep->spec.name, ep->stats->requests);
  }
  AppendHeader(out, "kvroute_upstream_errors_total", "Failed upstream attempts, by endpoint and kind.",
               MetricType::kCounter);
  for (const auto& ep : table->by_id) {
    if (!ep) continue;
    std::lock_guard<std::mutex> lock(ep->stats->errors_mu);
    for (const auto& [kind, n] : ep->stats->errors) {
      Label labels[] = {{"endpoint", ep->spec.name}, {"kind", kind}};
      AppendSample(out, "kvroute_upstream_errors_total", labels, static_cast<double>(n));
    }
  }
  AppendCounter(out, "kvroute_retries_total", "Attempts sent to a fallback endpoint.", {},
                GetU(c.retries));
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

  struct Row {
    const Endpoint* ep;
    health::Verdict v;
    metrics::EngineMetrics m;
    double age;
  };
  std::vector<Row> rows;
  rows.reserve(table->by_id.size());
  for (const auto& ep : table->by_id) {
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
  if (events_active_.load(std::memory_order_relaxed)) AppendKvEventMetrics(out, *table, now_s);
}

void RoutingCore::AppendKvEventMetrics(std::string& out, const EndpointTable& table, double now_s) const {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  std::vector<std::pair<const Endpoint*, kvevents::EndpointEventStats>> rows;
  size_t speculative = 0;
  {
    std::shared_lock<RwSpinLock> lock(events_mu_);
    for (const auto& ep : table.by_id) {
      if (!ep || ep->spec.kv_events.empty()) continue;
      rows.emplace_back(ep.get(), events_->Stats(ep->id, now_s));
    }
    speculative = events_->SpeculativeEntries();
  }
  AppendHeader(out, "kvroute_kv_events_state",
               "1 on the endpoint's KV-event state: unknown (never heard from), live (its "
               "prefix scores come from its events), stale (work dispatched, no events since), "
               "resync (entries dropped after a gap, an undecodable batch or an overflow), "
               "mismatch (engine block size not a multiple of the index's). Every state but "
               "live uses the approximate model.",
               MetricType::kGauge);
  for (const auto& [ep, st] : rows) {
    for (size_t k = 1; k < kvevents::kSourceStates; ++k) {
      const auto state = static_cast<kvevents::SourceState>(k);
      Label labels[] = {{"endpoint", ep->spec.name}, {"state", kvevents::SourceStateName(state)}};
      AppendSample(out, "kvroute_kv_events_state", labels, st.state == state ? 1.0 : 0.0);
    }
  }
  auto family = [&](std::string_view name, std::string_view help, MetricType type, auto value) {
    AppendHeader(out, name, help, type);
    for (const auto& [ep, st] : rows) {
      Label labels[] = {{"endpoint", ep->spec.name}};
      AppendSample(out, name, labels, value(st));
    }
  };
  using Stats = kvevents::EndpointEventStats;
  family("kvroute_kv_events_batches_total", "Event batches applied to the precise index.",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.batches); });
  AppendHeader(out, "kvroute_kv_events_events_total", "Events applied, by type.", MetricType::kCounter);
  for (const auto& [ep, st] : rows) {
    const std::pair<std::string_view, uint64_t> types[] = {
        {"BlockStored", st.stored}, {"BlockRemoved", st.removed}, {"AllBlocksCleared", st.cleared}};
    for (const auto& [type, n] : types) {
      Label labels[] = {{"endpoint", ep->spec.name}, {"type", type}};
      AppendSample(out, "kvroute_kv_events_events_total", labels, static_cast<double>(n));
    }
  }
  family("kvroute_kv_events_gaps_total", "Gaps in the event sequence (replayed or not).",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.gaps); });
  family("kvroute_kv_events_gaps_unrepaired_total",
         "Gaps replay could not fill: the endpoint's entries were dropped and it resyncs.",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.gaps_unrepaired); });
  family("kvroute_kv_events_restarts_total",
         "Publisher restarts (the sequence went back): the endpoint's entries were dropped.",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.restarts); });
  family("kvroute_kv_events_decode_errors_total",
         "Batches or events that could not be decoded or were malformed.", MetricType::kCounter,
         [](const Stats& st) { return static_cast<double>(st.decode_errors); });
  family("kvroute_kv_events_orphans_total",
         "Stored blocks dropped because their parent block was never seen.", MetricType::kCounter,
         [](const Stats& st) { return static_cast<double>(st.orphans); });
  family("kvroute_kv_events_block_size_mismatches_total",
         "Stored runs whose block size is not a multiple of the index's (pool.kv_events.block_size).",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.mismatches); });
  family("kvroute_kv_events_overflows_total",
         "Times the endpoint exceeded the index's per-endpoint bound (entries dropped).",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.overflows); });
  family("kvroute_kv_events_blocks", "Engine blocks the endpoint reports cached (indexed now).",
         MetricType::kGauge, [](const Stats& st) { return static_cast<double>(st.blocks); });
  family("kvroute_kv_events_engine_block_size",
         "Block size (tokens) in the endpoint's last stored run; NaN before one.", MetricType::kGauge,
         [](const Stats& st) {
           return st.block_size > 0 ? static_cast<double>(st.block_size) : std::nan("");
         });
  family("kvroute_kv_events_last_batch_age_seconds",
         "Seconds since the endpoint's last batch was applied; NaN when none arrived.",
         MetricType::kGauge, [&](const Stats& st) {
           return st.last_batch_s >= 0 ? now_s - st.last_batch_s : std::nan("");
         });
  const ReceiptStats& rc = counters_->receipts;
  metrics::AppendCounter(out, "kvroute_route_receipts_total",
                         "Answers whose engine reported its cached prompt tokens, for picks that "
                         "predicted them from KV events (route receipts).", {}, GetU(rc.receipts));
  metrics::AppendCounter(out, "kvroute_route_receipts_mispredicted_total",
                         "Route receipts where predicted and reported cached tokens differ by "
                         "more than one block of the index.", {}, GetU(rc.mispredicted));
  metrics::AppendCounter(out, "kvroute_route_receipts_unreported_total",
                         "Answers to picks with a prediction that carried no cached-token count "
                         "(the engine runs without --enable-prompt-tokens-details).",
                         {}, GetU(rc.unreported));
  {
    Label over[] = {{"direction", "over"}};
    Label under[] = {{"direction", "under"}};
    AppendHeader(out, "kvroute_route_receipts_off_total",
                 "Route receipts where the prediction was above (over) or below (under) what "
                 "the engine reported.", MetricType::kCounter);
    AppendSample(out, "kvroute_route_receipts_off_total", over, GetU(rc.over));
    AppendSample(out, "kvroute_route_receipts_off_total", under, GetU(rc.under));
  }
  metrics::AppendCounter(out, "kvroute_route_receipts_predicted_tokens_total",
                         "Cached prompt tokens predicted, over route receipts.", {}, GetU(rc.predicted_sum));
  metrics::AppendCounter(out, "kvroute_route_receipts_reported_tokens_total",
                         "Cached prompt tokens the engines reported, over route receipts.", {},
                         GetU(rc.reported_sum));
  AppendHeader(out, "kvroute_route_receipt_error_tokens",
               "|reported - predicted| cached prompt tokens per route receipt.", MetricType::kHistogram);
  {
    std::array<uint64_t, ReceiptStats::kBounds.size() + 1> counts;
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = rc.abs_error[i].load(std::memory_order_relaxed);
    metrics::AppendHistogramSeries(out, "kvroute_route_receipt_error_tokens", {}, ReceiptStats::kBounds,
                                   counts, GetU(rc.abs_error_sum));
  }
  metrics::AppendGauge(out, "kvroute_kv_events_speculative_entries",
                       "Speculative prefix entries (just-dispatched requests awaiting their events).",
                       {}, static_cast<double>(speculative));
}

}  // namespace kvroute::routing
