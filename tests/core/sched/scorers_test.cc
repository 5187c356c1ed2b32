// Each scorer's and filter's formula on hand-made endpoint states, read back from the
// per-plugin scores a Pick reports.
#include <gtest/gtest.h>

#include "core/sched/latency_trainer.h"

#include "sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;
using testing::MustBuild;
using testing::Plugin;
using testing::Req;
using testing::SpecOf;

TEST(KvUtilizationScorer, OneMinusUsageClamped) {
  auto s = MustBuild(SpecOf({Plugin("kv-cache-utilization-scorer")}));
  auto eps = MakeEndpoints(4);
  eps[0].kv_usage = 0.1;
  eps[1].kv_usage = 0.5;
  eps[2].kv_usage = 0.95;
  eps[3].kv_usage = 1.2;
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.candidates.size(), 4u);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.9);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 0.5);
  EXPECT_NEAR(r.Score(0, 2), 0.05, 1e-12);
  EXPECT_DOUBLE_EQ(r.Score(0, 3), 0.0);
  EXPECT_EQ(r.ranked[0], 0u);
  EXPECT_EQ(r.scorer_names[0], "kv-cache-utilization-scorer");
}

TEST(QueueScorer, MinMaxNormalisedWaiting) {
  for (const char* type : {"queue-scorer", "queue-depth-scorer"}) {
    auto s = MustBuild(SpecOf({Plugin(type)}));
    auto eps = MakeEndpoints(3);
    eps[0].waiting = 2;
    eps[1].waiting = 10;
    eps[2].waiting = 6;
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    ASSERT_TRUE(r.ok());
    EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0) << type;
    EXPECT_DOUBLE_EQ(r.Score(0, 1), 0.0) << type;
    EXPECT_DOUBLE_EQ(r.Score(0, 2), 0.5) << type;
  }
}

TEST(QueueScorer, AllEqualScoresOne) {
  auto s = MustBuild(SpecOf({Plugin("queue-scorer")}));
  auto eps = MakeEndpoints(3);
  for (auto& e : eps) e.waiting = 3;
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  for (size_t c = 0; c < 3; ++c) EXPECT_DOUBLE_EQ(r.Score(0, c), 1.0);
}

TEST(RunningRequestsScorer, MinMaxNormalisedRunning) {
  auto s = MustBuild(SpecOf({Plugin("running-requests-scorer")}));
  auto eps = MakeEndpoints(3);
  eps[0].running = 40;
  eps[1].running = 0;
  eps[2].running = 10;
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 2), 0.75);
}

TEST(LoadAwareScorer, HalfLinearToThreshold) {
  auto s = MustBuild(SpecOf({Plugin("load-aware-scorer")}));
  auto eps = MakeEndpoints(4);
  eps[0].waiting = 0;
  eps[1].waiting = 64;
  eps[2].waiting = 128;
  eps[3].waiting = 500;
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.5);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 0.25);
  EXPECT_DOUBLE_EQ(r.Score(0, 2), 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 3), 0.0);
}

TEST(LeastRequestScorer, NormalisedRouterInflight) {
  auto s = MustBuild(SpecOf({Plugin("least-request-scorer")}));
  auto eps = MakeEndpoints(3);
  // Two requests in flight on 0, one on 2, none on 1.
  for (uint32_t target : {0u, 0u, 2u}) {
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    s->OnDispatched(r.handle, target, 0.0);
  }
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 2), 0.5);
  EXPECT_EQ(r.ranked[0], 1u);
  EXPECT_EQ(s->inflight().InFlight(0), 2u);
}

TEST(SoftLoadScorer, GapOverGapPlusSpread) {
  // minSpread 2, relativeSpread 0.5: denominator = (max - min) + 2 + 0.5 * mean.
  auto s = MustBuild(SpecOf({Plugin("soft-load-scorer",
                                    {{"minSpread", 2.0}, {"relativeSpread", 0.5}})}));
  auto eps = MakeEndpoints(3);
  // Load = max(router in-flight, waiting + running): 4 in flight on 0 (nothing scraped);
  // 1 in flight on 2 but the scrape sees 6 there (another client's requests).
  for (uint32_t target : {0u, 0u, 0u, 0u, 2u}) {
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    s->OnDispatched(r.handle, target, 0.0);
  }
  eps[2].waiting = 2;
  eps[2].running = 4;
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  // Loads 4, 0, 6: range 6, mean 10/3, denominator 6 + 2 + 5/3 = 29/3.
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0 - 4.0 / (29.0 / 3.0));
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 2), 1.0 - 6.0 / (29.0 / 3.0));
  EXPECT_EQ(r.ranked[0], 1u);
}

TEST(SoftLoadScorer, OneRequestOfDifferenceCostsLittle) {
  // Defaults (minSpread 4, no relative spread): one request more costs 1/5 of the
  // weight, not all of it as a min-max scorer would; equal loads all score 1.
  auto s = MustBuild(SpecOf({Plugin("soft-load-scorer")}));
  auto eps = MakeEndpoints(2);
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
  s->OnDispatched(r.handle, 0, 0.0);
  r = s->Pick(Req("x"), eps, 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.8);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
}

TEST(SoftLoadScorer, SpeedAwareCountsEachRequestOfASlowReplicaByItsSlowness) {
  // The latency trainer learns that endpoint 1 decodes three times slower than 0.
  LatencyTrainer t;
  double now = 0;
  for (uint32_t i = 0; i < 200; ++i) {
    const uint32_t e = i % 2;
    const RequestHandle h = (uint64_t{1 + i} << 32) | (i % 3);
    LatencyTrainer::Dispatch d;
    d.endpoint = e;
    d.prompt_tokens = 600;
    d.uncached_tokens = 500;
    d.running = 10;
    d.kv_usage = 0.3;
    d.capacity_tokens = 400000;
    t.OnDispatched(h, d, now);
    t.OnFirstToken(h, now + 0.05);
    t.OnFinished(h, 21, now + 0.05 + 20 * (e == 1 ? 0.060 : 0.020));
    now += 1.0;
  }
  ASSERT_NEAR(t.Slowness(1), 3.0, 0.15);
  const double slow = t.Slowness(1);
  for (bool aware : {false, true}) {
    auto s = MustBuild(SpecOf({Plugin("soft-load-scorer", {{"speedAware", aware ? 1.0 : 0.0}})}));
    auto eps = MakeEndpoints(2);
    eps[0].running = 6;  // loads 6 and 4 as scraped
    eps[1].running = 4;
    SchedRequest req = Req("x");
    req.latency = &t;
    PickResult r = s->Pick(req, eps, 0.0);
    if (!aware) {
      // 6 against 4: the slow one looks lighter and wins.
      EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0 - 2.0 / (2.0 + 4.0));
      EXPECT_EQ(r.ranked[0], 1u);
    } else {
      // 6 against 4 x 3: the fast one wins.
      const double d = 4 * slow - 6;
      EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0);
      EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0 - d / (d + 4.0));
      EXPECT_EQ(r.ranked[0], 0u);
    }
  }
}

TEST(SoftLoadScorer, TokenAwareCountsInFlightRequestsByTheirWork) {
  // Two requests in flight on each endpoint: two long prompts on 0, two short ones on 1.
  for (bool aware : {false, true}) {
    auto s = MustBuild(SpecOf({Plugin("soft-load-scorer", {{"tokenAware", aware ? 1.0 : 0.0}})}));
    auto eps = MakeEndpoints(2);
    const std::string long_prompt(16000, 'l');  // about 4,000 tokens
    for (uint32_t target : {0u, 0u, 1u, 1u}) {
      PickResult r = s->Pick(Req(target == 0 ? long_prompt : "short"), eps, 0.0);
      s->OnDispatched(r.handle, target, 0.0);
    }
    const double b0 = s->inflight().ActiveBlocks(0);
    const double b1 = s->inflight().ActiveBlocks(1);
    ASSERT_GT(b0, 4 * b1);
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    if (!aware) {
      // By count, 2 against 2: equal.
      EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0);
      EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
    } else {
      // In units of the mean request (b0 + b1) / 4: the long prompts weigh more.
      const double per = (b0 + b1) / 4;
      const double d = b0 / per - b1 / per;
      EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
      EXPECT_NEAR(r.Score(0, 0), 1.0 - d / (d + 4.0), 1e-12);
      EXPECT_EQ(r.ranked[0], 1u);
    }
  }
}

TEST(RecentLoadScorer, DecayedDispatchCountsOverGapPlusSpread) {
  // Half-life 10 s, minSpread 2: at t = 10 every dispatch at t = 0 counts 1/2.
  auto s = MustBuild(SpecOf({Plugin("recent-load-scorer",
                                    {{"halfLifeSeconds", 10.0}, {"minSpread", 2.0}})}));
  auto eps = MakeEndpoints(3);
  for (uint32_t target : {0u, 0u, 1u}) {
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    s->OnDispatched(r.handle, target, 0.0);
    s->OnFinished(r.handle, 0.0);  // finished: only the decayed count remembers it
  }
  PickResult r = s->Pick(Req("x"), eps, 10.0);
  // Counts 1, 0.5, 0: denominator 1 + 2 = 3.
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0 - 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0 - 0.5 / 3.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 2), 1.0);
  EXPECT_EQ(r.ranked[0], 2u);
  // A dispatch adds 1 to the decayed count: endpoint 2 at 1, endpoint 0 at 1 too.
  s->OnDispatched(r.handle, 2, 10.0);
  r = s->Pick(Req("x"), eps, 10.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0 - 0.5 / 2.5);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 2), 1.0 - 0.5 / 2.5);
}

TEST(PrefixCacheScorer, LongestMatchedPrefixOverTotalBlocks) {
  auto s = MustBuild(SpecOf({Plugin("prefix-cache-scorer", {{"blockSize", 4.0}})}));
  auto eps = MakeEndpoints(2);
  PickResult r = s->Pick(Req("aaaabbbbcccc"), eps, 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.0);
  s->OnDispatched(r.handle, 0, 0.0);

  r = s->Pick(Req("aaaabbbbdddd"), eps, 1.0);  // 2 of 3 blocks shared
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 0.0);
  EXPECT_EQ(r.ranked[0], 0u);

  r = s->Pick(Req("aaaabbbbccccXY"), eps, 1.0);  // trailing partial block dropped
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0);

  r = s->Pick(Req("zaaabbbbcccc"), eps, 1.0);  // the chain breaks at block 0
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.0);

  r = s->Pick(Req("aaaabbbbcccc", "other-model"), eps, 1.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.0);

  SchedRequest salted = Req("aaaabbbbcccc");
  salted.cache_salt = "tenant-a";
  r = s->Pick(salted, eps, 1.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.0);

  r = s->Pick(Req("aaa"), eps, 1.0);  // shorter than a block
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 0.0);
}

TEST(PrefixCacheScorer, MaxPrefixBlocksToMatchCapsTheTotal) {
  auto s = MustBuild(SpecOf(
      {Plugin("prefix-cache-scorer", {{"blockSize", 4.0}, {"maxPrefixBlocksToMatch", 2.0}})}));
  auto eps = MakeEndpoints(2);
  PickResult r = s->Pick(Req("aaaabbbbcccc"), eps, 0.0);
  s->OnDispatched(r.handle, 1, 0.0);
  r = s->Pick(Req("aaaabbbbdddd"), eps, 1.0);  // only the first 2 blocks count
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
}

TEST(SaturationFilter, DropsOverKvOverQueueAndStale) {
  auto s = MustBuild(SpecOf({Plugin("saturation-filter")}));
  auto eps = MakeEndpoints(6);
  eps[0].kv_usage = 0.81;  // over kv
  eps[1].waiting = 6;      // over queue
  eps[2].waiting = 5;      // at the threshold: kept
  eps[2].kv_usage = 0.8;
  eps[3].scraped_at_s = 0.7;  // 0.3 s old at t=1.0 > 0.2: stale
  eps[4].scrape_ok = false;   // last scrape failed
  eps[5].scraped_at_s = 0.9;  // 0.1 s old: fresh
  for (auto& e : eps) {
    if (e.id != 3 && e.id != 5) e.scraped_at_s = 1.0;
  }
  PickResult r = s->Pick(Req("x"), eps, 1.0);
  ASSERT_TRUE(r.ok());
  std::vector<uint32_t> kept(r.candidates.begin(), r.candidates.end());
  EXPECT_EQ(kept, (std::vector<uint32_t>{2, 5}));
}

TEST(SaturationFilter, KeepsAllWhenAllAreOver) {
  auto s = MustBuild(SpecOf({Plugin("saturation-filter")}));
  auto eps = MakeEndpoints(3);
  eps[0].kv_usage = 0.9;
  eps[1].kv_usage = 0.95;
  eps[2].waiting = 50;
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.candidates.size(), 3u);
}

TEST(SaturationFilter, ThresholdParameters) {
  auto s = MustBuild(SpecOf({Plugin(
      "saturation-filter", {{"kvThreshold", 0.5}, {"queueThreshold", 1.0}})}));
  auto eps = MakeEndpoints(3);
  eps[0].kv_usage = 0.6;
  eps[1].waiting = 2;
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  ASSERT_EQ(r.candidates.size(), 1u);
  EXPECT_EQ(r.candidates[0], 2u);
}

TEST(Scheduler, UnhealthyEndpointsAreNeverPicked) {
  auto s = MustBuild(SpecOf({Plugin("kv-cache-utilization-scorer")}));
  auto eps = MakeEndpoints(3);
  eps[0].healthy = false;
  eps[0].kv_usage = 0.0;
  eps[1].kv_usage = 0.5;
  eps[2].kv_usage = 0.6;
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::vector<uint32_t>(r.ranked.begin(), r.ranked.end()),
            (std::vector<uint32_t>{1, 2}));
  for (auto& e : eps) e.healthy = false;
  EXPECT_EQ(s->Pick(Req("x"), eps, 0.0).status, PickStatus::kNoHealthyEndpoint);
  EXPECT_EQ(s->Pick(Req("x"), {}, 0.0).status, PickStatus::kNoHealthyEndpoint);
}

TEST(Scheduler, WeightsMultiplyAndSum) {
  auto s = MustBuild(
      SpecOf({Plugin("kv-cache-utilization-scorer"), Plugin("queue-scorer")}, {2.0, 0.5}));
  auto eps = MakeEndpoints(2);
  eps[0].kv_usage = 0.2;
  eps[0].waiting = 4;
  eps[1].kv_usage = 0.5;
  eps[1].waiting = 0;
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  EXPECT_DOUBLE_EQ(r.totals[0], 2.0 * 0.8 + 0.5 * 0.0);
  EXPECT_DOUBLE_EQ(r.totals[1], 2.0 * 0.5 + 0.5 * 1.0);
  EXPECT_EQ(r.ranked[0], 0u);
  EXPECT_EQ(r.weights[0], 2.0);
}

TEST(Scheduler, RankedListIsCappedByMaxRanked) {
  SchedulerOptions o;
  o.max_ranked = 2;
  auto s = MustBuild(SpecOf({Plugin("kv-cache-utilization-scorer")}), o);
  auto eps = MakeEndpoints(5);
  for (size_t i = 0; i < 5; ++i) eps[i].kv_usage = 0.1 * static_cast<double>(5 - i);
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  EXPECT_EQ(std::vector<uint32_t>(r.ranked.begin(), r.ranked.end()),
            (std::vector<uint32_t>{4, 3}));
}

TEST(Scheduler, HandlesAreSingleUse) {
  auto s = MustBuild(SpecOf({Plugin("least-request-scorer")}));
  auto eps = MakeEndpoints(2);
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  const RequestHandle h = r.handle;
  EXPECT_NE(h, kNoHandle);
  s->OnDispatched(h, 1, 0.0);
  EXPECT_EQ(s->inflight().InFlight(1), 1u);
  s->OnDispatched(h, 0, 0.1);  // retried on a fallback: moves
  EXPECT_EQ(s->inflight().InFlight(1), 0u);
  EXPECT_EQ(s->inflight().InFlight(0), 1u);
  s->OnFinished(h, 1.0);
  EXPECT_EQ(s->inflight().InFlight(0), 0u);
  // A finished handle is dead even after its slot is reused.
  PickResult r2 = s->Pick(Req("x"), eps, 2.0);
  EXPECT_NE(r2.handle, h);
  s->OnDispatched(h, 1, 2.0);
  s->OnFinished(h, 2.0);
  EXPECT_EQ(s->inflight().InFlight(1), 0u);
  s->OnDispatched(r2.handle, 1, 2.0);
  EXPECT_EQ(s->inflight().InFlight(1), 1u);
  s->OnFinished(kNoHandle, 3.0);  // ignored
}

}  // namespace
}  // namespace kvroute::sched
