// The routing core trains its latency model from the lifecycle front ends report (issue 24,
// step 1), in virtual time: a fleet of two endpoints, one twice as slow to prefill, requests
// picked, dispatched, answered at the TTFT and cadence the endpoint would give.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "metrics/metric_sum.h"
#include "core/routing/routing_core.h"
#include "support/routing_fixture.h"

namespace kvroute::routing {
namespace {

using metrics::testing::MetricSum;
using test_support::ScrapedLoad;
using test_support::TestEndpoint;

struct Fleet {
  RoutingCore core;
  Fleet() {
    CoreOptions o;
    o.scheduling.policy = "round-robin";  // no prefix model: every prompt token uncached
    o.health.staleness_s = 1e9;
    EXPECT_TRUE(core.Configure(o, {TestEndpoint("fast", 9100), TestEndpoint("slow", 9101)}, 0).ok());
  }
  // True TTFT: a 10 ms step plus the prompt at 40k (fast) or 20k (slow) tokens/s.
  static double Ttft(uint32_t id, double tokens) { return 0.010 + tokens / (id == 0 ? 40000 : 20000); }
  // One request of `tokens` prompt tokens (4 characters each), answered with 20 tokens 15 ms
  // apart. Returns the pick.
  PickResult Run(double tokens, double now) {
    const std::string prompt(static_cast<size_t>(tokens) * 4, 'x');
    PickRequest pr;
    pr.request.model = "m";
    pr.request.prompt = prompt;
    pr.dispatch_first = true;
    PickResult r = core.Pick(pr, now);
    EXPECT_TRUE(r.ok());
    const double first = now + Ttft(r.ranked[0], tokens);
    core.OnFirstToken(r.handle, first);
    for (int k = 1; k <= 20; ++k) core.OnTokens(r.handle, k, first + 0.015 * (k - 1));
    core.OnFinished(r.handle, r.ranked[0], 200, first + 0.015 * 19);
    return r;
  }
};

TEST(LatencyCore, LearnsEachEndpointsTtftAndTpotFromTheLifecycle) {
  Fleet f;
  double now = 0;
  for (uint32_t id = 0; id < 2; ++id) f.core.OnScrape(id, ScrapedLoad("4", "0", "0.2", 0), 0);
  // Cold: no prediction until the model has its samples.
  PickResult first = f.Run(1000, now);
  EXPECT_EQ(first.predicted_ttft_s, -1.0);
  EXPECT_EQ(first.predicted_tpot_s, -1.0);
  for (int i = 0; i < 200; ++i) {
    now += 1.0;
    f.Run(200 + (i * 397) % 4000, now);
  }
  const LatencyStats st = f.core.latency_stats();
  EXPECT_EQ(st.ttft_samples, 201u);
  EXPECT_EQ(st.tpot_samples, 201u);
  // Each endpoint's own model: round-robin alternates, so both have about 100 samples.
  for (int i = 0; i < 2; ++i) {
    now += 1.0;
    PickResult r = f.Run(3000, now);
    EXPECT_NEAR(r.predicted_ttft_s, Fleet::Ttft(r.ranked[0], 3000), 0.002) << r.ranked[0];
    EXPECT_NEAR(r.predicted_tpot_s, 0.015, 0.0005);
  }
  // Scored predictions: all but the cold ones, and accurate.
  const LatencyStats end = f.core.latency_stats();
  EXPECT_GT(end.ttft_errors.n, 150u);
  EXPECT_LT(end.ttft_errors.Mape(), 0.05);
  std::string m;
  f.core.AppendMetrics(m, now);
  EXPECT_EQ(MetricSum(m, "kvroute_latency_model_samples_total", {{"kind", "ttft"}}), 203);
  EXPECT_EQ(MetricSum(m, "kvroute_latency_predictions_scored_total", {{"kind", "ttft"}}),
            static_cast<double>(end.ttft_errors.n));
  EXPECT_NEAR(MetricSum(m, "kvroute_latency_prediction_abs_error_seconds_total", {{"kind", "ttft"}}),
              end.ttft_errors.abs_s, 1e-9);
  // llm-d Router's names: one prediction observed per dispatch that had one (each was
  // scored when its answer came back); every TPOT prediction (15 ms) in the 10-20 ms bucket.
  EXPECT_EQ(MetricSum(m, "llm_d_epp_request_predicted_ttft_seconds_count"),
            static_cast<double>(end.ttft_errors.n));
  EXPECT_EQ(MetricSum(m, "llm_d_epp_request_predicted_tpot_seconds_count"),
            static_cast<double>(end.tpot_errors.n));
  EXPECT_EQ(MetricSum(m, "llm_d_epp_request_predicted_tpot_seconds_bucket", {{"le", "0.01"}}), 0);
  EXPECT_EQ(MetricSum(m, "llm_d_epp_request_predicted_tpot_seconds_bucket", {{"le", "0.02"}}),
            static_cast<double>(end.tpot_errors.n));
  EXPECT_EQ(MetricSum(m, "llm_d_epp_request_slo_violation_total"), 0);
}

TEST(LatencyCore, ObjectivesFromTheRequestOrThePoolDefaultCountViolations) {
  RoutingCore core;
  CoreOptions o;
  o.scheduling.policy = "round-robin";
  o.health.staleness_s = 1e9;
  o.default_slo_ttft_s = 0.05;  // scheduling.slo: {ttft: 50ms}
  ASSERT_TRUE(core.Configure(o, {TestEndpoint("a", 9100)}, 0).ok());
  core.OnScrape(0, ScrapedLoad("0", "0", "0.1", 0), 0);
  auto run = [&](double ttft, double slo_ttft, double slo_tpot, double now) {
    PickRequest pr;
    pr.request.model = "m";
    pr.request.prompt = "hello";
    pr.request.slo_ttft_s = slo_ttft;
    pr.request.slo_tpot_s = slo_tpot;
    pr.dispatch_first = true;
    PickResult r = core.Pick(pr, now);
    core.OnFirstToken(r.handle, now + ttft);
    core.OnTokens(r.handle, 11, now + ttft + 0.2);  // TPOT 20 ms
    core.OnFinished(r.handle, r.ranked[0], 200, now + ttft + 0.2);
  };
  run(0.04, 0, 0, 1);      // default 50 ms: met; no TPOT objective
  run(0.06, 0, 0, 2);      // default: missed
  run(0.06, 0.1, 0.01, 3); // its own 100 ms: met; TPOT 10 ms: missed
  const LatencyStats st = core.latency_stats();
  EXPECT_EQ(st.ttft_slo.observed, 3u);
  EXPECT_EQ(st.ttft_slo.violated, 1u);
  EXPECT_EQ(st.tpot_slo.observed, 1u);
  EXPECT_EQ(st.tpot_slo.violated, 1u);
  std::string m;
  core.AppendMetrics(m, 4);
  EXPECT_EQ(MetricSum(m, "kvroute_slo_requests_total", {{"type", "ttft"}}), 3);
  EXPECT_EQ(MetricSum(m, "kvroute_slo_violations_total", {{"type", "ttft"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_slo_violations_total", {{"type", "tpot"}}), 1);
  EXPECT_EQ(MetricSum(m, "llm_d_epp_request_slo_violation_total", {{"type", "ttft"}}), 1);
  EXPECT_EQ(MetricSum(m, "llm_d_epp_request_slo_violation_total", {{"type", "tpot"}}), 1);
}

// Flow control's budget (issue 24): how long a request may still wait and meet its TTFT
// objective is the objective minus the model's TTFT where it would go.
TEST(LatencyCore, SloWaitBudgetIsTheObjectiveMinusThePredictedTtft) {
  Fleet f;
  for (uint32_t id = 0; id < 2; ++id) f.core.OnScrape(id, ScrapedLoad("4", "0", "0.2", 0), 0);
  const std::string prompt(3000 * 4, 'x');  // 3,000 tokens
  sched::SchedRequest req;
  req.model = "m";
  req.prompt = prompt;
  // No objective (and no pool default): no budget.
  EXPECT_EQ(f.core.SloWaitBudget(req, {}), std::nullopt);
  // Cold model: the whole objective.
  req.slo_ttft_s = 0.5;
  ASSERT_TRUE(f.core.SloWaitBudget(req, {}).has_value());
  EXPECT_DOUBLE_EQ(f.core.SloWaitBudget(req, {})->wait_s, 0.5);
  EXPECT_FALSE(f.core.SloWaitBudget(req, {})->predicted);
  double now = 0;
  for (int i = 0; i < 200; ++i) {
    now += 1.0;
    f.Run(200 + (i * 397) % 4000, now);
  }
  // Trained: nothing held anywhere and nothing queued, so the lowest id (the fast one,
  // 10 ms + 3,000 / 40k tokens/s = 85 ms).
  EXPECT_NEAR(f.core.SloWaitBudget(req, {})->wait_s, 0.5 - Fleet::Ttft(0, 3000), 0.002);
  EXPECT_TRUE(f.core.SloWaitBudget(req, {})->predicted);
  // An objective the prediction already exceeds: no time left, never negative.
  req.slo_ttft_s = 0.05;
  EXPECT_EQ(f.core.SloWaitBudget(req, {})->wait_s, 0.0);
  // The pool default stands in for a request without its own objective.
  req.slo_ttft_s = 0;
  CoreOptions o;
  o.scheduling.policy = "round-robin";
  o.health.staleness_s = 1e9;
  o.default_slo_ttft_s = 1.0;
  ASSERT_TRUE(f.core.Configure(o, {TestEndpoint("fast", 9100), TestEndpoint("slow", 9101)}, now).ok());
  EXPECT_NEAR(f.core.SloWaitBudget(req, {})->wait_s, 1.0 - Fleet::Ttft(0, 3000), 0.002);
}

// A request released from the flow queue (issue 24): its wait there counts against its
// TTFT objective (the client waited), but the model learns the TTFT from dispatch.
TEST(LatencyCore, TimeInTheRoutersQueueCountsAgainstTheObjectiveNotTheModel) {
  RoutingCore core;
  CoreOptions o;
  o.scheduling.policy = "round-robin";
  o.health.staleness_s = 1e9;
  ASSERT_TRUE(core.Configure(o, {TestEndpoint("a", 9100)}, 0).ok());
  core.OnScrape(0, ScrapedLoad("0", "0", "0.1", 0), 0);
  auto run = [&](double queued, double now) {
    PickRequest pr;
    pr.request.model = "m";
    pr.request.prompt = "hello";
    pr.request.slo_ttft_s = 1.0;
    pr.request.queued_s = queued;
    pr.dispatch_first = true;
    PickResult r = core.Pick(pr, now);
    core.OnFirstToken(r.handle, now + 0.3);
    core.OnFinished(r.handle, r.ranked[0], 200, now + 0.5);
  };
  for (int i = 0; i < 20; ++i) run(0.0, 1.0 + i);  // TTFT 0.3 s: met, and learned
  run(0.8, 30);                                    // waited 0.8 s first: 1.1 s, missed
  run(0.6, 31);                                    // 0.9 s: met
  const LatencyStats st = core.latency_stats();
  EXPECT_EQ(st.ttft_slo.observed, 22u);
  EXPECT_EQ(st.ttft_slo.violated, 1u);
  // Every observation was 0.3 s from dispatch, so the scored predictions are exact.
  EXPECT_EQ(st.ttft_samples, 22u);
  EXPECT_LT(st.ttft_errors.abs_s / st.ttft_errors.n, 1e-4);  // 0.1 s if the wait were learned
}

TEST(LatencyCore, EndpointsWithoutUsableSignalsTeachNothing) {
  Fleet f;  // never scraped: waiting, running and KV usage unknown
  for (int i = 0; i < 30; ++i) f.Run(500, i);
  EXPECT_EQ(f.core.latency_stats().ttft_samples, 0u);
  EXPECT_EQ(f.core.latency_stats().tpot_samples, 0u);
}

}  // namespace
}  // namespace kvroute::routing
