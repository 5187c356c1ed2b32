// Precise prefix routing in the routing core, in virtual time: KV-cache event batches as
// the subscriber adapter hands them over (RoutingCore::OnKvEvents), picks with token ids
// as a front end's tokenizer gives them.
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/routing/routing_core.h"
#include "support/routing_fixture.h"

namespace kvroute::routing {
namespace {

using kvevents::EventKind;
using kvevents::KvEvent;
using kvevents::KvEventBatch;
using kvevents::SourceState;
using test_support::ScrapedLoad;
using test_support::TestEndpoint;

std::vector<uint32_t> Tokens(size_t n, uint32_t first) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

KvEventBatch StoredBatch(const std::vector<uint32_t>& tokens, uint64_t first_hash) {
  KvEvent e;
  e.kind = EventKind::kBlockStored;
  e.block_size = 16;
  const size_t blocks = tokens.size() / 16;
  for (size_t i = 0; i < blocks; ++i) e.block_hashes.push_back(first_hash + i);
  e.token_ids.assign(tokens.begin(), tokens.begin() + static_cast<long>(blocks * 16));
  KvEventBatch b;
  b.events.push_back(e);
  return b;
}

KvEventBatch RemovedBatch(std::vector<uint64_t> hashes) {
  KvEvent e;
  e.kind = EventKind::kBlockRemoved;
  e.block_hashes = std::move(hashes);
  KvEventBatch b;
  b.events.push_back(e);
  return b;
}

class PreciseCore : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<EndpointSpec> eps;
    for (int i = 0; i < 3; ++i) {
      eps.push_back(TestEndpoint("r" + std::to_string(i), 9100 + i));
      if (i > 0) eps.back().kv_events = "tcp://127.0.0.1:" + std::to_string(5557 + i);
    }
    CoreOptions o;
    o.scheduling.policy = policy;
    o.health.staleness_s = 1e9;
    ASSERT_TRUE(core.Configure(o, eps, 0).ok());
    for (uint32_t id = 0; id < 3; ++id) core.OnScrape(id, ScrapedLoad("0", "0", "0.1", 0), 0);
  }
  // Picks, dispatches and finishes one request at `now`; returns the chosen endpoint.
  uint32_t PickOne(const std::vector<uint32_t>& tokens, double now, int64_t* predicted = nullptr) {
    std::string prompt(tokens.size() * 4, 'x');
    PickRequest pr;
    pr.request.model = "m";
    pr.request.prompt = prompt;
    pr.request.token_ids = tokens;
    pr.dispatch_first = true;
    PickResult r = core.Pick(pr, now);
    EXPECT_TRUE(r.ok());
    if (predicted) *predicted = r.predicted_cached_tokens;
    core.OnFinished(r.handle, r.ranked[0], 200, now);
    return r.ranked[0];
  }
  std::string policy = "kvroute";
  std::vector<std::string> logs;
  RoutingCore core{[this](std::string_view l) { logs.emplace_back(l); }};
};

TEST_F(PreciseCore, ReportedCacheWinsOverTheRoutersOwnHistory) {
  const auto prompt = Tokens(320, 1000);  // 20 blocks
  EXPECT_TRUE(core.kv_events_active());
  EXPECT_EQ(core.KvEventStats(0, 0).state, SourceState::kOff);
  EXPECT_EQ(core.KvEventStats(2, 0).state, SourceState::kUnknown);
  // Replica 2 computed the prompt for traffic that never passed through this router.
  core.OnKvEvents(2, StoredBatch(prompt, 500), 1.0);
  EXPECT_EQ(core.KvEventStats(2, 1).state, SourceState::kLive);
  EXPECT_EQ(core.KvEventStats(2, 1).blocks, 20u);
  int64_t predicted = -2;
  EXPECT_EQ(PickOne(prompt, 1.0, &predicted), 2u);
  EXPECT_EQ(predicted, 319 / 16 * 16);  // the last token is always computed
  // Replica 1 is live and holds nothing: its prediction is 0, not unknown.
  core.OnKvEvents(1, KvEventBatch{}, 1.0);
  const uint32_t ep = PickOne(Tokens(320, 1), 1.0, &predicted);
  EXPECT_EQ(predicted, ep == 0 ? -1 : 0);
  ASSERT_FALSE(logs.empty());
  bool saw = false;
  for (const auto& l : logs) saw = saw || l == "endpoint r2 KV events: unknown -> live (events arrive)";
  EXPECT_TRUE(saw);
  std::string m;
  core.AppendMetrics(m, 1.0);
  EXPECT_NE(m.find("kvroute_kv_events_state{endpoint=\"r2\",state=\"live\"} 1"), std::string::npos);
  EXPECT_NE(m.find("kvroute_kv_events_blocks{endpoint=\"r2\"} 20"), std::string::npos);
  EXPECT_NE(m.find("kvroute_kv_events_events_total{endpoint=\"r2\",type=\"BlockStored\"} 1"),
            std::string::npos);
  EXPECT_EQ(m.find("kvroute_kv_events_state{endpoint=\"r0\""), std::string::npos);
}

TEST_F(PreciseCore, EvictedBlocksStopAttractingRequests) {
  const auto prompt = Tokens(320, 1000);
  core.OnKvEvents(1, KvEventBatch{}, 0);
  core.OnKvEvents(2, StoredBatch(prompt, 500), 0);
  EXPECT_EQ(PickOne(prompt, 0), 2u);
  // The engine reused those blocks' slots (and its events for the request dispatched at 0
  // came; the speculative entries ended at 2 s).
  std::vector<uint64_t> hashes(20);
  std::iota(hashes.begin(), hashes.end(), 500);
  core.OnKvEvents(2, RemovedBatch(hashes), 3.0);
  EXPECT_EQ(core.KvEventStats(2, 3).blocks, 0u);
  int64_t predicted = -2;
  const uint32_t next = PickOne(prompt, 3.0, &predicted);
  EXPECT_EQ(predicted, next == 0 ? -1 : 0);
  // Replica 1 reports the prompt now: it wins.
  core.OnKvEvents(1, StoredBatch(prompt, 900), 6.0);
  EXPECT_EQ(PickOne(prompt, 6.0, &predicted), 1u);
  EXPECT_EQ(predicted, 304);
}

TEST_F(PreciseCore, SaltedRequestsAreNotPredictedFromUnsaltedEvents) {
  const auto prompt = Tokens(320, 1000);
  core.OnKvEvents(2, StoredBatch(prompt, 500), 0);
  std::string text(1280, 'x');
  PickRequest pr;
  pr.request.model = "m";
  pr.request.prompt = text;
  pr.request.token_ids = prompt;
  pr.request.cache_salt = "tenant-a";
  pr.dispatch_first = true;
  PickResult r = core.Pick(pr, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.predicted_cached_tokens, -1);
  core.OnFinished(r.handle, r.ranked[0], 200, 0);
  // No speculative entries either: the unsalted prompt finds only what the events said.
  EXPECT_EQ(core.KvEventStats(2, 0).blocks, 20u);
}

TEST_F(PreciseCore, UnknownOrStaleEndpointsUseTheApproximateModel) {
  const auto prompt = Tokens(320, 1000);
  // Nothing heard from anyone: the approximate model learns the first dispatch and keeps
  // the prompt there, with no receipt prediction.
  int64_t predicted = 0;
  const uint32_t first = PickOne(prompt, 0, &predicted);
  EXPECT_EQ(predicted, -1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(PickOne(prompt, 0.1 * i), first);
  // A live endpoint that was sent work needing blocks and publishes nothing for 10 s is
  // stale, logged once, and shown on /metrics.
  core.OnKvEvents(1, KvEventBatch{}, 1.0);
  core.OnKvEvents(2, KvEventBatch{}, 1.0);
  const auto other = Tokens(320, 7);
  const uint32_t sent = PickOne(other, 1.0);
  ASSERT_NE(sent, 0u);  // 0 is not tracked: events are not configured there
  EXPECT_EQ(core.KvEventStats(sent, 11.0).state, SourceState::kLive);
  EXPECT_EQ(core.KvEventStats(sent, 11.5).state, SourceState::kStale);
  core.OnScrape(0, ScrapedLoad("0", "0", "0.1", 11.5), 11.5);
  logs.clear();
  PickOne(Tokens(8, 1), 11.5);  // folds the scrape in, which ticks the index
  int stale_lines = 0;
  for (const auto& l : logs) stale_lines += l.find("live -> stale") != std::string::npos;
  EXPECT_EQ(stale_lines, 1);
}

TEST_F(PreciseCore, GapsRestartsAndDecodeErrorsReachTheIndex) {
  const auto prompt = Tokens(64, 1);
  core.OnKvEvents(2, StoredBatch(prompt, 10), 0);
  core.OnKvEventsGap(2, /*repaired=*/true, 1);
  EXPECT_EQ(core.KvEventStats(2, 1).blocks, 4u);
  core.OnKvEventsGap(2, /*repaired=*/false, 2);
  EXPECT_EQ(core.KvEventStats(2, 2).state, SourceState::kResync);
  EXPECT_EQ(core.KvEventStats(2, 2).blocks, 0u);
  core.OnKvEventsRestart(1, 3);
  EXPECT_EQ(core.KvEventStats(1, 3).restarts, 1u);
  EXPECT_EQ(core.KvEventStats(1, 3).state, SourceState::kLive);
  core.OnKvEventsDecodeError(1, 4);
  EXPECT_EQ(core.KvEventStats(1, 4).decode_errors, 1u);
  EXPECT_EQ(core.KvEventStats(1, 4).state, SourceState::kResync);
  // Events for an endpoint without kv_events are ignored.
  core.OnKvEvents(0, StoredBatch(prompt, 10), 5);
  EXPECT_EQ(core.KvEventStats(0, 5).blocks, 0u);
}

TEST_F(PreciseCore, ReloadKeepsEntriesAndDropsUnconfiguredEndpoints) {
  const auto prompt = Tokens(64, 1);
  core.OnKvEvents(1, StoredBatch(prompt, 10), 0);
  core.OnKvEvents(2, StoredBatch(prompt, 10), 0);
  std::vector<EndpointSpec> eps;
  for (int i = 0; i < 3; ++i) eps.push_back(TestEndpoint("r" + std::to_string(i), 9100 + i));
  eps[1].kv_events = "tcp://127.0.0.1:5558";
  CoreOptions o;
  o.health.staleness_s = 1e9;
  ASSERT_TRUE(core.Configure(o, eps, 1).ok());
  EXPECT_EQ(core.KvEventStats(1, 1).blocks, 4u);
  EXPECT_EQ(core.KvEventStats(1, 1).state, SourceState::kLive);
  EXPECT_EQ(core.KvEventStats(2, 1).state, SourceState::kOff);
  EXPECT_EQ(core.KvEventStats(2, 1).blocks, 0u);
  eps[1].kv_events.clear();
  ASSERT_TRUE(core.Configure(o, eps, 2).ok());
  EXPECT_FALSE(core.kv_events_active());
}

// The approximate-only peer model ignores events; the precise scorer in a custom profile
// uses them.
TEST(PreciseCorePolicies, GieDefaultIgnoresEventsPreciseScorerUsesThem) {
  for (const char* policy : {"gie-default", "precise"}) {
    RoutingCore core;
    std::vector<EndpointSpec> eps;
    for (int i = 0; i < 3; ++i) {
      eps.push_back(TestEndpoint("r" + std::to_string(i), 9100 + i));
      eps.back().kv_events = "tcp://127.0.0.1:" + std::to_string(5557 + i);
    }
    CoreOptions o;
    o.health.staleness_s = 1e9;
    if (std::string(policy) == "precise") {
      sched::PluginSpec scorer;
      scorer.type = "precise-prefix-cache-scorer";
      sched::PluginSpec picker;
      picker.type = "max-score-picker";
      o.scheduling.plugins = {scorer, picker};
      sched::ProfileSpec prof;
      prof.name = "default";
      prof.plugins = {{"precise-prefix-cache-scorer", 1, 0}, {"max-score-picker", 1, 0}};
      o.scheduling.profiles = {prof};
    } else {
      o.scheduling.policy = policy;
    }
    ASSERT_TRUE(core.Configure(o, eps, 0).ok()) << policy;
    for (uint32_t id = 0; id < 3; ++id) core.OnScrape(id, ScrapedLoad("0", "0", "0.1", 0), 0);
    const auto prompt = Tokens(320, 1000);
    for (uint32_t id = 0; id < 3; ++id) core.OnKvEvents(id, KvEventBatch{}, 0);
    core.OnKvEvents(1, StoredBatch(prompt, 500), 0);
    std::string text(1280, 'x');
    int to_one = 0;
    for (int i = 0; i < 30; ++i) {
      // A fresh text each time: the approximate model has nothing to go on.
      text[0] = static_cast<char>('a' + i % 26);
      text[1] = static_cast<char>('a' + i / 26);
      PickRequest pr;
      pr.request.model = "m";
      pr.request.prompt = text;
      pr.request.token_ids = prompt;
      PickResult r = core.Pick(pr, 10.0 + i * 3);
      ASSERT_TRUE(r.ok());
      to_one += r.ranked[0] == 1;
      core.OnFinished(r.handle, r.ranked[0], 200, 10.0 + i * 3);
    }
    if (std::string(policy) == "precise") {
      EXPECT_EQ(to_one, 30) << policy;
    } else {
      EXPECT_LT(to_one, 30) << policy;
    }
  }
}

// llm-d's 2025 precise arm (llm-d-2025-precise): the precise scorer's held blocks min-max
// normalised among the endpoints holding any (weight 3 against kv-cache 2 and queue 2), and
// no speculative entries: only what the engines report attracts.
TEST(PreciseCorePolicies, Llmd2025PreciseNormalisesAmongHoldersAndKeepsNoSpeculation) {
  RoutingCore core;
  std::vector<EndpointSpec> eps;
  for (int i = 0; i < 3; ++i) {
    eps.push_back(TestEndpoint("r" + std::to_string(i), 9100 + i));
    eps.back().kv_events = "tcp://127.0.0.1:" + std::to_string(5557 + i);
  }
  CoreOptions o;
  o.health.staleness_s = 1e9;
  o.scheduling.policy = "llm-d-2025-precise";
  ASSERT_TRUE(core.Configure(o, eps, 0).ok());
  const auto prompt = Tokens(320, 1000);  // 20 blocks
  for (uint32_t id = 0; id < 3; ++id) core.OnKvEvents(id, KvEventBatch{}, 0);
  core.OnKvEvents(1, StoredBatch(prompt, 500), 0);  // all 20
  core.OnKvEvents(2, StoredBatch(std::vector<uint32_t>(prompt.begin(), prompt.begin() + 304), 700),
                  0);  // 19 of them
  // r1 has the longest queue: queue score 0 there, 1 on r0 and r2. By share, r2 (0.95 x 3
  // + 2) would beat r1 (1.0 x 3 + 0); normalised among holders r2 scores 0 and r1 wins.
  core.OnScrape(0, ScrapedLoad("0", "0", "0.1", 0), 0);
  core.OnScrape(1, ScrapedLoad("0", "10", "0.1", 0), 0);
  core.OnScrape(2, ScrapedLoad("0", "0", "0.1", 0), 0);
  const std::string text(1280, 'x');  // the request holds a view of it
  PickRequest pr;
  pr.request.model = "m";
  pr.request.prompt = text;
  pr.request.token_ids = prompt;
  PickResult r = core.Pick(pr, 1.0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.ranked[0], 1u);
  core.OnFinished(r.handle, r.ranked[0], 200, 1.0);
  // A prompt nobody reports holding, sent again and again before any event: no
  // speculative entry pulls it back where it went (ties break at random).
  for (uint32_t id = 0; id < 3; ++id) core.OnScrape(id, ScrapedLoad("0", "0", "0.1", 1), 1);
  const auto fresh = Tokens(320, 50000);
  std::set<uint32_t> went;
  const std::string other(1280, 'y');
  for (int i = 0; i < 30; ++i) {
    PickRequest q;
    q.request.model = "m";
    q.request.prompt = other;
    q.request.token_ids = fresh;
    q.dispatch_first = true;
    PickResult p = core.Pick(q, 1.0 + 0.01 * i);
    ASSERT_TRUE(p.ok());
    went.insert(p.ranked[0]);
    core.OnFinished(p.handle, p.ranked[0], 200, 1.0 + 0.01 * i);
  }
  EXPECT_EQ(went.size(), 3u);
}

// The replica a front end asks for token ids: any endpoint that is not down, rotating.
TEST(RoutingCoreAnyUp, SkipsDownEndpointsAndRotates) {
  RoutingCore core;
  EXPECT_EQ(core.AnyUp(0), RoutingCore::kNoEndpoint);
  std::vector<EndpointSpec> eps;
  for (int i = 0; i < 3; ++i) eps.push_back(TestEndpoint("r" + std::to_string(i), 9100 + i));
  CoreOptions o;
  o.health.staleness_s = 1e9;
  ASSERT_TRUE(core.Configure(o, eps, 0).ok());
  for (uint32_t id = 0; id < 3; ++id) core.OnScrape(id, ScrapedLoad("0", "0", "0.1", 0), 0);
  core.OnUpstreamFailure(1, {"connect_refused", true}, 0);
  std::set<uint32_t> seen;
  for (int i = 0; i < 6; ++i) seen.insert(core.AnyUp(0));
  EXPECT_EQ(seen, (std::set<uint32_t>{0, 2}));
  core.OnUpstreamFailure(0, {"connect_refused", true}, 0);
  core.OnUpstreamFailure(2, {"connect_refused", true}, 0);
  EXPECT_EQ(core.AnyUp(0), RoutingCore::kNoEndpoint);
}

}  // namespace
}  // namespace kvroute::routing
