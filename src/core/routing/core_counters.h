// The routing core's lock-free counters: the small atomic helpers every core source and
// component uses, the counter shapes (by HTTP status, fixed-bound histograms, score sums),
// and each endpoint's counters and published gauges (EndpointStats, reached through the
// endpoint table). Not an interface: nothing outside core/routing includes it.
//
// Threads: every counter may be read from any thread; the comments say who writes.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/sched/types.h"

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

// Per endpoint: its counters, and the gauges the core publishes for it (endpoint_table.h's
// Endpoint::stats; it survives reloads with the endpoint).
struct EndpointStats {
  core_detail::CodeCounts requests;
  std::mutex errors_mu;  // failures only: never on a successful request's path
  std::map<std::string, uint64_t, std::less<>> errors;
  std::atomic<uint64_t> scrapes_ok{0}, scrapes_failed{0};
  std::atomic<uint64_t> ejections{0}, restarts{0};
  // Published under the scheduler's lock after each change of the endpoint's accounting.
  std::atomic<double> kv_adjusted{core_detail::kNaN}, waiting_adjusted{core_detail::kNaN},
      inflight{0}, prefix_entries{-1};
  // Its engine's queue waits for adapter slots, not for compute (metrics::AdapterBound):
  // the saturation detector does not read that queue as saturation (RoutingCore::Load).
  std::atomic<bool> adapter_bound{false};
  // The requests counter of the endpoint's region (CoreMetrics::BindRegions), set by
  // Configure from its labels; never null once the endpoint is published.
  std::atomic<std::atomic<uint64_t>*> region_requests{nullptr};
};

}  // namespace kvroute::routing
