// swapped-requests-scorer on vLLM V0's vllm:num_requests_swapped, from the scrape text to
// the pick: the parser's field (default name and an override) and the plugin's scores.
#include "core/sched/plugins/swapped_requests_scorer/swapped_requests_scorer.h"

#include <gtest/gtest.h>

#include <string>

#include "core/metrics/engine_metrics.h"
#include "core/sched/sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;
using testing::MustBuild;
using testing::Plugin;
using testing::Req;
using testing::SpecOf;
using F = metrics::EngineMetrics;

// What a vLLM V0 engine's /metrics says about running, waiting and swapped requests.
F Scrape(int swapped) {
  const std::string text =
      "vllm:num_requests_running{model_name=\"m\"} 3.0\n"
      "vllm:num_requests_swapped{model_name=\"m\"} " + std::to_string(swapped) + ".0\n"
      "vllm:num_requests_waiting{model_name=\"m\"} 1.0\n";
  F m;
  metrics::ExtractEngineMetrics(text, metrics::MetricNames::For(metrics::EngineType::kVllm), "", m);
  return m;
}

TEST(SwappedRequestsScorer, TheParserReadsTheGauge) {
  const F m = Scrape(4);
  EXPECT_TRUE(m.Has(F::kSwapped));
  EXPECT_EQ(m.swapped, 4.0);
  F v1;  // a V1 engine has no such series: unknown, not zero
  metrics::ExtractEngineMetrics("vllm:num_requests_running 3.0\n",
                                metrics::MetricNames::For(metrics::EngineType::kVllm), "", v1);
  EXPECT_FALSE(v1.Has(F::kSwapped));
  metrics::MetricNames renamed = metrics::MetricNames::For(metrics::EngineType::kVllm);
  ASSERT_TRUE(renamed.Set("swapped", "my:swapped"));
  F custom;
  metrics::ExtractEngineMetrics("my:swapped 2.0\n", renamed, "", custom);
  EXPECT_EQ(custom.swapped, 2.0);
}

TEST(SwappedRequestsScorer, FewerSwappedScoresHigherAndUnknownIsInTheMiddle) {
  auto s = MustBuild(SpecOf({Plugin("swapped-requests-scorer")}));
  auto eps = MakeEndpoints(4);
  eps[0].engine = Scrape(3);
  eps[1].engine = Scrape(0);
  eps[2].engine = Scrape(1);
  // eps[3]: no gauge (a V1 engine, or a stale scrape the core hid).
  PickResult r = s->Pick(Req("x"), eps, 0.0);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.candidates.size(), 4u);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.25);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 2), 0.5);
  EXPECT_DOUBLE_EQ(r.Score(0, 3), 0.5);
  EXPECT_EQ(r.ranked[0], 1u);
  EXPECT_EQ(s->consumed_fields(), static_cast<uint32_t>(F::kSwapped));
}

}  // namespace
}  // namespace kvroute::sched
