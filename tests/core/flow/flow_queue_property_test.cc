// Randomised property test of the flow-control queue against a trivially correct model
// (a map of what waits), over every fairness/ordering combination, with small bounds so
// that every rejection reason happens: thousands of random admits, dispatches (with and
// without a probe), cancels and expiries in virtual time, with a fixed seed.
//
// Checked after every operation: counts and bytes per band equal the model's contents,
// NextExpiry is the model's earliest expiry; each outcome is the one the rules give; a
// dispatched request was waiting, in the highest waiting band, not expired, and first of
// its flow (first of its band under global fairness) when no probe was given; nothing
// leaves twice and, at the end, every queued request left exactly once.
#include "core/flow/flow_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "core/common/rng.h"

namespace kvroute::flow {
namespace {

struct ModelEntry {
  int64_t priority;
  uint64_t flow;
  uint64_t bytes;
  double expires;
  ExpireReason reason;
  uint64_t seq;
  uint64_t prefix_key;
};

class Harness {
 public:
  Harness(const FlowOptions& o, uint64_t seed) : o_(o), q_(o), rng_(seed) {}

  void Run(int ops) {
    for (int i = 0; i < ops; ++i) {
      now_ += rng_.Uniform() < 0.3 ? rng_.Uniform() * 0.5 : 0.0;
      // Alternating overload and drain phases, so bands fill up and empty again.
      const bool overload = (i / 400) % 2 == 0;
      const uint64_t op = rng_.Below(100);
      const uint64_t admit = overload ? 70 : 35;
      if (op < admit) {
        DoAdmit();
      } else if (op < 75) {
        DoDispatch();
      } else if (op < 85) {
        DoCancel();
      } else {
        DoExpire(now_);
      }
      CheckCounts();
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Everything still waiting leaves by expiry; then every queued id left exactly once.
    DoExpire(std::numeric_limits<double>::infinity());
    CheckCounts();
    EXPECT_TRUE(q_.Empty());
    EXPECT_EQ(left_total_, queued_total_);
    const FlowStats s = q_.stats();
    uint64_t queued = 0, dispatched = 0, cancelled = 0, expired = 0;
    for (const auto& b : s.bands) {
      queued += b.queued;
      dispatched += b.dispatched;
      cancelled += b.cancelled;
      for (uint64_t e : b.expired) expired += e;
    }
    EXPECT_EQ(queued, queued_total_);
    EXPECT_EQ(dispatched + cancelled + expired, queued_total_);
    EXPECT_EQ(dispatched, dispatched_total_);
    EXPECT_EQ(cancelled, cancelled_total_);
    EXPECT_GT(dispatched_total_, 0u);
    EXPECT_GT(cancelled_total_, 0u);
    EXPECT_GT(expired, 0u);
  }

  uint64_t rejected(RejectReason r) const { return q_.stats().rejected[static_cast<int>(r)]; }
  uint64_t dispatched_by_affinity() const {
    uint64_t n = 0;
    for (const auto& b : q_.stats().bands) n += b.dispatched_by_affinity;
    return n;
  }

 private:
  bool HigherOrEqualWaits(int64_t p) const {
    for (const auto& [id, e] : model_) {
      if (e.priority >= p) return true;
    }
    return false;
  }
  uint64_t BandCount(int64_t p) const {
    uint64_t n = 0;
    for (const auto& [id, e] : model_) n += e.priority == p;
    return n;
  }
  uint64_t BandBytes(int64_t p) const {
    uint64_t n = 0;
    for (const auto& [id, e] : model_) n += e.priority == p ? e.bytes : 0;
    return n;
  }
  double OrderKey(const ModelEntry& e) const {
    return o_.ordering == Ordering::kEarliestDeadline ? e.expires : 0.0;
  }

  void DoAdmit() {
    FlowRequest r;
    // Mostly fresh ids; sometimes one that is waiting (duplicate) or one that left (reuse).
    const uint64_t pick = rng_.Below(20);
    if (pick == 0 && !model_.empty()) {
      r.id = std::next(model_.begin(), rng_.Below(model_.size()))->first;
    } else if (pick == 1 && !left_.empty()) {
      r.id = *std::next(left_.begin(), rng_.Below(std::min<uint64_t>(left_.size(), 8)));
    } else {
      r.id = next_id_++;
    }
    r.priority = static_cast<int64_t>(rng_.Below(4)) - 1;  // -1..2
    r.flow_id = rng_.Below(5);
    r.bytes = rng_.Below(2) == 0 ? 0 : rng_.Below(200);
    if (rng_.Below(3) == 0) r.deadline_s = now_ + rng_.Uniform() * 3.0;
    r.prefix_key = rng_.Next();
    const uint64_t ps = rng_.Below(10);
    const PoolState pool =
        ps < 3 ? PoolState::kAvailable : (ps < 9 ? PoolState::kSaturated : PoolState::kEmpty);

    const bool dup = model_.contains(r.id);
    const bool must_wait = pool != PoolState::kAvailable || HigherOrEqualWaits(r.priority);
    const AdmitResult got = q_.Admit(r, now_, pool);
    if (dup) {
      EXPECT_EQ(got.reason, RejectReason::kDuplicateId);
      return;
    }
    if (!must_wait) {
      EXPECT_EQ(got.outcome, AdmitOutcome::kDispatchNow);
      return;
    }
    if (r.priority < o_.shed_below_priority) {
      EXPECT_EQ(got.reason, RejectReason::kSheddable);
      return;
    }
    if (BandCount(r.priority) >= o_.max_requests) {
      EXPECT_EQ(got.reason, RejectReason::kBandFullRequests);
      return;
    }
    if (BandBytes(r.priority) + r.bytes > o_.max_bytes) {
      EXPECT_EQ(got.reason, RejectReason::kBandFullBytes);
      return;
    }
    ASSERT_EQ(got.outcome, AdmitOutcome::kQueued);
    ModelEntry e{r.priority, r.flow_id, r.bytes, 0, ExpireReason::kTtl, seq_++, r.prefix_key};
    const bool empty = pool == PoolState::kEmpty;
    e.expires = now_ + (empty ? o_.no_endpoint_ttl_s : o_.default_ttl_s);
    e.reason = empty ? ExpireReason::kNoEndpointTtl : ExpireReason::kTtl;
    if (r.deadline_s && *r.deadline_s < e.expires) {
      e.expires = *r.deadline_s;
      e.reason = ExpireReason::kDeadline;
    }
    model_[r.id] = e;
    left_.erase(r.id);
    ++queued_total_;
  }

  void DoDispatch() {
    DoExpire(now_);  // the contract: expire first, with the same time
    const bool with_probe = rng_.Below(2) == 0;
    const uint64_t replica = rng_.Next();
    // A replica holds a few blocks of some prefixes, decided by the key.
    auto held = [replica](uint64_t key) -> uint32_t {
      const uint64_t h = MixKey(key, replica);
      return h % 4 == 0 ? static_cast<uint32_t>(h >> 60) : 0;
    };
    int probe_calls = 0;
    auto probe = [&](const WaitingView& w) -> uint32_t {
      ++probe_calls;
      auto it = model_.find(w.id);
      EXPECT_NE(it, model_.end());
      if (it != model_.end()) {
        EXPECT_EQ(w.prefix_key, it->second.prefix_key);
        EXPECT_EQ(w.flow_id, it->second.flow);
      }
      return held(w.prefix_key);
    };
    const std::optional<Dispatch> d =
        with_probe ? q_.NextToDispatch(now_, probe) : q_.NextToDispatch(now_);
    EXPECT_LE(probe_calls, static_cast<int>(o_.affinity_window));
    if (model_.empty()) {
      EXPECT_FALSE(d.has_value());
      return;
    }
    ASSERT_TRUE(d.has_value());
    auto it = model_.find(d->id);
    ASSERT_NE(it, model_.end()) << "dispatched " << d->id << ", which was not waiting";
    const ModelEntry e = it->second;
    int64_t highest = std::numeric_limits<int64_t>::min();
    for (const auto& [id, m] : model_) highest = std::max(highest, m.priority);
    EXPECT_EQ(e.priority, highest);
    EXPECT_EQ(d->priority, e.priority);
    EXPECT_EQ(d->bytes, e.bytes);
    EXPECT_GT(e.expires, now_);
    if (with_probe) {
      EXPECT_EQ(d->held_blocks, held(e.prefix_key));
    } else {
      EXPECT_EQ(d->cause, DispatchCause::kOrder);
      // First in order among its flow (its whole band under global fairness).
      const bool global = o_.fairness == Fairness::kGlobal;
      for (const auto& [id, m] : model_) {
        if (id == d->id || m.priority != e.priority || (!global && m.flow != e.flow)) continue;
        EXPECT_LT(std::make_tuple(OrderKey(e), e.seq), std::make_tuple(OrderKey(m), m.seq))
            << "dispatched " << d->id << " ahead of " << id;
      }
    }
    Leave(d->id);
    ++dispatched_total_;
  }

  void DoCancel() {
    RequestId id;
    const bool known = !model_.empty() && rng_.Below(4) != 0;
    if (known) {
      id = std::next(model_.begin(), rng_.Below(model_.size()))->first;
    } else {
      id = next_id_ + 1000000 + rng_.Below(10);  // never admitted
    }
    EXPECT_EQ(q_.Cancel(id, now_), known);
    if (known) {
      Leave(id);
      ++cancelled_total_;
    }
  }

  void DoExpire(double t) {
    out_.clear();
    const std::size_t n = q_.Expire(t, out_);
    EXPECT_EQ(n, out_.size());
    double last = -std::numeric_limits<double>::infinity();
    for (const Expired& x : out_) {
      auto it = model_.find(x.id);
      ASSERT_NE(it, model_.end()) << "expired " << x.id << ", which was not waiting";
      EXPECT_LE(it->second.expires, t);
      EXPECT_GE(it->second.expires, last);  // earliest first
      last = it->second.expires;
      EXPECT_EQ(x.reason, it->second.reason);
      Leave(x.id);
    }
    for (const auto& [id, m] : model_) EXPECT_GT(m.expires, t) << id << " should have expired";
  }

  void Leave(RequestId id) {
    model_.erase(id);
    EXPECT_TRUE(left_.insert(id).second) << id << " left twice";
    ++left_total_;
  }

  void CheckCounts() {
    ASSERT_EQ(q_.size(), model_.size());
    const FlowStats s = q_.stats();
    uint64_t bytes = 0;
    std::map<int64_t, std::pair<uint64_t, uint64_t>> bands;  // priority -> requests, bytes
    double earliest = std::numeric_limits<double>::infinity();
    for (const auto& [id, m] : model_) {
      auto& b = bands[m.priority];
      ++b.first;
      b.second += m.bytes;
      bytes += m.bytes;
      earliest = std::min(earliest, m.expires);
      EXPECT_TRUE(q_.Contains(id));
    }
    EXPECT_EQ(s.waiting_requests, model_.size());
    EXPECT_EQ(s.waiting_bytes, bytes);
    EXPECT_EQ(q_.NextExpiry(), earliest);
    int64_t prev = std::numeric_limits<int64_t>::max();
    for (const auto& b : s.bands) {
      EXPECT_LT(b.priority, prev);  // highest first, each once
      prev = b.priority;
      auto it = bands.find(b.priority);
      const auto want = it == bands.end() ? std::pair<uint64_t, uint64_t>{0, 0} : it->second;
      EXPECT_EQ(b.waiting_requests, want.first) << "band " << b.priority;
      EXPECT_EQ(b.waiting_bytes, want.second) << "band " << b.priority;
      uint64_t expired = 0;
      for (uint64_t e : b.expired) expired += e;
      EXPECT_EQ(b.queued, b.waiting_requests + b.dispatched + b.cancelled + expired);
      EXPECT_LE(b.waiting_requests, o_.max_requests);
      EXPECT_LE(b.waiting_bytes, o_.max_bytes);
    }
    const auto highest = q_.HighestWaitingPriority();
    EXPECT_EQ(highest.has_value(), !model_.empty());
    if (highest && !bands.empty()) {
      EXPECT_EQ(*highest, bands.rbegin()->first);
    }
  }

  FlowOptions o_;
  FlowQueue q_;
  Rng rng_;
  double now_ = 0.0;
  std::map<RequestId, ModelEntry> model_;
  std::set<RequestId> left_;
  std::vector<Expired> out_;
  RequestId next_id_ = 1;
  uint64_t seq_ = 0;
  uint64_t queued_total_ = 0, dispatched_total_ = 0, cancelled_total_ = 0, left_total_ = 0;
};

class FlowQueueProperty
    : public ::testing::TestWithParam<std::tuple<Fairness, Ordering, uint32_t>> {};

TEST_P(FlowQueueProperty, MatchesTheModelOverRandomOperations) {
  const auto [fairness, ordering, window] = GetParam();
  FlowOptions o;
  o.fairness = fairness;
  o.ordering = ordering;
  o.affinity_window = window;
  o.max_affinity_skips = 3;
  o.max_requests = 12;
  o.max_bytes = 600;
  o.default_ttl_s = 4.0;
  o.no_endpoint_ttl_s = 1.5;
  Harness h(o, /*seed=*/0x5eed + window + 10 * static_cast<int>(fairness) +
                   100 * static_cast<int>(ordering));
  h.Run(20000);
  // The bounds were exercised, and so was shedding.
  EXPECT_GT(h.rejected(RejectReason::kBandFullRequests), 0u);
  EXPECT_GT(h.rejected(RejectReason::kBandFullBytes), 0u);
  EXPECT_GT(h.rejected(RejectReason::kSheddable), 0u);
  EXPECT_GT(h.rejected(RejectReason::kDuplicateId), 0u);
  // Late binding took a request out of order only when it could look past the first.
  if (window > 1) {
    EXPECT_GT(h.dispatched_by_affinity(), 0u);
  } else {
    EXPECT_EQ(h.dispatched_by_affinity(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllPolicies, FlowQueueProperty,
    ::testing::Combine(::testing::Values(Fairness::kRoundRobin, Fairness::kGlobal),
                       ::testing::Values(Ordering::kFcfs, Ordering::kEarliestDeadline),
                       ::testing::Values(1u, 4u, 16u)));

}  // namespace
}  // namespace kvroute::flow
