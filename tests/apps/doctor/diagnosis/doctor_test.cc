// kvroute doctor's pure half on fixtures and synthetic scrapes, in virtual time: parsing
// (both vLLM fixtures, engine sums, garbage), window figures, quantiles, every rule at its
// threshold, exit codes, and the JSON, text and watch renderings.
#include "apps/doctor/diagnosis/doctor.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "support/test_paths.h"

namespace kvroute::doctor {
namespace {

std::string Fixture(const std::string& name) {
  std::ifstream in(kvroute::test_support::SourceDir() + "/tests/metrics/testdata/" + name,
                   std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
const char* kV010 = "metrics-v0.10-engine-label.txt";
const char* kV06 = "metrics-v0.6-old-names.txt";

// One replica's state, written as vLLM would expose it (engine="0", new names).
struct Fake {
  double running = 1, waiting = 0, kv = 0.2;
  double queries = 0, hits = 0, preemptions = 0, prompt_tokens = 0, gen_tokens = 0, success = 0;
  // Cumulative counts for le = 0.1, 0.5, 1, +Inf.
  std::vector<double> ttft = {0, 0, 0, 0};
  std::vector<double> prompt_len;  // cumulative for le = 10, 100, 1000, +Inf (empty: none)
  std::vector<double> output_len;
  bool caching = true;
  int blocks = 1000;
  int block_size = 16;
};

std::string Hist(const std::string& name, const std::vector<double>& bounds,
                 const std::vector<double>& cum, const std::string& engine = "0") {
  std::string o = "# TYPE " + name + " histogram\n";
  for (size_t i = 0; i < cum.size(); ++i) {
    const std::string le = i < bounds.size() ? std::to_string(bounds[i]) : "+Inf";
    o += name + "_bucket{engine=\"" + engine + "\",le=\"" + le + "\"} " + std::to_string(cum[i]) +
         "\n";
  }
  o += name + "_count{engine=\"" + engine + "\"} " + std::to_string(cum.empty() ? 0 : cum.back()) +
       "\n";
  o += name + "_sum{engine=\"" + engine + "\"} 0\n";
  return o;
}

std::string Text(const Fake& f) {
  auto g = [](const std::string& n, double v) {
    return "# TYPE " + n + " gauge\n" + n + "{engine=\"0\",model_name=\"m\"} " + std::to_string(v) +
           "\n";
  };
  auto c = [](const std::string& n, double v) {
    return "# TYPE " + n + " counter\n" + n + "_total{engine=\"0\",model_name=\"m\"} " +
           std::to_string(v) + "\n";
  };
  std::string o =
      g("vllm:num_requests_running", f.running) + g("vllm:num_requests_waiting", f.waiting) +
      g("vllm:kv_cache_usage_perc", f.kv) + c("vllm:prefix_cache_queries", f.queries) +
      c("vllm:prefix_cache_hits", f.hits) + c("vllm:num_preemptions", f.preemptions) +
      c("vllm:prompt_tokens", f.prompt_tokens) + c("vllm:generation_tokens", f.gen_tokens);
  o += "# TYPE vllm:request_success counter\n";
  o += "vllm:request_success_total{engine=\"0\",finished_reason=\"stop\"} " +
       std::to_string(f.success) + "\n";
  o += "vllm:request_success_total{engine=\"0\",finished_reason=\"length\"} 0\n";
  o += Hist("vllm:time_to_first_token_seconds", {0.1, 0.5, 1}, f.ttft);
  if (!f.prompt_len.empty()) o += Hist("vllm:request_prompt_tokens", {10, 100, 1000}, f.prompt_len);
  if (!f.output_len.empty())
    o += Hist("vllm:request_generation_tokens", {10, 100, 1000}, f.output_len);
  o += std::string(
           "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"") +
       std::to_string(f.block_size) + "\"," +
       "enable_prefix_caching=\"" + (f.caching ? "True" : "False") +
       "\",engine=\"0\",num_gpu_blocks=\"" + std::to_string(f.blocks) + "\"} 1.0\n";
  return o;
}

// A replica scraped twice, `dt` apart: `a` then `b`.
ReplicaHistory Two(const std::string& name, const Fake& a, const Fake& b, double dt = 10) {
  return {name, name + ":8000", {ParseScrape(Text(a), 100), ParseScrape(Text(b), 100 + dt)}};
}

// A replica steady at KV `kv` with `waiting` queued, serving `queries` tokens at `hit` in 10 s.
ReplicaHistory Steady(const std::string& name, double kv, double waiting, double queries = 100000,
                      double hit = 0.8, double preemptions = 0) {
  Fake a, b;
  a.kv = b.kv = kv;
  a.waiting = b.waiting = waiting;
  b.queries = queries;
  b.hits = queries * hit;
  b.preemptions = preemptions;
  return Two(name, a, b);
}

std::vector<std::string> Rules(const Report& r) {
  std::vector<std::string> out;
  for (const Finding& f : r.findings) out.push_back(f.rule);
  return out;
}
bool Has(const Report& r, const std::string& rule) {
  for (const Finding& f : r.findings) {
    if (f.rule == rule) return true;
  }
  return false;
}
const Finding* Get(const Report& r, const std::string& rule) {
  for (const Finding& f : r.findings) {
    if (f.rule == rule) return &f;
  }
  return nullptr;
}

// --- Parsing.

TEST(ParseScrapeTest, V010FixtureReadsEveryFigure) {
  const Scrape s = ParseScrape(Fixture(kV010), 5);
  EXPECT_TRUE(s.reachable);
  EXPECT_TRUE(s.any_engine_series);
  EXPECT_TRUE(s.garbage.empty());
  EXPECT_EQ(s.t_s, 5);
  EXPECT_EQ(s.running, 41);
  EXPECT_EQ(s.waiting, 132);
  EXPECT_DOUBLE_EQ(*s.kv_usage, 0.9812345679012346);
  EXPECT_EQ(s.prefix_queries, 8.2634112e7);
  EXPECT_EQ(s.prefix_hits, 5.784384e6);
  EXPECT_FALSE(s.hit_rate_gauge);
  EXPECT_EQ(s.preemptions, 1874);
  EXPECT_EQ(s.prompt_tokens, 8.2634112e7);
  EXPECT_EQ(s.generation_tokens, 1.1730411e7);
  EXPECT_EQ(s.requests_finished, 15012 + 3141 + 40);
  ASSERT_EQ(s.ttft.upper.size(), 23u);
  EXPECT_EQ(s.ttft.upper[4], 0.04);
  EXPECT_EQ(s.ttft.cumulative[4], 1);
  EXPECT_TRUE(std::isinf(s.ttft.upper.back()));
  EXPECT_EQ(s.ttft.cumulative.back(), 500);
  EXPECT_EQ(s.ttft.count, 500);
  EXPECT_DOUBLE_EQ(s.ttft.sum, 1627.4655051726118);
  EXPECT_TRUE(s.prompt_len.empty());
  EXPECT_EQ(s.block_size, 16);
  EXPECT_EQ(s.num_gpu_blocks, 26304);
  EXPECT_EQ(s.prefix_caching, true);
  EXPECT_EQ(s.model, "meta-llama/Llama-3.1-8B-Instruct");
}

TEST(ParseScrapeTest, V06FixtureReadsOldNamesAndTheHitRateGauge) {
  const Scrape s = ParseScrape(Fixture(kV06), 0);
  EXPECT_TRUE(s.garbage.empty());
  EXPECT_EQ(s.running, 12);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_DOUBLE_EQ(*s.kv_usage, 0.4011);
  EXPECT_DOUBLE_EQ(*s.hit_rate_gauge, 0.07);
  EXPECT_FALSE(s.prefix_queries);
  EXPECT_FALSE(s.prefix_hits);
  EXPECT_EQ(s.preemptions, 0);
  EXPECT_FALSE(s.requests_finished);
  EXPECT_TRUE(s.ttft.empty());
  EXPECT_EQ(s.num_gpu_blocks, 27975);
  EXPECT_EQ(s.prefix_caching, true);
}

TEST(ParseScrapeTest, OldCounterNamesAreRead) {
  const Scrape s = ParseScrape(
      "vllm:gpu_prefix_cache_queries_total{model_name=\"m\"} 200\n"
      "vllm:gpu_prefix_cache_hits_total{model_name=\"m\"} 50\n",
      0);
  EXPECT_EQ(s.prefix_queries, 200);
  EXPECT_EQ(s.prefix_hits, 50);
}

TEST(ParseScrapeTest, SumsOverEnginesAndAveragesKv) {
  std::string t =
      "vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_running{engine=\"1\"} 4\n"
      "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n"
      "vllm:prefix_cache_queries_total{engine=\"0\"} "
      "10\nvllm:prefix_cache_queries_total{engine=\"1\"} 30\n"
      "vllm:cache_config_info{engine=\"0\",block_size=\"16\",num_gpu_blocks=\"100\",enable_prefix_"
      "caching=\"True\"} 1\n"
      "vllm:cache_config_info{engine=\"1\",block_size=\"16\",num_gpu_blocks=\"50\",enable_prefix_"
      "caching=\"True\"} 1\n";
  t += Hist("vllm:request_prompt_tokens", {10, 100}, {1, 2, 3}, "0");
  t += Hist("vllm:request_prompt_tokens", {10, 100}, {0, 5, 6}, "1");
  const Scrape s = ParseScrape(t, 0);
  EXPECT_TRUE(s.garbage.empty());
  EXPECT_EQ(s.running, 7);
  EXPECT_EQ(s.kv_usage, 0.5);
  EXPECT_EQ(s.prefix_queries, 40);
  EXPECT_EQ(s.num_gpu_blocks, 150);
  EXPECT_EQ(s.prompt_len.cumulative, (std::vector<double>{1, 7, 9}));
  EXPECT_EQ(s.prompt_len.count, 9);
}

TEST(ParseScrapeTest, MismatchedBucketBoundsAreGarbage) {
  std::string t = Hist("vllm:request_prompt_tokens", {10, 100}, {1, 2, 3}, "0");
  t += Hist("vllm:request_prompt_tokens", {10, 200}, {1, 2, 3}, "1");
  const Scrape s = ParseScrape(t, 0);
  EXPECT_TRUE(s.prompt_len.empty());
  ASSERT_EQ(s.garbage.size(), 1u);
  EXPECT_EQ(s.garbage[0],
            "vllm:request_prompt_tokens: bucket bounds differ across engines (engine 1)");
}

TEST(ParseScrapeTest, NanInfNegativeAndImplausibleValuesAreUnknownAndNamed) {
  const Scrape s = ParseScrape(
      "vllm:num_requests_running{engine=\"0\"} NaN\n"
      "vllm:num_requests_waiting{engine=\"0\"} +Inf\n"
      "vllm:kv_cache_usage_perc{engine=\"0\"} 1.5\n"
      "vllm:num_preemptions_total{engine=\"0\"} -3\n"
      "vllm:prefix_cache_queries_total{engine=\"0\"} 2e9\n"
      "vllm:prefix_cache_hits_total{engine=\"0\"} 5\n",
      0);
  EXPECT_TRUE(s.any_engine_series);
  EXPECT_FALSE(s.running);
  EXPECT_FALSE(s.waiting);
  EXPECT_FALSE(s.kv_usage);
  EXPECT_FALSE(s.preemptions);
  EXPECT_FALSE(s.prefix_queries);
  EXPECT_EQ(s.prefix_hits, 5);
  ASSERT_EQ(s.garbage.size(), 5u);
  EXPECT_EQ(s.garbage[0], "vllm:num_requests_running = NaN (line 1)");
  EXPECT_EQ(s.garbage[1], "vllm:num_requests_waiting = +Inf (line 2)");
  EXPECT_EQ(s.garbage[2], "vllm:kv_cache_usage_perc = 1.5 (line 3)");
  EXPECT_EQ(s.garbage[3], "vllm:num_preemptions_total = -3 (line 4)");
  EXPECT_EQ(s.garbage[4], "vllm:prefix_cache_queries_total = 2000000000 (line 5)");
}

TEST(ParseScrapeTest, HtmlPageAndBinaryAreNotAnExposition) {
  static constexpr char kPng[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR\xff\xfe";
  for (const std::string& body :
       {std::string(
            "<html><head><title>502 Bad Gateway</title></head>\n<body>nginx</body></html>\n"),
        std::string(kPng, sizeof kPng - 1)}) {
    const Scrape s = ParseScrape(body, 0);
    EXPECT_TRUE(s.reachable);
    EXPECT_FALSE(s.any_engine_series);
    ASSERT_EQ(s.garbage.size(), 1u);
    EXPECT_EQ(s.garbage[0].rfind("not a Prometheus text exposition", 0), 0u) << s.garbage[0];
    EXPECT_FALSE(s.running);
  }
}

TEST(ParseScrapeTest, TruncatedBodyKeepsWhatCameAndNamesTheCutLine) {
  const std::string full = Fixture(kV010);
  const size_t cut = full.find("vllm:kv_cache_usage_perc{engine") + 20;
  const Scrape s = ParseScrape(full.substr(0, cut), 0);
  EXPECT_EQ(s.running, 41);
  EXPECT_EQ(s.waiting, 132);
  EXPECT_FALSE(s.kv_usage);
  ASSERT_EQ(s.garbage.size(), 1u);
  EXPECT_EQ(s.garbage[0].rfind("line 24: missing value", 0), 0u) << s.garbage[0];
}

TEST(ParseScrapeTest, PrefixCachingOffAndNoneBlocks) {
  const Scrape s = ParseScrape(
      "vllm:cache_config_info{block_size=\"32\",enable_prefix_caching=\"False\",num_gpu_blocks="
      "\"None\"} 1\n",
      0);
  EXPECT_EQ(s.prefix_caching, false);
  EXPECT_EQ(s.block_size, 32);
  EXPECT_FALSE(s.num_gpu_blocks);
  EXPECT_TRUE(s.garbage.empty());
}

TEST(ParseScrapeTest, NotVllmAndFailed) {
  const Scrape s = ParseScrape("# TYPE up gauge\nup 1\n", 3);
  EXPECT_TRUE(s.reachable);
  EXPECT_FALSE(s.any_engine_series);
  EXPECT_TRUE(s.garbage.empty());
  const Scrape f = FailedScrape("connect: Connection refused", 4);
  EXPECT_FALSE(f.reachable);
  EXPECT_EQ(f.error, "connect: Connection refused");
  EXPECT_EQ(f.t_s, 4);
}

TEST(ParseScrapeTest, CapacityLabelsNoneIsUnknownAndNonsenseIsGarbage) {
  Scrape s =
      ParseScrape("vllm:cache_config_info{block_size=\"None\",num_gpu_blocks=\"None\"} 1\n", 0);
  EXPECT_FALSE(s.block_size);
  EXPECT_FALSE(s.num_gpu_blocks);
  EXPECT_TRUE(s.garbage.empty());
  s = ParseScrape("vllm:cache_config_info{block_size=\"-16\",num_gpu_blocks=\"lots\"} 1\n", 0);
  EXPECT_FALSE(s.block_size);
  EXPECT_FALSE(s.num_gpu_blocks);
  EXPECT_EQ(s.garbage,
            (std::vector<std::string>{"vllm:cache_config_info block_size=\"-16\" (line 1)",
                                      "vllm:cache_config_info num_gpu_blocks=\"lots\" (line 1)"}));
}

TEST(DiagnoseTest, FleetHitRateUsesWindowsOnlyWhenSomeReplicaHasOne) {
  // b was scraped once (lifetime 7% of 82.6M tokens): mixing it with a's window would
  // let its history drown the window.
  const Report r =
      Diagnose({Steady("a", 0.5, 0, 100000, 0.75), {"b", "b:1", {ParseScrape(Fixture(kV010), 10)}}},
               DoctorOptions{});
  EXPECT_EQ(r.replicas[1].hit_rate_source, "counters-lifetime");
  EXPECT_EQ(r.fleet.hit_rate_source, "counters");
  EXPECT_EQ(r.fleet.hit_rate, 0.75);
  EXPECT_EQ(r.fleet.queried_tokens, 100000);
}

// --- Quantiles.

TEST(HistogramQuantileTest, PrometheusSemantics) {
  Histogram h;
  h.upper = {1, 2, 4, std::numeric_limits<double>::infinity()};
  h.cumulative = {10, 20, 30, 40};
  EXPECT_DOUBLE_EQ(*HistogramQuantile(h, 0.1), 0.4);    // rank 4 in [0, 1]
  EXPECT_DOUBLE_EQ(*HistogramQuantile(h, 0.5), 2.0);    // rank 20: top of [1, 2]
  EXPECT_DOUBLE_EQ(*HistogramQuantile(h, 0.625), 3.0);  // rank 25: middle of [2, 4]
  EXPECT_DOUBLE_EQ(*HistogramQuantile(h, 0.99), 4.0);   // rank 39.6: in +Inf -> highest bound
  Histogram none = h;
  none.cumulative = {0, 0, 0, 0};
  EXPECT_FALSE(HistogramQuantile(none, 0.5));
  EXPECT_FALSE(HistogramQuantile(Histogram{}, 0.5));
}

TEST(HistogramDeltaTest, BucketwiseAndResetIsUnknown) {
  Histogram a, b;
  a.upper = b.upper = {1, std::numeric_limits<double>::infinity()};
  a.cumulative = {1, 2};
  b.cumulative = {4, 8};
  a.count = 2;
  b.count = 8;
  const auto d = HistogramDelta(b, a);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->cumulative, (std::vector<double>{3, 6}));
  EXPECT_EQ(d->count, 6);
  EXPECT_FALSE(HistogramDelta(a, b));
}

// --- Window figures.

TEST(DiagnoseTest, WindowFiguresFromFirstAndLastScrapes) {
  Fake a, mid, b;
  a.kv = 0.25;
  mid.kv = 0.75;
  b.kv = 0.5;
  a.waiting = 0;
  mid.waiting = 3;
  b.waiting = 6;
  a.queries = 1000;
  a.hits = 500;
  b.queries = 101000;
  b.hits = 80500;  // 80,000 of 100,000 in the window
  b.preemptions = 5;
  b.gen_tokens = 2000;
  b.success = 40;
  a.ttft = {0, 0, 0, 0};
  b.ttft = {20, 40, 40, 40};
  ReplicaHistory h{
      "r0", "r0:1", {ParseScrape(Text(a), 0), ParseScrape(Text(mid), 5), ParseScrape(Text(b), 10)}};
  const Report r = Diagnose({h}, DoctorOptions{});
  ASSERT_EQ(r.replicas.size(), 1u);
  const ReplicaFigures& x = r.replicas[0];
  EXPECT_EQ(r.window_s, 10);
  EXPECT_EQ(r.at_s, 10);
  EXPECT_EQ(x.scrapes, 3);
  EXPECT_EQ(x.kv_now, 0.5);
  EXPECT_EQ(x.kv_mean, 0.5);
  EXPECT_EQ(x.kv_max, 0.75);
  EXPECT_EQ(x.waiting, 6);
  EXPECT_EQ(x.waiting_mean, 3);
  EXPECT_EQ(x.hit_rate, 0.8);
  EXPECT_EQ(x.hit_rate_source, "counters");
  EXPECT_EQ(x.queried_tokens, 100000);
  EXPECT_EQ(x.preemptions_per_s, 0.5);
  EXPECT_EQ(x.tokens_per_s, 200);
  EXPECT_EQ(x.requests_per_s, 4);
  EXPECT_DOUBLE_EQ(*x.ttft_s.p50, 0.1);  // rank 20 of 40: top of the first bucket
  EXPECT_DOUBLE_EQ(*x.ttft_s.p99, 0.5 - 0.4 * (0.4 / 20));  // rank 39.6 in (0.1, 0.5]
  EXPECT_EQ(r.fleet.hit_rate, 0.8);
  EXPECT_EQ(r.fleet.hit_rate_source, "counters");
  EXPECT_EQ(r.fleet.preemptions_per_s, 0.5);
  EXPECT_EQ(r.fleet.ttft_s.p50, x.ttft_s.p50);
}

TEST(DiagnoseTest, CounterResetMakesThatRateUnknown) {
  Fake a, b;
  a.preemptions = 100;
  b.preemptions = 5;  // restarted
  a.queries = 5000;
  b.queries = 20000;
  b.hits = 10000;
  a.ttft = {5, 5, 5, 5};
  b.ttft = {1, 1, 1, 1};
  const Report r = Diagnose({Two("r0", a, b)}, DoctorOptions{});
  EXPECT_FALSE(r.replicas[0].preemptions_per_s);
  EXPECT_FALSE(r.fleet.preemptions_per_s);
  EXPECT_EQ(r.replicas[0].hit_rate, 10000.0 / 15000);
  EXPECT_FALSE(r.replicas[0].ttft_s.p50);
  EXPECT_FALSE(Has(r, "preemptions"));
}

TEST(DiagnoseTest, OneScrapeUsesLifetimeCounters) {
  const Report r = Diagnose({{"a", "a:1", {ParseScrape(Fixture(kV010), 7)}}}, DoctorOptions{});
  const ReplicaFigures& x = r.replicas[0];
  EXPECT_EQ(r.window_s, 0);
  EXPECT_EQ(x.hit_rate_source, "counters-lifetime");
  EXPECT_DOUBLE_EQ(*x.hit_rate, 5.784384e6 / 8.2634112e7);
  EXPECT_FALSE(x.preemptions_per_s);
  EXPECT_FALSE(x.tokens_per_s);
  EXPECT_FALSE(x.requests_per_s);
  EXPECT_DOUBLE_EQ(*x.ttft_s.p50, 1.0 + 1.5 * (250.0 - 193) / 140);  // rank 250 in (1, 2.5]
  EXPECT_EQ(r.fleet.hit_rate_source, "counters-lifetime");
}

// --- The article's tell, and the exit codes.

TEST(DiagnoseTest, TheArticlesTellFromTheRealFixtures) {
  // One replica at 41 running, 132 waiting, KV 98%, hit rate 7%; its sibling (old vLLM)
  // at 40% KV with an empty queue and the same 7%.
  const Report r = Diagnose({{"hot", "10.0.0.1:8000", {ParseScrape(Fixture(kV010), 0)}},
                             {"cold", "10.0.0.2:8000", {ParseScrape(Fixture(kV06), 0)}}},
                            DoctorOptions{});
  EXPECT_EQ(Rules(r),
            (std::vector<std::string>{"prefix-reuse-lost", "lopsided-kv", "queue-imbalance"}));
  EXPECT_EQ(r.ExitCode(), 1);
  const Finding* lop = Get(r, "lopsided-kv");
  EXPECT_EQ(lop->replicas, (std::vector<std::string>{"hot", "cold"}));
  EXPECT_EQ(lop->summary,
            "in 1 of 1 scrape rounds (100.0%) a replica was under pressure while a sibling "
            "idled; worst at t=0.0s: hot at 98.1% KV with 132.0 waiting, cold at 40.1% with 0.0 "
            "waiting (58.0 points apart)");
  EXPECT_TRUE(lop->routing);
  const Finding* lost = Get(r, "prefix-reuse-lost");
  EXPECT_EQ(lost->summary,
            "fleet prefix-cache hit rate 7.0% over 82.63M queried tokens since start "
            "(counters-lifetime source)");
  EXPECT_NE(lost->remedy.find("scheduling: {policy: kvroute}"), std::string::npos);
  EXPECT_NE(lost->remedy.find("if the traffic shares prefixes"), std::string::npos);
  EXPECT_EQ(lost->replicas, (std::vector<std::string>{"hot", "cold"}));
  const std::string text = ReportText(r);
  EXPECT_NE(text.find("FINDING lopsided-kv: in 1 of 1 scrape rounds"), std::string::npos) << text;
  EXPECT_NE(text.find("  rule: in >= 20.0% of scrape rounds: a replica with waiting >= 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  fix: pick by KV and queue"), std::string::npos) << text;
}

TEST(DiagnoseTest, TheArticlesTellOverAWindow) {
  Fake a, b, c, d;
  a.running = b.running = 41;
  a.waiting = b.waiting = 132;
  a.kv = b.kv = 0.98;
  b.queries = 1000000;
  b.hits = 70000;
  c.running = d.running = 12;
  c.kv = d.kv = 0.4;
  d.queries = 200000;
  d.hits = 14000;
  const Report r = Diagnose({Two("r1", a, b, 30), Two("r2", c, d, 30)}, DoctorOptions{});
  EXPECT_TRUE(Has(r, "prefix-reuse-lost"));
  EXPECT_TRUE(Has(r, "lopsided-kv"));
  EXPECT_DOUBLE_EQ(*r.fleet.hit_rate, 0.07);
  EXPECT_EQ(r.fleet.queried_tokens, 1200000);
  EXPECT_DOUBLE_EQ(*r.fleet.kv_spread, 0.98 - 0.4);
  EXPECT_EQ(r.ExitCode(), 1);
}

TEST(DiagnoseTest, HealthyFleetExitsZero) {
  const Report r = Diagnose({Steady("a", 0.5, 0), Steady("b", 0.6, 0.5)}, DoctorOptions{});
  EXPECT_TRUE(r.findings.empty()) << ReportText(r);
  EXPECT_TRUE(r.readable);
  EXPECT_EQ(r.ExitCode(), 0);
  EXPECT_NE(ReportText(r).find("healthy: no findings"), std::string::npos);
}

TEST(DiagnoseTest, AllUnreachableExitsTwo) {
  const Report r = Diagnose({{"a",
                              "a:1",
                              {FailedScrape("connect: Connection refused", 0),
                               FailedScrape("connect: Connection refused", 5)}},
                             {"b", "b:1", {FailedScrape("HTTP 503", 5)}}},
                            DoctorOptions{});
  EXPECT_FALSE(r.readable);
  EXPECT_EQ(r.ExitCode(), 2);
  EXPECT_EQ(Rules(r), (std::vector<std::string>{"unreachable"}));
  EXPECT_EQ(r.findings[0].severity, "error");
  EXPECT_EQ(r.findings[0].replicas, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.replicas[0].failures, 2);
  EXPECT_EQ(r.replicas[1].error, "HTTP 503");
  EXPECT_EQ(Diagnose({}, DoctorOptions{}).ExitCode(), 2);
}

TEST(DiagnoseTest, UnreachableGarbageAndNotVllmAreFindings) {
  ReplicaHistory down{"down", "d:1", {ParseScrape(Text(Fake{}), 0), FailedScrape("timeout", 10)}};
  ReplicaHistory html{
      "html", "h:1", {ParseScrape("<html><body>login</body></html>\n<p>x</p>\n", 10)}};
  ReplicaHistory other{"other", "o:1", {ParseScrape("up 1\n", 10)}};
  const Report r = Diagnose({Steady("ok", 0.5, 0), down, html, other}, DoctorOptions{});
  EXPECT_EQ(Rules(r), (std::vector<std::string>{"unreachable", "not-vllm", "garbage-metrics"}));
  EXPECT_EQ(Get(r, "unreachable")->replicas, (std::vector<std::string>{"down"}));
  EXPECT_EQ(Get(r, "unreachable")->summary,
            "1 of 4 replicas unreachable at the last scrape (down: timeout)");
  EXPECT_EQ(Get(r, "not-vllm")->replicas, (std::vector<std::string>{"html", "other"}));
  EXPECT_EQ(Get(r, "garbage-metrics")->replicas, (std::vector<std::string>{"html"}));
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_EQ(r.fleet.reachable, 3);
}

// --- Each rule at its threshold.

TEST(RuleTest, PrefixReuseLostAtItsThresholds) {
  DoctorOptions o;
  EXPECT_FALSE(Has(Diagnose({Steady("a", 0.5, 0, 100000, 0.5)}, o), "prefix-reuse-lost"));
  EXPECT_TRUE(Has(Diagnose({Steady("a", 0.5, 0, 100000, 0.25)}, o), "prefix-reuse-lost"));
  EXPECT_FALSE(Has(Diagnose({Steady("a", 0.5, 0, 9999, 0.25)}, o), "prefix-reuse-lost"));
  EXPECT_TRUE(Has(Diagnose({Steady("a", 0.5, 0, 10000, 0.25)}, o), "prefix-reuse-lost"));
  const Report at = Diagnose({Steady("a", 0.5, 0, 10000, 0.25)}, o);
  const Finding* f = Get(at, "prefix-reuse-lost");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->condition,
            "fleet hit rate < 50.0% with >= 10000 tokens queried and prefix caching on");
  EXPECT_EQ(f->summary,
            "fleet prefix-cache hit rate 25.0% over 10.0k queried tokens in the window (counters "
            "source)");
  o.low_hit_rate = 0.2;
  EXPECT_FALSE(Has(Diagnose({Steady("a", 0.5, 0, 100000, 0.25)}, o), "prefix-reuse-lost"));
}

TEST(RuleTest, PrefixCachingOffReplacesTheHitRateRule) {
  ReplicaHistory off = Steady("a", 0.5, 0, 100000, 0.0);
  for (Scrape& s : off.scrapes) s.prefix_caching = false;
  const Report r = Diagnose({off, Steady("b", 0.5, 0, 100000, 0.1)}, DoctorOptions{});
  EXPECT_EQ(Rules(r), (std::vector<std::string>{"prefix-caching-off"}));
  EXPECT_EQ(r.findings[0].replicas, (std::vector<std::string>{"a"}));
  EXPECT_NE(r.findings[0].remedy.find("--enable-prefix-caching"), std::string::npos);
  // From the exposition itself.
  Fake f;
  f.caching = false;
  EXPECT_TRUE(Has(Diagnose({Two("c", f, f)}, DoctorOptions{}), "prefix-caching-off"));
}

TEST(RuleTest, LopsidedKvNeedsSpreadPressureAndAnIdleSibling) {
  DoctorOptions o;
  o.kv_spread = 0.25;
  // Hot by queue (KV below kv_hot): mean waiting 2 on the hot one, 0.5 on the cold one.
  EXPECT_TRUE(Has(Diagnose({Steady("h", 0.75, 2), Steady("c", 0.5, 0.5)}, o), "lopsided-kv"));
  // Spread just below.
  o.kv_spread = 0.26;
  EXPECT_FALSE(Has(Diagnose({Steady("h", 0.75, 2), Steady("c", 0.5, 0.5)}, o), "lopsided-kv"));
  o.kv_spread = 0.25;
  // No pressure on the hot one: uneven KV alone (a prefix-affine router's normal state).
  EXPECT_FALSE(Has(Diagnose({Steady("h", 0.75, 1.5), Steady("c", 0.5, 0)}, o), "lopsided-kv"));
  EXPECT_TRUE(Diagnose({Steady("h", 0.85, 0), Steady("c", 0.25, 0)}, o).findings.empty());
  // The cold one queues too: not lopsided, the fleet is busy.
  EXPECT_FALSE(Has(Diagnose({Steady("h", 0.75, 2), Steady("c", 0.5, 0.75)}, o), "lopsided-kv"));
  // A full cache with no queue is not pressure (vLLM keeps its batch there by design)...
  EXPECT_FALSE(Has(Diagnose({Steady("h", 0.9375, 0), Steady("c", 0.5, 0)}, o), "lopsided-kv"));
  // ... at kv_hot with a queue forming (waiting above queue_idle) it is.
  EXPECT_TRUE(Has(Diagnose({Steady("h", 0.9375, 1), Steady("c", 0.5, 0)}, o), "lopsided-kv"));
  // Hot by a preemption since its previous scrape, KV and queue fine: the second of the
  // two rounds is lopsided, 1 of 2 >= 20%.
  const Report pre =
      Diagnose({Steady("h", 0.75, 0, 100000, 0.8, 2), Steady("c", 0.5, 0)}, o);
  EXPECT_TRUE(Has(pre, "lopsided-kv"));
  EXPECT_EQ(pre.fleet.rounds, 2);
  EXPECT_EQ(pre.fleet.lopsided_rounds, 1);
  // The cold one above kv_cold.
  o.kv_cold = 0.4;
  EXPECT_FALSE(Has(Diagnose({Steady("h", 0.9375, 1), Steady("c", 0.5, 0)}, o), "lopsided-kv"));
}

// Replicas scraped once per round, 1 s apart: kv[i][k] and waiting[i][k] in round k.
std::vector<ReplicaHistory> Rounds(const std::vector<std::vector<double>>& kv,
                                   const std::vector<std::vector<double>>& waiting) {
  std::vector<ReplicaHistory> out;
  for (size_t i = 0; i < kv.size(); ++i) {
    ReplicaHistory h{"r" + std::to_string(i), "r" + std::to_string(i) + ":8000", {}};
    for (size_t k = 0; k < kv[i].size(); ++k) {
      Fake f;
      f.kv = kv[i][k];
      f.waiting = waiting[i][k];
      f.queries = 100000.0 * k;
      f.hits = 80000.0 * k;
      h.scrapes.push_back(ParseScrape(Text(f), static_cast<double>(k)));
    }
    out.push_back(std::move(h));
  }
  return out;
}

TEST(RuleTest, LopsidedKvSeesRoundRobinsMomentsThatWindowMeansHide) {
  // Round-robin's pattern: every replica gets the same mix, so over the window each one's
  // mean KV and queue are the same; at each moment, one holds the long answers and queues
  // while the others idle. Round k: replica k % 3 at 90% KV with 4 waiting.
  std::vector<std::vector<double>> kv(3), waiting(3);
  for (int k = 0; k < 6; ++k) {
    for (int i = 0; i < 3; ++i) {
      kv[i].push_back(k % 3 == i ? 0.9 : 0.3);
      waiting[i].push_back(k % 3 == i ? 4 : 0);
    }
  }
  const Report r = Diagnose(Rounds(kv, waiting), DoctorOptions{});
  EXPECT_NEAR(*r.fleet.kv_spread, 0.0, 1e-12);  // the window means are even
  EXPECT_FALSE(Has(r, "queue-imbalance"));    // and so are the mean queues
  ASSERT_TRUE(Has(r, "lopsided-kv")) << ReportText(r);
  EXPECT_EQ(r.fleet.rounds, 6);
  EXPECT_EQ(r.fleet.lopsided_rounds, 6);
  // The first worst round (all tie at 60 points): round 0, r0 hot, r1 the coldest first seen.
  EXPECT_EQ(Get(r, "lopsided-kv")->replicas, (std::vector<std::string>{"r0", "r1"}));
}

TEST(RuleTest, LopsidedKvNeedsItsShareOfRounds) {
  // Two replicas, 10 rounds; r0 is pressured in the first `n` rounds only.
  auto run = [](int n) {
    std::vector<std::vector<double>> kv(2), waiting(2);
    for (int k = 0; k < 10; ++k) {
      kv[0].push_back(k < n ? 0.9 : 0.3);
      waiting[0].push_back(k < n ? 3 : 0);
      kv[1].push_back(0.3);
      waiting[1].push_back(0);
    }
    return Diagnose(Rounds(kv, waiting), DoctorOptions{});
  };
  EXPECT_FALSE(Has(run(0), "lopsided-kv"));
  EXPECT_FALSE(Has(run(1), "lopsided-kv"));  // 10% < 20%
  const Report two = run(2);                  // 20%
  EXPECT_TRUE(Has(two, "lopsided-kv"));
  EXPECT_EQ(two.fleet.lopsided_rounds, 2);
  EXPECT_EQ(two.fleet.rounds, 10);
}

TEST(RuleTest, QueueImbalanceAtItsThresholds) {
  DoctorOptions o;
  EXPECT_TRUE(Has(Diagnose({Steady("b", 0.5, 2), Steady("i", 0.5, 0.5)}, o), "queue-imbalance"));
  EXPECT_FALSE(
      Has(Diagnose({Steady("b", 0.5, 1.75), Steady("i", 0.5, 0.5)}, o), "queue-imbalance"));
  EXPECT_FALSE(Has(Diagnose({Steady("b", 0.5, 2), Steady("i", 0.5, 0.75)}, o), "queue-imbalance"));
  const Report r = Diagnose({Steady("b", 0.5, 2), Steady("i", 0.5, 0.5)}, o);
  EXPECT_EQ(Get(r, "queue-imbalance")->replicas, (std::vector<std::string>{"b", "i"}));
  EXPECT_EQ(Get(r, "queue-imbalance")->condition,
            "some replica's mean waiting >= 2 while another's <= 0.5");
}

TEST(RuleTest, PreemptionsAboveTheRateNameTheReplicas) {
  DoctorOptions o;
  // 1 in 10 s is 0.1/s: not above.
  EXPECT_FALSE(Has(Diagnose({Steady("a", 0.5, 0, 100000, 0.8, 1)}, o), "preemptions"));
  const Report r = Diagnose({Steady("a", 0.5, 0, 100000, 0.8, 2), Steady("b", 0.5, 0)}, o);
  EXPECT_EQ(Rules(r), (std::vector<std::string>{"preemptions"}));
  EXPECT_EQ(r.findings[0].replicas, (std::vector<std::string>{"a"}));
  EXPECT_EQ(r.findings[0].summary, "preempting: a 0.20/s");
  EXPECT_EQ(r.fleet.preempting, (std::vector<std::string>{"a"}));
  EXPECT_NE(r.findings[0].remedy.find("flow: {enabled: true}"), std::string::npos);
}

TEST(RuleTest, UnknownFiguresNeverFire) {
  Fake a, b;
  a.kv = b.kv = 0.99;
  a.waiting = b.waiting = 50;
  std::string ta = Text(a), tb = Text(b);
  // The cold sibling's KV and waiting are garbage: lopsided/queue rules cannot use it.
  Fake c;
  std::string tc = Text(c);
  auto nan = [](std::string t) {
    for (const char* n : {"vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} ",
                          "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} "}) {
      const size_t at = t.find(n) + std::string(n).size();
      t.replace(at, t.find('\n', at) - at, "NaN");
    }
    return t;
  };
  const Report r = Diagnose({{"h", "h:1", {ParseScrape(ta, 0), ParseScrape(tb, 10)}},
                             {"c", "c:1", {ParseScrape(nan(tc), 0), ParseScrape(nan(tc), 10)}}},
                            DoctorOptions{});
  EXPECT_EQ(Rules(r), (std::vector<std::string>{"garbage-metrics"}));
  EXPECT_FALSE(r.fleet.waiting_total);
  EXPECT_EQ(r.fleet.kv_max, 0.99);
}

// --- Renderings.

TEST(RenderTest, JsonParsesWithTheSchemaAndNullsForUnknowns) {
  ReplicaHistory down{"down \"x\"\n", "d:1", {FailedScrape("connect: refused \xff\x01", 0)}};
  const Report r = Diagnose({{"hot", "h:1", {ParseScrape(Fixture(kV010), 0)}},
                             {"cold", "c:1", {ParseScrape(Fixture(kV06), 0)}},
                             down},
                            DoctorOptions{});
  const std::string json = ReportJson(r);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(json).get(doc), simdjson::SUCCESS) << json;
  EXPECT_EQ(std::string_view(doc["schema"]), "kvroute-doctor/1");
  EXPECT_EQ(int64_t(doc["exit_code"]), 1);
  EXPECT_EQ(bool(doc["healthy"]), false);
  EXPECT_EQ(bool(doc["readable"]), true);
  EXPECT_EQ(double(doc["window"]["intended_s"]), 30);
  EXPECT_EQ(double(doc["window"]["actual_s"]), 0);
  simdjson::dom::array reps = doc["replicas"];
  ASSERT_EQ(reps.size(), 3u);
  simdjson::dom::element hot = reps.at(0);
  EXPECT_EQ(std::string_view(hot["name"]), "hot");
  EXPECT_EQ(double(hot["running"]), 41);
  EXPECT_EQ(double(hot["kv"]["now"]), 0.9812345679012346);
  EXPECT_TRUE(hot["preemptions_per_s"].is_null());  // one scrape: no rate
  EXPECT_EQ(std::string_view(hot["hit_rate_source"]), "counters-lifetime");
  EXPECT_EQ(int64_t(hot["num_gpu_blocks"]), 26304);
  EXPECT_EQ(bool(hot["prefix_caching"]), true);
  simdjson::dom::element cold = reps.at(1);
  EXPECT_TRUE(cold["ttft_s"]["p50"].is_null());
  EXPECT_EQ(std::string_view(cold["hit_rate_source"]), "gauge");
  simdjson::dom::element d = reps.at(2);
  EXPECT_EQ(std::string_view(d["name"]), "down \"x\"\n");
  EXPECT_EQ(std::string_view(d["error"]), "connect: refused \xef\xbf\xbd\x01");
  EXPECT_TRUE(d["kv"]["mean"].is_null());
  EXPECT_TRUE(d["running"].is_null());
  EXPECT_TRUE(d["prefix_caching"].is_null());
  simdjson::dom::element fleet = doc["fleet"];
  EXPECT_EQ(int64_t(fleet["replicas"]), 3);
  EXPECT_EQ(int64_t(fleet["reachable"]), 2);
  EXPECT_DOUBLE_EQ(double(fleet["kv"]["spread"]), 0.9812345679012346 - 0.4011);
  EXPECT_TRUE(fleet["tokens_per_s"].is_null());
  EXPECT_TRUE(fleet["ttft_s"]["p50"].is_null());  // the old replica has no histogram
  simdjson::dom::array findings = doc["findings"];
  ASSERT_EQ(findings.size(), 4u);
  EXPECT_EQ(std::string_view(findings.at(0)["rule"]), "unreachable");
  EXPECT_EQ(std::string_view(findings.at(0)["severity"]), "error");
  EXPECT_EQ(bool(findings.at(2)["routing"]), true);
  EXPECT_EQ(simdjson::dom::array(findings.at(2)["replicas"]).size(), 2u);
  for (const char* key : {"summary", "condition", "remedy"}) {
    EXPECT_FALSE(std::string_view(findings.at(1)[key]).empty());
  }
  // Healthy and empty reports are valid JSON too.
  ASSERT_EQ(parser.parse(ReportJson(Diagnose({}, DoctorOptions{}))).get(doc), simdjson::SUCCESS);
  EXPECT_EQ(int64_t(doc["exit_code"]), 2);
  EXPECT_EQ(simdjson::dom::array(doc["findings"]).size(), 0u);
}

// The schema's keys, exactly (docs/DOCTOR.md, "JSON"): a rename is a schema change.
TEST(RenderTest, JsonHasExactlyTheDocumentedKeys) {
  const Report r = Diagnose({Steady("a", 0.5, 3), Steady("b", 0.5, 0)}, DoctorOptions{});
  const std::string json = ReportJson(r);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(json).get(doc), simdjson::SUCCESS) << json;
  auto keys = [](simdjson::dom::object o) {
    std::vector<std::string> out;
    for (auto field : o) out.emplace_back(field.key);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(keys(doc), (V{"schema", "window", "replicas", "fleet", "router", "findings",
                          "readable", "healthy", "exit_code"}));
  EXPECT_EQ(keys(doc["window"]), (V{"intended_s", "actual_s", "at_s"}));
  EXPECT_EQ(keys(simdjson::dom::array(doc["replicas"]).at(0)),
            (V{"name",           "address",
               "reachable",      "error",
               "scrapes",        "failures",
               "running",        "waiting",
               "waiting_mean",   "kv",
               "hit_rate",       "hit_rate_source",
               "queried_tokens", "preemptions_per_s",
               "tokens_per_s",   "requests_per_s",
               "ttft_s",         "prefix_caching",
               "block_size",     "num_gpu_blocks",
               "garbage",        "kv_events"}));
  EXPECT_EQ(keys(doc["replicas"].at(0)["kv"]), (V{"now", "mean", "max"}));
  EXPECT_EQ(keys(doc["replicas"].at(0)["ttft_s"]), (V{"p50", "p99"}));
  EXPECT_EQ(keys(doc["fleet"]), (V{"replicas", "reachable", "hit_rate", "hit_rate_source",
                                   "queried_tokens", "kv", "rounds", "lopsided_rounds",
                                   "waiting", "preemptions_per_s",
                                   "preempting", "tokens_per_s", "requests_per_s", "ttft_s"}));
  EXPECT_EQ(keys(doc["fleet"]["kv"]), (V{"min", "max", "spread"}));
  EXPECT_EQ(keys(doc["fleet"]["waiting"]), (V{"total", "min_mean", "max_mean"}));
  ASSERT_EQ(simdjson::dom::array(doc["findings"]).size(), 1u);  // queue-imbalance
  EXPECT_EQ(keys(doc["findings"].at(0)),
            (V{"rule", "severity", "routing", "summary", "condition", "remedy", "replicas"}));
  EXPECT_EQ(double(doc["fleet"]["waiting"]["total"]), 3);
}

TEST(RenderTest, TextTableShowsDashesForUnknowns) {
  const Report r = Diagnose({{"hot", "h:1", {ParseScrape(Fixture(kV010), 0)}},
                             {"down", "d:1", {FailedScrape("HTTP 503", 0)}}},
                            DoctorOptions{});
  const std::string t = ReportText(r);
  EXPECT_NE(t.find("replica  up running waiting    KV  mean   max    hit preempt/s TTFTp50 TTFTp99 "
                   "   tok/s prefix\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("hot     yes      41     132   98%   98%   98%   7.0%         -   1.61s  35.56s "
                   "       -     on\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("down     NO       -       -     -     -     -      -         -       -       - "
                   "       -      -\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("  down: HTTP 503\n"), std::string::npos) << t;
  EXPECT_NE(t.find("\nfleet: hit rate 7.0% (counters-lifetime), KV min 98% max 98%"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("FINDING unreachable (error): 1 of 2 replicas"), std::string::npos) << t;
}

TEST(RenderTest, WatchViewFitsTheWidthAndDrawsTheKvBar) {
  const Report r =
      Diagnose({Steady("replica-0", 0.5, 3),
                Steady("replica-1", 0.25, 0),
                {"replica-2", "x:1", {FailedScrape("connect: Connection refused", 10)}}},
               DoctorOptions{});
  for (int width : {40, 80, 132}) {
    const std::string v = WatchView(r, width);
    size_t start = 0;
    int lines = 0;
    while (start < v.size()) {
      const size_t end = v.find('\n', start);
      EXPECT_LE(end - start, static_cast<size_t>(width)) << v.substr(start, end - start);
      start = end + 1;
      ++lines;
    }
    EXPECT_GE(lines, 4);
  }
  const std::string v = WatchView(r, 100);
  EXPECT_NE(v.find("replica-0 [###############...............]  50% wait    3 run    1 hit  80.0% "
                   "pre  0.00"),
            std::string::npos)
      << v;
  EXPECT_NE(v.find("replica-2 ["), std::string::npos);
  EXPECT_NE(v.find("DOWN connect: Connection refused"), std::string::npos) << v;
}

// --- Scenario text (its loading and running is tests/apps/simulate/doctor_scenario_test.cc).

TEST(ScenarioYamlTest, NoRequestsIsAnError) {
  std::string error;
  const Report one = Diagnose({{"a", "a:1", {ParseScrape(Fixture(kV010), 0)}}}, DoctorOptions{});
  EXPECT_EQ(ScenarioYaml(one, {{"a", "a:1", {ParseScrape(Fixture(kV010), 0)}}}, &error), "");
  EXPECT_EQ(error.rfind("no requests in the window", 0), 0u) << error;
}

TEST(ScenarioYamlTest, LengthsFromTheRequestSizeHistograms) {
  Fake a, b;
  a.prompt_len = {0, 0, 0, 0};
  a.output_len = {0, 0, 0, 0};
  b.prompt_len = {0, 30, 40, 40};   // 30 in (10, 100], 10 in (100, 1000]
  b.output_len = {40, 40, 40, 40};  // all in [0, 10]
  b.success = 40;
  b.queries = 100000;
  b.hits = 25000;
  std::vector<ReplicaHistory> hs = {Two("a", a, b)};
  const Report r = Diagnose(hs, DoctorOptions{});
  std::string error = "x";
  const std::string y = ScenarioYaml(r, hs, &error);
  EXPECT_EQ(error, "");
  EXPECT_NE(y.find("  type: shared-prefix\n"), std::string::npos) << y;
  EXPECT_NE(y.find("  rate: 4.000\n  num_requests: 240\n"), std::string::npos) << y;
  EXPECT_NE(y.find("      - {weight: 0.7500, min: 8, max: 75, mean: 41.6, std_dev: 16.7}\n"),
            std::string::npos)
      << y;
  EXPECT_NE(y.find("  output_len:\n    mixture:\n      - {weight: 1.0000, min: 1, max: 10, mean: "
                   "5.5, std_dev: 2.2}\n"),
            std::string::npos)
      << y;
  EXPECT_NE(y.find("  kv_blocks: 1000"), std::string::npos) << y;
  EXPECT_NE(y.find("policies: [round-robin, kvroute]\n"), std::string::npos) << y;
}

// --- KV-cache events: what the event probe saw against what the scrapes say was computed.

// A replica scraped at t = 0, 1, 2, ... with cumulative prompt tokens prompt[i] (and
// prefix-cache hits hits[i], 0 when not given), its KV events probed at tcp://<name>:5557:
// one batch storing blocks of `event_block` tokens at each of `batch_times`.
ReplicaHistory Probed(const std::string& name, const std::vector<double>& prompt,
                      const std::vector<double>& batch_times, int32_t event_block = 16,
                      const std::vector<double>& hits = {}, int cache_block = 16) {
  ReplicaHistory h{name, name + ":8000", {}, EventProbe{}};
  for (size_t i = 0; i < prompt.size(); ++i) {
    Fake f;
    f.prompt_tokens = f.queries = prompt[i];
    f.hits = i < hits.size() ? hits[i] : 0;
    f.block_size = cache_block;
    h.scrapes.push_back(ParseScrape(Text(f), static_cast<double>(i)));
  }
  h.events->address = "tcp://" + name + ":5557";
  for (double t : batch_times) h.events->batches.push_back(EventBatchSeen{t, {event_block}});
  return h;
}

TEST(DoctorKvEvents, SilentWhenTokensWereComputedAndNoBatchCame) {
  const Report r = Diagnose({Probed("a", {0, 100, 200, 300, 400}, {}),
                             Probed("b", {0, 100, 200, 300, 400}, {0.5, 1.5, 2.5, 3.5})},
                            DoctorOptions{});
  ASSERT_EQ(Rules(r), std::vector<std::string>{"kv-events-silent"});
  EXPECT_EQ(r.ExitCode(), 1);
  const Finding* f = Get(r, "kv-events-silent");
  EXPECT_EQ(f->replicas, std::vector<std::string>{"a"});
  EXPECT_EQ(f->severity, "warning");
  EXPECT_FALSE(f->routing);
  EXPECT_NE(f->summary.find("a (tcp://a:5557) published no batch in 4.0s while it computed 400.0 "
                            "prompt tokens (25.0 blocks of 16)"),
            std::string::npos)
      << f->summary;
  EXPECT_NE(f->remedy.find("enable_kv_cache_events"), std::string::npos);
  EXPECT_NE(f->remedy.find("firewall"), std::string::npos);
  EXPECT_NE(f->remedy.find("approximate model"), std::string::npos);
  ASSERT_TRUE(r.replicas[0].events.has_value());
  EXPECT_EQ(r.replicas[0].events->batches, 0);
  EXPECT_EQ(r.replicas[0].events->tokens_computed, 400.0);
  EXPECT_EQ(r.replicas[1].events->batches, 4);
  EXPECT_EQ(r.replicas[1].events->last_batch_s, 3.5);
  EXPECT_EQ(r.replicas[1].events->block_sizes, std::vector<int32_t>{16});
}

TEST(DoctorKvEvents, SilentNeedsOneBlockOfComputedTokens) {
  // 15 new tokens: not a full block, so not a block the engine must have stored.
  EXPECT_TRUE(Diagnose({Probed("a", {0, 15}, {})}, DoctorOptions{}).findings.empty());
  EXPECT_TRUE(Has(Diagnose({Probed("a", {0, 16}, {})}, DoctorOptions{}), "kv-events-silent"));
  // The replica's own block size sets the block: 32 tokens of a 64-token block are not one.
  EXPECT_TRUE(Diagnose({Probed("a", {0, 32}, {}, 64, {}, 64)}, DoctorOptions{}).findings.empty());
  DoctorOptions o;
  o.event_min_blocks = 4;
  EXPECT_TRUE(Diagnose({Probed("a", {0, 63}, {})}, o).findings.empty());
  EXPECT_TRUE(Has(Diagnose({Probed("a", {0, 64}, {})}, o), "kv-events-silent"));
}

TEST(DoctorKvEvents, CachedPromptTokensAreNotComputed) {
  // 1,000 prompt tokens, 995 of them prefix-cache hits: 5 computed, nothing to store.
  EXPECT_TRUE(
      Diagnose({Probed("a", {0, 1000}, {}, 16, {0, 995})}, DoctorOptions{}).findings.empty());
  const Report r = Diagnose({Probed("a", {0, 1000}, {}, 16, {0, 984})}, DoctorOptions{});
  EXPECT_TRUE(Has(r, "kv-events-silent"));
  EXPECT_EQ(r.replicas[0].events->tokens_computed, 16.0);
}

TEST(DoctorKvEvents, NoRuleOnUnknownOrUnconfigured) {
  // Not configured: no probe, no event rule, kv_events null in JSON.
  ReplicaHistory plain = Probed("a", {0, 400}, {});
  plain.events.reset();
  Report r = Diagnose({plain}, DoctorOptions{});
  EXPECT_TRUE(r.findings.empty());
  EXPECT_FALSE(r.replicas[0].events.has_value());
  EXPECT_NE(ReportJson(r).find("\"kv_events\": null"), std::string::npos);
  // A counter that went down (a restart): the computed tokens are unknown.
  r = Diagnose({Probed("a", {500, 100}, {})}, DoctorOptions{});
  EXPECT_TRUE(r.findings.empty());
  EXPECT_FALSE(r.replicas[0].events->tokens_computed.has_value());
  // One scrape: no window.
  EXPECT_TRUE(Diagnose({Probed("a", {400}, {})}, DoctorOptions{}).findings.empty());
  // Unreachable at the end: the usable scrapes still bound the window.
  ReplicaHistory down = Probed("a", {0, 100}, {});
  down.scrapes.push_back(FailedScrape("connect: Connection refused", 2));
  r = Diagnose({down}, DoctorOptions{});
  EXPECT_EQ(Rules(r), (std::vector<std::string>{"unreachable", "kv-events-silent"}));
}

TEST(DoctorKvEvents, StaleWhenBatchesStopHalfwayWhileTokensGrow) {
  // Scrapes at 0..4: the second half starts at the scrape at t=2.
  const std::vector<double> prompt = {0, 100, 200, 300, 400};
  Report r = Diagnose({Probed("a", prompt, {0.5, 1.5})}, DoctorOptions{});
  ASSERT_EQ(Rules(r), std::vector<std::string>{"kv-events-stale"});
  const Finding* f = Get(r, "kv-events-stale");
  EXPECT_EQ(f->replicas, std::vector<std::string>{"a"});
  EXPECT_NE(f->summary.find("a (tcp://a:5557): 2 batches, the last at t=1.5s, none in the last "
                            "2.0s while it computed 200.0 prompt tokens (12.5 blocks of 16)"),
            std::string::npos)
      << f->summary;
  // A batch at the mid scrape's time is still the first half; one after it is not stale.
  EXPECT_TRUE(Has(Diagnose({Probed("a", prompt, {0.5, 2.0})}, DoctorOptions{}), "kv-events-stale"));
  EXPECT_TRUE(Diagnose({Probed("a", prompt, {0.5, 2.1})}, DoctorOptions{}).findings.empty());
  // Idle in the second half (15 tokens, under a block): nothing to publish, not stale.
  EXPECT_TRUE(
      Diagnose({Probed("a", {0, 100, 200, 210, 215}, {0.5, 1.5})}, DoctorOptions{}).findings.empty());
  // Two scrapes: no second half to read.
  EXPECT_TRUE(Diagnose({Probed("a", {0, 400}, {0.5})}, DoctorOptions{}).findings.empty());
}

TEST(DoctorKvEvents, BlockSizeMismatch) {
  // Events in blocks of 32 from a replica whose cache_config_info says 16.
  Report r = Diagnose({Probed("a", {0, 100}, {0.5}, 32)}, DoctorOptions{});
  ASSERT_EQ(Rules(r), std::vector<std::string>{"kv-events-block-size"});
  const Finding* f = Get(r, "kv-events-block-size");
  EXPECT_EQ(f->replicas, std::vector<std::string>{"a"});
  EXPECT_NE(f->summary.find("a (tcp://a:5557): events say block_size 32, cache_config_info says 16"),
            std::string::npos)
      << f->summary;
  EXPECT_NE(f->remedy.find("pool.kv_events.block_size"), std::string::npos);
  // Engines in blocks of 16, the router's index in blocks of 48: not a multiple.
  DoctorOptions o;
  o.router_block_size = 48;
  r = Diagnose({Probed("a", {0, 100}, {0.5})}, o);
  ASSERT_EQ(Rules(r), std::vector<std::string>{"kv-events-block-size"});
  EXPECT_NE(Get(r, "kv-events-block-size")
                ->summary.find("events' block_size 16 is not a multiple of the router's "
                               "pool.kv_events.block_size 48"),
            std::string::npos);
  // 32 everywhere and a router at 16: a multiple, usable.
  o.router_block_size = 16;
  EXPECT_TRUE(Diagnose({Probed("a", {0, 100}, {0.5}, 32, {}, 32)}, o).findings.empty());
  // Batches that stored nothing (removals, a clear) say nothing about block sizes.
  ReplicaHistory h = Probed("a", {0, 100}, {0.5});
  h.events->batches[0].block_sizes.clear();
  EXPECT_TRUE(Diagnose({h}, o).findings.empty());
  // Both reasons on one replica: one finding that gives both.
  o.router_block_size = 48;
  r = Diagnose({Probed("a", {0, 100}, {0.5}, 32)}, o);
  ASSERT_EQ(Rules(r), std::vector<std::string>{"kv-events-block-size"});
  EXPECT_NE(Get(r, "kv-events-block-size")->summary.find(" and "), std::string::npos);
}

TEST(DoctorKvEvents, RenderedInJsonAndText) {
  DoctorOptions o;
  o.router_block_size = 16;
  ReplicaHistory h = Probed("a", {0, 100, 200}, {0.5, 1.5}, 16);
  h.events->decode_errors = 2;
  const Report r = Diagnose({h, Probed("b", {0, 100, 200}, {})}, o);
  const std::string json = ReportJson(r);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(json).get(doc), simdjson::SUCCESS) << json;
  simdjson::dom::element e = doc["replicas"].at(0)["kv_events"];
  std::vector<std::string> keys;
  for (auto field : simdjson::dom::object(e)) keys.emplace_back(field.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"address", "error", "batches", "decode_errors",
                                            "last_batch_s", "block_sizes", "tokens_computed"}));
  EXPECT_EQ(std::string_view(e["address"].get_string()), "tcp://a:5557");
  EXPECT_EQ(int64_t(e["batches"].get_int64()), 2);
  EXPECT_EQ(int64_t(e["decode_errors"].get_int64()), 2);
  EXPECT_EQ(double(e["last_batch_s"].get_double()), 1.5);
  EXPECT_EQ(int64_t(e["block_sizes"].at(0).get_int64()), 16);
  EXPECT_EQ(double(e["tokens_computed"].get_double()), 200.0);
  EXPECT_TRUE(e["error"].is_null());
  EXPECT_TRUE(doc["replicas"].at(1)["kv_events"]["last_batch_s"].is_null());
  EXPECT_EQ(std::string_view(doc["findings"].at(0)["rule"].get_string()), "kv-events-silent");
  const std::string text = ReportText(r);
  EXPECT_NE(text.find("a KV events tcp://a:5557: 2 batches (last at 1.5s), block size 16, tokens "
                      "computed 200"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("FINDING kv-events-silent: b (tcp://b:5557)"), std::string::npos) << text;
}

// --- The router (--router, issue 24): kvroute's latency series, as serve and epp expose them.
struct RouterCounters {
  double scored[2] = {0, 0}, abs_s[2] = {0, 0}, rel[2] = {0, 0};
  double slo_req[2] = {0, 0}, slo_viol[2] = {0, 0};
  bool flow = false;
};

std::string RouterText(const RouterCounters& c) {
  std::string o;
  auto series = [&](const std::string& name, const char* label, const double* v) {
    o += "# TYPE " + name + " counter\n";
    o += name + "{" + label + "=\"ttft\"} " + std::to_string(v[0]) + "\n";
    o += name + "{" + label + "=\"tpot\"} " + std::to_string(v[1]) + "\n";
  };
  o += "# TYPE kvroute_requests_total counter\nkvroute_requests_total{endpoint=\"a\",code=\"200\"} 9\n";
  series("kvroute_latency_predictions_scored_total", "kind", c.scored);
  series("kvroute_latency_prediction_abs_error_seconds_total", "kind", c.abs_s);
  series("kvroute_latency_prediction_abs_relative_error_total", "kind", c.rel);
  series("kvroute_slo_requests_total", "type", c.slo_req);
  series("kvroute_slo_violations_total", "type", c.slo_viol);
  if (c.flow) o += "# TYPE kvroute_flow_dispatched_total counter\nkvroute_flow_dispatched_total{cause=\"immediate\"} 3\n";
  return o;
}

ReplicaHistory RouterTwo(const RouterCounters& a, const RouterCounters& b) {
  return {"router", "r:8080", {ParseScrape(RouterText(a), 100), ParseScrape(RouterText(b), 130)}};
}

TEST(DoctorRouter, ParsesKvroutesLatencySeriesAndNotAsAnEngine) {
  RouterCounters c;
  c.scored[0] = 10;
  c.abs_s[0] = 2.5;
  c.rel[0] = 3;
  c.slo_req[1] = 7;
  c.slo_viol[1] = 1;
  c.flow = true;
  const Scrape s = ParseScrape(RouterText(c), 5);
  EXPECT_TRUE(s.any_router_series);
  EXPECT_FALSE(s.any_engine_series);
  EXPECT_EQ(s.router.scored[0], 10);
  EXPECT_EQ(s.router.abs_error_s[0], 2.5);
  EXPECT_EQ(s.router.abs_rel_error[0], 3);
  EXPECT_EQ(s.router.slo_requests[1], 7);
  EXPECT_EQ(s.router.slo_violations[1], 1);
  EXPECT_TRUE(s.router.flow_control);
  EXPECT_TRUE(s.garbage.empty());
  // Garbage is unknown, named, and never summed with a repeat.
  const Scrape bad = ParseScrape(
      "kvroute_latency_predictions_scored_total{kind=\"ttft\"} NaN\n"
      "kvroute_slo_requests_total{type=\"ttft\"} 4\n"
      "kvroute_slo_requests_total{type=\"ttft\"} 5\n"
      "kvroute_slo_requests_total{type=\"tpot\"} -1\n",
      5);
  EXPECT_EQ(bad.router.scored[0], std::nullopt);
  EXPECT_EQ(bad.router.slo_requests[0], std::nullopt);
  EXPECT_EQ(bad.router.slo_requests[1], std::nullopt);
  ASSERT_EQ(bad.garbage.size(), 3u);
  EXPECT_EQ(bad.garbage[0], "kvroute_latency_predictions_scored_total{kind=\"ttft\"} = NaN (line 1)");
  EXPECT_EQ(bad.garbage[1], "kvroute_slo_requests_total{type=\"ttft\"} = repeated (line 3)");
}

TEST(DoctorRouter, WindowFiguresAndBothRulesFire) {
  RouterCounters a, b;
  a.scored[0] = 100, a.abs_s[0] = 10, a.rel[0] = 20, a.slo_req[0] = 100, a.slo_viol[0] = 5;
  b.scored[0] = 300, b.abs_s[0] = 50, b.rel[0] = 180, b.slo_req[0] = 300, b.slo_viol[0] = 65;
  b.scored[1] = 60, b.rel[1] = 6, b.abs_s[1] = 0.06, b.slo_req[1] = 60;  // TPOT: fine
  const ReplicaHistory router = RouterTwo(a, b);
  const Report r = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{}, &router);
  ASSERT_TRUE(r.router.has_value());
  const RouterFigures& f = *r.router;
  EXPECT_TRUE(f.kvroute);
  EXPECT_TRUE(f.reachable);
  EXPECT_FALSE(f.flow_control);
  EXPECT_EQ(f.scrapes, 2);
  EXPECT_EQ(f.ttft.predictions, 200);
  EXPECT_DOUBLE_EQ(*f.ttft.mape, 0.8);
  EXPECT_DOUBLE_EQ(*f.ttft.mean_abs_error_s, 0.2);
  EXPECT_EQ(f.ttft.slo_requests, 200);
  EXPECT_EQ(f.ttft.slo_violations, 60);
  EXPECT_DOUBLE_EQ(*f.ttft.attainment, 0.7);
  EXPECT_EQ(f.tpot.predictions, 60);
  EXPECT_DOUBLE_EQ(*f.tpot.mape, 0.1);
  EXPECT_DOUBLE_EQ(*f.tpot.attainment, 1.0);
  EXPECT_EQ(Rules(r), (std::vector<std::string>{"latency-model-inaccurate", "slo-missed"}));
  EXPECT_EQ(r.findings[0].summary,
            "router's latency model: TTFT predictions off by 80.0% on average (mean 0.200 s) over "
            "200.0 predictions");
  EXPECT_EQ(r.findings[1].summary, "at the router: 30.0% of 200.0 requests missed their TTFT objective");
  EXPECT_TRUE(r.findings[1].routing);
  EXPECT_NE(r.findings[1].remedy.find("flow: {enabled: true}"), std::string::npos);
  EXPECT_EQ(r.ExitCode(), 1);
  // With flow control on, the remedy is capacity.
  b.flow = true;
  const ReplicaHistory flowing = RouterTwo(a, b);
  const Report r2 = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{}, &flowing);
  EXPECT_NE(r2.findings[1].remedy.find("flow control is on"), std::string::npos);
}

TEST(DoctorRouter, NoRuleBelowTheThresholdsOrOnUnknowns) {
  RouterCounters a, b;
  b.scored[0] = 49, b.rel[0] = 49, b.abs_s[0] = 49;   // 100% off, but only 49 predictions
  b.slo_req[0] = 49, b.slo_viol[0] = 49;               // all missed, but only 49
  ReplicaHistory router = RouterTwo(a, b);
  Report r = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{}, &router);
  EXPECT_TRUE(r.findings.empty()) << Rules(r).size();
  EXPECT_DOUBLE_EQ(*r.router->ttft.mape, 1.0);
  // 100% off over 60 predictions, but 10 ms on average: too small to matter.
  RouterCounters e;
  e.scored[0] = 60, e.rel[0] = 60, e.abs_s[0] = 0.6;
  router = RouterTwo(a, e);
  r = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{}, &router);
  EXPECT_TRUE(r.findings.empty());
  EXPECT_DOUBLE_EQ(*r.router->ttft.mean_abs_error_s, 0.01);
  // At the thresholds exactly: not above them.
  RouterCounters c;
  c.scored[0] = 50, c.rel[0] = 25, c.slo_req[0] = 50, c.slo_viol[0] = 5;
  router = RouterTwo(a, c);
  r = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{}, &router);
  EXPECT_TRUE(r.findings.empty());
  // A counter that went down (the router restarted): unknown, no rule.
  RouterCounters d = c;
  d.scored[0] = 500, d.rel[0] = 500, d.slo_req[0] = 500, d.slo_viol[0] = 500;
  router = RouterTwo(d, c);
  r = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{}, &router);
  EXPECT_EQ(r.router->ttft.predictions, std::nullopt);
  EXPECT_EQ(r.router->ttft.attainment, std::nullopt);
  EXPECT_TRUE(r.findings.empty());
}

TEST(DoctorRouter, AReplicaOrNothingAtTheRouterAddressIsAFinding) {
  const ReplicaHistory replica = Steady("r", 0.3, 0);  // a vLLM /metrics, not a router's
  Report r = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{}, &replica);
  EXPECT_EQ(Rules(r), (std::vector<std::string>{"router-unreadable"}));
  EXPECT_FALSE(r.router->kvroute);
  const ReplicaHistory down{"router", "r:8080", {FailedScrape("connect: Connection refused", 1)}};
  r = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{}, &down);
  ASSERT_EQ(Rules(r), (std::vector<std::string>{"router-unreadable"}));
  EXPECT_EQ(r.findings[0].summary, "router r:8080 unreachable: connect: Connection refused");
  // Without --router: no router figures, no router rule.
  r = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{});
  EXPECT_FALSE(r.router.has_value());
  EXPECT_TRUE(r.findings.empty());
}

TEST(DoctorRouter, RenderedInJsonAndText) {
  RouterCounters a, b;
  b.scored[0] = 400, b.rel[0] = 48, b.abs_s[0] = 12, b.slo_req[0] = 400, b.slo_viol[0] = 4;
  b.flow = true;
  const ReplicaHistory router = RouterTwo(a, b);
  const Report r = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{}, &router);
  const std::string json = ReportJson(r);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(json).get(doc), simdjson::SUCCESS) << json;
  simdjson::dom::element x = doc["router"];
  EXPECT_EQ(std::string_view(x["address"].get_string()), "r:8080");
  EXPECT_TRUE(bool(x["kvroute"].get_bool()));
  EXPECT_TRUE(bool(x["flow_control"].get_bool()));
  EXPECT_EQ(double(x["ttft"]["predictions"].get_double()), 400.0);
  EXPECT_DOUBLE_EQ(double(x["ttft"]["mape"].get_double()), 0.12);
  EXPECT_DOUBLE_EQ(double(x["ttft"]["attainment"].get_double()), 0.99);
  EXPECT_TRUE(x["tpot"]["mape"].is_null());  // no TPOT predictions in the window
  EXPECT_TRUE(x["error"].is_null());
  const std::string text = ReportText(r);
  EXPECT_NE(text.find("router r:8080: latency model error TTFT 12.0% (mean 0.030 s, 400 "
                      "predictions), TPOT -; objectives met: TTFT 99.0% of 400, TPOT -; flow "
                      "control on"),
            std::string::npos)
      << text;
  // Without --router the JSON says null.
  const Report plain = Diagnose({Steady("a", 0.3, 0)}, DoctorOptions{});
  EXPECT_NE(ReportJson(plain).find("\"router\": null"), std::string::npos);
}

}  // namespace
}  // namespace kvroute::doctor
