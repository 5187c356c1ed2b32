// The routing core's private state: what RoutingCore's sources (routing_core.cc and the
// core_*.cc files beside it, one per feature) share. Not an interface: nothing outside
// core/routing includes it.
//
// Threads: the comments on each member say who writes it and under which lock
// (sched_mu_: the scheduler's reader/writer lock; Slot::mu: one endpoint's scrape state).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/routing/routing_core.h"
#include "core/sched/plugin.h"

namespace kvroute::routing {

namespace core_detail {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Written by one thread at a time (under the scheduler's lock, or by the owning scrape),
// read by any: relaxed atomics are enough, and a plain store beats a CAS loop.
inline void Set(std::atomic<double>& a, double v) { a.store(v, std::memory_order_relaxed); }
inline double Get(const std::atomic<double>& a) { return a.load(std::memory_order_relaxed); }
inline void Bump(std::atomic<uint64_t>& a, uint64_t n = 1) { a.fetch_add(n, std::memory_order_relaxed); }
// The prompt's length in tokens: its token ids when the front end tokenized it, else the
// estimate from its text.
inline int64_t PromptTokensOf(const sched::SchedRequest& req) {
  return req.token_ids.empty() ? req.EstimatedPromptTokens()
                               : static_cast<int64_t>(req.token_ids.size());
}

inline double GetU(const std::atomic<uint64_t>& a) {
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

struct ScoreSummary {
  std::atomic<double> sum{0.0};
  std::atomic<uint64_t> count{0};
  void Add(double v) {  // single writer (under the scheduler's lock)
    Set(sum, Get(sum) + v);
    Bump(count);
  }
};

}  // namespace core_detail

// The helpers and counters above are used unqualified by every core source.
using namespace core_detail;  // NOLINT(google-build-using-namespace)

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

namespace core_detail {

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

}  // namespace core_detail

}  // namespace kvroute::routing
