// The locality-filter's rules in virtual time, on hand-made endpoint states: stay local
// below saturation, spill when every local candidate is saturated or slower than a remote
// round trip, hysteresis, prefix-coherent (sticky) spill, endpoints without a region,
// regions without a round trip, unknown metrics, counters; and the kvroute policy with and
// without a router region.
#include "core/sched/plugins/locality_filter/locality_filter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/sched/latency_trainer.h"
#include "core/sched/prefix_index.h"
#include "core/sched/profile_scheduler.h"
#include "core/sched/sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;
using testing::MustBuild;
using testing::MustBuildPolicy;
using testing::Plugin;
using testing::Req;
using testing::SpecOf;

// First blocks (64 characters) differ between the two conversations.
constexpr const char* kPromptA =
    "conversation A: you are a helpful assistant for the billing team; answer briefly. "
    "What is my balance?";
constexpr const char* kPromptB =
    "conversation B: you are a terse assistant for the support desk of a bike shop. "
    "Where is my order?";

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

SchedulerOptions Options(std::string region = "us") {
  SchedulerOptions o;
  o.region = std::move(region);
  o.region_rtt_s = {{"eu", 0.07}};
  o.max_ranked = 0;  // rank every candidate
  return o;
}

// `local` endpoints in us (ids 0..local-1), then `remote` in `remote_region`.
std::vector<EndpointState> Fleet(size_t local, size_t remote, std::string remote_region = "eu") {
  auto eps = MakeEndpoints(local + remote);
  for (size_t i = 0; i < eps.size(); ++i) {
    eps[i].SetLabels({{"region", i < local ? "us" : remote_region}});
  }
  return eps;
}

void Scrape(std::vector<EndpointState>& eps, double t) {
  for (auto& e : eps) e.scraped_at_s = t;
}

void SetWaiting(std::vector<EndpointState>& eps, size_t from, size_t to, double waiting) {
  for (size_t i = from; i < to; ++i) eps[i].waiting = waiting;
}

// The locality-filter with `params` and a KV scorer (no prefix scorer: the sticky table
// alone must keep a prefix on its replica), scraped loads (no in-flight accounting).
SchedulingSpec LocalitySpec(std::map<std::string, ParamValue> params = {}) {
  return SpecOf({Plugin("locality-filter", std::move(params)),
                 Plugin("kv-cache-utilization-scorer")});
}

bool AllIn(std::span<const uint32_t> ids, uint32_t lo, uint32_t hi) {
  for (uint32_t id : ids) {
    if (id < lo || id >= hi) return false;
  }
  return !ids.empty();
}

// Pick, dispatch to ranked[0], finish: the whole cycle, returning the pick's reason and
// the endpoint it went to.
std::pair<Locality, uint32_t> Cycle(Scheduler& s, std::string_view prompt,
                                    std::span<const EndpointState> eps, double now) {
  PickResult r = s.Pick(Req(prompt), eps, now);
  EXPECT_TRUE(r.ok());
  if (!r.ok()) return {Locality::kOff, 0};
  const Locality why = r.locality;
  const uint32_t to = r.ranked[0];
  s.OnDispatched(r.handle, to, now);
  s.OnFinished(r.handle, now);
  return {why, to};
}

TEST(RegionOf, RegionLabelThenKubernetesTopology) {
  EXPECT_EQ(RegionOf({{"region", "eu"}, {"topology.kubernetes.io/region", "us"}}), "eu");
  EXPECT_EQ(RegionOf({{"topology.kubernetes.io/region", "us"}, {"region", "eu"}}), "eu");
  EXPECT_EQ(RegionOf({{"topology.kubernetes.io/region", "us"}}), "us");
  EXPECT_EQ(RegionOf({{"app", "vllm"}}), "");
  EXPECT_EQ(ZoneOf({{"topology.kubernetes.io/zone", "us-a"}}), "us-a");
  EXPECT_EQ(ZoneOf({{"zone", "b"}, {"topology.kubernetes.io/zone", "us-a"}}), "b");
  EndpointState e;
  e.SetLabels({{"region", "eu"}, {"zone", "eu-1"}});
  EXPECT_EQ(e.region, "eu");
  EXPECT_EQ(e.zone, "eu-1");
  e.SetLabels({{"app", "vllm"}});  // a label change is a region change
  EXPECT_EQ(e.region, "");
  EXPECT_EQ(e.zone, "");
  ASSERT_EQ(e.labels.size(), 1u);
}

TEST(Locality, StaysLocalBelowSaturationEvenWhenARemoteHoldsThePrefix) {
  auto s = MustBuildPolicy("kvroute", Options());
  auto blind = MustBuildPolicy("kvroute-region-blind", Options());
  EXPECT_EQ(s->policy(), "kvroute");
  EXPECT_EQ(blind->policy(), "kvroute-region-blind");
  auto eps = Fleet(2, 2);
  // Busy, below the queue threshold of 5 and the wait rule (3 x 0.02 s < 0.07 s).
  eps[0].waiting = eps[1].waiting = 3;
  // Both learn that replica 3 (eu) holds the whole prompt.
  for (Scheduler* x : {s.get(), blind.get()}) {
    PickResult r = x->Pick(Req(kPromptA), eps, 0.1);
    ASSERT_TRUE(r.ok());
    x->OnDispatched(r.handle, 3, 0.1);
    x->OnFinished(r.handle, 0.1);
  }
  PickResult r = s->Pick(Req(kPromptA), eps, 0.2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.locality, Locality::kLocal);
  EXPECT_TRUE(AllIn(r.candidates, 0, 2));
  EXPECT_TRUE(AllIn(r.ranked, 0, 2));
  s->OnFinished(r.handle, 0.2);
  // Region-blind, the prefix wins: the remote replica.
  PickResult b = blind->Pick(Req(kPromptA), eps, 0.2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.locality, Locality::kOff);
  EXPECT_EQ(b.ranked[0], 3u);
  EXPECT_EQ(b.candidates.size(), 4u);
  EXPECT_EQ(s->locality_stats().Picks(Locality::kLocal), 2u);
}

TEST(Locality, SpillsWhenEveryLocalCandidateIsSaturated) {
  auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}}), Options());
  auto eps = Fleet(3, 2);
  eps[0].waiting = 5;  // the queue threshold (>=)
  eps[1].kv_usage = 0.8;  // the KV threshold (>=)
  eps[2].waiting = 9;
  eps[3].kv_usage = 0.5;
  eps[4].kv_usage = 0.2;
  PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.locality, Locality::kSpillSaturated);
  ASSERT_EQ(r.ranked.size(), 2u);
  EXPECT_EQ(r.ranked[0], 4u);  // the emptier remote
  EXPECT_EQ(r.ranked[1], 3u);
  s->OnFinished(r.handle, 0.1);
  // One local endpoint just below both thresholds: local (a fresh scheduler, not in the
  // spill's hysteresis).
  auto t = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}}), Options());
  eps[1].kv_usage = 0.79;
  eps[1].waiting = 4;
  r = t->Pick(Req(kPromptA), eps, 0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.locality, Locality::kLocal);
  EXPECT_TRUE(AllIn(r.ranked, 0, 3));
  t->OnFinished(r.handle, 0.1);
  LocalityStats st = s->locality_stats();
  EXPECT_EQ(st.Picks(Locality::kSpillSaturated), 1u);
  EXPECT_EQ(st.spills_started, 1u);
  EXPECT_TRUE(st.spilling);
  EXPECT_EQ(t->locality_stats().Picks(Locality::kLocal), 1u);
  EXPECT_FALSE(t->locality_stats().spilling);
}

TEST(Locality, StaysLocalWhenNoRemoteHasRoom) {
  auto s = MustBuild(LocalitySpec(), Options());
  auto eps = Fleet(2, 2);
  SetWaiting(eps, 0, 4, 6);  // everyone saturated
  PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.locality, Locality::kLocalSaturated);
  EXPECT_TRUE(AllIn(r.ranked, 0, 2));
  s->OnFinished(r.handle, 0.1);
  EXPECT_EQ(s->locality_stats().Picks(Locality::kLocalSaturated), 1u);
  EXPECT_FALSE(s->locality_stats().spilling);
}

TEST(Locality, SpillsWhenTheExpectedLocalWaitExceedsRoundTripPlusRemoteWait) {
  // Expected wait = waiting x 0.02 s. Locals at 4 queued: 0.08 s; eu is 0.07 s away.
  auto eps = Fleet(2, 1);
  SetWaiting(eps, 0, 2, 4);
  {
    auto s = MustBuild(LocalitySpec(), Options());
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kSpillWait);
    EXPECT_EQ(r.ranked.size(), 1u);
    EXPECT_EQ(r.ranked[0], 2u);
    s->OnFinished(r.handle, 0.1);
    EXPECT_EQ(s->locality_stats().Picks(Locality::kSpillWait), 1u);
  }
  {
    // The remote has one queued too: 0.07 + 0.02 > 0.08, stay.
    auto s = MustBuild(LocalitySpec(), Options());
    eps[2].waiting = 1;
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kLocal);
    s->OnFinished(r.handle, 0.1);
    eps[2].waiting = 0;
  }
  {
    // Farther away (0.1 s): stay.
    auto s = MustBuild(LocalitySpec(), Options());
    s->SetRegionRtt("eu", 0.1);
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kLocal);
    s->OnFinished(r.handle, 0.1);
  }
  {
    // The best local endpoint counts: one of them with 3 queued (0.06 s) keeps it local.
    auto s = MustBuild(LocalitySpec(), Options());
    eps[1].waiting = 3;
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kLocal);
    EXPECT_TRUE(AllIn(r.ranked, 0, 2));
    s->OnFinished(r.handle, 0.1);
    eps[1].waiting = 4;
  }
  {
    // secondsPerQueuedRequest 0 turns the rule off.
    auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}}), Options());
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kLocal);
    s->OnFinished(r.handle, 0.1);
  }
}

// Issue 24: spill by predicted miss. The latency model learned that the us replicas,
// with 3 queued, take 2 s to a first token whatever the prompt, and the eu replica, idle,
// 100 ms. A request with a 1 s TTFT objective is predicted to miss it locally even with its
// whole prompt cached, and to meet it in eu (0.2 s away) with nothing cached: it spills,
// although the fixed wait rule (3 x 20 ms = 60 ms < 200 ms) keeps it local.
TEST(Locality, SpillsWhenEveryLocalReplicaIsPredictedToMissAndARemoteToMeet) {
  auto eps = Fleet(2, 1);
  for (EndpointState& e : eps) {
    e.waiting = e.id < 2 ? 3 : 0;
    e.engine.waiting = e.waiting;
    e.engine.kv_usage = 0.2;
    e.engine.present = metrics::EngineMetrics::kWaiting | metrics::EngineMetrics::kRunning |
                       metrics::EngineMetrics::kKvUsage;
  }
  LatencyTrainer model;
  uint64_t slot = 0;
  for (int i = 0; i < 40; ++i) {
    for (const EndpointState& e : eps) {
      const std::string prompt(static_cast<size_t>(100 + (i * 389) % 3000) * 4, 'q');
      const double t0 = i * 10.0, ttft = e.id < 2 ? 2.0 : 0.1;
      const RequestHandle h = (uint64_t{1} << 32) | slot++;
      model.OnDispatched(h, LatencyTrainer::DispatchOf(Req(prompt), e, 0.0), t0);
      model.OnFirstToken(h, t0 + ttft);
      model.OnFinished(h, 5, t0 + ttft + 0.05);
    }
  }
  // The pick's locality and its ranking (copied: it views the scheduler's scratch).
  struct Outcome {
    Locality locality;
    std::vector<uint32_t> ranked;
  };
  auto pick = [&](double slo_ttft_s, const LatencyTrainer* latency) {
    auto s = MustBuild(LocalitySpec(), Options());
    s->SetRegionRtt("eu", 0.2);
    SchedRequest r = Req(kPromptA);
    r.slo_ttft_s = slo_ttft_s;
    r.latency = latency;
    PickResult res = s->Pick(r, eps, 0.1);
    Outcome o{res.locality, std::vector<uint32_t>(res.ranked.begin(), res.ranked.end())};
    s->OnFinished(res.handle, 0.1);
    return o;
  };
  const Outcome r = pick(1.0, &model);
  EXPECT_EQ(r.locality, Locality::kSpillWait);
  EXPECT_EQ(r.ranked, std::vector<uint32_t>{2u});
  // No objective, no model, or an objective the local replicas are predicted to meet
  // (3 s): the fixed rules alone, local.
  EXPECT_EQ(pick(0.0, &model).locality, Locality::kLocal);
  EXPECT_EQ(pick(1.0, nullptr).locality, Locality::kLocal);
  EXPECT_EQ(pick(3.0, &model).locality, Locality::kLocal);
  // A remote that cannot meet it either (0.05 s objective): stay.
  EXPECT_EQ(pick(0.05, &model).locality, Locality::kLocal);
  // One local replica without a usable queue signal has no prediction: no predicted miss.
  eps[1].engine.present &= ~metrics::EngineMetrics::kWaiting;
  EXPECT_EQ(pick(1.0, &model).locality, Locality::kLocal);
}

TEST(Locality, HysteresisHoldsTheSpillAcrossTheThreshold) {
  auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}, {"stickySeconds", 0.0}}),
                     Options());
  auto eps = Fleet(2, 2);
  SetWaiting(eps, 0, 2, 5);
  EXPECT_EQ(Cycle(*s, kPromptB, eps, 0.0).first, Locality::kSpillSaturated);
  // Within minSpillSeconds (1 s), even an idle local pool does not end the spill.
  SetWaiting(eps, 0, 2, 0);
  Scrape(eps, 0.5);
  EXPECT_EQ(Cycle(*s, kPromptB, eps, 0.5).first, Locality::kSpillSaturated);
  // After it, the local queue going back and forth across 5 (4, 5, 4, 3, ...) does not
  // bring picks home: room again only at waiting <= 2.
  int t = 0;
  for (double w : {4.0, 5.0, 4.0, 5.0, 3.0, 4.0, 3.0}) {
    const double now = 2.0 + 0.1 * t++;
    SetWaiting(eps, 0, 2, w);
    Scrape(eps, now);
    EXPECT_EQ(Cycle(*s, kPromptB, eps, now).first, Locality::kSpillSaturated) << "waiting " << w;
  }
  // Clearly recovered (2 queued on one endpoint): the spill recedes.
  eps[1].waiting = 2;
  Scrape(eps, 3.0);
  auto [why, to] = Cycle(*s, kPromptB, eps, 3.0);
  EXPECT_EQ(why, Locality::kLocal);
  EXPECT_LT(to, 2u);
  // And it takes saturation again (waiting >= 5 everywhere local) to spill again.
  SetWaiting(eps, 0, 2, 4);
  Scrape(eps, 3.1);
  EXPECT_EQ(Cycle(*s, kPromptB, eps, 3.1).first, Locality::kLocal);
  LocalityStats st = s->locality_stats();
  EXPECT_EQ(st.Picks(Locality::kSpillSaturated), 9u);
  EXPECT_EQ(st.Picks(Locality::kLocal), 2u);
  EXPECT_EQ(st.spills_started, 1u);
  EXPECT_FALSE(st.spilling);
}

TEST(Locality, WithoutHysteresisTheSamePoolFlaps) {
  // The control for the test above: recover thresholds equal to the entry ones and no
  // minimum spill.
  auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0},
                                   {"recoverQueueThreshold", 4.99},
                                   {"recoverKvThreshold", 0.79},
                                   {"minSpillSeconds", 0.0},
                                   {"stickySeconds", 0.0}}),
                     Options());
  auto eps = Fleet(2, 2);
  int t = 0;
  for (double w : {5.0, 4.0, 5.0, 4.0}) {
    const double now = 0.1 * t++;
    SetWaiting(eps, 0, 2, w);
    Scrape(eps, now);
    Cycle(*s, kPromptB, eps, now);
  }
  EXPECT_EQ(s->locality_stats().spills_started, 2u);
  EXPECT_EQ(s->locality_stats().Picks(Locality::kLocal), 2u);
}

TEST(Locality, WaitSpillRecedesBelowHalfTheRemoteCost) {
  auto s = MustBuild(LocalitySpec({{"minSpillSeconds", 0.0}, {"stickySeconds", 0.0}}), Options());
  auto eps = Fleet(2, 1);
  SetWaiting(eps, 0, 2, 4);  // 0.08 s > 0.07 s
  EXPECT_EQ(Cycle(*s, kPromptB, eps, 0.0).first, Locality::kSpillWait);
  SetWaiting(eps, 0, 2, 2);  // 0.04 s > 0.5 x 0.07 s: still spilling
  EXPECT_EQ(Cycle(*s, kPromptB, eps, 0.1).first, Locality::kSpillWait);
  SetWaiting(eps, 0, 2, 1);  // 0.02 s: home
  EXPECT_EQ(Cycle(*s, kPromptB, eps, 0.2).first, Locality::kLocal);
  SetWaiting(eps, 0, 2, 3);  // 0.06 s < 0.07 s: not again
  EXPECT_EQ(Cycle(*s, kPromptB, eps, 0.3).first, Locality::kLocal);
}

TEST(Locality, SamePrefixSpillsToTheSameRemoteReplica) {
  auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}, {"stickySeconds", 3.0}}),
                     Options());
  auto eps = Fleet(2, 3);
  SetWaiting(eps, 0, 2, 6);
  eps[2].kv_usage = 0.3;
  eps[3].kv_usage = 0.1;  // the KV scorer's favourite
  eps[4].kv_usage = 0.2;
  auto [why, to] = Cycle(*s, kPromptA, eps, 0.0);
  EXPECT_EQ(why, Locality::kSpillSaturated);
  EXPECT_EQ(to, 3u);
  // Replica 3 fills up a little: the scorer now prefers 4, but A stays on 3; B goes to 4.
  eps[3].kv_usage = 0.5;
  PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.locality, Locality::kSpillSaturated);
  ASSERT_EQ(r.ranked.size(), 3u);
  EXPECT_EQ(r.ranked[0], 3u);  // pinned
  EXPECT_EQ(r.ranked[1], 4u);  // then by score
  EXPECT_EQ(r.ranked[2], 2u);
  s->OnDispatched(r.handle, 3, 0.1);
  s->OnFinished(r.handle, 0.1);
  EXPECT_EQ(Cycle(*s, kPromptB, eps, 0.1).second, 4u);
  // Replica 3 saturated: A moves (to the best one with room) and sticks there instead.
  eps[3].waiting = 5;
  EXPECT_EQ(Cycle(*s, kPromptA, eps, 0.2).second, 4u);
  eps[3].waiting = 0;
  eps[3].kv_usage = 0.0;
  EXPECT_EQ(Cycle(*s, kPromptA, eps, 0.3).second, 4u);
}

TEST(Locality, ASpilledConversationDoesNotBounceWithinTheStickyTime) {
  auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}, {"stickySeconds", 3.0}}),
                     Options());
  auto eps = Fleet(2, 2);
  SetWaiting(eps, 0, 2, 6);
  auto [why, to] = Cycle(*s, kPromptA, eps, 0.0);
  ASSERT_EQ(why, Locality::kSpillSaturated);
  const uint32_t remote = to;
  // The local pool recovers after the minimum spill: new conversations come home, A stays
  // on its remote replica (ranked first, local fallbacks behind it).
  SetWaiting(eps, 0, 2, 0);
  Scrape(eps, 1.5);
  PickResult r = s->Pick(Req(kPromptA), eps, 1.5);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.locality, Locality::kSpillSticky);
  ASSERT_EQ(r.ranked.size(), 3u);
  EXPECT_EQ(r.ranked[0], remote);
  EXPECT_TRUE(AllIn(r.ranked.subspan(1), 0, 2));
  s->OnDispatched(r.handle, remote, 1.5);  // does not extend the entry
  s->OnFinished(r.handle, 1.5);
  EXPECT_EQ(Cycle(*s, kPromptB, eps, 1.5).first, Locality::kLocal);
  Scrape(eps, 2.9);
  EXPECT_EQ(Cycle(*s, kPromptA, eps, 2.9).second, remote);
  // The entry expires 3 s after the spill: A comes home.
  Scrape(eps, 3.0);
  auto [why2, to2] = Cycle(*s, kPromptA, eps, 3.0);
  EXPECT_EQ(why2, Locality::kLocal);
  EXPECT_LT(to2, 2u);
  LocalityStats st = s->locality_stats();
  EXPECT_EQ(st.Picks(Locality::kSpillSticky), 2u);
  EXPECT_EQ(st.Picks(Locality::kLocal), 2u);
}

TEST(Locality, ADispatchHomeDropsTheStickyEntry) {
  auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}, {"stickySeconds", 3.0}}),
                     Options());
  auto eps = Fleet(2, 2);
  SetWaiting(eps, 0, 2, 6);
  const uint32_t remote = Cycle(*s, kPromptA, eps, 0.0).second;
  SetWaiting(eps, 0, 2, 0);
  Scrape(eps, 1.5);
  // The router sent A to a local fallback (say the remote failed): A is home now.
  PickResult r = s->Pick(Req(kPromptA), eps, 1.5);
  ASSERT_EQ(r.ranked[0], remote);
  s->OnDispatched(r.handle, r.ranked[1], 1.5);
  s->OnFinished(r.handle, 1.5);
  EXPECT_EQ(Cycle(*s, kPromptA, eps, 1.6).first, Locality::kLocal);
}

TEST(Locality, StickyTableIsBounded) {
  auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0},
                                   {"stickySeconds", 100.0},
                                   {"stickyCapacity", 8.0}}),
                     Options());
  auto* ps = dynamic_cast<ProfileScheduler*>(s.get());
  ASSERT_NE(ps, nullptr);
  auto* filter = dynamic_cast<LocalityFilter*>(ps->plugins()[0]);
  ASSERT_NE(filter, nullptr);
  auto eps = Fleet(1, 1);
  eps[0].waiting = 9;
  std::vector<std::string> prompts;
  for (int i = 0; i < 100; ++i) {
    prompts.push_back("prompt number " + std::to_string(i) +
                      " with a first block that differs from every other one .....");
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(Cycle(*s, prompts[i], eps, 0.01 * static_cast<double>(i)).second, 1u);
  }
  std::vector<uint64_t> key;
  int live = 0;
  for (const std::string& p : prompts) {
    HashPromptBlocks("m", "", p, 64, 1, key);
    live += filter->StickyTarget(key[0], 1.0) == 1 ? 1 : 0;
  }
  EXPECT_LE(live, 8);
  EXPECT_GE(live, 1);
  // The latest spill is always remembered.
  HashPromptBlocks("m", "", prompts.back(), 64, 1, key);
  EXPECT_EQ(filter->StickyTarget(key[0], 1.0), 1);
}

TEST(Locality, EndpointsWithoutARegionAreLocal) {
  auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}}), Options());
  auto eps = Fleet(0, 2);
  eps.push_back(eps[0]);
  eps[2].id = 2;
  eps[2].SetLabels({{"app", "vllm"}});  // no region
  PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.locality, Locality::kLocal);
  ASSERT_EQ(r.ranked.size(), 1u);
  EXPECT_EQ(r.ranked[0], 2u);
  s->OnFinished(r.handle, 0.1);
  // The Kubernetes topology label counts as a region: us is local, eu remote.
  eps[0].SetLabels({{"topology.kubernetes.io/region", "us"}});
  eps[2].waiting = 7;
  r = s->Pick(Req(kPromptA), eps, 0.1);
  EXPECT_EQ(r.locality, Locality::kLocal);
  ASSERT_EQ(r.ranked.size(), 2u);
  EXPECT_EQ(std::count(r.ranked.begin(), r.ranked.end(), 1u), 0);
  s->OnFinished(r.handle, 0.1);
}

TEST(Locality, ARegionSetWithoutSetLabelsIsComparedByName) {
  auto s = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}}), Options());
  auto eps = MakeEndpoints(2);
  eps[0].region = "us";  // no region_key: the filter falls back to the name
  eps[1].region = "eu";
  PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
  EXPECT_EQ(r.locality, Locality::kLocal);
  ASSERT_EQ(r.ranked.size(), 1u);
  EXPECT_EQ(r.ranked[0], 0u);
  s->OnFinished(r.handle, 0.1);
}

TEST(Locality, ConcurrentRankReportsAndCommitCounts) {
  auto s = MustBuildPolicy("kvroute", Options());
  ASSERT_TRUE(s->concurrent_picks());
  auto eps = Fleet(2, 2);
  SetWaiting(eps, 0, 2, 6);
  PickScratch a(1), b(2);
  // Two ranks against the same learned state, then their commits.
  PickResult ra = s->Rank(Req(kPromptA), eps, 0.1, a);
  PickResult rb = s->Rank(Req(kPromptB), eps, 0.1, b);
  EXPECT_EQ(ra.locality, Locality::kSpillSaturated);
  EXPECT_EQ(rb.locality, Locality::kSpillSaturated);
  EXPECT_TRUE(AllIn(ra.ranked, 2, 4));
  EXPECT_EQ(s->locality_stats().Picks(Locality::kSpillSaturated), 0u);
  RequestHandle ha = s->Commit(a, eps);
  RequestHandle hb = s->Commit(b, eps);
  EXPECT_EQ(s->locality_stats().Picks(Locality::kSpillSaturated), 2u);
  EXPECT_EQ(s->locality_stats().spills_started, 1u);
  s->OnDispatched(ha, ra.ranked[0], 0.1);
  s->OnDispatched(hb, rb.ranked[0], 0.1);
  s->OnFinished(ha, 0.2);
  s->OnFinished(hb, 0.2);
}

TEST(Locality, RegionsWithoutARoundTripAreNeverASpillTarget) {
  auto eps = Fleet(2, 2, "ap");  // ap has no round trip
  SetWaiting(eps, 0, 2, 6);
  {
    auto s = MustBuild(LocalitySpec(), Options());
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kLocalSaturated);
    EXPECT_TRUE(AllIn(r.ranked, 0, 2));
    s->OnFinished(r.handle, 0.1);
    // Measured now: a target.
    s->SetRegionRtt("ap", 0.15);
    r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kSpillSaturated);
    EXPECT_TRUE(AllIn(r.ranked, 2, 4));
    s->OnFinished(r.handle, 0.1);
    // Forgotten (NaN): unknown again.
    s->SetRegionRtt("ap", kNaN);
    r = s->Pick(Req(kPromptA), eps, 0.2);
    EXPECT_EQ(r.locality, Locality::kLocalSaturated);
    s->OnFinished(r.handle, 0.2);
  }
  {
    // A configured default round trip makes unknown regions usable.
    auto s = MustBuild(LocalitySpec({{"defaultRttSeconds", 0.2}}), Options());
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kSpillSaturated);
    s->OnFinished(r.handle, 0.1);
  }
  {
    // Two remote regions: the nearer one (eu, 0.07 s) over ap (0.15 s), unless eu is full.
    auto s = MustBuild(LocalitySpec(), Options());
    s->SetRegionRtt("ap", 0.15);
    auto three = Fleet(2, 2, "ap");
    SetWaiting(three, 0, 2, 6);
    three.push_back(three[2]);
    three[4].id = 4;
    three[4].SetLabels({{"region", "eu"}});
    PickResult r = s->Pick(Req(kPromptA), three, 0.1);
    EXPECT_EQ(r.locality, Locality::kSpillSaturated);
    ASSERT_EQ(r.ranked.size(), 1u);
    EXPECT_EQ(r.ranked[0], 4u);
    s->OnFinished(r.handle, 0.1);
    three[4].waiting = 5;
    r = s->Pick(Req(kPromptA), three, 0.2);
    EXPECT_TRUE(AllIn(r.ranked, 2, 4));
    s->OnFinished(r.handle, 0.2);
  }
}

TEST(Locality, NoHealthyLocalEndpointGoesRemotePreferringKnownRoundTrips) {
  auto s = MustBuild(LocalitySpec(), Options());
  auto eps = Fleet(1, 2);
  eps.push_back(eps[2]);
  eps[3].id = 3;
  eps[3].SetLabels({{"region", "ap"}});  // no round trip
  eps[0].healthy = false;
  PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.locality, Locality::kNoLocal);
  EXPECT_TRUE(AllIn(r.ranked, 1, 3));
  s->OnFinished(r.handle, 0.1);
  // Only the unknown region left: better than nothing.
  eps[1].healthy = eps[2].healthy = false;
  r = s->Pick(Req(kPromptA), eps, 0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.locality, Locality::kNoLocal);
  ASSERT_EQ(r.ranked.size(), 1u);
  EXPECT_EQ(r.ranked[0], 3u);
  s->OnFinished(r.handle, 0.1);
  EXPECT_EQ(s->locality_stats().Picks(Locality::kNoLocal), 2u);
}

TEST(Locality, UnknownLocalLoadIsNeitherRoomNorSaturation) {
  auto eps = Fleet(2, 1);
  {
    // Every local endpoint stale (its values say saturated, as the routing core marks
    // them): no evidence, no spill.
    auto s = MustBuild(LocalitySpec(), Options());
    SetWaiting(eps, 0, 2, 50);
    eps[0].scraped_at_s = eps[1].scraped_at_s = -5.0;
    eps[2].scraped_at_s = 0.0;
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kLocal);
    EXPECT_TRUE(AllIn(r.ranked, 0, 2));
    s->OnFinished(r.handle, 0.1);
    // Never scraped, or the last scrape failed: the same.
    eps[0].scraped_at_s = -1.0;
    eps[1].scraped_at_s = 0.0;
    eps[1].scrape_ok = false;
    r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kLocal);
    s->OnFinished(r.handle, 0.1);
    eps[1].scrape_ok = true;
    Scrape(eps, 0.0);
  }
  // A fresh scheduler's first pick on `eps` (finished at once): its reason.
  auto first_pick = [&eps] {
    auto s = MustBuild(LocalitySpec(), Options());
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    s->OnFinished(r.handle, 0.1);
    return r.locality;
  };
  // One local saturated, the other NaN: the NaN one is not room, so spill.
  eps[0].waiting = 6;
  eps[1].waiting = 0;
  eps[1].kv_usage = kNaN;
  EXPECT_EQ(first_pick(), Locality::kSpillSaturated);
  eps[1].kv_usage = 0.0;
  // A NaN queue on the idle-looking local does not make its wait 0 (no wait rule from
  // garbage) and does not count as room; the other local's known wait decides.
  eps[0].waiting = 3;  // 0.06 s < 0.07 s
  eps[1].waiting = kNaN;
  EXPECT_EQ(first_pick(), Locality::kLocal);
  eps[1].waiting = 0;
  {
    // A remote with stale or NaN load is never a target.
    auto s = MustBuild(LocalitySpec(), Options());
    SetWaiting(eps, 0, 2, 6);
    eps[2].scraped_at_s = -5.0;
    PickResult r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kLocalSaturated);
    s->OnFinished(r.handle, 0.1);
    eps[2].scraped_at_s = 0.0;
    eps[2].kv_usage = kNaN;
    r = s->Pick(Req(kPromptA), eps, 0.1);
    EXPECT_EQ(r.locality, Locality::kLocalSaturated);
    s->OnFinished(r.handle, 0.1);
  }
}

TEST(Locality, OffWithoutARouterRegion) {
  // kvroute without a region is kvroute as before: the same picks as region-blind.
  auto with = MustBuildPolicy("kvroute", Options(""));
  auto blind = MustBuildPolicy("kvroute-region-blind", Options(""));
  auto eps = Fleet(3, 3);
  for (int i = 0; i < 50; ++i) {
    eps[i % 6].waiting = (i * 7) % 9;
    eps[(i + 2) % 6].kv_usage = ((i * 13) % 10) / 10.0;
    const std::string prompt = (i % 2 ? kPromptA : kPromptB) + std::to_string(i % 5);
    const double now = 0.01 * i;
    PickResult a = with->Pick(Req(prompt), eps, now);
    PickResult b = blind->Pick(Req(prompt), eps, now);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a.locality, Locality::kOff);
    ASSERT_EQ(std::vector<uint32_t>(a.ranked.begin(), a.ranked.end()),
              std::vector<uint32_t>(b.ranked.begin(), b.ranked.end()))
        << i;
    with->OnDispatched(a.handle, a.ranked[0], now);
    blind->OnDispatched(b.handle, b.ranked[0], now);
    with->OnFinished(a.handle, now);
    blind->OnFinished(b.handle, now);
  }
  EXPECT_EQ(with->locality_stats().Picks(Locality::kOff), 0u);
  // A locality-filter in a custom profile without a region passes everything.
  auto custom = MustBuild(LocalitySpec(), Options(""));
  SetWaiting(eps, 0, 3, 9);
  PickResult r = custom->Pick(Req(kPromptA), eps, 0.1);
  EXPECT_EQ(r.locality, Locality::kOff);
  EXPECT_EQ(r.candidates.size(), 6u);
  custom->OnFinished(r.handle, 0.1);
}

TEST(Locality, KvroutePolicyTurnsItOnWithARegion) {
  auto spec = PolicyAsSpec("kvroute", Options());
  ASSERT_TRUE(spec.has_value());
  EXPECT_EQ(spec->plugins[0].type, "locality-filter");
  EXPECT_EQ(spec->profiles[0].plugins[0].plugin_ref, "locality-filter");
  EXPECT_EQ(ValidateSchedulingSpec(*spec), std::nullopt);
  for (const auto& other : {PolicyAsSpec("kvroute", Options("")),
                            PolicyAsSpec("kvroute-region-blind", Options())}) {
    ASSERT_TRUE(other.has_value());
    for (const auto& p : other->plugins) EXPECT_NE(p.type, "locality-filter");
  }
  for (std::string_view name : PolicyNames()) EXPECT_NE(name, "kvroute-region-blind");
  // With in-flight accounting, the local pool fills from the router's own dispatches
  // before any scrape. Two idle local replicas, distinct prompts: they alternate, and with
  // 4 queued on each (0.08 s > 0.07 s) the 9th request spills by the wait rule; with eu
  // 1 s away only saturation (5 each) spills, from the 11th on.
  for (double rtt : {0.07, 1.0}) {
    auto s = MustBuildPolicy("kvroute", Options());
    s->SetRegionRtt("eu", rtt);
    auto eps = Fleet(2, 2);
    std::vector<RequestHandle> open;
    int first_remote = -1;
    Locality why = Locality::kOff;
    for (int i = 0; i < 12 && first_remote < 0; ++i) {
      PickResult r = s->Pick(Req(std::to_string(i) + kPromptA), eps, 0.1);
      ASSERT_TRUE(r.ok());
      if (r.ranked[0] >= 2) {
        first_remote = i;
        why = r.locality;
      } else {
        EXPECT_EQ(r.locality, Locality::kLocal);
      }
      s->OnDispatched(r.handle, r.ranked[0], 0.1);
      open.push_back(r.handle);
    }
    EXPECT_EQ(first_remote, rtt < 1 ? 8 : 10) << rtt;
    EXPECT_EQ(why, rtt < 1 ? Locality::kSpillWait : Locality::kSpillSaturated) << rtt;
    for (RequestHandle h : open) s->OnFinished(h, 0.2);
  }
}

TEST(Locality, ReloadKeepsCountersAndSpillState) {
  auto a = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}, {"stickySeconds", 3.0}}),
                     Options());
  auto eps = Fleet(2, 2);
  SetWaiting(eps, 0, 2, 6);
  const uint32_t remote = Cycle(*a, kPromptA, eps, 0.0).second;
  auto b = MustBuild(LocalitySpec({{"secondsPerQueuedRequest", 0.0}, {"stickySeconds", 3.0}}),
                     Options());
  ASSERT_TRUE(b->AdoptStateFrom(*a));
  EXPECT_EQ(b->locality_stats().Picks(Locality::kSpillSaturated), 1u);
  EXPECT_TRUE(b->locality_stats().spilling);
  // Still within the minimum spill, and A still sticks.
  SetWaiting(eps, 0, 2, 0);
  PickResult r = b->Pick(Req(kPromptA), eps, 0.5);
  EXPECT_EQ(r.locality, Locality::kSpillSaturated);
  EXPECT_EQ(r.ranked[0], remote);
  b->OnFinished(r.handle, 0.5);
}

}  // namespace
}  // namespace kvroute::sched
