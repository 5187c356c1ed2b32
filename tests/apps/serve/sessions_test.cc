// Session affinity through `kvroute serve` over loopback (issue 26, item 3): three
// simulated replicas behind the router, requests carrying x-session-id or the
// x-session-token the router writes on every response.
#include "apps/serve/router.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "config/router_config.h"
#include "core/routing/sessions.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "metrics/metric_sum.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/wait.h"

namespace kvroute::router {
namespace {

using http::ClientResponse;
using http::Fetch;
using kvroute::test_support::CompletionBody;
using kvroute::test_support::WaitFor;
using metrics::testing::MetricSum;

class SessionsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    fleet_.reset();
  }

  // Three replicas r0..r2 behind a round-robin router: without a session, consecutive
  // requests go to different replicas.
  void Start(const std::string& extra = "") {
    std::vector<sim::ReplicaConfig> rs;
    for (int i = 0; i < 3; ++i) {
      rs.push_back(kvroute::test_support::SimReplica({.name = "r" + std::to_string(i)}));
    }
    fleet_ = std::make_unique<sim::Fleet>(std::move(rs), 2);
    ASSERT_TRUE(fleet_->Start().ok());
    std::string yaml = "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n  endpoints:\n";
    for (int i = 0; i < 3; ++i) {
      yaml += "    - {address: " + Address(i) + ", name: r" + std::to_string(i) + "}\n";
    }
    yaml += "scheduling:\n  policy: round-robin\n" + extra;
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "test.yaml");
    ASSERT_TRUE(r.ok()) << r.error.ToString();
    RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = false;
    router_ = std::make_unique<Router>(std::move(*r.value), o);
    ASSERT_TRUE(router_->Start().ok());
    ASSERT_TRUE(WaitFor([&] { return MetricSum(Metrics(), "kvroute_endpoint_metrics_fresh") == 3; }));
  }

  std::string Address(int i) const { return "127.0.0.1:" + std::to_string(fleet_->port(i)); }

  std::optional<ClientResponse> Post(const std::vector<std::pair<std::string, std::string>>& headers,
                                     int i = 0) {
    return Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions",
                 CompletionBody("turn " + std::to_string(i) + " of the conversation", 2), headers);
  }
  // Sends and returns the replica that answered ("" on failure).
  std::string Served(const std::vector<std::pair<std::string, std::string>>& headers, int i = 0) {
    auto r = Post(headers, i);
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    return r && r->status == 200 ? r->Header("x-kvroute-endpoint") : "";
  }
  std::string Metrics() {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    return r ? r->body : std::string();
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Router> router_;
};

// The issue's done-test: 20 requests with one x-session-id land on one replica; when it is
// taken out, the session moves once and stays.
TEST_F(SessionsTest, OneSessionStaysOnOneReplicaAndMovesOnceWhenItGoes) {
  Start();
  std::map<std::string, int> before;
  for (int i = 0; i < 20; ++i) ++before[Served({{"x-session-id", "conversation-7"}}, i)];
  ASSERT_EQ(before.size(), 1u);
  const std::string first = before.begin()->first;
  EXPECT_EQ(before[first], 20);
  // Without the header the round robin spreads requests as usual.
  std::set<std::string> spread;
  for (int i = 0; i < 3; ++i) spread.insert(Served({}, i));
  EXPECT_EQ(spread.size(), 3u);

  // Take the session's replica out: it crashes (stops listening) for a while.
  const int out = first[1] - '0';
  auto crash = Fetch("127.0.0.1", fleet_->port(out), "POST", "/admin/fault",
                     R"({"kind":"crash","duration":"60s"})");
  ASSERT_TRUE(crash && crash->status == 200) << (crash ? crash->body : "no answer");
  ASSERT_TRUE(WaitFor([&] { return MetricSum(Metrics(), "kvroute_endpoint_metrics_fresh") == 2; }));

  std::map<std::string, int> after;
  for (int i = 0; i < 20; ++i) ++after[Served({{"x-session-id", "conversation-7"}}, 20 + i)];
  ASSERT_EQ(after.size(), 1u);
  EXPECT_NE(after.begin()->first, first);
  EXPECT_EQ(after.begin()->second, 20);

  const std::string m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvroute_session_picks_total", {{"outcome", "moved_gone"}}), 1) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_session_picks_total", {{"outcome", "moved_saturated"}}), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_session_picks_total", {{"outcome", "new"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_session_picks_total", {{"outcome", "bound"}}), 38);
  EXPECT_EQ(MetricSum(m, "kvroute_sessions"), 1);
}

TEST_F(SessionsTest, TheTokenIsWrittenOnResponsesAndFollowedOnRequests) {
  Start();
  // Every response carries the token of the replica that served it.
  for (int i = 0; i < 3; ++i) {
    auto r = Post({}, i);
    ASSERT_TRUE(r && r->status == 200);
    const std::string served = r->Header("x-kvroute-endpoint");
    EXPECT_EQ(r->Header("x-session-token"), routing::EncodeSessionToken(Address(served[1] - '0')));
  }
  // A request carrying r2's token goes to r2, whatever the round robin's turn.
  const std::string token = routing::EncodeSessionToken(Address(2));
  for (int i = 0; i < 6; ++i) {
    auto r = Post({{"x-session-token", token}}, i);
    ASSERT_TRUE(r && r->status == 200);
    EXPECT_EQ(r->Header("x-kvroute-endpoint"), "r2");
    EXPECT_EQ(r->Header("x-session-token"), token);
  }
  // A token that is not base64 or names no endpoint is ignored, never an error.
  EXPECT_FALSE(Served({{"x-session-token", "%%% not a token"}}).empty());
  EXPECT_FALSE(Served({{"x-session-token", routing::EncodeSessionToken("10.9.9.9:1")}}).empty());
  EXPECT_EQ(MetricSum(Metrics(), "kvroute_session_picks_total", {{"outcome", "token"}}), 6);
}

TEST_F(SessionsTest, ConfiguredHeadersAndOff) {
  Start("sessions:\n  header: x-conversation\n  token_header: x-route-token\n");
  std::set<std::string> on;
  for (int i = 0; i < 6; ++i) on.insert(Served({{"x-conversation", "c1"}}, i));
  EXPECT_EQ(on.size(), 1u);
  auto r = Post({}, 0);
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_FALSE(r->Header("x-route-token").empty());
  EXPECT_TRUE(r->Header("x-session-token").empty());

  TearDown();
  Start("sessions: {enabled: false}\n");
  std::set<std::string> off;
  for (int i = 0; i < 6; ++i) off.insert(Served({{"x-session-id", "c1"}}, i));
  EXPECT_EQ(off.size(), 3u);
  r = Post({}, 0);
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_TRUE(r->Header("x-session-token").empty());
}

}  // namespace
}  // namespace kvroute::router
