// Prefill/decode disaggregation in the routing core (issue 25, core/routing/pd.h): roles
// from labels, the decider, the prefill pick and its queue term, and what a pick returns in
// a pool with prefill endpoints, in virtual time over a real RoutingCore.
#include "core/routing/pd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/routing/routing_core.h"
#include "support/routing_fixture.h"

namespace kvroute::routing {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

TEST(PdRules, RolesFromTheLlmdLabel) {
  EXPECT_EQ(RoleOf(Labels{}), Role::kUnset);
  EXPECT_EQ(RoleOf(Labels{{"llm-d.ai/role", "prefill"}}), Role::kPrefill);
  EXPECT_EQ(RoleOf(Labels{{"llm-d.ai/role", "decode"}}), Role::kDecode);
  EXPECT_EQ(RoleOf(Labels{{"llm-d.ai/role", "prefill-decode"}}), Role::kBoth);
  EXPECT_EQ(RoleOf(Labels{{"llm-d.ai/role", "both"}}), Role::kBoth);
  EXPECT_EQ(RoleOf(Labels{{"llm-d.ai/role", "Prefill"}}), Role::kUnset);  // exact names only
  EXPECT_FALSE(ParseRole("prefil").ok);
  EXPECT_TRUE(DecodeCapable(Role::kUnset));
  EXPECT_TRUE(DecodeCapable(Role::kBoth));
  EXPECT_FALSE(DecodeCapable(Role::kPrefill));
  EXPECT_FALSE(PrefillCapable(Role::kUnset));
  EXPECT_FALSE(PrefillCapable(Role::kDecode));
  EXPECT_TRUE(PrefillCapable(Role::kBoth));
}

TEST(PdRules, TheDeciderNeedsBothThresholds) {
  const PdOptions o{/*non_cached_tokens=*/100, /*prompt_tokens=*/300};
  EXPECT_EQ(Decide(o, 299, 0), PdDecision::kShortPrompt);
  EXPECT_EQ(Decide(o, 300, 0), PdDecision::kDisaggregate);
  EXPECT_EQ(Decide(o, 300, 200), PdDecision::kDisaggregate);  // 100 uncached: reaches it
  EXPECT_EQ(Decide(o, 300, 201), PdDecision::kCached);
  EXPECT_EQ(Decide(o, 300, 5000), PdDecision::kCached);       // clamped to the prompt
  EXPECT_EQ(Decide(o, 300, -7), PdDecision::kDisaggregate);   // clamped to 0
  EXPECT_EQ(Decide(PdOptions{0, 0}, 0, 0), PdDecision::kShortPrompt);  // nothing to prefill
  EXPECT_EQ(Decide(PdOptions{0, 0}, 1, 1), PdDecision::kDisaggregate);
}

TEST(PdRules, ThePrefillPickTakesTheLeastWorkThenTheShorterQueue) {
  std::vector<PrefillCandidate> c = {
      {7, 1000, 0, 2},     // cold, idle: 1,000
      {3, 200, 900, 0},    // warm but 900 queued: 1,100
      {5, 200, 300, -1},   // warm, 300 queued: 500 (queue unknown)
  };
  EXPECT_EQ(PickPrefill(c), 2);
  c.push_back({4, 400, 100, 3});  // also 500, known queue: shorter than unknown
  EXPECT_EQ(PickPrefill(c), 3);
  c.push_back({1, 500, 0, 3});  // 500, same queue, lower id
  EXPECT_EQ(PickPrefill(c), 4);
  c.push_back({0, std::nan(""), 0, 0});  // unknown work is never attractive
  EXPECT_EQ(PickPrefill(c), 4);
  EXPECT_EQ(PickPrefill({}), -1);
}

constexpr const char* kModel = "meta-llama/Llama-3.1-8B-Instruct";

sched::SchedRequest Req(const std::string& prompt) {
  sched::SchedRequest r;
  r.model = kModel;
  r.prompt = prompt;
  r.max_tokens = 16;
  return r;
}

// a, b: decode; p, q: prefill; c: unlabelled (decode-capable). Ids follow the order.
std::vector<EndpointSpec> PdPool() {
  auto role = [](const char* r) { return Labels{{"llm-d.ai/role", r}}; };
  return {test_support::TestEndpoint("a", 9001, role("decode")),
          test_support::TestEndpoint("b", 9002, role("decode")),
          test_support::TestEndpoint("p", 9003, role("prefill")),
          test_support::TestEndpoint("q", 9004, role("prefill")),
          test_support::TestEndpoint("c", 9005)};
}

class PdCoreTest : public ::testing::Test {
 protected:
  void Configure(std::vector<EndpointSpec> eps, PdOptions pd = {}) {
    CoreOptions o;
    o.scheduling.policy = "kvroute";
    o.health.staleness_s = 100.0;
    o.pd = pd;
    ASSERT_TRUE(core_.Configure(o, std::move(eps), 0.0).ok());
    for (uint32_t id = 0; id < core_.table()->by_id.size(); ++id) {
      core_.OnScrape(id, test_support::ScrapedLoad("1.0", "0.0", "0.10", now_), now_);
    }
  }
  PickResult Pick(const std::string& prompt) {
    PickRequest pr;
    pr.request = Req(prompt);
    pr.dispatch_first = true;
    return core_.Pick(pr, now_);
  }
  std::string Name(uint32_t id) { return core_.table()->Find(id)->spec.name; }
  std::string Metrics() {
    std::string m;
    core_.AppendMetrics(m, now_);
    return m;
  }

  RoutingCore core_;
  double now_ = 1.0;
};

TEST_F(PdCoreTest, WithoutPrefillEndpointsAPickIsOrdinary) {
  Configure({test_support::TestEndpoint("a", 9001), test_support::TestEndpoint("b", 9002)});
  const PickResult r = Pick(std::string(4000, 'x'));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.pd, PdDecision::kOff);
  EXPECT_FALSE(r.disaggregated());
  EXPECT_EQ(r.prefill, RoutingCore::kNoEndpoint);
}

// A long prompt: decode on a decode-capable endpoint, prefill on a prefill one; a short
// one: decode alone. Prefill endpoints are never the decode pick.
TEST_F(PdCoreTest, ALongPromptGetsAPairAndAShortOneDecodesAlone) {
  Configure(PdPool());
  std::set<std::string> decoders, prefillers;
  for (int i = 0; i < 40; ++i) {
    // ~1,000 tokens each (4 characters a token), distinct from the first character on.
    const PickResult r = Pick(std::string(1, static_cast<char>('A' + i % 26)) + std::to_string(i) +
                              std::string(4000, 'x'));
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r.pd, PdDecision::kDisaggregate) << i;
    decoders.insert(r.endpoint(0).spec.name);
    for (std::size_t k = 0; k < r.n_ranked; ++k) EXPECT_NE(r.endpoint(k).spec.name[0], 'p');
    prefillers.insert(r.prefill_endpoint().spec.name);
    EXPECT_DOUBLE_EQ(r.prefill_tokens, 1001.0);  // ceil(4,002..4,003 / 4): uncached everywhere
    core_.OnPrefillDone(r.prefill, r.prefill_tokens);
  }
  EXPECT_EQ(decoders, (std::set<std::string>{"a", "b", "c"}));
  // Each leg answered before the next: no queue anywhere and equal (cold) work, so the
  // lower id every time (the queue term spreads concurrent legs: the next test).
  EXPECT_EQ(prefillers, (std::set<std::string>{"p"}));
  const PickResult s = Pick("short question");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.pd, PdDecision::kShortPrompt);
  EXPECT_EQ(s.prefill, RoutingCore::kNoEndpoint);
  EXPECT_NE(s.endpoint(0).spec.name, "p");
  EXPECT_NE(s.endpoint(0).spec.name, "q");
}

// Embeddings, responses and every other forwarded path (SchedRequest::disaggregable
// false) are served whole by a decode-capable endpoint: the same long prompt that gets a
// pair as a completion gets none, and no decision is counted for it.
TEST_F(PdCoreTest, ARequestThatCannotBeSplitIsNeverDisaggregated) {
  Configure(PdPool());
  const std::string prompt = "Z" + std::string(4000, 'x');  // outlives the pick's views
  PickRequest pr;
  pr.request = Req(prompt);
  pr.request.disaggregable = false;
  pr.dispatch_first = true;
  const PickResult r = core_.Pick(pr, now_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.pd, PdDecision::kOff);
  EXPECT_EQ(r.prefill, RoutingCore::kNoEndpoint);
  EXPECT_NE(r.endpoint(0).spec.name, "p");
  EXPECT_NE(r.endpoint(0).spec.name, "q");
  EXPECT_EQ(Metrics().find("kvroute_pd_decisions_total{decision=\"disaggregate\"} 1"), std::string::npos);
  EXPECT_NE(Metrics().find("kvroute_pd_decisions_total{decision=\"disaggregate\"}"), std::string::npos);
  core_.OnFinished(r.handle, r.ranked[0], 200, now_);
  const PickResult c = Pick("Y" + std::string(4000, 'x'));  // a completion: a pair
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.pd, PdDecision::kDisaggregate);
  core_.OnPrefillDone(c.prefill, c.prefill_tokens);
}

// The queue term: prefill legs not yet answered count against their endpoint, so two
// cold requests in a row go to different prefill endpoints; OnPrefillDone gives it back.
TEST_F(PdCoreTest, UnansweredPrefillLegsSpreadThePrefillPicks) {
  Configure(PdPool());
  const PickResult r1 = Pick("one " + std::string(4000, 'x'));
  const PickResult r2 = Pick("two " + std::string(4000, 'y'));
  ASSERT_TRUE(r1.disaggregated() && r2.disaggregated());
  EXPECT_EQ(Name(r1.prefill), "p");  // equal work: the lower id
  EXPECT_EQ(Name(r2.prefill), "q");  // p has r1's 1,001 tokens queued
  core_.OnPrefillDone(r1.prefill, r1.prefill_tokens);
  const PickResult r3 = Pick("three " + std::string(4000, 'z'));
  ASSERT_TRUE(r3.disaggregated());
  EXPECT_EQ(Name(r3.prefill), "p");
  const std::string m = Metrics();
  EXPECT_NE(m.find("kvroute_pd_prefill_queued_tokens{endpoint=\"p\"} 1002"), std::string::npos) << m;
  EXPECT_NE(m.find("kvroute_pd_prefill_queued_tokens{endpoint=\"q\"} 1001"), std::string::npos);
  EXPECT_NE(m.find("kvroute_pd_decisions_total{decision=\"disaggregate\"} 3"), std::string::npos);
}

// A prompt cached on the decode endpoint (the policy learned it) is not disaggregated.
TEST_F(PdCoreTest, APromptCachedOnTheDecodeEndpointDecodesAlone) {
  Configure(PdPool());
  const std::string prompt = "shared " + std::string(4000, 's');
  const PickResult first = Pick(prompt);
  ASSERT_TRUE(first.disaggregated());
  core_.OnFirstToken(first.handle, now_);
  core_.OnFinished(first.handle, first.ranked[0], 200, now_);
  core_.OnPrefillDone(first.prefill, first.prefill_tokens);
  const PickResult again = Pick(prompt);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.ranked[0], first.ranked[0]);  // prefix affinity
  EXPECT_EQ(again.pd, PdDecision::kCached);
  const std::string m = Metrics();
  EXPECT_NE(m.find("kvroute_pd_decisions_total{decision=\"cached\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("kvroute_pd_pairs_total{prefill=\"p\",decode=\"" + Name(first.ranked[0]) +
                   "\"} 1"),
            std::string::npos);
}

// No ready prefill endpoint: the decode endpoint serves it alone (no_prefill); a failed
// leg moves to another prefill endpoint with PickPrefill, never one already tried.
TEST_F(PdCoreTest, ADownPrefillEndpointIsSkippedAndNoneLeftMeansDecodeAlone) {
  Configure(PdPool());
  const PickResult r = Pick("long " + std::string(4000, 'x'));
  ASSERT_TRUE(r.disaggregated());
  EXPECT_EQ(Name(r.prefill), "p");
  PickResult again = r;
  const uint32_t tried[] = {r.prefill};
  ASSERT_TRUE(core_.PickPrefill(Req("long " + std::string(4000, 'x')), r.ranked[0], tried, again));
  EXPECT_EQ(Name(again.prefill), "q");
  const uint32_t both[] = {r.prefill, again.prefill};
  PickResult none = r;
  EXPECT_FALSE(core_.PickPrefill(Req("long"), r.ranked[0], both, none));
  EXPECT_EQ(none.prefill, RoutingCore::kNoEndpoint);
  // Both prefill endpoints refuse connections: down until their next good scrape.
  for (uint32_t id : {r.prefill, again.prefill}) {
    UpstreamFailure f;
    f.kind = "connect_refused";
    f.connect_failed = true;
    core_.OnUpstreamFailure(id, f, now_);
  }
  now_ += 0.1;
  const PickResult alone = Pick("other " + std::string(4000, 'y'));
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone.pd, PdDecision::kNoPrefill);
  EXPECT_EQ(alone.prefill, RoutingCore::kNoEndpoint);
}

TEST_F(PdCoreTest, TheDecidersThresholdsComeFromTheOptions) {
  Configure(PdPool(), PdOptions{/*non_cached_tokens=*/5000, /*prompt_tokens=*/0});
  EXPECT_EQ(Pick("long " + std::string(4000, 'x')).pd, PdDecision::kCached);
  Configure(PdPool(), PdOptions{/*non_cached_tokens=*/0, /*prompt_tokens=*/2000});
  EXPECT_EQ(Pick("long " + std::string(4000, 'x')).pd, PdDecision::kShortPrompt);
  EXPECT_EQ(Pick("long " + std::string(9000, 'x')).pd, PdDecision::kDisaggregate);
}

// The latency model predicts both legs of a pair: the prefill endpoint's TTFT for what it
// lacks of the prompt, plus the decode endpoint's with the prompt all held (pulled). A
// pair's TTFT spans both legs, so it counts against the objective but is not learned as
// the decode endpoint's; its TPOT is, and the prefill leg's answer time is learned as the
// prefill endpoint's TTFT.
TEST(PdLatency, APairsTtftIsBothLegsAndIsNotLearnedAsTheDecodeEndpoints) {
  RoutingCore core;
  CoreOptions o;
  o.scheduling.policy = "round-robin";  // no prefix model: every prompt token uncached
  o.health.staleness_s = 1e9;
  o.default_slo_ttft_s = 0.2;
  auto role = [](const char* r) { return Labels{{"llm-d.ai/role", r}}; };
  ASSERT_TRUE(core.Configure(o, {test_support::TestEndpoint("a", 9001, role("decode")),
                                 test_support::TestEndpoint("b", 9002, role("decode")),
                                 test_support::TestEndpoint("p", 9003, role("prefill"))},
                             0)
                  .ok());
  for (uint32_t id = 0; id < 3; ++id) core.OnScrape(id, test_support::ScrapedLoad("4", "0", "0.2", 0), 0);
  // True TTFT: a 10 ms step plus the uncached prompt at 40k tokens/s, everywhere.
  auto ttft = [](double uncached) { return 0.010 + uncached / 40000; };
  auto run = [&](double tokens, double now, double first_after) {
    PickRequest pr;
    pr.request = Req(std::string(static_cast<std::size_t>(tokens) * 4, 'x'));
    pr.dispatch_first = true;
    PickResult r = core.Pick(pr, now);
    EXPECT_TRUE(r.ok());
    // A prefill leg answers when its endpoint has computed the prompt.
    if (r.disaggregated()) core.OnPrefillDone(r.prefill, r.prefill_tokens, r.handle, true, now + ttft(tokens));
    const double first = now + first_after;
    core.OnFirstToken(r.handle, first);
    for (int k = 1; k <= 20; ++k) core.OnTokens(r.handle, k, first + 0.015 * (k - 1));
    core.OnFinished(r.handle, r.ranked[0], 200, first + 0.015 * 19);
    return r;
  };
  // Train on prompts below the decider's 256 tokens: decoded alone, learned.
  double now = 0;
  for (int i = 0; i < 200; ++i) {
    now += 1.0;
    const double tokens = 10 + (i * 37) % 240;
    const PickResult r = run(tokens, now, ttft(tokens));
    ASSERT_EQ(r.pd, PdDecision::kShortPrompt);
  }
  const LatencyStats trained = core.latency_stats();
  EXPECT_EQ(trained.ttft_samples, 200u);
  // A 3,000-token prompt: a pair. Prefill on p (its model: the fleet's) for all 3,000
  // tokens, then the decode endpoint with none left to compute.
  now += 1.0;
  const PickResult pair = run(3000, now, /*first_after=*/0.5);  // slow on purpose
  ASSERT_EQ(pair.pd, PdDecision::kDisaggregate);
  EXPECT_EQ(pair.prefill_endpoint().spec.name, "p");
  EXPECT_NEAR(pair.predicted_ttft_s, ttft(3000) + ttft(0), 0.003);
  EXPECT_NEAR(pair.predicted_tpot_s, 0.015, 0.001);  // extrapolated to a longer context
  // Its 0.5 s TTFT was not learned as a's or b's (nor scored); its prefill leg's answer
  // time was, as p's (and scored against the leg's prediction); its TPOT was learned; it
  // missed the 200 ms objective.
  const LatencyStats after = core.latency_stats();
  EXPECT_EQ(after.ttft_samples, trained.ttft_samples + 1);
  EXPECT_EQ(after.ttft_errors.n, trained.ttft_errors.n + 1);
  EXPECT_NEAR(after.ttft_errors.abs_s - trained.ttft_errors.abs_s, 0.0, 0.003);
  EXPECT_EQ(after.tpot_samples, trained.tpot_samples + 1);
  EXPECT_EQ(after.ttft_slo.observed, trained.ttft_slo.observed + 1);
  EXPECT_EQ(after.ttft_slo.violated, trained.ttft_slo.violated + 1);
  // So the next short prompt's prediction is as accurate as before.
  now += 1.0;
  const PickResult next = run(200, now, ttft(200));
  EXPECT_NEAR(next.predicted_ttft_s, ttft(200), 0.002);
}

}  // namespace
}  // namespace kvroute::routing
