// The routing core's side of locality (issue 10): the router's region and round trips
// reach the scheduler, endpoints' regions come from their labels, the pick reports its
// decision, measured round trips survive reloads, and /metrics counts it all. Virtual
// time, no sockets.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include "core/routing/routing_core.h"
#include "support/routing_fixture.h"

namespace kvroute::routing {
namespace {

using sched::Locality;

// Two running requests, `waiting` queued, KV usage `kv`.
ScrapeResult Scraped(const std::string& waiting, const std::string& kv, double at) {
  return test_support::ScrapedLoad("2.0", waiting, kv, at);
}

using test_support::TestEndpoint;

// Two replicas in us-east (one by the plain label, one by the Kubernetes topology label),
// two in eu-west, one without a region (local).
std::vector<EndpointSpec> Fleet() {
  return {TestEndpoint("east-a", 9001, {{"region", "us-east"}}),
          TestEndpoint("east-b", 9002, {{"topology.kubernetes.io/region", "us-east"}}),
          TestEndpoint("west-a", 9003, {{"region", "eu-west"}}),
          TestEndpoint("west-b", 9004,
                       {{"topology.kubernetes.io/region", "eu-west"}, {"zone", "eu-west-1a"}}),
          TestEndpoint("plain", 9005, {})};
}

CoreOptions Options(std::string region, std::vector<std::pair<std::string, double>> rtt = {}) {
  CoreOptions o;
  o.scheduling.policy = "kvroute";
  o.health.staleness_s = 2.0;
  o.region = std::move(region);
  o.region_rtt_s = std::move(rtt);
  return o;
}

uint32_t IdOf(const RoutingCore& core, const std::string& name) {
  for (const auto& ep : core.table()->by_id) {
    if (ep && ep->spec.name == name) return ep->id;
  }
  ADD_FAILURE() << "no endpoint " << name;
  return 0;
}

bool IsWest(const std::string& name) { return name.rfind("west", 0) == 0; }

// Every endpoint scraped at `at`: the local ones (east-*, plain) with `local_waiting`
// queued, the remote ones calm.
void ScrapeAll(RoutingCore& core, const std::string& local_waiting, double at) {
  for (const auto& ep : core.table()->by_id) {
    if (!ep) continue;
    const bool remote = IsWest(ep->spec.name);
    core.OnScrape(ep->id, remote ? Scraped("0.0", "0.2", at) : Scraped(local_waiting, "0.3", at), at);
  }
}

std::string Prompt(int i) {
  std::string p = "conversation " + std::to_string(i) + ": ";
  while (p.size() < 400) p += static_cast<char>('a' + (i * 7 + p.size()) % 26);
  return p;
}

struct Served {
  std::string name;
  Locality locality = Locality::kOff;
};

Served Serve(RoutingCore& core, int i, double now) {
  const std::string prompt = Prompt(i);  // the request holds a view of it
  PickRequest pr;
  pr.request.model = "m";
  pr.request.prompt = prompt;
  pr.request.max_tokens = 16;
  PickResult r = core.Pick(pr, now);
  if (!r.ok()) return {};
  Served s{r.endpoint(0).spec.name, r.locality};
  core.OnDispatched(r.handle, r.ranked[0], now);
  core.OnFinished(r.handle, r.ranked[0], 200, now + 0.001);
  return s;
}

std::string Metrics(const RoutingCore& core, double now) {
  std::string out;
  core.AppendMetrics(out, now);
  return out;
}

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(RoutingLocality, PicksStayLocalBelowSaturationWhateverTheRemoteLoad) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options("us-east", {{"eu-west", 0.08}}), Fleet(), 0.0).ok());
  ScrapeAll(core, "1.0", 0.0);
  int local = 0;
  for (int i = 0; i < 30; ++i) {
    Served s = Serve(core, i, 0.01 + i * 0.001);
    ASSERT_FALSE(s.name.empty());
    EXPECT_FALSE(IsWest(s.name)) << s.name;
    EXPECT_EQ(s.locality, Locality::kLocal);
    local += !IsWest(s.name);
  }
  EXPECT_EQ(local, 30);
  const std::string m = Metrics(core, 0.1);
  EXPECT_TRUE(Has(m, "kvroute_locality_picks_total{decision=\"local\"} 30.0")) << m;
  EXPECT_TRUE(Has(m, "kvroute_locality_picks_total{decision=\"spill_saturated\"} 0.0"));
  EXPECT_TRUE(Has(m, "kvroute_locality_spill_ratio 0.0"));
  EXPECT_TRUE(Has(m, "kvroute_locality_requests_total{region=\"eu-west\"} 0.0"));
  EXPECT_TRUE(Has(m, "kvroute_locality_rtt_seconds{region=\"eu-west\",source=\"configured\"} 0.08"));
}

// The plain label and topology.kubernetes.io/region both make a region: with every
// local endpoint saturated the pick spills to eu-west (both of its replicas labelled one
// way or the other), and requests are counted by the region that answered.
TEST(RoutingLocality, RegionsFromLabelsAndSpillWhenLocalIsSaturated) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options("us-east", {{"eu-west", 0.08}}), Fleet(), 0.0).ok());
  ScrapeAll(core, "9.0", 0.0);
  std::set<std::string> remote;
  for (int i = 0; i < 20; ++i) {
    Served s = Serve(core, i, 0.01 + i * 0.001);
    EXPECT_TRUE(IsWest(s.name)) << s.name;
    EXPECT_TRUE(sched::IsRemote(s.locality)) << sched::LocalityName(s.locality);
    remote.insert(s.name);
  }
  EXPECT_EQ(remote, (std::set<std::string>{"west-a", "west-b"}));
  const std::string m = Metrics(core, 0.1);
  EXPECT_TRUE(Has(m, "kvroute_locality_requests_total{region=\"eu-west\"} 20.0")) << m;
  EXPECT_TRUE(Has(m, "kvroute_locality_requests_total{region=\"us-east\"} 0.0"));
  EXPECT_TRUE(Has(m, "kvroute_locality_requests_total{region=\"\"} 0.0"));
  EXPECT_TRUE(Has(m, "kvroute_locality_spill_ratio 1.0"));
  EXPECT_TRUE(Has(m, "kvroute_locality_spilling 1.0"));
  EXPECT_TRUE(Has(m, "kvroute_locality_spills_started_total 1.0"));
}

// Without a router region the filter is off: every pick reports off, remote endpoints
// are ordinary candidates.
TEST(RoutingLocality, NoRegionIsOff) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(""), Fleet(), 0.0).ok());
  ScrapeAll(core, "1.0", 0.0);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(Serve(core, i, 0.01 + i * 0.001).locality, Locality::kOff);
  EXPECT_TRUE(Has(Metrics(core, 0.1), "kvroute_locality_picks_total{decision=\"off\"} 10.0"));
}

// A region with no round trip is never a spill target; a measured one makes it one, and
// the measurement survives a reload (the new scheduler gets it again).
TEST(RoutingLocality, MeasuredRoundTripSurvivesReload) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options("us-east"), Fleet(), 0.0).ok());
  ScrapeAll(core, "9.0", 0.0);
  EXPECT_EQ(Serve(core, 0, 0.01).locality, Locality::kLocalSaturated);

  core.SetRegionRtt("eu-west", 0.07);
  Served s = Serve(core, 1, 0.02);
  EXPECT_TRUE(IsWest(s.name)) << s.name;
  EXPECT_EQ(s.locality, Locality::kSpillSaturated);

  // Reload with the same options (and a new weight-free policy spelling): still measured.
  ASSERT_TRUE(core.Configure(Options("us-east"), Fleet(), 0.03).ok());
  ScrapeAll(core, "9.0", 0.03);
  s = Serve(core, 2, 0.04);
  EXPECT_TRUE(IsWest(s.name)) << s.name;
  EXPECT_TRUE(sched::IsRemote(s.locality));
  EXPECT_TRUE(Has(Metrics(core, 0.05), "kvroute_locality_rtt_seconds{region=\"eu-west\",source=\"measured\"} 0.07"));
  ASSERT_EQ(core.measured_rtt().size(), 1u);

  // Forgetting it: never a target again (after the spill's minimum duration).
  core.SetRegionRtt("eu-west", -1.0);
  EXPECT_TRUE(core.measured_rtt().empty());
  ScrapeAll(core, "9.0", 2.0);
  EXPECT_EQ(Serve(core, 3, 2.01).locality, Locality::kLocalSaturated);
}

// A configured round trip wins: forgetting the measured value of that region leaves the
// configured one in force; both series are reported.
TEST(RoutingLocality, ConfiguredRoundTripWinsOverMeasured) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options("us-east", {{"eu-west", 0.08}}), Fleet(), 0.0).ok());
  core.SetRegionRtt("eu-west", 0.5);
  core.SetRegionRtt("eu-west", -1.0);
  core.SetRegionRtt("ap-south", 0.15);
  ScrapeAll(core, "9.0", 0.0);
  Served s = Serve(core, 0, 0.01);
  EXPECT_TRUE(IsWest(s.name)) << s.name;
  const std::string m = Metrics(core, 0.02);
  EXPECT_TRUE(Has(m, "kvroute_locality_rtt_seconds{region=\"eu-west\",source=\"configured\"} 0.08")) << m;
  EXPECT_TRUE(Has(m, "kvroute_locality_rtt_seconds{region=\"ap-south\",source=\"measured\"} 0.15"));
  EXPECT_EQ(m.find("region=\"eu-west\",source=\"measured\""), std::string::npos);
}

// A label change on reload is a region change, and the request counters stay per region.
TEST(RoutingLocality, RelabelledEndpointChangesRegionOnReload) {
  RoutingCore core;
  std::vector<EndpointSpec> eps = {TestEndpoint("a", 9001, {{"region", "eu-west"}}),
                                   TestEndpoint("b", 9002, {{"region", "eu-west"}})};
  ASSERT_TRUE(core.Configure(Options("us-east", {{"eu-west", 0.08}}), eps, 0.0).ok());
  for (const auto& ep : core.table()->by_id) core.OnScrape(ep->id, Scraped("0.0", "0.1", 0.0), 0.0);
  EXPECT_EQ(Serve(core, 0, 0.01).locality, Locality::kNoLocal);
  eps[0].labels = {{"region", "us-east"}};
  ASSERT_TRUE(core.Configure(Options("us-east", {{"eu-west", 0.08}}), eps, 0.02).ok());
  for (const auto& ep : core.table()->by_id) core.OnScrape(ep->id, Scraped("0.0", "0.1", 0.02), 0.02);
  Served s = Serve(core, 1, 0.03);
  EXPECT_EQ(s.name, "a");
  EXPECT_EQ(s.locality, Locality::kLocal);
  const std::string m = Metrics(core, 0.04);
  EXPECT_TRUE(Has(m, "kvroute_locality_requests_total{region=\"eu-west\"} 1.0")) << m;
  EXPECT_TRUE(Has(m, "kvroute_locality_requests_total{region=\"us-east\"} 1.0"));
  (void)IdOf;
}

// Picks on two threads while a third sets measured round trips, reloads and renders
// /metrics (ThreadSanitizer's target: make test-tsan). Every pick gets an answer.
TEST(RoutingLocality, ConcurrentPicksRoundTripsReloadsAndMetrics) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options("us-east"), Fleet(), 0.0).ok());
  ScrapeAll(core, "9.0", 0.0);
  std::atomic<int> answered{0};
  std::vector<std::thread> pickers;
  for (int t = 0; t < 2; ++t) {
    pickers.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) answered += !Serve(core, t * 1000 + i, 0.01 + i * 1e-4).name.empty();
    });
  }
  for (int i = 0; i < 100; ++i) {
    core.SetRegionRtt("eu-west", i % 2 ? 0.07 : -1.0);
    if (i % 25 == 0) {
      ASSERT_TRUE(core.Configure(Options("us-east"), Fleet(), 0.01).ok());
    }
    EXPECT_NE(Metrics(core, 0.02).find("kvroute_locality_picks_total"), std::string::npos);
  }
  for (std::thread& th : pickers) th.join();
  EXPECT_EQ(answered.load(), 600);
}

}  // namespace
}  // namespace kvroute::routing
