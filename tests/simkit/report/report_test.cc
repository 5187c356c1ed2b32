#include <gtest/gtest.h>

#include <cmath>

#include "simkit/report/summary.h"
#include "simkit/report/writers.h"

namespace kvroute::report {
namespace {

RequestRecord Rec(uint64_t id, double send, double ttft, double e2e, int64_t out,
                  int64_t prompt = 100, int64_t cached = 0) {
  RequestRecord r;
  r.id = id;
  r.send_s = send;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.output_tokens = out;
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  return r;
}

TEST(PercentileTest, NearestRank) {
  std::vector<double> v{10, 1, 9, 2, 8, 3, 7, 4, 6, 5};  // 1..10 shuffled
  EXPECT_EQ(Percentile(v, 50), 5);                       // rank ceil(5) = 5
  EXPECT_EQ(Percentile(v, 90), 9);                       // rank 9
  EXPECT_EQ(Percentile(v, 99), 10);                      // rank ceil(9.9) = 10
  EXPECT_EQ(Percentile(v, 0), 1);                        // rank 1
  EXPECT_EQ(Percentile(v, 100), 10);
  EXPECT_EQ(Percentile(v, 51), 6);  // rank ceil(5.1) = 6
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_EQ(Percentile(hundred, 99), 99);  // 0.99 * 100 is not 99.000...01 here
  EXPECT_EQ(Percentile(hundred, 99.9), 100);
  std::vector<double> one{3.5};
  EXPECT_EQ(Percentile(one, 50), 3.5);
  std::vector<double> none;
  EXPECT_EQ(Percentile(none, 50), 0);
}

TEST(SummarizeTest, MeanMinMaxPercentiles) {
  std::vector<double> v{4, 1, 3, 2};
  Stats s = Summarize(v);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.mean, 2.5);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 4);
  EXPECT_EQ(s.p50, 2);
  EXPECT_EQ(s.p90, 4);
  EXPECT_EQ(s.p99, 4);
}

TEST(RecordTest, TpotAndSlo) {
  RequestRecord r = Rec(1, 0, 0.5, 2.5, 5);
  EXPECT_EQ(r.Tpot(), 0.5);  // (2.5 - 0.5) / 4
  EXPECT_EQ(Rec(1, 0, 0.5, 0.5, 1).Tpot(), -1);
  Slo slo;
  EXPECT_TRUE(MeetsSlo(r, slo));
  slo.ttft_s = 0.5;
  EXPECT_TRUE(MeetsSlo(r, slo));
  slo.ttft_s = 0.4;
  EXPECT_FALSE(MeetsSlo(r, slo));
  slo = {};
  slo.tpot_s = 0.5;
  EXPECT_TRUE(MeetsSlo(r, slo));
  slo.tpot_s = 0.49;
  EXPECT_FALSE(MeetsSlo(r, slo));
  r.error = ErrorKind::kUpstream;
  EXPECT_FALSE(MeetsSlo(r, Slo{}));
}

TEST(PolicySummaryTest, RatesGoodputHitRatesAndErrors) {
  std::vector<RequestRecord> recs{
      Rec(0, 0.0, 0.1, 1.1, 11, 100, 0),   // tpot 0.1
      Rec(1, 1.0, 0.3, 2.3, 5, 200, 160),  // tpot 0.5
      Rec(2, 2.0, 0.2, 8.0, 30, 100, 96),  // ends at 10.0
      Rec(3, 3.0, -1, -1, 0, 50, 0),
  };
  recs[3].error = ErrorKind::kRejected;
  Slo slo;
  slo.ttft_s = 0.25;
  slo.tpot_s = 0.3;
  FleetTotals totals;
  totals.prefix_queries_tokens = 500;
  totals.prefix_hits_tokens = 256;
  totals.preemptions = 3;
  totals.oracle_hit_rate = 0.8;
  PolicyReport p = Summarize("x", recs, slo, totals, nullptr, nullptr);
  EXPECT_EQ(p.requests, 4);
  EXPECT_EQ(p.succeeded, 3);
  EXPECT_EQ(p.good, 2);  // #1 fails TTFT (0.3 > 0.25) and TPOT
  EXPECT_EQ(p.errors_by_kind.at("rejected"), 1);
  EXPECT_EQ(p.span_s, 10.0);
  EXPECT_DOUBLE_EQ(p.requests_per_s, 0.3);
  EXPECT_DOUBLE_EQ(p.output_tokens_per_s, 4.6);
  EXPECT_DOUBLE_EQ(p.goodput_requests_per_s, 0.2);
  EXPECT_EQ(p.ttft_s.p50, 0.2);
  EXPECT_EQ(p.ttft_s.p99, 0.3);
  EXPECT_EQ(p.e2e_s.p99, 8.0);
  EXPECT_DOUBLE_EQ(p.prefix_hit_rate, 256.0 / 500.0);
  EXPECT_DOUBLE_EQ(p.request_cached_fraction, 256.0 / 400.0);
  EXPECT_DOUBLE_EQ(p.oracle_ratio, 0.64 / 0.8);
  EXPECT_EQ(p.preemptions, 3);
  ASSERT_EQ(p.ttft_cdf.size(), 3u);
  EXPECT_EQ(p.ttft_cdf[0], std::make_pair(0.1, 1.0 / 3));
  EXPECT_EQ(p.ttft_cdf[2], std::make_pair(0.3, 1.0));
}

TEST(GapHistogramTest, BucketEdgesAndMean) {
  GapHistogram h;
  // 10 ms is the lower edge of bucket 400 (1e-6 * 10^(400/100)); use mid-bucket values.
  for (int i = 0; i < 98; ++i) h.Add(0.0101);  // bucket 400: [0.01, 0.010233)
  h.Add(0.101);                                // bucket 500
  h.Add(1.01);                                 // bucket 600
  EXPECT_EQ(h.count(), 100);
  EXPECT_NEAR(h.Mean(), (98 * 0.0101 + 0.101 + 1.01) / 100, 1e-15);
  EXPECT_NEAR(h.Percentile(50), 1e-6 * std::pow(10.0, 4.01), 1e-15);
  EXPECT_NEAR(h.Percentile(99), 1e-6 * std::pow(10.0, 5.01), 1e-14);
  EXPECT_NEAR(h.Percentile(100), 1e-6 * std::pow(10.0, 6.01), 1e-13);
  GapHistogram g;
  g.Add(0.0);  // below the range: bucket 0
  g.Merge(h);
  EXPECT_EQ(g.count(), 101);
  EXPECT_NEAR(g.Percentile(0), GapHistogram::BucketUpperEdge(0), 1e-18);
}

TEST(FleetRecorderTest, MinMaxMeansAndDecimation) {
  FleetRecorder f(3, 2, 4);
  for (int i = 0; i < 10; ++i) {
    const double kv[3] = {0.1 * i / 10, 0.5, 0.2};
    const double waiting[3] = {1, 2, static_cast<double>(i)};
    f.AddSample(i, kv, waiting);
  }
  EXPECT_EQ(f.samples(), 10);
  EXPECT_NEAR(f.KvMinMean(), 0.045, 1e-15);  // min is replica 0: 0.01 * i, i = 0..9
  EXPECT_DOUBLE_EQ(f.KvMaxMean(), 0.5);
  EXPECT_DOUBLE_EQ(f.KvPeak(), 0.5);
  EXPECT_DOUBLE_EQ(f.WaitingMean(), 3 + 4.5);
  EXPECT_DOUBLE_EQ(f.WaitingMax(), 12);
  ASSERT_EQ(f.series().size(), 2u);  // only the first 2 replicas are kept
  // 4 points max: samples 0,1,2,3 -> halve to 0,2 (every 2nd) -> 0,2,4,6 -> halve to 0,4
  // (every 4th) -> 0,4,8.
  EXPECT_EQ(f.series_times(), (std::vector<double>{0, 4, 8}));
  EXPECT_EQ(f.series()[1], (std::vector<double>{0.5, 0.5, 0.5}));
}

TEST(WritersTest, JsonHasTheSchemaFieldsAndMarkdownARow) {
  std::vector<RequestRecord> recs{Rec(0, 0.0, 0.1, 1.1, 11, 100, 32)};
  PolicyReport p = Summarize("kvroute", recs, {}, {100, 32, 0, 0.32}, nullptr, nullptr);
  ReportMeta meta;
  meta.scenario = "t \"q\"";
  meta.info = {{"replicas", "8"}};
  std::vector<PolicyReport> ps{p};
  const std::string json = ReportJson(meta, ps);
  for (const char* field :
       {"\"policy\": \"kvroute\"", "\"requests\": 1", "\"output_tokens_per_s\": 10",
        "\"requests_per_s\"", "\"ttft_p50_s\": 0.1", "\"ttft_p99_s\"", "\"tpot_p50_s\": 0.1",
        "\"e2e_p99_s\"", "\"goodput_requests_per_s\"", "\"prefix_hit_rate\": 0.32",
        "\"oracle_hit_rate\": 0.32", "\"oracle_ratio\": 1", "\"kv_usage_min\"", "\"kv_usage_max\"",
        "\"preemptions\": 0", "\"scenario\": \"t \\\"q\\\"\"", "\"replicas\": \"8\""}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << "\n" << json;
  }
  // One request over a 1.1 s span: 0.91 req/s, 11 / 1.1 = 10 tokens/s.
  const std::string md = ReportMarkdown(meta, ps);
  EXPECT_NE(md.find("| kvroute | 0.91 | 10 | 100 ms |"), std::string::npos) << md;
  const std::string svg = TtftCdfSvg(ps);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(KvUsageSvg(ps).find("</svg>"), std::string::npos);
}

TEST(WritersTest, PdBlockOnlyWhenReported) {
  std::vector<RequestRecord> recs{Rec(0, 0.0, 0.1, 1.1, 11, 100, 32)};
  PolicyReport p = Summarize("kvroute", recs, {}, {}, nullptr, nullptr);
  ReportMeta meta;
  std::vector<PolicyReport> ps{p};
  EXPECT_EQ(ReportJson(meta, ps).find("\"pd\""), std::string::npos);
  EXPECT_EQ(ReportMarkdown(meta, ps).find("Prefill/decode"), std::string::npos);
  PolicyReport& q = ps[0];
  q.pd_reported = true;
  q.pd.decisions = {{"off", 0}, {"short_prompt", 2}, {"disaggregate", 5}};
  q.pd.disaggregated = 5;
  q.pd.pulls = 4;
  q.pd.recomputed = 1;
  q.pd.disaggregated_requests.requests = 5;
  q.pd.disaggregated_requests.ttft_s.mean = 0.25;
  q.pd.disaggregated_requests.itl_mean_s = 0.016;
  q.pd.aggregated_requests.requests = 2;
  q.pd.transfer_s.mean = 0.026;
  q.pd.transfer_s.p99 = 0.026;
  q.pd.roles = {{"prefill", 4, 10.0, 0.5, 0.02}, {"decode", 4, 20.0, 1.0, 0.45}};
  const std::string json = ReportJson(meta, ps);
  for (const char* field :
       {"\"pd\": {", "\"disaggregate\": 5", "\"short_prompt\": 2", "\"disaggregated\": 5",
        "\"pulls\": 4", "\"recomputed\": 1", "\"disaggregated_requests\": {",
        "\"aggregated_requests\": {", "\"transfer_s\": {", "\"role\": \"decode\"",
        "\"kv_usage_mean\": 0.45", "\"utilization\": 0.5"}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << "\n" << json;
  }
  const std::string md = ReportMarkdown(meta, ps);
  EXPECT_NE(md.find("| kvroute | disaggregated | 5 | 250 ms |"), std::string::npos) << md;
  EXPECT_NE(md.find("| kvroute | aggregated | 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("- kvroute: decisions 2 short_prompt, 5 disaggregate; 5 disaggregated (4 "
                    "pulled, transfer mean 26 ms p99 26 ms; 1 recomputed, 0 pull failures); 0 "
                    "prefill retries, 0 local prefills; by role (mean over the run): prefill x4: "
                    "busy 50%, KV 2%; decode x4: busy 100%, KV 45%."),
            std::string::npos)
      << md;
}

}  // namespace
}  // namespace kvroute::report
