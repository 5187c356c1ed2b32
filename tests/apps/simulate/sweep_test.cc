#include "apps/simulate/sweep.h"

#include <gtest/gtest.h>

#include <string>

namespace kvroute::simulate {
namespace {

SweepPoint Point(double rate, double ttft_p99, double tok_s, int64_t failed = 0) {
  SweepPoint p;
  p.rate = rate;
  p.report.requests = 100;
  p.report.succeeded = 100 - failed;
  p.report.ttft_s.p99 = ttft_p99;
  p.report.output_tokens_per_s = tok_s;
  p.report.requests_per_s = rate * 0.9;
  p.report.goodput_requests_per_s = rate * 0.8;
  p.steady.output_tokens_per_s = tok_s * 1.5;
  p.steady.requests_per_s = rate * 0.95;
  return p;
}

TEST(SweepTest, MaxRateIsTheLastOfTheLeadingPassingRun) {
  PolicySweep s{"p", {Point(10, 0.5, 1000), Point(20, 1.9, 2000), Point(30, 2.5, 2500),
                      Point(40, 1.0, 3000)}};
  // 40 meets the bound again, but 30 did not: 20 is the highest sustained rate.
  SweepSummary sum = SummarizeSweep(s, 2.0);
  EXPECT_EQ(sum.max_rate, 20);
  EXPECT_EQ(sum.output_tokens_per_s, 2000);
  EXPECT_DOUBLE_EQ(sum.requests_per_s, 18);
  EXPECT_DOUBLE_EQ(sum.goodput_requests_per_s, 16);
  EXPECT_EQ(sum.ttft_p99_s, 1.9);
  EXPECT_EQ(FirstFailingRate(s, 2.0), 30);
  // The bound is inclusive.
  EXPECT_EQ(SummarizeSweep(s, 2.5).max_rate, 40);
  EXPECT_EQ(FirstFailingRate(s, 2.5), -1);
}

TEST(SweepTest, FailedRequestsOrAFailingFirstRateMeanNoSustainedRate) {
  PolicySweep s{"p", {Point(10, 0.1, 1000, 1), Point(20, 0.1, 2000)}};
  SweepSummary sum = SummarizeSweep(s, 2.0);
  EXPECT_EQ(sum.max_rate, -1);
  EXPECT_EQ(sum.output_tokens_per_s, 0);
  EXPECT_EQ(FirstFailingRate(s, 2.0), 10);
}

TEST(SweepTest, MarkdownAndJsonCompareToTheBaseline) {
  std::vector<PolicySweep> sweeps{
      {"round-robin", {Point(10, 0.5, 1000), Point(20, 8.0, 1500), Point(30, 20.0, 1600)}},
      {"kvroute", {Point(10, 0.1, 1000), Point(20, 0.4, 2000), Point(30, 1.5, 2500)}}};
  const std::string md = SweepMarkdown("s", sweeps, 2.0);
  // kvroute sustains 30 (2500 tok/s) vs round-robin's 10 (1000): 2.50x; at 20 req/s, where
  // round-robin first misses the bound, its p99 is 0.4 / 8.0 = 0.05 of round-robin's.
  // Steady-state columns: 3750 / 1500 tok/s.
  EXPECT_NE(md.find("| kvroute | 30 | 2500 | 27.00 | 2.50x | 3750 | 28.50 | 2.50x | 400 ms | 0.050 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| round-robin | 10 | 1000 | 9.00 | 1.00x | 1500 | 9.50 | 1.00x | 8.00 s | 1.000 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| round-robin | 20 | 18.00 | 1500 |"), std::string::npos) << md;
  const std::string json = SweepJson("s", sweeps, 2.0);
  EXPECT_NE(json.find("\"baseline_saturation_rate\": 20"), std::string::npos) << json;
  EXPECT_NE(json.find("\"policy\": \"kvroute\", \"max_rate\": 30, \"output_tokens_per_s\": 2500"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"vs_baseline\": 2.5"), std::string::npos) << json;
  EXPECT_NE(json.find("\"steady_output_tokens_per_s\": 3750, \"steady_requests_per_s\": 28.5, "
                      "\"steady_vs_baseline\": 2.5"),
            std::string::npos)
      << json;
}

TEST(SweepTest, PeakIsTheHighestThroughputAtAnyRate) {
  std::vector<PolicySweep> sweeps{
      {"round-robin", {Point(10, 0.5, 1000), Point(20, 8.0, 1500), Point(30, 20.0, 1400)}},
      {"sticky", {Point(10, 0.1, 1000), Point(20, 3.0, 3300), Point(30, 9.0, 3000)}}};
  sweeps[1].points[2].report.ttft_s.p90 = 4.5;
  sweeps[0].points[2].report.ttft_s.p90 = 15.0;
  const SweepPeak pk = PeakOfSweep(sweeps[1]);
  EXPECT_EQ(pk.output_tokens_per_s, 3300);
  EXPECT_EQ(pk.rate, 20);
  EXPECT_EQ(pk.steady_output_tokens_per_s, 4950);
  EXPECT_EQ(pk.steady_rate, 20);
  EXPECT_EQ(pk.top_rate, 30);
  EXPECT_EQ(pk.ttft_p90_at_top_s, 4.5);
  // Over round-robin's peak (1500 at 20): 2.20x, whatever the TTFT bound says.
  const std::string md = SweepMarkdown("s", sweeps, 2.0);
  EXPECT_NE(md.find("| sticky | 3300 | 20 | 2.20x | 4950 | 20 | 2.20x | 4.50 s |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| round-robin | 1500 | 20 | 1.00x | 2250 | 20 | 1.00x | 15.00 s |"),
            std::string::npos)
      << md;
  const std::string json = SweepJson("s", sweeps, 2.0);
  EXPECT_NE(json.find("\"peak\": {\"output_tokens_per_s\": 3300, \"rate\": 20, "
                      "\"steady_output_tokens_per_s\": 4950, \"steady_rate\": 20, "
                      "\"vs_baseline\": 2.2"),
            std::string::npos)
      << json;
  EXPECT_EQ(PeakOfSweep(PolicySweep{"empty", {}}).rate, -1);
}

report::RequestRecord Rec(double send, double e2e, int64_t out, bool ok = true) {
  report::RequestRecord r;
  r.send_s = send;
  r.ttft_s = ok ? 0.1 : -1.0;
  r.e2e_s = ok ? e2e : -1.0;
  r.output_tokens = out;
  if (!ok) r.error = report::ErrorKind::kTimeout;
  return r;
}

TEST(SweepTest, SteadyThroughputCountsCompletionsInsideTheArrivalWindow) {
  // Sends at 0..100 s; warm-up 25% -> window [25, 100] (75 s).
  std::vector<report::RequestRecord> recs{
      Rec(0, 10, 1000),     // ends at 10: warm-up, not counted
      Rec(20, 5, 300),      // ends at 25: counted (window is inclusive)
      Rec(50, 40, 600),     // ends at 90: counted
      Rec(60, 50, 5000),    // ends at 110: after the last send, not counted (drain tail)
      Rec(70, 1, 77, false),  // failed: not counted
      Rec(100, 0, 600)};    // ends at 100: counted
  SteadyThroughput t = MeasureSteadyThroughput(recs);
  EXPECT_DOUBLE_EQ(t.window_s, 75.0);
  EXPECT_DOUBLE_EQ(t.output_tokens_per_s, 1500.0 / 75.0);
  EXPECT_DOUBLE_EQ(t.requests_per_s, 3.0 / 75.0);
  // No window: one send, or the whole span as warm-up.
  EXPECT_EQ(MeasureSteadyThroughput(std::span(recs).first(1)).window_s, 0.0);
  EXPECT_EQ(MeasureSteadyThroughput(recs, 1.0).output_tokens_per_s, 0.0);
}

TEST(SweepTest, WithRateKeepsTheAmountOfWork) {
  config::Scenario s;
  s.arrivals.stages = {{6, 60}, {12, 60}};
  config::Scenario r = WithRate(s, 20);
  ASSERT_EQ(r.arrivals.stages.size(), 1u);
  EXPECT_EQ(r.arrivals.stages[0].rate, 20);
  EXPECT_EQ(r.arrivals.num_requests, 6 * 60 + 12 * 60);
  s.arrivals.num_requests = 500;
  EXPECT_EQ(WithRate(s, 20).arrivals.num_requests, 500);
}

}  // namespace
}  // namespace kvroute::simulate
