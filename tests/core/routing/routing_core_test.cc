// The routing core's contract, exercised without sockets and in virtual time: scrapes are
// fed as the scraper adapter would feed them (the repository's vLLM fixtures and garbage
// variants of them), picks and lifecycle calls as a front end makes them.
#include "core/routing/routing_core.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <atomic>

#include "core/sched/registry.h"
#include "metrics/testdata_util.h"
#include "support/routing_fixture.h"

namespace kvroute::routing {
namespace {

using health::Condition;
using health::Signal;
using health::Treatment;

using metrics::testing::ReplaceOnce;
using metrics::testing::V010Series;

std::string V010(const std::string& running, const std::string& waiting, const std::string& kv) {
  return metrics::testing::V010With(running, waiting, kv);
}
std::string DataParallel(const std::string& kv1) { return metrics::testing::V010DataParallel(kv1); }
std::string OldNames96() { return metrics::testing::V06WithKv("0.96"); }

using test_support::Scraped;
using test_support::TestEndpoint;

std::vector<EndpointSpec> Eps(std::initializer_list<const char*> names) {
  std::vector<EndpointSpec> v;
  int port = 9001;
  for (const char* n : names) v.push_back(TestEndpoint(n, port++));
  return v;
}

CoreOptions Options(health::StalePolicy policy = health::StalePolicy::kExclude,
                    std::string sched_policy = "kvroute") {
  CoreOptions o;
  o.scheduling.policy = std::move(sched_policy);
  o.health.staleness_s = 2.0;
  o.health.stale_policy = policy;
  return o;
}

uint32_t IdOf(const RoutingCore& core, const std::string& name) {
  for (const auto& ep : core.table()->by_id) {
    if (ep && ep->spec.name == name) return ep->id;
  }
  ADD_FAILURE() << "no endpoint " << name;
  return 0;
}

std::string Prompt(int i) {
  std::string p = "fresh request " + std::to_string(i) + ": ";
  while (p.size() < 600) p += static_cast<char>('a' + (i * 13 + p.size()) % 26);
  return p;
}

// Picks, dispatches to the winner and finishes, as a front end does for a request that
// completes before the next one arrives. Returns the winner's name ("" when none).
std::string Serve(RoutingCore& core, const std::string& prompt, double now, int code = 200) {
  PickRequest pr;
  pr.request.model = "meta-llama/Llama-3.1-8B-Instruct";
  pr.request.prompt = prompt;
  pr.request.max_tokens = 64;
  PickResult r = core.Pick(pr, now);
  if (!r.ok()) return "";
  core.OnDispatched(r.handle, r.ranked[0], now);
  core.OnFirstToken(r.handle, now + 0.01);
  core.OnFinished(r.handle, r.ranked[0], code, now + 0.02);
  return r.endpoint(0).spec.name;
}

std::string Metrics(const RoutingCore& core, double now) {
  std::string out;
  core.AppendMetrics(out, now);
  return out;
}

class FixtureFleet : public ::testing::TestWithParam<health::StalePolicy> {};

// The scenario: a busy data-parallel replica, one at 96% KV under the old metric
// names, a calm one at 31% KV with an empty queue, and one whose KV usage is NaN.
TEST_P(FixtureFleet, FreshRequestsGoToTheCalmReplicaNeverToTheNaNOne) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(GetParam()), Eps({"busy-dp", "old-96", "calm", "nan"}), 0.0).ok());
  core.OnScrape(IdOf(core, "busy-dp"), Scraped(DataParallel("0.95"), 0.0), 0.0);
  core.OnScrape(IdOf(core, "old-96"), Scraped(OldNames96(), 0.0), 0.0);
  core.OnScrape(IdOf(core, "calm"), Scraped(V010("3.0", "0.0", "0.31"), 0.0), 0.0);
  core.OnScrape(IdOf(core, "nan"), Scraped(V010("2.0", "3.0", "NaN"), 0.0), 0.0);

  std::map<std::string, int> picks;
  for (int i = 0; i < 40; ++i) ++picks[Serve(core, Prompt(i), 0.1 + i * 0.001)];
  EXPECT_EQ(picks["calm"], 40);
  EXPECT_EQ(picks["nan"], 0);

  health::Verdict v = core.Health(IdOf(core, "nan"), 0.2);
  EXPECT_EQ(v.condition, Condition::kUp);
  EXPECT_FALSE(v.Known(Signal::kKvUsage));
  EXPECT_TRUE(v.Known(Signal::kWaiting));
  EXPECT_EQ(v.treatment, GetParam() == health::StalePolicy::kExclude ? Treatment::kLastResort
                                                                     : Treatment::kSaturated);
  const std::string m = Metrics(core, 0.2);
  EXPECT_NE(m.find("kvroute_endpoint_kv_usage{endpoint=\"nan\"} NaN\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kvroute_endpoint_signal_known{endpoint=\"nan\",signal=\"kv_usage\"} 0.0\n"),
            std::string::npos);
  EXPECT_NE(m.find("kvroute_endpoint_signal_known{endpoint=\"nan\",signal=\"waiting\"} 1.0\n"),
            std::string::npos);
  EXPECT_NE(m.find("kvroute_endpoint_kv_usage{endpoint=\"calm\"} 0.31\n"), std::string::npos);
  // Old names read as well as new ones; the data-parallel replica is the mean of its
  // engines weighted by capacity (one cache_config_info, unlabelled fallback: plain mean).
  EXPECT_NE(m.find("kvroute_endpoint_kv_usage{endpoint=\"old-96\"} 0.96\n"), std::string::npos);
  EXPECT_NE(m.find("kvroute_endpoint_waiting{endpoint=\"busy-dp\"} 252.0\n"), std::string::npos);
  EXPECT_NE(m.find("kvroute_requests_total{endpoint=\"calm\",code=\"200\"} 40.0\n"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(StalePolicies, FixtureFleet,
                         ::testing::Values(health::StalePolicy::kExclude,
                                           health::StalePolicy::kSaturated));

// Every kind of garbage in the calm replica's KV series makes its KV unknown: it then
// loses to a busier replica whose numbers are real, and /metrics says unknown.
TEST(RoutingCore, GarbageKvIsUnknownNotZero) {
  const std::string variants[] = {"NaN", "+Inf", "-Inf", "-0.2", "1.7"};
  for (const std::string& bad : variants) {
    RoutingCore core;
    ASSERT_TRUE(core.Configure(Options(), Eps({"real", "garbage"}), 0.0).ok());
    core.OnScrape(IdOf(core, "real"), Scraped(V010("20.0", "2.0", "0.85"), 0.0), 0.0);
    core.OnScrape(IdOf(core, "garbage"), Scraped(V010("0.0", "0.0", bad), 0.0), 0.0);
    std::map<std::string, int> picks;
    for (int i = 0; i < 10; ++i) ++picks[Serve(core, Prompt(i), 0.1)];
    EXPECT_EQ(picks["real"], 10) << bad;
    EXPECT_FALSE(core.Health(IdOf(core, "garbage"), 0.1).Known(Signal::kKvUsage)) << bad;
    EXPECT_NE(Metrics(core, 0.1).find("kvroute_endpoint_kv_usage{endpoint=\"garbage\"} NaN"),
              std::string::npos)
        << bad;
  }
}

TEST(RoutingCore, NegativeOrMissingQueueIsUnknown) {
  const std::string calm = V010("0.0", "0.0", "0.10");
  const std::string waiting0 = V010Series("num_requests_waiting", "0") + "0.0";
  const std::string negative = ReplaceOnce(calm, waiting0, V010Series("num_requests_waiting", "0") + "-4");
  const std::string missing = ReplaceOnce(calm, waiting0, "");
  const std::string garbage_line = ReplaceOnce(calm, waiting0, V010Series("num_requests_waiting", "0") + "zero");
  for (const std::string& text : {negative, missing, garbage_line}) {
    RoutingCore core;
    ASSERT_TRUE(core.Configure(Options(), Eps({"real", "odd"}), 0.0).ok());
    core.OnScrape(IdOf(core, "real"), Scraped(V010("10.0", "1.0", "0.60"), 0.0), 0.0);
    core.OnScrape(IdOf(core, "odd"), Scraped(text, 0.0), 0.0);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(Serve(core, Prompt(i), 0.1), "real");
    EXPECT_FALSE(core.Health(IdOf(core, "odd"), 0.1).Known(Signal::kWaiting));
  }
}

// One engine's NaN makes the data-parallel endpoint's KV unknown, not the other's value.
TEST(RoutingCore, OneEngineNaNMakesTheAggregateUnknown) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Eps({"dp"}), 0.0).ok());
  core.OnScrape(0, Scraped(DataParallel("NaN"), 0.0), 0.0);
  EXPECT_FALSE(core.Health(0, 0.0).Known(Signal::kKvUsage));
  EXPECT_TRUE(core.Health(0, 0.0).Known(Signal::kRunning));
  core.OnScrape(0, Scraped(DataParallel("0.5"), 0.05), 0.05);
  EXPECT_TRUE(core.Health(0, 0.06).Known(Signal::kKvUsage));
}

// With nothing else available, an endpoint with unknown signals is still used (exclude),
// rather than refusing traffic the fleet can probably serve.
TEST(RoutingCore, UnknownEndpointIsTheLastResort) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Eps({"only"}), 0.0).ok());
  core.OnScrape(0, Scraped(V010("1.0", "0.0", "NaN"), 0.0), 0.0);
  EXPECT_EQ(Serve(core, Prompt(1), 0.1), "only");
}

// Staleness in virtual time: an endpoint whose last scrape is older than pool.staleness
// stops receiving picks (exclude) the moment it turns stale, and again once scraped.
TEST(RoutingCore, StaleEndpointExcludedInVirtualTime) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Eps({"a", "b"}), 0.0).ok());
  const std::string idle = V010("0.0", "0.0", "0.05");
  const std::string busier = V010("30.0", "12.0", "0.90");
  core.OnScrape(0, Scraped(idle, 0.0), 0.0);    // a: the better one
  core.OnScrape(1, Scraped(busier, 0.0), 0.0);
  EXPECT_EQ(Serve(core, Prompt(1), 1.0), "a");
  core.OnScrape(1, Scraped(busier, 1.5), 1.5);  // b keeps being scraped, a does not
  EXPECT_EQ(Serve(core, Prompt(2), 2.0), "a");  // a's scrape is exactly 2 s old: fresh
  EXPECT_EQ(Serve(core, Prompt(3), 2.01), "b");  // now stale
  EXPECT_EQ(core.Health(0, 2.01).condition, Condition::kStale);
  core.OnScrape(0, Scraped(idle, 2.1), 2.1);
  EXPECT_EQ(Serve(core, Prompt(4), 2.2), "a");
}

// stale_policy saturated: a stale endpoint stays a candidate but counts as full, so it
// only wins when the others are worse than full.
TEST(RoutingCore, StalePolicySaturatedCountsStaleAsFull) {
  RoutingCore core;
  CoreOptions o = Options(health::StalePolicy::kSaturated, "least-request");
  o.scheduling.policy.clear();
  o.scheduling = sched::SeedArticleSpec();  // prefix 3, kv 2, queue 1: reads kv and queue
  ASSERT_TRUE(core.Configure(o, Eps({"stale", "fresh"}), 0.0).ok());
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.05"), 0.0), 0.0);
  core.OnScrape(1, Scraped(V010("30.0", "20.0", "0.90"), 0.0), 0.0);
  EXPECT_EQ(Serve(core, Prompt(1), 1.0), "stale");  // fresh still, and idle
  core.OnScrape(1, Scraped(V010("30.0", "20.0", "0.90"), 3.0), 3.0);
  EXPECT_EQ(core.Health(0, 3.0).treatment, Treatment::kSaturated);
  std::map<std::string, int> picks;
  for (int i = 0; i < 10; ++i) ++picks[Serve(core, Prompt(10 + i), 3.0)];
  EXPECT_EQ(picks["fresh"], 10);  // 90% KV and 20 waiting beat "full and 1000 waiting"
  // Under exclude the same stale endpoint is not a candidate at all; under saturated it
  // is, which shows when the fresh one goes down.
  core.OnUpstreamFailure(1, {"connect_refused", true}, 3.1);
  EXPECT_EQ(Serve(core, Prompt(30), 3.2), "stale");
}

TEST(RoutingCore, ConnectFailureMarksDownUntilTheNextGoodScrape) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Eps({"a", "b"}), 0.0).ok());
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.05"), 0.0), 0.0);
  core.OnScrape(1, Scraped(V010("9.0", "0.0", "0.50"), 0.0), 0.0);
  EXPECT_EQ(Serve(core, Prompt(1), 0.1), "a");
  core.OnUpstreamFailure(0, {"connect_refused", true}, 0.2);
  EXPECT_EQ(core.Health(0, 0.2).condition, Condition::kDown);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Serve(core, Prompt(2 + i), 0.3), "b");
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.05"), 0.4), 0.4);
  EXPECT_EQ(Serve(core, Prompt(9), 0.5), "a");
  EXPECT_NE(Metrics(core, 0.5).find(
                "kvroute_upstream_errors_total{endpoint=\"a\",kind=\"connect_refused\"} 1.0"),
            std::string::npos);
  // Every endpoint down: no pick, a clear reason.
  core.OnUpstreamFailure(0, {"connect_refused", true}, 0.6);
  core.OnUpstreamFailure(1, {"connect_refused", true}, 0.6);
  PickRequest pr;
  pr.request.prompt = "x";
  PickResult r = core.Pick(pr, 0.7);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status.message(), "no healthy endpoint is available");
}

// A shared prefix of `group`: 2,048 characters, then a distinct question.
std::string GroupPrompt(int group, int i) {
  std::string p = "system prompt of group " + std::to_string(group) + ". ";
  while (p.size() < 2048) p += static_cast<char>('a' + (group * 5 + p.size()) % 26);
  return p + " question " + std::to_string(i);
}

sched::SchedulingSpec KvrouteWithWeights(double prefix, double kv, double load) {
  sched::SchedulingSpec s = *sched::PolicyAsSpec("kvroute");
  for (auto& ref : s.profiles[0].plugins) {
    if (ref.plugin_ref == "prefix-cache-scorer") ref.weight = prefix;
    if (ref.plugin_ref == "kv-cache-utilization-scorer") ref.weight = kv;
    if (ref.plugin_ref == "soft-load-scorer") ref.weight = load;
  }
  return s;
}

// Reload keeps state: four same-prefix groups keep their replicas across a configuration
// that changes the weights; requests in flight across it finish on the new scheduler.
TEST(RoutingCore, ReloadWithNewWeightsKeepsAffinityAndInflight) {
  RoutingCore core;
  CoreOptions o = Options();
  o.scheduling = KvrouteWithWeights(3, 2, 4);
  auto eps = Eps({"r0", "r1", "r2", "r3"});
  ASSERT_TRUE(core.Configure(o, eps, 0.0).ok());
  for (uint32_t id = 0; id < 4; ++id) core.OnScrape(id, Scraped(V010("0.0", "0.0", "0.10"), 0.0), 0.0);
  // The first request of each group stays in flight while the next group arrives, so the
  // load scorer spreads the groups over the four replicas.
  std::map<int, std::string> home;
  std::vector<PickResult> warm;
  std::vector<std::string> warm_prompts;
  for (int g = 0; g < 4; ++g) warm_prompts.push_back(GroupPrompt(g, 0));
  for (int g = 0; g < 4; ++g) {
    PickRequest wr;
    wr.request.prompt = warm_prompts[g];
    wr.request.model = "meta-llama/Llama-3.1-8B-Instruct";
    warm.push_back(core.Pick(wr, 0.1));
    ASSERT_TRUE(warm.back().ok());
    core.OnDispatched(warm.back().handle, warm.back().ranked[0], 0.1);
    home[g] = warm.back().endpoint(0).spec.name;
  }
  for (PickResult& w : warm) core.OnFinished(w.handle, w.ranked[0], 200, 0.15);
  for (int g = 0; g < 4; ++g) EXPECT_EQ(Serve(core, GroupPrompt(g, 1), 0.2), home[g]);
  std::set<std::string> distinct;
  for (auto& [g, n] : home) distinct.insert(n);
  EXPECT_EQ(distinct.size(), 4u);  // the load scorer spreads the four groups

  // One request in flight across the reload.
  PickRequest pr;
  const std::string prompt99 = GroupPrompt(0, 99);
  pr.request.prompt = prompt99;
  pr.request.model = "meta-llama/Llama-3.1-8B-Instruct";
  PickResult inflight = core.Pick(pr, 0.3);
  ASSERT_TRUE(inflight.ok());
  core.OnDispatched(inflight.handle, inflight.ranked[0], 0.3);

  o.scheduling = KvrouteWithWeights(5, 1, 2);  // new weights
  ASSERT_TRUE(core.Configure(o, eps, 0.4).ok());
  EXPECT_EQ(core.reloads(), 1u);
  for (int g = 0; g < 4; ++g) EXPECT_EQ(Serve(core, GroupPrompt(g, 2), 0.5), home[g]) << g;
  // The in-flight request's accounting moved with it and is released by the new scheduler.
  const std::string name = inflight.endpoint(0).spec.name;
  EXPECT_NE(Metrics(core, 0.5).find("kvroute_endpoint_inflight{endpoint=\"" + name + "\"} 1.0"),
            std::string::npos);
  core.OnFinished(inflight.handle, inflight.ranked[0], 200, 0.6);
  EXPECT_NE(Metrics(core, 0.6).find("kvroute_endpoint_inflight{endpoint=\"" + name + "\"} 0.0"),
            std::string::npos);
  // Scraped state survived too: no endpoint is back to "never scraped".
  for (uint32_t id = 0; id < 4; ++id) EXPECT_EQ(core.Health(id, 0.6).condition, Condition::kUp);
}

// Removed endpoints are dropped (prefix entries gone, not picked); a survivor keeps its id.
TEST(RoutingCore, ReloadDropsRemovedEndpoints) {
  RoutingCore core;
  auto eps = Eps({"r0", "r1"});
  ASSERT_TRUE(core.Configure(Options(), eps, 0.0).ok());
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.10"), 0.0), 0.0);
  core.OnScrape(1, Scraped(V010("0.0", "0.0", "0.10"), 0.0), 0.0);
  const std::string r1 = eps[1].address;
  std::string first = Serve(core, GroupPrompt(7, 0), 0.1);
  std::vector<EndpointSpec> only_r1 = {eps[1]};
  ASSERT_TRUE(core.Configure(Options(), only_r1, 0.2).ok());
  EXPECT_EQ(core.table()->Find(0), nullptr);
  ASSERT_NE(core.table()->Find(1), nullptr);
  EXPECT_EQ(core.table()->Find(1)->spec.address, r1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Serve(core, GroupPrompt(7, i + 1), 0.3), "r1");
  // A new endpoint takes the vacant id (nothing in flight there) with a clean slate.
  std::vector<EndpointSpec> again = {eps[1], TestEndpoint("r9", 9009)};
  ASSERT_TRUE(core.Configure(Options(), again, 0.4).ok());
  ASSERT_NE(core.table()->Find(0), nullptr);
  EXPECT_EQ(core.table()->Find(0)->spec.name, "r9");
  EXPECT_EQ(core.Health(0, 0.4).condition, Condition::kNeverScraped);
  EXPECT_NE(Metrics(core, 0.4).find("kvroute_prefix_index_entries{endpoint=\"r9\"} 0.0"),
            std::string::npos);
}

TEST(RoutingCore, ConfigureRejectsBadInputAndKeepsTheRunningOne) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Eps({"a"}), 0.0).ok());
  CoreOptions bad = Options();
  bad.scheduling.policy = "no-such-policy";
  Status st = core.Configure(bad, Eps({"a", "b"}), 0.1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  auto dup = Eps({"a"});
  dup.push_back(dup[0]);
  dup[1].name = "copy";
  st = core.Configure(Options(), dup, 0.1);
  EXPECT_EQ(st.message(), "pool.endpoints[1]: address 127.0.0.1:9001 is listed twice");
  EXPECT_EQ(core.table()->by_id.size(), 1u);
  EXPECT_EQ(core.policy(), "kvroute");
}

TEST(RoutingCore, HintedEndpointsComeFirstUnlessDown) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Eps({"a", "b", "c"}), 0.0).ok());
  for (uint32_t id = 0; id < 3; ++id) core.OnScrape(id, Scraped(V010("0.0", "0.0", "0.1"), 0.0), 0.0);
  PickRequest pr;
  pr.request.prompt = "hello";
  pr.hint = " c , 127.0.0.1:9002,unknown";
  PickResult r = core.Pick(pr, 0.1);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.n_ranked, 3u);
  EXPECT_EQ(r.endpoint(0).spec.name, "c");
  EXPECT_EQ(r.endpoint(1).spec.name, "b");
  EXPECT_EQ(r.endpoint(2).spec.name, "a");
  core.OnFinished(r.handle, RoutingCore::kNoEndpoint, 499, 0.1);
  core.OnUpstreamFailure(2, {"connect_refused", true}, 0.2);
  r = core.Pick(pr, 0.3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.endpoint(0).spec.name, "b");
  core.OnFinished(r.handle, 1, 200, 0.3);
}

TEST(RoutingCore, DispatchFirstRecordsTheDispatchWithThePick) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Eps({"a"}), 0.0).ok());
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.1"), 0.0), 0.0);
  PickRequest pr;
  const std::string prompt = GroupPrompt(1, 1);
  pr.request.prompt = prompt;
  pr.dispatch_first = true;
  PickResult r = core.Pick(pr, 0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.dispatched);
  EXPECT_NE(Metrics(core, 0.1).find("kvroute_endpoint_inflight{endpoint=\"a\"} 1.0"), std::string::npos);
  EXPECT_NE(Metrics(core, 0.1).find("kvroute_prefix_index_entries{endpoint=\"a\"} 32.0"), std::string::npos);
  core.OnFinished(r.handle, 0, 200, 0.2);
  EXPECT_NE(Metrics(core, 0.2).find("kvroute_endpoint_inflight{endpoint=\"a\"} 0.0"), std::string::npos);
  pr.dispatch_first = false;
  r = core.Pick(pr, 0.3);
  EXPECT_FALSE(r.dispatched);
  EXPECT_NE(Metrics(core, 0.3).find("kvroute_endpoint_inflight{endpoint=\"a\"} 0.0"), std::string::npos);
  core.OnFinished(r.handle, 0, 200, 0.3);
}

TEST(RoutingCore, ReadyOnlyWithFreshMetrics) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Eps({"a"}), 0.0).ok());
  EXPECT_FALSE(core.Ready(0.0));
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.1"), 0.0), 0.0);
  EXPECT_TRUE(core.Ready(1.0));
  EXPECT_FALSE(core.Ready(2.5));
}

TEST(RoutingCore, LogsEachHealthTransitionOnce) {
  std::vector<std::string> lines;
  RoutingCore core([&](std::string_view l) { lines.emplace_back(l); });
  ASSERT_TRUE(core.Configure(Options(), Eps({"a", "b"}), 0.0).ok());
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.1"), 0.0), 0.0);
  core.OnScrape(1, Scraped(V010("0.0", "0.0", "0.1"), 0.0), 0.0);
  Serve(core, Prompt(0), 0.01);
  lines.clear();
  for (int i = 0; i < 5; ++i) {
    core.OnScrape(1, Scraped(V010("0.0", "0.0", "NaN"), 0.05 * (i + 1)), 0.05 * (i + 1));
    core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.1"), 0.05 * (i + 1)), 0.05 * (i + 1));
    Serve(core, Prompt(i + 1), 0.05 * (i + 1) + 0.01);
  }
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "endpoint b: up, kv_usage unknown (missing, NaN, Inf or out of range), "
                      "treated as last_resort");
  core.OnScrape(1, Scraped(V010("0.0", "0.0", "0.2"), 0.4), 0.4);
  Serve(core, Prompt(9), 0.41);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], "endpoint b: up, kv_usage known, treated as normal");
}

TEST(RoutingCore, PickTimerFeedsTheSchedulingHistogram) {
  RoutingCore core;
  double t = 0;
  core.set_pick_timer([&] { return t += 3e-6; });  // every read of the clock moves it 3 us
  ASSERT_TRUE(core.Configure(Options(), Eps({"a"}), 0.0).ok());
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.1"), 0.0), 0.0);
  for (int i = 0; i < 4; ++i) Serve(core, Prompt(i), 0.1);
  const std::string m = Metrics(core, 0.1);
  // The same timer times each plugin call inside the pick: one read before the first call,
  // one after each call and one before the picker (after the weighted sum), so a pick of a
  // profile with P plugins reads it P + 2 times inside and spans P + 3 steps.
  std::size_t plugins = 0;
  for (std::size_t at = 0; (at = m.find("\nllm_d_epp_plugin_duration_seconds_count{", at)) != std::string::npos; ++at) {
    ++plugins;
  }
  ASSERT_GT(plugins, 0u) << m;
  const std::string sum = "kvroute_scheduling_duration_seconds_sum ";
  const std::size_t at = m.find(sum);
  ASSERT_NE(at, std::string::npos) << m;
  EXPECT_NEAR(std::stod(m.substr(at + sum.size())), 4 * 3e-6 * static_cast<double>(plugins + 3), 1e-12);
  EXPECT_NE(m.find("kvroute_scheduling_duration_seconds_count 4.0"), std::string::npos) << m;
  EXPECT_NE(m.find("kvroute_scheduling_duration_seconds_bucket{le=\"2.5e-06\"} 0.0"), std::string::npos);
}

// Picks from two threads while a third feeds scrapes, a fourth renders /metrics and a
// fifth reloads with alternating weights: every request is counted once, every handle is
// released (nothing left in flight), and no pick fails. make test-asan and make test-tsan
// run it under AddressSanitizer and ThreadSanitizer.
// CoreOptions::seed reaches the tie-breaks of concurrent picks (the random policy ranks
// under the shared lock, in the core's own scratch): the same seed gives the same picks,
// each seed its own, and a single-threaded core draws what the scheduler's own Pick
// draws with that seed.
std::vector<uint32_t> RandomPicks(uint64_t seed, bool through_core) {
  std::vector<uint32_t> out;
  const std::vector<EndpointSpec> eps = Eps({"a", "b", "c", "d", "e", "f", "g", "h"});
  if (!through_core) {
    sched::SchedulerOptions so;
    so.seed = seed;
    so.max_ranked = kMaxRanked;  // as the core ranks
    auto s = sched::BuildPolicy("random", so).scheduler;
    std::vector<sched::EndpointState> states(eps.size());
    for (uint32_t i = 0; i < states.size(); ++i) states[i].id = i;
    for (int i = 0; i < 40; ++i) {
      sched::SchedRequest req;
      req.prompt = "p";
      sched::PickResult r = s->Pick(req, states, 1.0);
      out.push_back(r.ranked[0]);
      s->OnFinished(r.handle, 1.0);
    }
    return out;
  }
  RoutingCore core;
  CoreOptions o = Options(health::StalePolicy::kExclude, "random");
  o.seed = seed;
  EXPECT_TRUE(core.Configure(o, eps, 0.0).ok());
  for (uint32_t id = 0; id < eps.size(); ++id) core.OnScrape(id, Scraped(V010("0", "0", "0.1"), 0.0), 0.0);
  for (int i = 0; i < 40; ++i) {
    PickRequest pr;
    pr.request.prompt = "p";
    PickResult r = core.Pick(pr, 1.0);
    out.push_back(r.ranked[0]);
    core.OnFinished(r.handle, r.ranked[0], 200, 1.0);
  }
  return out;
}

TEST(RoutingCore, SeedReachesConcurrentPicks) {
  EXPECT_EQ(RandomPicks(7, true), RandomPicks(7, true));
  EXPECT_NE(RandomPicks(7, true), RandomPicks(8, true));
  EXPECT_EQ(RandomPicks(7, true), RandomPicks(7, false));
  EXPECT_EQ(RandomPicks(8, true), RandomPicks(8, false));
}

TEST(RoutingCore, ConcurrentPicksScrapesRenderingAndReloads) {
  RoutingCore core;
  CoreOptions o = Options();
  o.scheduling = KvrouteWithWeights(3, 2, 4);
  auto eps = Eps({"r0", "r1", "r2", "r3"});
  ASSERT_TRUE(core.Configure(o, eps, 0.0).ok());
  const std::string calm = V010("2.0", "0.0", "0.2");
  metrics::EngineMetrics m;
  metrics::ExtractEngineMetrics(calm, metrics::MetricNames::For(metrics::EngineType::kVllm), "", m);
  for (uint32_t id = 0; id < 4; ++id) core.OnScrape(id, Scraped(calm, 0.0), 0.0);
  constexpr int kPerThread = 2000;
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0};
  auto picker = [&](int t) {
    for (int i = 0; i < kPerThread; ++i) {
      std::string name = Serve(core, GroupPrompt((i + t) % 8, i), 1.0);
      if (name.empty()) ++failed;
    }
  };
  std::thread scraper([&] {
    for (int i = 0; !stop; ++i) {
      ScrapeResult r;
      r.ok = true;
      r.sent_at_s = 1.0;
      r.metrics = m;
      core.OnScrape(i % 4, r, 1.0);
    }
  });
  std::thread renderer([&] {
    std::string out;
    while (!stop) {
      out.clear();
      core.AppendMetrics(out, 1.0);
    }
  });
  std::thread reloader([&] {
    for (int i = 0; i < 20 && !stop; ++i) {
      CoreOptions r = o;
      r.scheduling = i % 2 ? KvrouteWithWeights(3, 2, 4) : KvrouteWithWeights(5, 1, 2);
      EXPECT_TRUE(core.Configure(r, eps, 1.0).ok());
      std::this_thread::yield();
    }
  });
  std::thread a(picker, 0), b(picker, 1);
  a.join();
  b.join();
  stop = true;
  scraper.join();
  renderer.join();
  reloader.join();
  EXPECT_EQ(failed.load(), 0);
  const std::string text = Metrics(core, 1.0);
  double total = 0, inflight = 0;
  for (const char* n : {"r0", "r1", "r2", "r3"}) {
    const std::string key = std::string("kvroute_requests_total{endpoint=\"") + n + "\",code=\"200\"} ";
    std::size_t at = text.find(key);
    if (at != std::string::npos) total += std::stod(text.substr(at + key.size()));
    const std::string ik = std::string("kvroute_endpoint_inflight{endpoint=\"") + n + "\"} ";
    at = text.find(ik);
    ASSERT_NE(at, std::string::npos);
    inflight += std::stod(text.substr(at + ik.size()));
  }
  EXPECT_EQ(total, 2.0 * kPerThread);
  EXPECT_EQ(inflight, 0.0);
}

}  // namespace
}  // namespace kvroute::routing

namespace kvroute::routing {
namespace {

// A replica answering 503 at once looks idle to every scrape; its failures eject it.
TEST(RoutingCore, ConsecutiveFailuresEjectAnEndpointThatScrapesCallIdle) {
  std::vector<std::string> logs;
  RoutingCore core([&](std::string_view l) { logs.emplace_back(l); });
  CoreOptions o = Options();
  o.outlier.consecutive_failures = 3;
  o.outlier.base_ejection_s = 5.0;
  ASSERT_TRUE(core.Configure(o, Eps({"sick", "busy"}), 0.0).ok());
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.0"), 0.0), 0.0);
  core.OnScrape(1, Scraped(V010("20.0", "5.0", "0.70"), 0.0), 0.0);
  EXPECT_EQ(Serve(core, Prompt(0), 0.1, 503), "sick");
  // Two failures, then a success: the count starts over.
  core.OnUpstreamFailure(0, {"http_503", false}, 0.1);
  core.OnUpstreamFailure(0, {"http_503", false}, 0.2);
  core.OnAttemptSucceeded(0);
  core.OnUpstreamFailure(0, {"http_503", false}, 0.3);
  core.OnUpstreamFailure(0, {"http_503", false}, 0.4);
  EXPECT_FALSE(core.Health(0, 0.4).ejected);
  EXPECT_EQ(Serve(core, Prompt(1), 0.4), "sick");
  core.OnUpstreamFailure(0, {"http_503", false}, 0.5);  // third in a row
  health::Verdict v = core.Health(0, 0.5);
  EXPECT_TRUE(v.ejected);
  EXPECT_EQ(v.treatment, Treatment::kDown);
  EXPECT_EQ(v.condition, Condition::kUp);  // its scrapes are fine: only its answers are not
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Serve(core, Prompt(2 + i), 1.0 + i * 0.5), "busy");
  std::string m = Metrics(core, 1.0);
  EXPECT_NE(m.find("kvroute_endpoint_ejected{endpoint=\"sick\"} 1.0"), std::string::npos);
  EXPECT_NE(m.find("kvroute_endpoint_ejections_total{endpoint=\"sick\"} 1.0"), std::string::npos);
  EXPECT_NE(m.find("kvroute_upstream_errors_total{endpoint=\"sick\",kind=\"http_503\"} 5.0"),
            std::string::npos);
  ASSERT_FALSE(logs.empty());
  bool logged = false;
  for (const auto& l : logs) {
    logged = logged || l == "endpoint sick: ejected for 5 s after 3 consecutive failures "
                            "(last http_503), ejection #1";
  }
  EXPECT_TRUE(logged);
  // The ejection ends at 5.5 s (scrapes kept it fresh): picked again.
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.0"), 5.4), 5.4);
  core.OnScrape(1, Scraped(V010("20.0", "5.0", "0.70"), 5.4), 5.4);
  EXPECT_EQ(Serve(core, Prompt(20), 5.49), "busy");
  EXPECT_EQ(Serve(core, Prompt(21), 5.5), "sick");
  EXPECT_FALSE(core.Health(0, 5.5).ejected);
  // Failing again right away: ejected for twice as long.
  for (int i = 0; i < 3; ++i) core.OnUpstreamFailure(0, {"http_503", false}, 5.6);
  EXPECT_TRUE(core.Health(0, 15.5).ejected);
  EXPECT_FALSE(core.Health(0, 15.6).ejected);
}

TEST(RoutingCore, PanicThresholdKeepsTheLastEndpointAndCountsTheSkip) {
  RoutingCore core;
  CoreOptions o = Options(health::StalePolicy::kExclude, "round-robin");
  o.outlier.consecutive_failures = 2;
  ASSERT_TRUE(core.Configure(o, Eps({"a", "b"}), 0.0).ok());
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.0"), 0.0), 0.0);
  core.OnScrape(1, Scraped(V010("0.0", "0.0", "0.0"), 0.0), 0.0);
  for (int i = 0; i < 2; ++i) core.OnUpstreamFailure(0, {"reset", false}, 0.1);
  EXPECT_TRUE(core.Health(0, 0.1).ejected);
  for (int i = 0; i < 2; ++i) core.OnUpstreamFailure(1, {"reset", false}, 0.2);
  EXPECT_FALSE(core.Health(1, 0.2).ejected);  // 1 of 2 is the most that may be out
  EXPECT_NE(Metrics(core, 0.2).find("kvroute_ejections_skipped_total 1.0"), std::string::npos);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Serve(core, Prompt(i), 0.3), "b");
}

TEST(RoutingCore, EjectedEndpointsServeWhenNothingElseCan) {
  RoutingCore core;
  CoreOptions o = Options();
  o.outlier.consecutive_failures = 1;
  ASSERT_TRUE(core.Configure(o, Eps({"flaky", "gone"}), 0.0).ok());
  core.OnScrape(0, Scraped(V010("0.0", "0.0", "0.0"), 0.0), 0.0);
  core.OnScrape(1, Scraped(V010("0.0", "0.0", "0.0"), 0.0), 0.0);
  core.OnUpstreamFailure(0, {"first_byte_timeout", false}, 0.1);
  ASSERT_TRUE(core.Health(0, 0.1).ejected);
  // The other one then refuses connections: better the ejected one than nothing.
  core.OnUpstreamFailure(1, {"connect_refused", true}, 0.2);
  EXPECT_EQ(Serve(core, Prompt(1), 0.3), "flaky");
}

// A restarted vLLM starts its counters at zero and its prefix cache empty: the router's
// prefix model must forget what it assumed cached there.
TEST(RoutingCore, CountersGoingDownDropThePrefixIndexEntries) {
  std::vector<std::string> logs;
  RoutingCore core([&](std::string_view l) { logs.emplace_back(l); });
  ASSERT_TRUE(core.Configure(Options(), Eps({"a", "b"}), 0.0).ok());
  // The fixture's query counter (8.26e7 in engine 0) replaced by `queries`.
  auto text = [](const std::string& queries) {
    const std::string line = V010Series("prefix_cache_queries_total", "0");
    return ReplaceOnce(V010("0.0", "0.0", "0.10"), line + "8.2634112e+07", line + queries);
  };
  core.OnScrape(0, Scraped(text("5000.0"), 0.0), 0.0);
  core.OnScrape(1, Scraped(text("5000.0"), 0.0), 0.0);
  for (int i = 0; i < 6; ++i) Serve(core, GroupPrompt(1, i), 0.1);
  auto entries = [&](const std::string& name) {
    std::string m = Metrics(core, 0.2);
    std::string key = "kvroute_prefix_index_entries{endpoint=\"" + name + "\"} ";
    auto p = m.find(key);
    return p == std::string::npos ? -1.0 : std::stod(m.substr(p + key.size()));
  };
  double before = entries("a") + entries("b");
  ASSERT_GT(before, 0.0);
  const std::string warm = entries("a") > 0 ? "a" : "b";
  const uint32_t warm_id = IdOf(core, warm);
  core.OnScrape(warm_id, Scraped(text("6000.0"), 0.3), 0.3);  // counters rose: nothing
  Serve(core, GroupPrompt(1, 50), 0.35);
  EXPECT_GT(entries(warm), 0.0);
  core.OnScrape(warm_id, Scraped(text("12.0"), 0.4), 0.4);   // went down: restarted
  {
    // The next pick folds the scrape in (not dispatched: it records no prefix).
    const std::string prompt = Prompt(99);  // the request holds a view of it
    PickRequest pr;
    pr.request.prompt = prompt;
    PickResult r = core.Pick(pr, 0.45);
    ASSERT_TRUE(r.ok());
    core.OnFinished(r.handle, RoutingCore::kNoEndpoint, 499, 0.45);
  }
  EXPECT_EQ(entries(warm), 0.0);
  EXPECT_NE(Metrics(core, 0.5).find("kvroute_endpoint_restarts_total{endpoint=\"" + warm + "\"} 1.0"),
            std::string::npos);
  bool logged = false;
  for (const auto& l : logs) logged = logged || l.find("endpoint " + warm + " restarted") == 0;
  EXPECT_TRUE(logged);
}

}  // namespace
}  // namespace kvroute::routing
