// The lifecycle decisions of the routing core (core/routing/lifecycle.h): when a failed
// attempt moves to the next-ranked endpoint, when a failed prefill leg moves to another
// prefill endpoint, and the sidecar's same-prefiller rule. Virtual time, a real RoutingCore.
#include "core/routing/lifecycle.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/routing/routing_core.h"
#include "support/routing_fixture.h"

namespace kvroute::routing {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

sched::SchedRequest Req(const std::string& prompt) {
  sched::SchedRequest r;
  r.model = "meta-llama/Llama-3.1-8B-Instruct";
  r.prompt = prompt;
  r.max_tokens = 16;
  return r;
}

class LifecycleTest : public ::testing::Test {
 protected:
  // One retry in the budget's window whatever the traffic (ratio 0, minimum 1).
  void Configure(std::vector<EndpointSpec> eps) {
    CoreOptions o;
    o.scheduling.policy = "kvroute";
    o.health.staleness_s = 100.0;
    o.retry_budget.ratio = 0.0;
    o.retry_budget.min_retries = 1;
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
  AttemptFailure Failed(const PickResult& r, uint32_t attempt, bool connect) {
    AttemptFailure f;
    f.endpoint_id = r.ranked[attempt];
    f.failure = {connect ? "connect_refused" : "reset", connect};
    f.attempt = attempt;
    f.n_ranked = r.n_ranked;
    f.max_attempts = 3;
    return f;
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

std::vector<EndpointSpec> ThreeEndpoints() {
  return {test_support::TestEndpoint("a", 9001), test_support::TestEndpoint("b", 9002),
          test_support::TestEndpoint("c", 9003)};
}

TEST_F(LifecycleTest, AFailedAttemptMovesToTheNextRankedEndpointWithinTheLimits) {
  Configure(ThreeEndpoints());
  const PickResult r = Pick("hello");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.n_ranked, 3u);

  // Each reason to end is checked before the budget is asked (so none spends it).
  AttemptFailure started = Failed(r, 0, false);
  started.started = true;
  EXPECT_FALSE(core_.OnAttemptFailed(started, now_).retry());
  AttemptFailure not_retryable = Failed(r, 0, false);
  not_retryable.retryable = false;
  EXPECT_FALSE(core_.OnAttemptFailed(not_retryable, now_).retry());
  AttemptFailure gone = Failed(r, 0, false);
  gone.client_gone = true;
  EXPECT_FALSE(core_.OnAttemptFailed(gone, now_).retry());
  AttemptFailure capped = Failed(r, 1, false);
  capped.max_attempts = 2;  // attempt 1 was the last allowed
  EXPECT_FALSE(core_.OnAttemptFailed(capped, now_).retry());
  EXPECT_FALSE(core_.OnAttemptFailed(Failed(r, 2, false), now_).retry());  // none ranked after

  // The budget's one retry goes to the first retryable failure: on to ranked[1].
  const AttemptDecision d = core_.OnAttemptFailed(Failed(r, 0, false), now_);
  ASSERT_TRUE(d.retry());
  EXPECT_EQ(d.next_attempt, 1u);
  // The budget is spent: a reset on ranked[1] ends the request...
  EXPECT_FALSE(core_.OnAttemptFailed(Failed(r, 1, false), now_).retry());
  // ...but a refused connection never reached an engine: its retry is free.
  const AttemptDecision free = core_.OnAttemptFailed(Failed(r, 1, true), now_);
  ASSERT_TRUE(free.retry());
  EXPECT_EQ(free.next_attempt, 2u);

  // Every failure was counted against its endpoint (ranked[0] four times, ranked[1] three,
  // ranked[2] once); the budget was asked twice (one allowed, one denied), the free retry
  // not at all.
  const std::string m = Metrics();
  const std::string names[] = {Name(r.ranked[0]), Name(r.ranked[1]), Name(r.ranked[2])};
  for (const std::string& line :
       {"kvroute_upstream_errors_total{endpoint=\"" + names[0] + "\",kind=\"reset\"} 4.0\n",
        "kvroute_upstream_errors_total{endpoint=\"" + names[1] + "\",kind=\"reset\"} 2.0\n",
        "kvroute_upstream_errors_total{endpoint=\"" + names[1] + "\",kind=\"connect_refused\"} 1.0\n",
        "kvroute_upstream_errors_total{endpoint=\"" + names[2] + "\",kind=\"reset\"} 1.0\n",
        std::string("kvroute_retries_total 2.0\n"), std::string("kvroute_retries_free_total 1.0\n"),
        std::string("kvroute_retries_denied_total 1.0\n")}) {
    EXPECT_NE(m.find(line), std::string::npos) << line << m;
  }
}

// a, b: decode; p, q: prefill.
std::vector<EndpointSpec> PdPool() {
  auto role = [](const char* r) { return Labels{{"llm-d.ai/role", r}}; };
  return {test_support::TestEndpoint("a", 9001, role("decode")),
          test_support::TestEndpoint("b", 9002, role("decode")),
          test_support::TestEndpoint("p", 9003, role("prefill")),
          test_support::TestEndpoint("q", 9004, role("prefill"))};
}

TEST_F(LifecycleTest, AFailedPrefillLegMovesOnceThenTheDecodeEndpointPrefillsLocally) {
  Configure(PdPool());
  const std::string prompt = "long " + std::string(4000, 'x');
  const PickResult r = Pick(prompt);
  ASSERT_TRUE(r.disaggregated());
  ASSERT_EQ(Name(r.prefill), "p");
  const sched::SchedRequest req = Req(prompt);
  std::vector<uint32_t> tried;

  // A 4xx is the request's fault: no move, nothing counted, nothing tried.
  PrefillFailure rejected;
  rejected.prefill_id = r.prefill;
  rejected.failure = {"http_400", false};
  rejected.server_fault = false;
  rejected.request = &req;
  rejected.decode_id = r.ranked[0];
  rejected.tried = &tried;
  EXPECT_FALSE(core_.OnPrefillFailed(rejected, now_).move());
  EXPECT_TRUE(tried.empty());

  // p resets: the leg moves to q, charged there.
  core_.OnPrefillDone(r.prefill, r.prefill_tokens);
  PrefillFailure f = rejected;
  f.failure = {"reset", false};
  f.server_fault = true;
  const PrefillDecision moved = core_.OnPrefillFailed(f, now_);
  ASSERT_TRUE(moved.move());
  EXPECT_EQ(Name(moved.prefill), "q");
  EXPECT_GT(moved.prefill_tokens, 0.0);
  ASSERT_NE(moved.table, nullptr);
  EXPECT_EQ(tried, std::vector<uint32_t>({r.prefill}));

  // q resets too: no untried prefill endpoint is left, so the decode endpoint prefills.
  core_.OnPrefillDone(moved.prefill, moved.prefill_tokens);
  PrefillFailure again = f;
  again.prefill_id = moved.prefill;
  EXPECT_FALSE(core_.OnPrefillFailed(again, now_).move());
  EXPECT_EQ(tried, std::vector<uint32_t>({r.prefill, moved.prefill}));
}

TEST_F(LifecycleTest, APrefillMoveNeedsTheRetryBudgetAndAClient) {
  Configure(PdPool());
  const std::string prompt = "long " + std::string(4000, 'x');
  const PickResult r = Pick(prompt);
  ASSERT_TRUE(r.disaggregated());
  const sched::SchedRequest req = Req(prompt);
  std::vector<uint32_t> tried;
  PrefillFailure f;
  f.prefill_id = r.prefill;
  f.failure = {"reset", false};
  f.request = &req;
  f.decode_id = r.ranked[0];
  f.tried = &tried;
  f.client_gone = true;
  EXPECT_FALSE(core_.OnPrefillFailed(f, now_).move());  // counted, but nobody to serve
  EXPECT_EQ(tried.size(), 1u);
  // Spend the budget's one retry, then a reset cannot move the leg.
  const PickResult other = Pick("hi");
  ASSERT_TRUE(core_.OnAttemptFailed(Failed(other, 0, false), now_).retry());
  tried.clear();
  f.client_gone = false;
  EXPECT_FALSE(core_.OnPrefillFailed(f, now_).move());
  // A refused connection is free of the budget: it moves.
  tried.clear();
  f.failure = {"connect_refused", true};
  EXPECT_TRUE(core_.OnPrefillFailed(f, now_).move());
}

TEST(SidecarPrefillRule, RetriesTheSamePrefillerOnTransientFailuresUpToTheLimit) {
  auto decide = [](bool transport, int status, int so_far, bool gone = false) {
    return DecideSidecarPrefill({transport, status, so_far, 2, gone});
  };
  using D = SidecarPrefillDecision;
  EXPECT_EQ(decide(true, 0, 0), D::kRetrySame);
  EXPECT_EQ(decide(false, 502, 1), D::kRetrySame);
  EXPECT_EQ(decide(false, 503, 0), D::kRetrySame);
  EXPECT_EQ(decide(false, 504, 0), D::kRetrySame);
  EXPECT_EQ(decide(false, 500, 0), D::kLocal);  // an engine error: not transient
  EXPECT_EQ(decide(false, 400, 0), D::kLocal);
  EXPECT_EQ(decide(true, 0, 2), D::kLocal);     // the limit
  EXPECT_EQ(decide(true, 0, 0, true), D::kLocal);  // the client left
}

}  // namespace
}  // namespace kvroute::routing
