// The routing core's private state: what RoutingCore's sources (routing_core.cc and the
// core_*.cc files beside it, one per feature) share. Not an interface: nothing outside
// core/routing includes it. The components' state is their own (the headers named in
// routing_core.h's table); the counters' shapes are in core_counters.h.
//
// Threads: the comments on each member say who writes it and under which lock
// (sched_mu_: the scheduler's reader/writer lock; Slot::mu: one endpoint's scrape state).
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/routing/core_counters.h"
#include "core/routing/routing_core.h"
#include "core/routing/sched_view.h"
#include "core/sched/plugin.h"

namespace kvroute::routing {

// The helpers and counters of core_counters.h are used unqualified by every core source.
using namespace core_detail;  // NOLINT(google-build-using-namespace)

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
  std::function<double()> timer;
  RetryBudget budget;
  RetryBudgetOptions budget_options;
  // The view lent to the components that work under sched_mu_ (sched_view.h).
  SchedView view() const {
    return SchedView{scheduler.get(), table.get(), states, verdicts, vacant, max_ranked};
  }
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
