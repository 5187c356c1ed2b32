// The flow-control queue as pure logic, in virtual time: admission, ordering between and
// inside bands, bounds, TTLs, cancellation, late binding and its anti-starvation rule.
#include "core/flow/flow_queue.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

namespace kvroute::flow {
namespace {

constexpr AdmitResult kNow{AdmitOutcome::kDispatchNow, RejectReason::kNone};
constexpr AdmitResult kQueued{AdmitOutcome::kQueued, RejectReason::kNone};
constexpr AdmitResult Rejected(RejectReason r) { return {AdmitOutcome::kRejected, r}; }

FlowRequest Req(RequestId id, int64_t priority = 0, uint64_t flow = 0, uint64_t bytes = 0) {
  FlowRequest r;
  r.id = id;
  r.priority = priority;
  r.flow_id = flow;
  r.bytes = bytes;
  r.prefix_key = id * 100;  // distinct, so probes can tell requests apart by key too
  return r;
}

// Dispatches everything that waits (no probe) and returns the ids in order.
std::vector<RequestId> Drain(FlowQueue& q, double now) {
  std::vector<RequestId> ids;
  while (auto d = q.NextToDispatch(now)) ids.push_back(d->id);
  return ids;
}

BandStats BandOf(const FlowStats& s, int64_t priority) {
  for (const auto& b : s.bands) {
    if (b.priority == priority) return b;
  }
  ADD_FAILURE() << "no band " << priority;
  return {};
}

TEST(FlowQueue, DispatchesAtOnceWhenThePoolIsAvailableAndNothingWaits) {
  FlowQueue q;
  EXPECT_EQ(q.Admit(Req(1), 0.0, PoolState::kAvailable), kNow);
  EXPECT_TRUE(q.Empty());
  EXPECT_FALSE(q.Contains(1));
  EXPECT_EQ(q.NextToDispatch(0.0), std::nullopt);
  const FlowStats s = q.stats();
  ASSERT_EQ(s.bands.size(), 1u);
  EXPECT_EQ(s.bands[0].dispatched_at_once, 1u);
  EXPECT_EQ(s.bands[0].queued, 0u);
  EXPECT_EQ(s.bands[0].wait.count, 1u);      // counted as a zero wait
  EXPECT_EQ(s.bands[0].wait.counts[0], 1u);  // first bucket (<= 1 ms)
}

TEST(FlowQueue, QueuesWhenSaturatedAndDispatchesWhenCapacityFrees) {
  FlowQueue q;
  EXPECT_EQ(q.Admit(Req(1), 1.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(q.size(), 1u);
  EXPECT_TRUE(q.Contains(1));
  auto d = q.NextToDispatch(1.75);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->id, 1u);
  EXPECT_DOUBLE_EQ(d->waited_s, 0.75);
  EXPECT_EQ(d->cause, DispatchCause::kOrder);
  EXPECT_EQ(d->held_blocks, 0u);
  EXPECT_TRUE(q.Empty());
  const BandStats b = BandOf(q.stats(), 0);
  EXPECT_EQ(b.queued, 1u);
  EXPECT_EQ(b.dispatched, 1u);
  EXPECT_EQ(b.waiting_requests, 0u);
}

TEST(FlowQueue, AnAvailablePoolStillQueuesBehindEqualOrHigherPriority) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(Req(1, 5), 0.0, PoolState::kSaturated), kQueued);
  // Capacity appeared but the adapter has not drained yet: no overtaking.
  EXPECT_EQ(q.Admit(Req(2, 5), 0.1, PoolState::kAvailable), kQueued);  // equal
  EXPECT_EQ(q.Admit(Req(3, 2), 0.2, PoolState::kAvailable), kQueued);  // lower
  // Something more important than everything waiting goes at once.
  EXPECT_EQ(q.Admit(Req(4, 9), 0.3, PoolState::kAvailable), kNow);
  EXPECT_EQ(Drain(q, 1.0), (std::vector<RequestId>{1, 2, 3}));
}

TEST(FlowQueue, StrictPriorityBetweenBandsHighestFirst) {
  FlowQueue q;
  // Interleaved arrivals over three bands and two flows.
  RequestId id = 1;
  for (int round = 0; round < 3; ++round) {
    for (int64_t p : {0, 7, 3}) {
      ASSERT_EQ(q.Admit(Req(id, p, id % 2), 0.01 * id, PoolState::kSaturated), kQueued);
      ++id;
    }
  }
  std::vector<int64_t> priorities;
  while (auto d = q.NextToDispatch(1.0)) priorities.push_back(d->priority);
  EXPECT_EQ(priorities, (std::vector<int64_t>{7, 7, 7, 3, 3, 3, 0, 0, 0}));
  EXPECT_EQ(q.HighestWaitingPriority(), std::nullopt);
}

TEST(FlowQueue, AHigherBandArrivingLaterOvertakesAWaitingLowerBand) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(Req(1, 0), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(2, 0), 0.1, PoolState::kSaturated), kQueued);
  EXPECT_EQ(q.NextToDispatch(0.2)->id, 1u);
  ASSERT_EQ(q.Admit(Req(3, 1), 0.3, PoolState::kSaturated), kQueued);
  EXPECT_EQ(q.HighestWaitingPriority(), 1);
  EXPECT_EQ(Drain(q, 0.4), (std::vector<RequestId>{3, 2}));
}

TEST(FlowQueue, RoundRobinGivesASmallFlowItsShareAgainstAFlood) {
  FlowQueue q;
  // Flow A (1) queues 100 first, then flow B (2) queues 3.
  for (RequestId i = 0; i < 100; ++i) {
    ASSERT_EQ(q.Admit(Req(1000 + i, 0, 1), 0.001 * i, PoolState::kSaturated), kQueued);
  }
  for (RequestId i = 0; i < 3; ++i) {
    ASSERT_EQ(q.Admit(Req(2000 + i, 0, 2), 1.0 + i, PoolState::kSaturated), kQueued);
  }
  const std::vector<RequestId> order = Drain(q, 10.0);
  ASSERT_EQ(order.size(), 103u);
  // Exactly alternating while both wait: A B A B A B, then the rest of A in order.
  EXPECT_EQ(std::vector<RequestId>(order.begin(), order.begin() + 7),
            (std::vector<RequestId>{1000, 2000, 1001, 2001, 1002, 2002, 1003}));
  for (std::size_t i = 6; i < order.size(); ++i) EXPECT_EQ(order[i], 1000 + (i - 3));
}

TEST(FlowQueue, AFlowThatStartsWaitingGoesBehindEveryWaitingFlow) {
  FlowQueue q;
  for (uint64_t flow : {1, 2, 3}) {
    ASSERT_EQ(q.Admit(Req(flow * 10, 0, flow), 0.0, PoolState::kSaturated), kQueued);
    ASSERT_EQ(q.Admit(Req(flow * 10 + 1, 0, flow), 0.0, PoolState::kSaturated), kQueued);
  }
  EXPECT_EQ(q.NextToDispatch(1.0)->id, 10u);  // flow 1; flow 2's turn next
  ASSERT_EQ(q.Admit(Req(40, 0, 4), 1.0, PoolState::kSaturated), kQueued);
  // The tail of the list, as in deficit round-robin: after 2, 3 and 1 (which went to the
  // tail when it was served).
  EXPECT_EQ(Drain(q, 2.0), (std::vector<RequestId>{20, 30, 11, 40, 21, 31}));
}

TEST(FlowQueue, AnEmptiedFlowLeavesTheRingAndRejoinsAtTheEnd) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(Req(10, 0, 1), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(20, 0, 2), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(21, 0, 2), 0.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(q.NextToDispatch(1.0)->id, 10u);  // flow 1 empties
  ASSERT_EQ(q.Admit(Req(11, 0, 1), 1.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(Drain(q, 2.0), (std::vector<RequestId>{20, 11, 21}));
}

TEST(FlowQueue, GlobalFairnessIsOneOrderAcrossFlows) {
  FlowOptions o;
  o.fairness = Fairness::kGlobal;
  FlowQueue q(o);
  for (RequestId i = 0; i < 5; ++i) {
    ASSERT_EQ(q.Admit(Req(10 + i, 0, 1), 0.1 * i, PoolState::kSaturated), kQueued);
  }
  ASSERT_EQ(q.Admit(Req(20, 0, 2), 1.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(Drain(q, 2.0), (std::vector<RequestId>{10, 11, 12, 13, 14, 20}));
}

TEST(FlowQueue, FcfsInsideAFlowIgnoresDeadlines) {
  FlowQueue q;  // FCFS by default
  FlowRequest late = Req(1);
  late.deadline_s = 20.0;
  FlowRequest early = Req(2);
  early.deadline_s = 5.0;
  ASSERT_EQ(q.Admit(late, 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(early, 0.5, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(3), 1.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(Drain(q, 2.0), (std::vector<RequestId>{1, 2, 3}));
}

TEST(FlowQueue, EarliestDeadlineInsideAFlowTiesByAdmission) {
  FlowOptions o;
  o.ordering = Ordering::kEarliestDeadline;
  o.default_ttl_s = 10.0;
  FlowQueue q(o);
  auto with_deadline = [](RequestId id, double deadline) {
    FlowRequest r = Req(id);
    r.deadline_s = deadline;
    return r;
  };
  ASSERT_EQ(q.Admit(with_deadline(1, 8.0), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(2), 0.0, PoolState::kSaturated), kQueued);  // TTL: 10
  ASSERT_EQ(q.Admit(with_deadline(3, 3.0), 1.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(with_deadline(4, 8.0), 2.0, PoolState::kSaturated), kQueued);   // tie
  ASSERT_EQ(q.Admit(with_deadline(5, 99.0), 2.0, PoolState::kSaturated), kQueued);  // TTL 12
  ASSERT_EQ(q.Admit(Req(6), 0.5, PoolState::kSaturated), kQueued);                  // TTL: 10.5
  EXPECT_EQ(Drain(q, 2.5), (std::vector<RequestId>{3, 1, 4, 2, 6, 5}));
}

TEST(FlowQueue, EarliestDeadlineWithRoundRobinOrdersEachFlowOnItsOwn) {
  FlowOptions o;
  o.ordering = Ordering::kEarliestDeadline;
  FlowQueue q(o);
  auto r = [](RequestId id, uint64_t flow, double deadline) {
    FlowRequest x = Req(id, 0, flow);
    x.deadline_s = deadline;
    return x;
  };
  ASSERT_EQ(q.Admit(r(1, 1, 9.0), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(r(2, 1, 4.0), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(r(3, 2, 1.0), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(r(4, 2, 2.0), 0.0, PoolState::kSaturated), kQueued);
  // Flow 1's turn first (it waited first), its earliest deadline; then flow 2's.
  EXPECT_EQ(Drain(q, 0.5), (std::vector<RequestId>{2, 3, 1, 4}));
}

TEST(FlowQueue, BandBoundByRequestsRejectsTheOneOverAndFreesWithDispatch) {
  FlowOptions o;
  o.max_requests = 3;
  FlowQueue q(o);
  for (RequestId i = 1; i <= 3; ++i) {
    ASSERT_EQ(q.Admit(Req(i, 0, i), 0.0, PoolState::kSaturated), kQueued);
  }
  EXPECT_EQ(q.Admit(Req(4), 0.0, PoolState::kSaturated), Rejected(RejectReason::kBandFullRequests));
  // The bound is per band: another priority still has room.
  EXPECT_EQ(q.Admit(Req(5, 1), 0.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(q.NextToDispatch(1.0)->id, 5u);
  EXPECT_EQ(q.NextToDispatch(1.0)->id, 1u);
  EXPECT_EQ(q.Admit(Req(4), 1.0, PoolState::kSaturated), kQueued);
  const FlowStats s = q.stats();
  EXPECT_EQ(BandOf(s, 0).rejected[static_cast<int>(RejectReason::kBandFullRequests)], 1u);
  EXPECT_EQ(s.rejected[static_cast<int>(RejectReason::kBandFullRequests)], 1u);
  EXPECT_EQ(BandOf(s, 0).waiting_requests, 3u);
}

TEST(FlowQueue, BandBoundByBytesRejectsWhatWouldExceedIt) {
  FlowOptions o;
  o.max_bytes = 100;
  FlowQueue q(o);
  EXPECT_EQ(q.Admit(Req(1, 0, 0, 60), 0.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(q.Admit(Req(2, 0, 0, 40), 0.0, PoolState::kSaturated), kQueued);  // exactly 100
  EXPECT_EQ(q.Admit(Req(3, 0, 0, 1), 0.0, PoolState::kSaturated),
            Rejected(RejectReason::kBandFullBytes));
  EXPECT_EQ(q.Admit(Req(4, 1, 0, std::numeric_limits<uint64_t>::max()), 0.0, PoolState::kSaturated),
            Rejected(RejectReason::kBandFullBytes));  // no overflow on a huge size
  FlowStats s = q.stats();
  EXPECT_EQ(BandOf(s, 0).waiting_bytes, 100u);
  EXPECT_EQ(s.waiting_bytes, 100u);
  EXPECT_EQ(s.rejected[static_cast<int>(RejectReason::kBandFullBytes)], 2u);
  EXPECT_EQ(q.NextToDispatch(1.0)->id, 1u);
  EXPECT_EQ(q.Admit(Req(3, 0, 0, 60), 1.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(BandOf(q.stats(), 0).waiting_bytes, 100u);
}

TEST(FlowQueue, ExpiresAtTheExactVirtualTime) {
  FlowOptions o;
  o.default_ttl_s = 2.5;
  FlowQueue q(o);
  ASSERT_EQ(q.Admit(Req(1), 1.0, PoolState::kSaturated), kQueued);  // expires at 3.5
  ASSERT_EQ(q.Admit(Req(2), 1.5, PoolState::kSaturated), kQueued);  // at 4.0
  std::vector<Expired> out;
  EXPECT_EQ(q.Expire(std::nan(""), out), 0u);  // a broken clock expires nothing
  EXPECT_EQ(q.Expire(3.4999, out), 0u);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(q.Expire(3.5, out), 1u);
  EXPECT_EQ(out, (std::vector<Expired>{{1, ExpireReason::kTtl}}));
  EXPECT_FALSE(q.Contains(1));
  EXPECT_DOUBLE_EQ(q.NextExpiry(), 4.0);
  EXPECT_EQ(q.Expire(10.0, out), 1u);
  EXPECT_EQ(out.back(), (Expired{2, ExpireReason::kTtl}));
  EXPECT_TRUE(q.Empty());
  const BandStats b = BandOf(q.stats(), 0);
  EXPECT_EQ(b.expired[static_cast<int>(ExpireReason::kTtl)], 2u);
  EXPECT_EQ(b.waiting_requests, 0u);
  EXPECT_EQ(b.dispatched, 0u);
}

TEST(FlowQueue, ExpireReportsEarliestFirstAcrossBands) {
  FlowOptions o;
  o.default_ttl_s = 10.0;
  FlowQueue q(o);
  ASSERT_EQ(q.Admit(Req(1, 3), 2.0, PoolState::kSaturated), kQueued);  // 12
  ASSERT_EQ(q.Admit(Req(2, 0), 1.0, PoolState::kSaturated), kQueued);  // 11
  ASSERT_EQ(q.Admit(Req(3, 5), 3.0, PoolState::kSaturated), kQueued);  // 13
  std::vector<Expired> out;
  EXPECT_EQ(q.Expire(12.0, out), 2u);
  EXPECT_EQ(out, (std::vector<Expired>{{2, ExpireReason::kTtl}, {1, ExpireReason::kTtl}}));
  EXPECT_EQ(q.size(), 1u);
}

TEST(FlowQueue, AnEmptyPoolQueuesWithTheNoEndpointTtl) {
  FlowOptions o;
  o.default_ttl_s = 30.0;
  o.no_endpoint_ttl_s = 2.0;
  FlowQueue q(o);
  ASSERT_EQ(q.Admit(Req(1), 10.0, PoolState::kEmpty), kQueued);
  ASSERT_EQ(q.Admit(Req(2), 10.5, PoolState::kSaturated), kQueued);
  EXPECT_DOUBLE_EQ(q.NextExpiry(), 12.0);
  std::vector<Expired> out;
  EXPECT_EQ(q.Expire(12.0, out), 1u);
  EXPECT_EQ(out, (std::vector<Expired>{{1, ExpireReason::kNoEndpointTtl}}));
  EXPECT_DOUBLE_EQ(q.NextExpiry(), 40.5);
  // Nothing is dispatched at once into an empty pool, and sheddable work is refused.
  FlowQueue q2(o);
  EXPECT_EQ(q2.Admit(Req(3), 0.0, PoolState::kEmpty), kQueued);
  EXPECT_EQ(q2.Admit(Req(4, -1), 0.0, PoolState::kEmpty), Rejected(RejectReason::kSheddable));
  EXPECT_EQ(BandOf(q.stats(), 0).expired[static_cast<int>(ExpireReason::kNoEndpointTtl)], 1u);
}

TEST(FlowQueue, ADeadlineBeforeTheTtlExpiresTheRequestThen) {
  FlowOptions o;
  o.default_ttl_s = 30.0;
  FlowQueue q(o);
  FlowRequest r = Req(1);
  r.deadline_s = 4.25;
  ASSERT_EQ(q.Admit(r, 1.0, PoolState::kSaturated), kQueued);
  FlowRequest far = Req(2);
  far.deadline_s = 100.0;  // after the TTL: the TTL wins
  ASSERT_EQ(q.Admit(far, 1.0, PoolState::kSaturated), kQueued);
  EXPECT_DOUBLE_EQ(q.NextExpiry(), 4.25);
  std::vector<Expired> out;
  EXPECT_EQ(q.Expire(4.25, out), 1u);
  EXPECT_EQ(out[0], (Expired{1, ExpireReason::kDeadline}));
  EXPECT_DOUBLE_EQ(q.NextExpiry(), 31.0);
  EXPECT_EQ(q.Expire(31.0, out), 1u);
  EXPECT_EQ(out[1], (Expired{2, ExpireReason::kTtl}));
}

TEST(FlowQueue, NextExpiryFollowsEveryWayOfLeaving) {
  FlowOptions o;
  o.default_ttl_s = 10.0;
  FlowQueue q(o);
  EXPECT_EQ(q.NextExpiry(), std::numeric_limits<double>::infinity());
  ASSERT_EQ(q.Admit(Req(1), 1.0, PoolState::kSaturated), kQueued);     // 11
  ASSERT_EQ(q.Admit(Req(2), 2.0, PoolState::kSaturated), kQueued);     // 12
  ASSERT_EQ(q.Admit(Req(3, 4), 3.0, PoolState::kSaturated), kQueued);  // 13, higher band
  FlowRequest d = Req(4);
  d.deadline_s = 5.0;
  ASSERT_EQ(q.Admit(d, 4.0, PoolState::kSaturated), kQueued);  // 5
  EXPECT_DOUBLE_EQ(q.NextExpiry(), 5.0);
  EXPECT_TRUE(q.Cancel(4, 4.5));
  EXPECT_DOUBLE_EQ(q.NextExpiry(), 11.0);
  EXPECT_EQ(q.NextToDispatch(4.5)->id, 3u);  // the higher band; the earliest stays
  EXPECT_DOUBLE_EQ(q.NextExpiry(), 11.0);
  EXPECT_EQ(q.NextToDispatch(4.5)->id, 1u);
  EXPECT_DOUBLE_EQ(q.NextExpiry(), 12.0);
  std::vector<Expired> out;
  EXPECT_EQ(q.Expire(12.0, out), 1u);
  EXPECT_EQ(q.NextExpiry(), std::numeric_limits<double>::infinity());
}

TEST(FlowQueue, CancelWhileQueuedRemovesItAndLeavesNothingBehind) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(Req(1, 0, 7, 300), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(2, 0, 8, 200), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(3, 2, 7, 100), 0.0, PoolState::kSaturated), kQueued);
  EXPECT_TRUE(q.Cancel(2, 0.5));
  EXPECT_FALSE(q.Cancel(2, 0.6));   // already gone: nothing counted twice
  EXPECT_FALSE(q.Cancel(99, 0.6));  // never queued
  EXPECT_TRUE(q.Cancel(3, 0.7));
  EXPECT_TRUE(q.Cancel(1, 0.8));
  EXPECT_TRUE(q.Empty());
  EXPECT_EQ(q.NextToDispatch(1.0), std::nullopt);
  EXPECT_EQ(q.NextExpiry(), std::numeric_limits<double>::infinity());
  std::vector<Expired> out;
  EXPECT_EQ(q.Expire(1e9, out), 0u);
  const FlowStats s = q.stats();
  EXPECT_EQ(s.waiting_requests, 0u);
  EXPECT_EQ(s.waiting_bytes, 0u);
  EXPECT_EQ(BandOf(s, 0).cancelled, 2u);
  EXPECT_EQ(BandOf(s, 2).cancelled, 1u);
  for (const auto& b : s.bands) {
    EXPECT_EQ(b.waiting_requests, 0u);
    EXPECT_EQ(b.waiting_bytes, 0u);
    EXPECT_EQ(b.dispatched, 0u);
  }
  // Ids may be reused once they left, and the emptied flows work again.
  ASSERT_EQ(q.Admit(Req(2, 0, 8), 2.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(1, 0, 7), 2.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(Drain(q, 3.0), (std::vector<RequestId>{2, 1}));
}

TEST(FlowQueue, CancellingTheFlowWhoseTurnItIsPassesTheTurnOn) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(Req(10, 0, 1), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(20, 0, 2), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(30, 0, 3), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(11, 0, 1), 0.0, PoolState::kSaturated), kQueued);
  // Flow 1 keeps its turn when one of its requests is cancelled...
  EXPECT_TRUE(q.Cancel(10, 0.5));
  EXPECT_EQ(q.NextToDispatch(1.0)->id, 11u);
  // ...and flow 2, whose turn it now is, passes it on to 3 when it empties by a cancel.
  EXPECT_TRUE(q.Cancel(20, 1.5));
  EXPECT_EQ(Drain(q, 2.0), (std::vector<RequestId>{30}));
}

TEST(FlowQueue, SheddableIsRejectedWhenSaturatedAndDispatchedWhenNot) {
  FlowQueue q;
  EXPECT_EQ(q.Admit(Req(1, -1), 0.0, PoolState::kSaturated), Rejected(RejectReason::kSheddable));
  EXPECT_FALSE(q.Contains(1));
  EXPECT_EQ(q.Admit(Req(2, -1), 0.0, PoolState::kAvailable), kNow);
  EXPECT_EQ(q.Admit(Req(3, 0), 0.0, PoolState::kSaturated), kQueued);  // 0 is not sheddable
  // Something of higher priority waits: a sheddable request would wait, so it is refused
  // even though the pool says it has room.
  EXPECT_EQ(q.Admit(Req(4, -5), 0.1, PoolState::kAvailable), Rejected(RejectReason::kSheddable));
  const FlowStats s = q.stats();
  EXPECT_EQ(BandOf(s, -1).rejected[static_cast<int>(RejectReason::kSheddable)], 1u);
  EXPECT_EQ(BandOf(s, -1).dispatched_at_once, 1u);
  EXPECT_EQ(BandOf(s, -5).rejected[static_cast<int>(RejectReason::kSheddable)], 1u);
  EXPECT_EQ(s.rejected[static_cast<int>(RejectReason::kSheddable)], 2u);
  EXPECT_EQ(q.size(), 1u);
}

TEST(FlowQueue, ShedThresholdIsConfigurable) {
  FlowOptions o;
  o.shed_below_priority = 10;
  FlowQueue q(o);
  EXPECT_EQ(q.Admit(Req(1, 9), 0.0, PoolState::kSaturated), Rejected(RejectReason::kSheddable));
  EXPECT_EQ(q.Admit(Req(2, 10), 0.0, PoolState::kSaturated), kQueued);
  o.shed_below_priority = std::numeric_limits<int64_t>::min();  // nothing sheddable
  FlowQueue q2(o);
  EXPECT_EQ(q2.Admit(Req(3, -100), 0.0, PoolState::kSaturated), kQueued);
}

TEST(FlowQueue, DuplicateIdIsRejectedWhileTheFirstWaits) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(Req(1), 0.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(q.Admit(Req(1, 3), 0.1, PoolState::kAvailable), Rejected(RejectReason::kDuplicateId));
  EXPECT_EQ(q.Admit(Req(1), 0.1, PoolState::kSaturated), Rejected(RejectReason::kDuplicateId));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.stats().rejected[static_cast<int>(RejectReason::kDuplicateId)], 2u);
}

TEST(FlowQueue, PrioritiesBeyondMaxBandsAreRejected) {
  FlowOptions o;
  o.max_bands = 2;
  FlowQueue q(o);
  EXPECT_EQ(q.Admit(Req(1, 1), 0.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(q.Admit(Req(2, 2), 0.0, PoolState::kAvailable), kNow);
  EXPECT_EQ(q.Admit(Req(3, 3), 0.0, PoolState::kSaturated), Rejected(RejectReason::kTooManyBands));
  EXPECT_EQ(q.Admit(Req(4, 2), 0.0, PoolState::kSaturated), kQueued);  // a known band
  const FlowStats s = q.stats();
  EXPECT_EQ(s.bands.size(), 2u);
  EXPECT_EQ(s.rejected[static_cast<int>(RejectReason::kTooManyBands)], 1u);
}

// The replica that freed holds some prefixes: blocks held per prefix key.
struct FakeReplica {
  std::map<uint64_t, uint32_t> held;
  mutable int calls = 0;
  uint32_t operator()(const WaitingView& w) const {
    ++calls;
    auto it = held.find(w.prefix_key);
    return it == held.end() ? 0 : it->second;
  }
};

TEST(FlowQueue, LateBindingPrefersTheFreedReplicasPrefixWithinTheBand) {
  FlowQueue q;
  for (RequestId i = 1; i <= 4; ++i) {
    ASSERT_EQ(q.Admit(Req(i), 0.1 * i, PoolState::kSaturated), kQueued);
  }
  FakeReplica r;
  r.held = {{300, 5}, {400, 2}};  // request 3 best, request 4 some
  auto d = q.NextToDispatch(1.0, r);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->id, 3u);
  EXPECT_EQ(d->held_blocks, 5u);
  EXPECT_EQ(d->cause, DispatchCause::kAffinity);
  EXPECT_EQ(r.calls, 4);
  // A replica holding nothing takes them in order.
  FakeReplica none;
  d = q.NextToDispatch(1.0, none);
  EXPECT_EQ(d->id, 1u);
  EXPECT_EQ(d->cause, DispatchCause::kOrder);
  // Ties go to the earlier request.
  FakeReplica tie;
  tie.held = {{200, 3}, {400, 3}};
  d = q.NextToDispatch(1.0, tie);
  EXPECT_EQ(d->id, 2u);
  EXPECT_EQ(d->cause, DispatchCause::kOrder);
  EXPECT_EQ(d->held_blocks, 3u);
  const BandStats b = BandOf(q.stats(), 0);
  EXPECT_EQ(b.dispatched, 3u);
  EXPECT_EQ(b.dispatched_by_affinity, 1u);
}

TEST(FlowQueue, LateBindingNeverReachesAcrossBands) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(Req(1, 0), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(2, 1), 0.5, PoolState::kSaturated), kQueued);
  FakeReplica r;
  r.held = {{100, 50}};  // holds all of the lower band's prefix, nothing of the higher one
  auto d = q.NextToDispatch(1.0, r);
  EXPECT_EQ(d->id, 2u);
  EXPECT_EQ(d->held_blocks, 0u);
  EXPECT_EQ(r.calls, 1);  // only the highest band was looked at
  d = q.NextToDispatch(1.0, r);
  EXPECT_EQ(d->id, 1u);
  EXPECT_EQ(d->held_blocks, 50u);
  EXPECT_EQ(d->cause, DispatchCause::kOrder);
}

TEST(FlowQueue, LateBindingLooksAtMostAffinityWindowRequests) {
  FlowOptions o;
  o.affinity_window = 4;
  FlowQueue q(o);
  for (RequestId i = 1; i <= 10; ++i) {
    ASSERT_EQ(q.Admit(Req(i), 0.0, PoolState::kSaturated), kQueued);
  }
  FakeReplica r;
  r.held = {{500, 9}, {400, 1}};  // request 5 is just outside the window
  auto d = q.NextToDispatch(1.0, r);
  EXPECT_EQ(d->id, 4u);
  EXPECT_EQ(r.calls, 4);
  d = q.NextToDispatch(1.0, r);  // now 5 is inside: 1 2 3 5
  EXPECT_EQ(d->id, 5u);
  EXPECT_EQ(r.calls, 8);
}

TEST(FlowQueue, LateBindingWindowInterleavesFlowsInRoundRobinOrder) {
  FlowOptions o;
  o.affinity_window = 3;
  FlowQueue q(o);
  // Flow 1: 11 12 13; flow 2: 21 22. Dispatch order 11 21 12 22 13: the window is 11 21 12.
  for (RequestId id : {11, 12, 13}) {
    ASSERT_EQ(q.Admit(Req(id, 0, 1), 0.0, PoolState::kSaturated), kQueued);
  }
  for (RequestId id : {21, 22}) {
    ASSERT_EQ(q.Admit(Req(id, 0, 2), 0.0, PoolState::kSaturated), kQueued);
  }
  std::vector<RequestId> seen;
  auto probe = [&](const WaitingView& w) -> uint32_t {
    seen.push_back(w.id);
    return w.id == 12 ? 1 : 0;
  };
  EXPECT_EQ(q.NextToDispatch(1.0, probe)->id, 12u);
  EXPECT_EQ(seen, (std::vector<RequestId>{11, 21, 12}));
  // It was flow 1's turn, and flow 1 was served (out of order inside it): flow 2 is next.
  EXPECT_EQ(Drain(q, 2.0), (std::vector<RequestId>{21, 11, 22, 13}));
}

TEST(FlowQueue, LateBindingOutOfTurnKeepsTheRoundRobinTurn) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(Req(10, 0, 1), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(11, 0, 1), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(20, 0, 2), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(21, 0, 2), 0.0, PoolState::kSaturated), kQueued);
  FakeReplica r;
  r.held = {{2000, 4}};
  EXPECT_EQ(q.NextToDispatch(1.0, r)->id, 20u);                    // flow 2, out of turn
  EXPECT_EQ(Drain(q, 2.0), (std::vector<RequestId>{10, 21, 11}));  // flow 1 still next
}

TEST(FlowQueue, ARequestPassedOverMaxSkipsTimesGoesFirst) {
  FlowOptions o;
  o.max_affinity_skips = 3;
  FlowQueue q(o);
  ASSERT_EQ(q.Admit(Req(1), 0.0, PoolState::kSaturated), kQueued);  // nobody holds its prefix
  // A stream of requests whose prefix the freeing replicas always hold.
  FakeReplica r;
  RequestId next = 100;
  std::vector<RequestId> order;
  std::vector<DispatchCause> causes;
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(q.Admit(Req(next), 0.1 * i, PoolState::kSaturated), kQueued);
    r.held[next * 100] = 8;
    ++next;
    auto d = q.NextToDispatch(0.1 * i + 0.05, r);
    order.push_back(d->id);
    causes.push_back(d->cause);
  }
  EXPECT_EQ(order, (std::vector<RequestId>{100, 101, 102, 1, 103}));
  EXPECT_EQ(causes, (std::vector<DispatchCause>{DispatchCause::kAffinity, DispatchCause::kAffinity,
                                                DispatchCause::kAffinity, DispatchCause::kAged,
                                                DispatchCause::kOrder}));
  EXPECT_EQ(BandOf(q.stats(), 0).dispatched_aged, 1u);
  EXPECT_EQ(BandOf(q.stats(), 0).dispatched_by_affinity, 3u);
}

TEST(FlowQueue, SkipsCountOnlyForRequestsAheadOfTheChosenOne) {
  FlowOptions o;
  o.max_affinity_skips = 1;
  FlowQueue q(o);
  for (RequestId i = 1; i <= 4; ++i) {
    ASSERT_EQ(q.Admit(Req(i), 0.0, PoolState::kSaturated), kQueued);
  }
  FakeReplica r;
  r.held = {{200, 1}};
  EXPECT_EQ(q.NextToDispatch(1.0, r)->id, 2u);  // 1 skipped once (now aged); 3, 4 not
  r.held = {{400, 9}};
  auto d = q.NextToDispatch(1.0, r);
  EXPECT_EQ(d->id, 1u);  // aged, ahead of the holder
  EXPECT_EQ(d->cause, DispatchCause::kAged);
  d = q.NextToDispatch(1.0, r);
  EXPECT_EQ(d->id, 4u);  // 3 had no skip: the holder wins again
  EXPECT_EQ(d->cause, DispatchCause::kAffinity);
  EXPECT_EQ(q.NextToDispatch(1.0, r)->id, 3u);
}

// The checked form makes the same choice and removes it only when the check accepts it; a
// refusal leaves the queue, its counters and the skips as they were.
TEST(FlowQueue, ACheckedDispatchThatIsRefusedChangesNothing) {
  FlowOptions o;
  o.max_affinity_skips = 1;
  FlowQueue q(o);
  ASSERT_EQ(q.Admit(Req(1), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(2), 0.5, PoolState::kSaturated), kQueued);
  FakeReplica r;
  r.held = {{200, 4}};
  std::vector<std::pair<RequestId, double>> asked;
  bool accept = false;
  auto check = [&](const WaitingView& w, double waited_s) {
    asked.emplace_back(w.id, waited_s);
    return accept;
  };
  EXPECT_FALSE(q.NextToDispatch(2.0, r, check).has_value());
  EXPECT_FALSE(q.NextToDispatch(2.0, r, check).has_value());
  // The choice was 2 both times (it holds the prefix), asked with its wait.
  EXPECT_EQ(asked, (std::vector<std::pair<RequestId, double>>{{2, 1.5}, {2, 1.5}}));
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(BandOf(q.stats(), 0).dispatched, 0u);
  // Two refusals counted no skip for 1 (with max_affinity_skips 1 it would now be aged).
  accept = true;
  auto d = q.NextToDispatch(2.0, r, check);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->id, 2u);
  EXPECT_EQ(d->cause, DispatchCause::kAffinity);
  EXPECT_EQ(d->waited_s, 1.5);
  EXPECT_EQ(BandOf(q.stats(), 0).dispatched, 1u);
  EXPECT_EQ(q.NextToDispatch(2.0, r, check)->id, 1u);
  EXPECT_FALSE(q.NextToDispatch(2.0, r, check).has_value());  // empty: the check not asked
  EXPECT_EQ(asked.size(), 4u);
}

TEST(FlowQueue, WaitHistogramBucketsAreExact) {
  FlowQueue q;
  const double waits[] = {0.0005, 0.001, 0.002, 0.3, 45.0};
  RequestId id = 1;
  for (double w : waits) {
    ASSERT_EQ(q.Admit(Req(id), 0.0, PoolState::kSaturated), kQueued);
    EXPECT_EQ(q.NextToDispatch(w)->id, id);
    ++id;
  }
  const WaitHistogram h = BandOf(q.stats(), 0).wait;
  EXPECT_EQ(h.count, 5u);
  EXPECT_EQ(h.counts[0], 2u);                          // <= 1 ms, the bound included
  EXPECT_EQ(h.counts[1], 1u);                          // <= 5 ms
  EXPECT_EQ(h.counts[7], 1u);                          // <= 0.5 s
  EXPECT_EQ(h.counts[kWaitBucketBoundsS.size()], 1u);  // above 30 s
  EXPECT_NEAR(h.sum_s, 45.3035, 1e-9);
}

// A sheddable request sees the pool saturated unless some replica has more room than the
// reserve; other requests, and pools already saturated or empty, keep their verdict.
TEST(FlowQueue, AdmissionStateKeepsTheReserveForBandsThatMayWait) {
  FlowOptions o;
  EXPECT_EQ(AdmissionState(o, -1, PoolState::kAvailable, 1), PoolState::kAvailable);  // reserve 0
  o.sheddable_reserve = 2;
  EXPECT_EQ(AdmissionState(o, -1, PoolState::kAvailable, 2), PoolState::kSaturated);
  EXPECT_EQ(AdmissionState(o, -1, PoolState::kAvailable, 3), PoolState::kAvailable);
  EXPECT_EQ(AdmissionState(o, 0, PoolState::kAvailable, 0), PoolState::kAvailable);
  EXPECT_EQ(AdmissionState(o, -1, PoolState::kEmpty, 0), PoolState::kEmpty);
  EXPECT_EQ(AdmissionState(o, -1, PoolState::kSaturated, 5), PoolState::kSaturated);
  o.shed_below_priority = 1;  // priority 0 is sheddable now
  EXPECT_EQ(AdmissionState(o, 0, PoolState::kAvailable, 2), PoolState::kSaturated);
}

// Issue 24: flow control by predicted miss. `late_s` is when the request, still waiting,
// is predicted to miss its TTFT objective.
FlowRequest LateReq(RequestId id, double late_s, int64_t priority = 0, uint64_t flow = 0) {
  FlowRequest r = Req(id, priority, flow);
  r.late_s = late_s;
  return r;
}

TEST(FlowQueue, ARequestPredictedToMissGoesBehindTheOnTimeOnesAndStillLeaves) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(LateReq(1, 1.0), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(LateReq(2, 5.0), 0.1, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(Req(3), 0.2, PoolState::kSaturated), kQueued);  // no objective
  ASSERT_EQ(q.Admit(LateReq(4, 1.5), 0.3, PoolState::kSaturated), kQueued);
  std::vector<Expired> out;
  EXPECT_EQ(q.Expire(0.99, out), 0u);
  EXPECT_EQ(BandOf(q.stats(), 0).went_late, 0u);
  // At 1.0 request 1 goes late (not expired: it still waits); 4 is on time until 1.5.
  EXPECT_EQ(q.Expire(1.0, out), 0u);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(q.size(), 4u);
  EXPECT_EQ(BandOf(q.stats(), 0).went_late, 1u);
  EXPECT_EQ(q.NextToDispatch(1.0)->id, 2u);
  EXPECT_EQ(q.Expire(1.5, out), 0u);  // 4 goes late too, behind 1 (they keep their order)
  EXPECT_EQ(Drain(q, 1.5), (std::vector<RequestId>{3, 1, 4}));
  const BandStats b = BandOf(q.stats(), 0);
  EXPECT_EQ(b.went_late, 2u);
  EXPECT_EQ(b.dispatched_late, 2u);
  EXPECT_EQ(b.dispatched, 4u);
}

TEST(FlowQueue, WithoutSloAwarenessLateSIsIgnored) {
  FlowOptions o;
  o.slo_aware = false;
  FlowQueue q(o);
  ASSERT_EQ(q.Admit(LateReq(1, 1.0), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(LateReq(2, 5.0), 0.1, PoolState::kSaturated), kQueued);
  std::vector<Expired> out;
  q.Expire(2.0, out);
  EXPECT_EQ(Drain(q, 2.0), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(BandOf(q.stats(), 0).went_late, 0u);
  // A sheddable request already predicted to miss is treated as any sheddable one.
  EXPECT_EQ(q.Admit(LateReq(3, 2.0, -1), 2.0, PoolState::kAvailable), kNow);
}

TEST(FlowQueue, ARequestAlreadyLateWhenQueuedWaitsBehindAtOnce) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(LateReq(1, 0.5), 0.5, PoolState::kSaturated), kQueued);  // no time left
  ASSERT_EQ(q.Admit(LateReq(2, 9.0), 0.6, PoolState::kSaturated), kQueued);
  EXPECT_EQ(BandOf(q.stats(), 0).went_late, 1u);
  EXPECT_EQ(Drain(q, 0.7), (std::vector<RequestId>{2, 1}));
  EXPECT_EQ(BandOf(q.stats(), 0).dispatched_late, 1u);
}

TEST(FlowQueue, ASheddableRequestPredictedToMissIsRefusedEvenWithRoom) {
  FlowQueue q;
  EXPECT_EQ(q.Admit(LateReq(1, 1.0, -1), 1.0, PoolState::kAvailable),
            Rejected(RejectReason::kPredictedMiss));
  EXPECT_EQ(q.Admit(LateReq(2, 1.2, -1), 1.0, PoolState::kAvailable), kNow);
  // Time left, but it would have to wait: shed as before (sheddable requests never wait).
  EXPECT_EQ(q.Admit(LateReq(3, 1.2, -1), 1.0, PoolState::kSaturated),
            Rejected(RejectReason::kSheddable));
  // Not sheddable: never refused for lateness.
  EXPECT_EQ(q.Admit(LateReq(4, 0.5, 0), 1.0, PoolState::kAvailable), kNow);
  const FlowStats s = q.stats();
  EXPECT_EQ(s.rejected[static_cast<size_t>(RejectReason::kPredictedMiss)], 1u);
  EXPECT_EQ(BandOf(s, -1).rejected[static_cast<size_t>(RejectReason::kPredictedMiss)], 1u);
  EXPECT_EQ(RejectReasonName(RejectReason::kPredictedMiss), "predicted_miss");
}

TEST(FlowQueue, RoundRobinServesAFlowWithAnOnTimeRequestFirst) {
  FlowQueue q;
  // Flow 1 starts waiting first (its turn), but its only request goes late at 0.5.
  ASSERT_EQ(q.Admit(LateReq(11, 0.5, 0, 1), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(LateReq(21, 9.0, 0, 2), 0.1, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(LateReq(22, 9.0, 0, 2), 0.2, PoolState::kSaturated), kQueued);
  std::vector<Expired> out;
  q.Expire(1.0, out);
  EXPECT_EQ(Drain(q, 1.0), (std::vector<RequestId>{21, 22, 11}));
}

TEST(FlowQueue, TheAffinityWindowHoldsOnlyOnTimeRequestsWhileAnyWait) {
  FlowQueue q;
  ASSERT_EQ(q.Admit(LateReq(1, 0.5), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(LateReq(2, 9.0), 0.1, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(LateReq(3, 9.0), 0.2, PoolState::kSaturated), kQueued);
  std::vector<Expired> out;
  q.Expire(1.0, out);
  FakeReplica r;
  r.held = {{100, 9}, {300, 2}};  // holds the late request's prefix best
  auto d = q.NextToDispatch(1.0, r);
  EXPECT_EQ(d->id, 3u);
  EXPECT_EQ(d->cause, DispatchCause::kAffinity);
  EXPECT_EQ(r.calls, 2);  // 2 and 3 only
  d = q.NextToDispatch(1.0, r);
  EXPECT_EQ(d->id, 2u);
  // Only the late one left: it goes, with its affinity.
  d = q.NextToDispatch(1.0, r);
  EXPECT_EQ(d->id, 1u);
  EXPECT_EQ(d->held_blocks, 9u);
  EXPECT_TRUE(q.Empty());
}

TEST(FlowQueue, CancelAndExpiryOfLateAndOnTimeRequestsLeaveNothingBehind) {
  FlowOptions o;
  o.default_ttl_s = 2.0;
  FlowQueue q(o);
  ASSERT_EQ(q.Admit(LateReq(1, 0.5), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(LateReq(2, 0.5), 0.0, PoolState::kSaturated), kQueued);
  ASSERT_EQ(q.Admit(LateReq(3, 9.0), 0.0, PoolState::kSaturated), kQueued);  // TTL first
  std::vector<Expired> out;
  q.Expire(1.0, out);
  EXPECT_TRUE(q.Cancel(1, 1.0));
  EXPECT_TRUE(q.Cancel(3, 1.0));
  EXPECT_EQ(q.Expire(2.0, out), 1u);  // 2, late, at its TTL
  EXPECT_EQ(out, (std::vector<Expired>{{2, ExpireReason::kTtl}}));
  EXPECT_TRUE(q.Empty());
  // The queue is whole: a new on-time request is served normally.
  ASSERT_EQ(q.Admit(LateReq(4, 9.0), 3.0, PoolState::kSaturated), kQueued);
  EXPECT_EQ(Drain(q, 3.0), (std::vector<RequestId>{4}));
}

TEST(FlowQueue, ValidateNamesTheBadField) {
  EXPECT_TRUE(Validate(FlowOptions{}).ok());
  FlowOptions o;
  o.max_requests = 0;
  EXPECT_NE(Validate(o).message().find("max_requests"), std::string::npos);
  o = {};
  o.max_bytes = 0;
  EXPECT_NE(Validate(o).message().find("max_bytes"), std::string::npos);
  o = {};
  o.default_ttl_s = 0;
  EXPECT_NE(Validate(o).message().find("default_ttl_s"), std::string::npos);
  o = {};
  o.no_endpoint_ttl_s = std::numeric_limits<double>::infinity();
  EXPECT_NE(Validate(o).message().find("no_endpoint_ttl_s"), std::string::npos);
  o = {};
  o.affinity_window = kMaxAffinityWindow + 1;
  EXPECT_NE(Validate(o).message().find("affinity_window"), std::string::npos);
  o = {};
  o.sheddable_reserve = 5;
  EXPECT_NE(Validate(o).message().find("sheddable_reserve"), std::string::npos);
  o = {};
  o.max_bands = 0;
  EXPECT_EQ(Validate(o).code(), StatusCode::kInvalidArgument);
  // The queue clamps what Validate rejects instead of misbehaving.
  o.affinity_window = 1000;
  o.default_ttl_s = std::nan("");
  FlowQueue q(o);
  EXPECT_EQ(q.options().affinity_window, kMaxAffinityWindow);
  EXPECT_EQ(q.options().default_ttl_s, FlowOptions{}.default_ttl_s);
  EXPECT_EQ(q.options().max_bands, 1u);
}

TEST(FlowQueue, DefaultsFollowTheReferencePicker) {
  const FlowOptions o;
  EXPECT_EQ(o.max_requests, 5000u);
  EXPECT_EQ(o.max_bytes, uint64_t{1} << 30);
  EXPECT_EQ(o.default_ttl_s, 30.0);
  EXPECT_EQ(o.shed_below_priority, 0);
  EXPECT_EQ(o.fairness, Fairness::kRoundRobin);
  EXPECT_EQ(o.ordering, Ordering::kFcfs);
  EXPECT_TRUE(o.slo_aware);
  EXPECT_EQ(RejectReasonName(RejectReason::kBandFullBytes), "band_full_bytes");
  EXPECT_EQ(ExpireReasonName(ExpireReason::kNoEndpointTtl), "no_endpoint_ttl");
}

}  // namespace
}  // namespace kvroute::flow
