// Loopback test of locality in `kvroute serve` (issue 10): two simulated replicas, one
// labelled in the router's region and one remote, behind the router with
// locality.region set. Every wait is bounded.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "config/router_config.h"
#include "core/api/openai.h"
#include "adapters/http/test_client.h"
#include "apps/serve/router.h"
#include "apps/sim/fleet.h"
#include "metrics/metric_sum.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/wait.h"

namespace kvroute::router {
namespace {

using namespace std::chrono_literals;
using http::Fetch;
using metrics::testing::MetricSum;

sim::ReplicaConfig Replica(const std::string& name) {
  return kvroute::test_support::SimReplica({.name = name});
}

std::string Body(int i) {
  return kvroute::test_support::CompletionBody(
      "conversation " + std::to_string(i) + " " + std::string(200, 'x'), 3);
}

using kvroute::test_support::WaitFor;

class LocalityTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    fleet_.reset();
  }

  // "east" (us-east) and "west" (eu-west), each a sim replica labelled with its region.
  void StartFleet() {
    fleet_ = std::make_unique<sim::Fleet>(std::vector<sim::ReplicaConfig>{Replica("east"), Replica("west")}, 2);
    ASSERT_TRUE(fleet_->Start().ok());
  }

  std::string Yaml(const std::string& locality) {
    return "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n  endpoints:\n"
           "    - {address: 127.0.0.1:" + std::to_string(fleet_->port(0)) +
           ", name: east, labels: {region: us-east}}\n"
           "    - {address: 127.0.0.1:" + std::to_string(fleet_->port(1)) +
           ", name: west, labels: {region: eu-west}}\n"
           "scheduling: {policy: kvroute}\n" + locality;
  }

  void StartRouter(const std::string& yaml, std::optional<std::string> region = std::nullopt) {
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "test.yaml");
    ASSERT_TRUE(r.ok()) << r.error.ToString() << "\n" << yaml;
    RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = false;
    o.region = std::move(region);
    router_ = std::make_unique<Router>(std::move(*r.value), o);
    Status st = router_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(WaitFor([&] { return MetricSum(Metrics(), "kvroute_endpoint_metrics_fresh") == 2; }));
  }

  std::string Post(int i) {
    auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", Body(i));
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    return r ? r->Header("x-kvroute-endpoint") : "";
  }

  std::string Metrics() {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? r->body : std::string();
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Router> router_;
};

// Below saturation every request stays in us-east, whatever the remote replica offers;
// /metrics counts the decisions and the requests by region, and shows the configured
// round trip and the measured ones (scrapes over kept-alive connections).
TEST_F(LocalityTest, RequestsStayLocalAndMetricsShowDecisionsAndRoundTrips) {
  StartFleet();
  StartRouter(Yaml("locality:\n  region: us-east\n  rtt: {eu-west: 70ms}\n"));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(Post(i), "east") << i;
  // Requests are counted by region when answered, which can come just after the client read
  // the last byte: wait for all twelve.
  ASSERT_TRUE(WaitFor([&] { return MetricSum(Metrics(), "kvroute_locality_requests_total") == 12; }))
      << Metrics();
  std::string m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvroute_locality_picks_total", {{"decision", "local"}}), 12) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_locality_picks_total", {{"decision", "spill_saturated"}}), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_locality_requests_total", {{"region", "us-east"}}), 12);
  EXPECT_EQ(MetricSum(m, "kvroute_locality_requests_total", {{"region", "eu-west"}}), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_locality_spill_ratio"), 0);
  EXPECT_DOUBLE_EQ(MetricSum(m, "kvroute_locality_rtt_seconds", {{"region", "eu-west"}, {"source", "configured"}}),
                   0.07);
  // Measured: both regions once a scrape reused its connection (the first opens it).
  ASSERT_TRUE(WaitFor([&] {
    const std::string t = Metrics();
    return t.find("kvroute_locality_rtt_seconds{region=\"eu-west\",source=\"measured\"}") != std::string::npos &&
           t.find("kvroute_locality_rtt_seconds{region=\"us-east\",source=\"measured\"}") != std::string::npos;
  })) << Metrics();
  m = Metrics();
  const double measured = MetricSum(m, "kvroute_locality_rtt_seconds", {{"region", "eu-west"}, {"source", "measured"}});
  EXPECT_GE(measured, 0.0);
  EXPECT_LT(measured, 1.0);  // loopback
}

// --region "" (RouterOptions::region) overrides the file: locality off, both replicas used.
TEST_F(LocalityTest, RegionFlagOverridesTheFile) {
  StartFleet();
  StartRouter(Yaml("locality: {region: us-east, measure_rtt: false}\n"), "");
  std::set<std::string> used;
  for (int i = 0; i < 16; ++i) used.insert(Post(i));
  // Counted when answered (see above): wait for all sixteen.
  ASSERT_TRUE(WaitFor([&] { return MetricSum(Metrics(), "kvroute_locality_requests_total") == 16; }))
      << Metrics();
  const std::string m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvroute_locality_picks_total", {{"decision", "off"}}), 16) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_locality_requests_total"), 16);
  EXPECT_EQ(m.find("source=\"measured\""), std::string::npos);  // measure_rtt: false
  EXPECT_EQ(used.size(), 2u);
}

// With no round trip (none configured, none measured) the remote region is never a spill
// target: it is picked only when no local endpoint is healthy (the local replica crashed).
TEST_F(LocalityTest, RemoteOnlyWhenNoLocalEndpointIsHealthy) {
  StartFleet();
  StartRouter(Yaml("locality: {region: us-east, measure_rtt: false}\n"));
  EXPECT_EQ(Post(0), "east");
  auto crash = Fetch("127.0.0.1", fleet_->port(0), "POST", "/admin/fault", R"({"kind":"crash","duration":"30s"})");
  ASSERT_TRUE(crash && crash->status == 200) << (crash ? crash->body : "no answer");
  ASSERT_TRUE(WaitFor([&] { return MetricSum(Metrics(), "kvroute_endpoint_metrics_fresh") == 1; }));
  EXPECT_EQ(Post(1), "west");
  EXPECT_EQ(MetricSum(Metrics(), "kvroute_locality_picks_total", {{"decision", "no_local"}}), 1);
}

}  // namespace
}  // namespace kvroute::router
