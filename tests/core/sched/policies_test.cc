// Complete policies on scenarios with exact expected picks.
#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <set>
#include <string>

#include "core/sched/sglang_cache_aware.h"
#include "sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;
using testing::MustBuild;
using testing::MustBuildPolicy;
using testing::Plugin;
using testing::Req;
using testing::SpecOf;

// A 4096-character shared prefix followed by a 64-character distinct suffix.
std::string SharedPrefixPrompt(int i) {
  std::string p;
  for (int k = 0; p.size() < 4096; ++k) p += "You are a helpful assistant, rule " + std::to_string(k) + ". ";
  p.resize(4096);
  std::string suffix = "question " + std::to_string(i) + " ";
  while (suffix.size() < 64) suffix += "?";
  return p + suffix;
}

std::string DistinctPrompt(int i) {
  std::string p = "distinct prompt #" + std::to_string(i) + " ";
  while (p.size() < 1024) p += static_cast<char>('a' + (i * 7 + p.size()) % 26);
  return p;
}

// The seed scenario: 8 replicas, same-prefix traffic sticks to one replica while its KV
// fills up (KV alone never filters: in a KV-bound fleet every replica sits near the old
// 0.8 threshold, and spilling the prefix would only copy it), and spills to the next-best
// once its queue passes the saturation threshold.
TEST(KvroutePolicy, SameprefixSticksThenSpillsToNextBest) {
  auto s = MustBuildPolicy("kvroute");
  auto eps = MakeEndpoints(8);
  for (size_t i = 0; i < 8; ++i) eps[i].kv_usage = 0.20 + 0.01 * static_cast<double>(i);
  double now = 0.0;
  uint32_t sticky = 99;
  for (int i = 0; i < 7; ++i) {
    now += 0.05;
    PickResult r = s->Pick(Req(SharedPrefixPrompt(i)), eps, now);
    ASSERT_TRUE(r.ok());
    if (i == 0) {
      EXPECT_EQ(r.ranked[0], 0u);  // lowest KV wins when nobody has the prefix
      sticky = r.ranked[0];
    }
    EXPECT_EQ(r.ranked[0], sticky) << "request " << i;
    EXPECT_EQ(r.candidates.size(), 8u) << "request " << i;  // high KV is not filtered
    s->OnDispatched(r.handle, r.ranked[0], now);
    s->OnFirstToken(r.handle, now + 0.01);
    // Short answers: each request is done before the next arrives, so the replica is
    // loaded in KV (held prefixes, long-running neighbours), not in request count. (With
    // requests piling up in flight there, the soft load scorer would spread them.)
    s->OnFinished(r.handle, now + 0.015);
    // The next scrape sees the replica fill up, past 0.8 at the end.
    eps[sticky].kv_usage += 0.1;
    for (auto& e : eps) e.scraped_at_s = now + 0.02;
    for (auto& e : eps) s->OnMetricsUpdated(e.id, now + 0.02);
  }
  EXPECT_NEAR(eps[sticky].kv_usage, 0.9, 1e-9);
  // Its queue passes the threshold (waiting > 5): the next same-prefix request goes to the
  // next-best replica (the lowest KV among the others), and the prefix then sticks there.
  eps[sticky].waiting = 6;
  now += 0.05;
  for (auto& e : eps) e.scraped_at_s = now;
  PickResult r = s->Pick(Req(SharedPrefixPrompt(100)), eps, now);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.ranked[0], 1u);
  EXPECT_EQ(r.candidates.size(), 7u);  // the saturated one was filtered
  s->OnDispatched(r.handle, r.ranked[0], now);
  s->OnFirstToken(r.handle, now);
  r = s->Pick(Req(SharedPrefixPrompt(101)), eps, now + 0.01);
  EXPECT_EQ(r.ranked[0], 1u);
}

// One prefix for everything (the hotspot scenario): the replica holding it keeps the
// traffic while its load is close to the others', but once requests pile up there (the
// others idle) the load terms outweigh the prefix and another replica takes over.
TEST(KvroutePolicy, SamePrefixSpreadsWhenRequestsPileUp) {
  auto s = MustBuildPolicy("kvroute");
  auto eps = MakeEndpoints(8);
  std::map<uint32_t, int> count;
  uint32_t first = 99;
  for (int i = 0; i < 20; ++i) {
    PickResult r = s->Pick(Req(SharedPrefixPrompt(i)), eps, 0.1);
    ASSERT_TRUE(r.ok());
    if (i == 0) first = r.ranked[0];
    s->OnDispatched(r.handle, r.ranked[0], 0.1);
    s->OnFirstToken(r.handle, 0.1);  // never finish: they pile up
    count[r.ranked[0]]++;
  }
  // Prefix 3 x 0.985 (the shared blocks of this prompt) against load 4 x n / (n + 8 + 0.25
  // * n / 8), KV 2 x the holder's estimated blocks over 1,000 (81 for the first request,
  // 17 for each cached one) and recent load 1 x n / (n + 2) (no decay within the burst):
  // an idle replica scores 7; with 6 in flight the holder scores 2.955 + 2.31 + 1.67 +
  // 0.25 = 7.18, with 7 2.955 + 2.16 + 1.63 + 0.22 = 6.97, so the 8th request goes to an
  // idle replica, which then holds the prefix too and takes the next 7, and a third the
  // last 6.
  ASSERT_EQ(count.size(), 3u);
  EXPECT_EQ(count[first], 7);
  for (auto [endpoint, n] : count) EXPECT_LE(n, 7) << endpoint;
}

// Without a scrape in between, a burst of distinct prompts must spread instead of piling
// onto the replica with the lowest scraped usage.
TEST(KvroutePolicy, BurstOfDistinctPromptsSpreadsBetweenScrapes) {
  auto s = MustBuildPolicy("kvroute");
  auto eps = MakeEndpoints(8);
  for (size_t i = 0; i < 8; ++i) eps[i].kv_usage = 0.20 + 0.01 * static_cast<double>(i);
  std::map<uint32_t, int> count;
  for (int i = 0; i < 16; ++i) {
    PickResult r = s->Pick(Req(DistinctPrompt(i)), eps, 0.1);
    ASSERT_TRUE(r.ok());
    s->OnDispatched(r.handle, r.ranked[0], 0.1);
    count[r.ranked[0]]++;
  }
  ASSERT_EQ(count.size(), 8u);
  for (auto& [ep, n] : count) EXPECT_EQ(n, 2) << "endpoint " << ep;
}

TEST(GieDefaultPolicy, BurstPilesOntoLowestScrapedUsage) {
  // The same burst under gie-default (no in-flight accounting): every request sees the
  // same scrape and goes to the same replica. This is the behaviour kvroute fixes.
  auto s = MustBuildPolicy("gie-default");
  auto eps = MakeEndpoints(8);
  for (size_t i = 0; i < 8; ++i) eps[i].kv_usage = 0.20 + 0.01 * static_cast<double>(i);
  for (int i = 0; i < 16; ++i) {
    PickResult r = s->Pick(Req(DistinctPrompt(i)), eps, 0.1);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.ranked[0], 0u);
    s->OnDispatched(r.handle, r.ranked[0], 0.1);
  }
}

TEST(SeedArticleProfile, LoadsAndSticksToThePrefix) {
  auto s = MustBuild(SeedArticleSpec());
  EXPECT_EQ(s->policy(), "custom");
  auto eps = MakeEndpoints(8);
  for (size_t i = 0; i < 8; ++i) eps[i].kv_usage = 0.5 - 0.01 * static_cast<double>(i);
  PickResult r = s->Pick(Req(SharedPrefixPrompt(0)), eps, 0.0);
  EXPECT_EQ(r.ranked[0], 7u);
  s->OnDispatched(r.handle, 7, 0.0);
  eps[7].kv_usage = 0.7;  // now the fullest, but it holds the prefix
  r = s->Pick(Req(SharedPrefixPrompt(1)), eps, 0.1);
  EXPECT_EQ(r.ranked[0], 7u);
  EXPECT_EQ(r.scorer_names.size(), 3u);
  EXPECT_EQ(r.scorer_names[2], "queue-depth-scorer");
}

TEST(KvroutePolicy, NewPromptGroupsGoToTheReplicasWithTheLeastRecentTraffic) {
  // Four idle replicas and four prompt groups, each request finished before the next: all
  // replicas look the same to the scrape and the in-flight count, so without memory of
  // recent traffic the random tie-break may stack groups on one replica (issue 12's demo:
  // five of sixteen groups on one replica, whose KV then filled). With it, each new group
  // takes a replica no group has used yet, and a group's later requests stay with it.
  auto s = MustBuildPolicy("kvroute");
  auto eps = MakeEndpoints(4);
  auto prompt = [](int group, int question) {
    return std::string(4000, static_cast<char>('a' + group)) + " question " +
           std::to_string(question);
  };
  std::vector<uint32_t> home;
  double now = 0.0;
  for (int g = 0; g < 4; ++g) {
    for (auto& e : eps) e.scraped_at_s = now;
    PickResult r = s->Pick(Req(prompt(g, 0)), eps, now);
    ASSERT_TRUE(r.ok());
    home.push_back(r.ranked[0]);
    s->OnDispatched(r.handle, r.ranked[0], now);
    s->OnFinished(r.handle, now + 0.1);
    now += 0.2;
  }
  std::vector<uint32_t> sorted = home;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<uint32_t>{0, 1, 2, 3}));
  for (int g = 0; g < 4; ++g) {
    for (auto& e : eps) e.scraped_at_s = now;
    PickResult r = s->Pick(Req(prompt(g, 1)), eps, now);
    EXPECT_EQ(r.ranked[0], home[g]) << "group " << g;
    s->OnDispatched(r.handle, r.ranked[0], now);
    s->OnFinished(r.handle, now + 0.1);
    now += 0.2;
  }
}

TEST(RoundRobinPolicy, Cycles) {
  auto s = MustBuildPolicy("round-robin");
  auto eps = MakeEndpoints(3);
  std::vector<uint32_t> firsts;
  for (int i = 0; i < 7; ++i) {
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    firsts.push_back(r.ranked[0]);
    if (i == 0) {
      EXPECT_EQ(std::vector<uint32_t>(r.ranked.begin(), r.ranked.end()),
                (std::vector<uint32_t>{0, 1, 2}));
    }
    s->OnFinished(r.handle, 0.0);
  }
  EXPECT_EQ(firsts, (std::vector<uint32_t>{0, 1, 2, 0, 1, 2, 0}));
}

TEST(RandomPolicy, DeterministicPerSeedAndCoversAll) {
  SchedulerOptions o;
  o.seed = 42;
  auto a = MustBuildPolicy("random", o);
  auto b = MustBuildPolicy("random", o);
  auto eps = MakeEndpoints(5);
  std::set<uint32_t> seen;
  for (int i = 0; i < 100; ++i) {
    PickResult ra = a->Pick(Req("x"), eps, 0.0);
    const uint32_t first = ra.ranked[0];
    PickResult rb = b->Pick(Req("x"), eps, 0.0);
    EXPECT_EQ(first, rb.ranked[0]);
    seen.insert(first);
    a->OnFinished(ra.handle, 0.0);
    b->OnFinished(rb.handle, 0.0);
  }
  EXPECT_EQ(seen.size(), 5u);
}

TEST(LeastRequestPolicy, PicksFewestInFlight) {
  auto s = MustBuildPolicy("least-request");
  auto eps = MakeEndpoints(3);
  std::vector<RequestHandle> on0;
  // Six requests never finishing: they spread two per endpoint.
  std::map<uint32_t, int> count;
  for (int i = 0; i < 6; ++i) {
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    s->OnDispatched(r.handle, r.ranked[0], 0.0);
    count[r.ranked[0]]++;
    if (r.ranked[0] == 0) on0.push_back(r.handle);
  }
  EXPECT_EQ(count, (std::map<uint32_t, int>{{0, 2}, {1, 2}, {2, 2}}));
  s->OnFinished(on0[0], 1.0);
  PickResult r = s->Pick(Req("x"), eps, 1.0);
  EXPECT_EQ(r.ranked[0], 0u);
}

TEST(WeightedRandomPicker, ProportionalToTotals) {
  SchedulerOptions o;
  o.seed = 7;
  auto s = MustBuild(
      SpecOf({Plugin("kv-cache-utilization-scorer"), Plugin("weighted-random-picker")}), o);
  auto eps = MakeEndpoints(3);
  eps[0].kv_usage = 0.5;  // score 0.5
  eps[1].kv_usage = 0.0;  // score 1.0
  eps[2].kv_usage = 1.0;  // score 0: never first
  std::map<uint32_t, int> count;
  for (int i = 0; i < 900; ++i) {
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    count[r.ranked[0]]++;
    EXPECT_EQ(r.ranked.size(), 3u);
    EXPECT_EQ(r.ranked[2], 2u);
    s->OnFinished(r.handle, 0.0);
  }
  EXPECT_EQ(count[2], 0);
  EXPECT_GT(count[1], 540);  // expected 600
  EXPECT_LT(count[1], 660);
}

// ---- sglang-cache-aware ----

TEST(CharRadixTree, SplitsAndMatchesPerWorker) {
  CharRadixTree t;
  t.Insert("abc", 0, 1);
  t.Insert("abd", 1, 2);
  std::vector<uint32_t> m;
  EXPECT_EQ(t.Match("abcz", m), 3u);
  EXPECT_EQ(m[0], 3u);
  EXPECT_EQ(m[1], 2u);
  EXPECT_EQ(t.WorkerChars(0), 3u);  // "ab" + "c"
  EXPECT_EQ(t.WorkerChars(1), 3u);  // "ab" + "d"
  EXPECT_EQ(t.Match("xyz", m), 0u);
}

TEST(CharRadixTree, EvictsLeastRecentLeavesAboveCap) {
  CharRadixTree t;
  t.Insert("hello world", 0, 1);
  t.Insert("help me", 0, 2);
  EXPECT_EQ(t.WorkerChars(0), 15u);  // "hel" + "lo world" + "p me"
  t.EvictWorker(0, 10);
  EXPECT_EQ(t.WorkerChars(0), 7u);  // the older leaf "lo world" went
  std::vector<uint32_t> m;
  t.Match("hello world", m);
  EXPECT_EQ(m[0], 3u);
  t.Match("help me", m);
  EXPECT_EQ(m[0], 7u);
  t.EvictWorker(0, 0);
  EXPECT_EQ(t.WorkerChars(0), 0u);
  EXPECT_EQ(t.NodeCount(), 1u);  // the root
}

TEST(SglangCacheAware, BestMatchAboveThresholdElseSmallestTree) {
  auto s = MustBuildPolicy("sglang-cache-aware");
  auto eps = MakeEndpoints(3);
  const std::string text(1000, 'a');
  PickResult r = s->Pick(Req(text), eps, 0.0);
  const uint32_t first = r.ranked[0];
  s->OnDispatched(r.handle, first, 0.0);
  // Same text: full match (1.0 > 0.3) on `first`, even though it now has a request.
  r = s->Pick(Req(text + "bbbb"), eps, 0.1);
  EXPECT_EQ(r.ranked[0], first);
  s->OnDispatched(r.handle, first, 0.1);
  // 25% shared: below the threshold, so the smallest tree: not `first` (the others hold
  // nothing, the least loaded of them).
  const std::string partial = std::string(250, 'a') + std::string(750, 'c');
  r = s->Pick(Req(partial), eps, 0.2);
  EXPECT_NE(r.ranked[0], first);
  EXPECT_DOUBLE_EQ(r.Score(0, first), 0.25);
  // 40% shared: above 0.3, so `first` again.
  const std::string more = std::string(400, 'a') + std::string(600, 'd');
  r = s->Pick(Req(more), eps, 0.3);
  EXPECT_EQ(r.ranked[0], first);
}

// Puts `n` requests in flight on `eps[id]` alone (the text goes to its tree).
void Load(Scheduler& s, std::vector<EndpointState>& eps, uint32_t id, int n,
          const std::string& text) {
  for (int i = 0; i < n; ++i) {
    PickResult r = s.Pick(Req(text), std::span(eps).subspan(id, 1), 0.0);
    ASSERT_EQ(r.ranked[0], id);
    s.OnDispatched(r.handle, id, 0.0);
  }
}

TEST(SglangCacheAware, BalanceOverridesCacheAboveAbsoluteThreshold) {
  const std::string text(500, 'q');
  for (int load : {64, 65}) {
    auto s = MustBuildPolicy("sglang-cache-aware");
    auto eps = MakeEndpoints(2);
    Load(*s, eps, 0, load, text);  // endpoint 0 holds the text and `load` requests
    PickResult r = s->Pick(Req(text), eps, 1.0);
    EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0);
    // 64 - 0 is not > 64: the cache wins. 65 - 0 > 64 and 65 > 1.5 * 0: balance wins.
    EXPECT_EQ(r.ranked[0], load == 64 ? 0u : 1u) << "load " << load;
  }
}

TEST(SglangCacheAware, BalanceNeedsTheRelativeThresholdToo) {
  const std::string text(500, 'z');
  const std::string other(500, 'y');
  for (int load1 : {300, 260}) {
    auto s = MustBuildPolicy("sglang-cache-aware");
    auto eps = MakeEndpoints(2);
    Load(*s, eps, 0, 400, text);
    Load(*s, eps, 1, load1, other);
    PickResult r = s->Pick(Req(text), eps, 1.0);
    // 400 vs 300: 100 > 64 but 400 <= 1.5 * 300 = 450, so balanced: the cache wins.
    // 400 vs 260: 140 > 64 and 400 > 390: imbalanced, the least loaded wins.
    EXPECT_EQ(r.ranked[0], load1 == 300 ? 0u : 1u) << "load1 " << load1;
  }
}

// dynamo-cost: dynamo_cost_test.cc.

}  // namespace
}  // namespace kvroute::sched
