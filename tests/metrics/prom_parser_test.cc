#include "core/metrics/prom_parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "testdata_util.h"

namespace kvroute::metrics {
namespace {

using testing::kV010;
using testing::ReadTestdata;

const OwnedSample* FindSample(const std::vector<OwnedSample>& v, std::string_view name) {
  for (const OwnedSample& s : v) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

TEST(PromParser, V010FixtureEverySample) {
  const std::string text = ReadTestdata(kV010);
  ASSERT_FALSE(text.empty());
  ParseReport r;
  std::vector<OwnedSample> all = ParseAllSamples(text, &r);
  EXPECT_TRUE(r.ok()) << r.errors.front().line << ": " << r.errors.front().message;
  EXPECT_EQ(r.lines, 130);
  EXPECT_EQ(r.samples, 92);
  EXPECT_EQ(all.size(), 92u);
  EXPECT_FALSE(r.aborted);

  const OwnedSample* running = FindSample(all, "vllm:num_requests_running");
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->value, 41.0);
  EXPECT_EQ(running->type, MetricType::kGauge);
  EXPECT_EQ(running->family, "vllm:num_requests_running");
  ASSERT_EQ(running->labels.size(), 2u);
  EXPECT_EQ(running->labels[0], std::make_pair(std::string("engine"), std::string("0")));
  EXPECT_EQ(running->labels[1], std::make_pair(std::string("model_name"),
                                               std::string("meta-llama/Llama-3.1-8B-Instruct")));

  EXPECT_EQ(FindSample(all, "vllm:kv_cache_usage_perc")->value, 0.9812345679012346);
  EXPECT_EQ(FindSample(all, "vllm:prefix_cache_queries_total")->value, 82634112.0);
  EXPECT_EQ(FindSample(all, "vllm:prefix_cache_queries_total")->type, MetricType::kCounter);
  EXPECT_EQ(FindSample(all, "process_resident_memory_bytes")->value, 3412295680.0);
  EXPECT_EQ(FindSample(all, "http_requests_created")->value, 1.7643912245172e+09);

  const OwnedSample* sum = FindSample(all, "vllm:time_to_first_token_seconds_sum");
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(sum->family, "vllm:time_to_first_token_seconds");
  EXPECT_EQ(sum->type, MetricType::kHistogram);
  EXPECT_EQ(sum->value, 1627.4655051726118);

  int ttft_buckets = 0;
  double inf_bucket = -1;
  for (const OwnedSample& s : all) {
    if (s.name != "vllm:time_to_first_token_seconds_bucket") continue;
    ++ttft_buckets;
    EXPECT_EQ(s.family, "vllm:time_to_first_token_seconds");
    EXPECT_EQ(s.type, MetricType::kHistogram);
    ASSERT_EQ(s.labels.back().first, "le");
    if (s.labels.back().second == "+Inf") inf_bucket = s.value;
  }
  EXPECT_EQ(ttft_buckets, 23);
  EXPECT_EQ(inf_bucket, 500.0);
}

// Visitor that keeps two names and counts how often it was asked.
struct Picky : SampleVisitor {
  int asked = 0;
  std::vector<std::pair<std::string, double>> got;
  bool Wants(std::string_view name) override {
    ++asked;
    return name == "vllm:num_requests_waiting" || name == "vllm:cache_config_info";
  }
  void OnSample(const Sample& s) override {
    got.emplace_back(std::string(s.name), s.value);
    if (s.name == "vllm:cache_config_info") {
      EXPECT_EQ(s.labels.GetInt("num_gpu_blocks"), 26304);
      EXPECT_EQ(s.labels.GetInt("block_size"), 16);
      EXPECT_EQ(s.labels.GetInt("num_cpu_blocks"), std::nullopt);  // "None"
      EXPECT_TRUE(s.labels.Equals("enable_prefix_caching", "True"));
      EXPECT_FALSE(s.labels.Equals("enable_prefix_caching", "False"));
      EXPECT_EQ(s.labels.Find("model_name"), std::nullopt);
      EXPECT_EQ(s.line, 130);
    }
  }
};

TEST(PromParser, VisitorSkipsUnwantedSamples) {
  Picky v;
  ParseReport r = ParsePrometheusText(ReadTestdata(kV010), v);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(v.asked, 92);
  EXPECT_EQ(r.samples, 2);
  EXPECT_EQ(r.skipped, 90);
  ASSERT_EQ(v.got.size(), 2u);
  EXPECT_EQ(v.got[0], std::make_pair(std::string("vllm:num_requests_waiting"), 132.0));
  EXPECT_EQ(v.got[1], std::make_pair(std::string("vllm:cache_config_info"), 1.0));
}

TEST(PromParser, EscapedLabelValues) {
  const std::string text =
      "m{a=\"back\\\\slash\",b=\"q\\\"uote\",c=\"new\\nline\",d=\"\"} 1\n";
  ParseReport r;
  auto all = ParseAllSamples(text, &r);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(all.size(), 1u);
  ASSERT_EQ(all[0].labels.size(), 4u);
  EXPECT_EQ(all[0].labels[0].second, "back\\slash");
  EXPECT_EQ(all[0].labels[1].second, "q\"uote");
  EXPECT_EQ(all[0].labels[2].second, "new\nline");
  EXPECT_EQ(all[0].labels[3].second, "");

  struct V : SampleVisitor {
    void OnSample(const Sample& s) override {
      EXPECT_EQ(s.labels.Find("b"), std::string_view("q\\\"uote"));
      EXPECT_TRUE(s.labels.Equals("b", "q\"uote"));
      EXPECT_FALSE(s.labels.Equals("b", "q\\\"uote"));
      EXPECT_TRUE(s.labels.Equals("c", "new\nline"));
      EXPECT_EQ(s.labels.Get("a"), std::optional<std::string>("back\\slash"));
    }
  } v;
  ParsePrometheusText(text, v);
}

TEST(PromParser, SpecialValuesTimestampsBlankLinesCrlf) {
  const std::string text =
      "# HELP a Doc with \\\\ and \\n.\r\n"
      "# TYPE a gauge\r\n"
      "\r\n"
      "a{x=\"1\"} NaN\r\n"
      "a{x=\"2\"} +Inf 1700000000000\r\n"
      "a{x=\"3\"} -Inf\r\n"
      "  \t \n"
      "a{x=\"4\",} 9.75e-06 -5\n"
      "a { x = \"5\" } 1e3\n"
      "b 42\n"
      "# just a comment\n"
      "c\t7\t\n";
  ParseReport r;
  auto all = ParseAllSamples(text, &r);
  ASSERT_TRUE(r.ok()) << r.errors.front().line << ": " << r.errors.front().message;
  EXPECT_EQ(r.lines, 12);
  ASSERT_EQ(all.size(), 7u);
  EXPECT_TRUE(std::isnan(all[0].value));
  EXPECT_EQ(all[0].line, 4);
  EXPECT_EQ(all[1].value, std::numeric_limits<double>::infinity());
  EXPECT_EQ(all[1].timestamp_ms, 1700000000000);
  EXPECT_EQ(all[2].value, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(all[2].timestamp_ms, std::nullopt);
  EXPECT_EQ(all[3].value, 9.75e-06);
  EXPECT_EQ(all[3].timestamp_ms, -5);
  EXPECT_EQ(all[3].labels.size(), 1u);
  EXPECT_EQ(all[4].value, 1000.0);
  EXPECT_EQ(all[4].labels[0], std::make_pair(std::string("x"), std::string("5")));
  EXPECT_EQ(all[5].name, "b");
  EXPECT_EQ(all[5].type, MetricType::kUnknown);  // not part of family "a"
  EXPECT_EQ(all[5].value, 42.0);
  EXPECT_EQ(all[6].value, 7.0);
}

TEST(PromParser, HelpAndTypeCallbacks) {
  struct V : SampleVisitor {
    std::vector<std::string> events;
    void OnSample(const Sample&) override {}
    void OnType(std::string_view f, MetricType t) override {
      events.push_back("T " + std::string(f) + " " + std::string(MetricTypeName(t)));
    }
    void OnHelp(std::string_view f, std::string_view h) override {
      events.push_back("H " + std::string(f) + " " + std::string(h));
    }
  } v;
  ParsePrometheusText("# HELP x_total Some \\n text\n# TYPE x_total counter\nx_total 1\n", v);
  ASSERT_EQ(v.events.size(), 2u);
  EXPECT_EQ(v.events[0], "H x_total Some \\n text");
  EXPECT_EQ(v.events[1], "T x_total counter");
}

TEST(PromParser, FamilySuffixes) {
  const std::string text =
      "# TYPE req counter\nreq_total 3\nreq_created 1.7e9\n"
      "# TYPE lat summary\nlat{quantile=\"0.5\"} 0.2\nlat_sum 10\nlat_count 50\n"
      "lat_bucket 1\n";
  auto all = ParseAllSamples(text);
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0].family, "req");
  EXPECT_EQ(all[0].type, MetricType::kCounter);
  EXPECT_EQ(all[1].family, "req");
  EXPECT_EQ(all[2].family, "lat");
  EXPECT_EQ(all[2].type, MetricType::kSummary);
  EXPECT_EQ(all[4].family, "lat");
  EXPECT_EQ(all[5].family, "lat_bucket");  // summaries have no buckets
  EXPECT_EQ(all[5].type, MetricType::kUnknown);
}

TEST(PromParser, MalformedLinesAreReportedAndSkipped) {
  const std::string text =
      "good_a 1\n"
      "bad_unterminated{a=\"oops} 1\n"
      "bad_value{a=\"x\"} abc\n"
      "bad_missing{a=\"x\"}\n"
      "bad_missing2\n"
      "bad_escape{a=\"\\t\"} 1\n"
      "bad_ts 1 12.5\n"
      "bad_trailing 1 2 3\n"
      "bad_labelname{1a=\"x\"} 1\n"
      "bad_noeq{a \"x\"} 1\n"
      "bad_sep{a=\"x\" b=\"y\"} 1\n"
      "bad_open{a=\"x\",\n"
      "{a=\"x\"} 1\n"
      "bad-name 1\n"
      "# TYPE t bogus\n"
      "plus_minus +-1\n"
      "good_b{a=\"y\"} 2\n";
  ParseReport r;
  auto all = ParseAllSamples(text, &r);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].name, "good_a");
  EXPECT_EQ(all[1].name, "good_b");
  EXPECT_EQ(all[1].line, 17);
  EXPECT_FALSE(r.aborted);
  const std::vector<std::pair<int, std::string>> want = {
      {2, "unterminated label value in bad_unterminated"},
      {3, "invalid value 'abc' for bad_value"},
      {4, "missing value for bad_missing"},
      {5, "missing value for bad_missing2"},
      {6, "invalid escape in label value (only \\\\, \\\" and \\n are allowed) in bad_escape"},
      {7, "invalid timestamp '12.5' for bad_ts"},
      {8, "unexpected text after timestamp for bad_trailing"},
      {9, "invalid label name in bad_labelname"},
      {10, "expected '=' after label name in bad_noeq"},
      {11, "expected ',' or '}' after label value in bad_sep"},
      {12, "unterminated label set in bad_open"},
      {13, "invalid metric name"},
      {14, "invalid character '-' in metric name bad"},
      {15, "unknown metric type 'bogus' for t"},
      {16, "invalid value '+-1' for plus_minus"},
  };
  ASSERT_EQ(r.errors.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(r.errors[i].line, want[i].first) << i;
    EXPECT_EQ(r.errors[i].message, want[i].second) << i;
  }
}

TEST(PromParser, GarbageAbortsAfterMaxErrors) {
  std::string html = "<html>\n";
  for (int i = 0; i < 100; ++i) html += "<p>error page</p>\n";
  html += "real 1\n";
  ParseReport r;
  auto all = ParseAllSamples(html, &r);
  EXPECT_TRUE(r.aborted);
  EXPECT_EQ(r.errors.size(), 32u);
  EXPECT_EQ(r.lines, 32);
  EXPECT_TRUE(all.empty());
}

TEST(PromParser, TruncatedTextAndNoTrailingNewline) {
  ParseReport r;
  auto all = ParseAllSamples("a 1\nb{x=\"y\"} 2", &r);
  EXPECT_TRUE(r.ok());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].value, 2.0);
  all = ParseAllSamples("a 1\nb{x=\"y", &r);
  EXPECT_EQ(all.size(), 1u);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].message, "unterminated label value in b");
  EXPECT_TRUE(ParseAllSamples("", &r).empty());
  EXPECT_TRUE(r.ok());
}

TEST(PromParser, HugeExponentsSaturateLikeGo) {
  auto all = ParseAllSamples("a 1e999\nb -1e999\nc 1e-999\n");
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].value, std::numeric_limits<double>::infinity());
  EXPECT_EQ(all[1].value, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(all[2].value, 0.0);
}

TEST(LabelValue, UnescapeAndEquals) {
  EXPECT_EQ(UnescapeLabelValue("a\\\\b\\\"c\\nd"), "a\\b\"c\nd");
  EXPECT_TRUE(LabelValueEquals("a\\\\b", "a\\b"));
  EXPECT_FALSE(LabelValueEquals("a\\\\b", "a\\bc"));
  EXPECT_FALSE(LabelValueEquals("a\\\\bc", "a\\b"));
  EXPECT_TRUE(LabelValueEquals("plain", "plain"));
}

}  // namespace
}  // namespace kvroute::metrics

namespace kvroute::metrics {
namespace {

// Deterministic byte mutations of a real scrape: the parser must neither crash nor lose
// count (every line is a sample, an error, a skip, or blank/comment).
TEST(PromParser, MutatedFixtureNeverBreaksAccounting) {
  const std::string base = testing::ReadTestdata(testing::kV010);
  ASSERT_FALSE(base.empty());
  uint64_t x = 12345;
  auto next = [&x] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  const char kBytes[] = "{}\",=\\\n \t#e+-.0aZ:\r";
  for (int round = 0; round < 300; ++round) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(next() % 8);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = next() % text.size();
      switch (next() % 3) {
        case 0: text[pos] = kBytes[next() % (sizeof kBytes - 1)]; break;
        case 1: text.erase(pos, 1 + next() % 16); break;
        default: text.insert(pos, 1, kBytes[next() % (sizeof kBytes - 1)]);
      }
    }
    struct Count : SampleVisitor {
      int n = 0;
      void OnSample(const Sample& s) override {
        ++n;
        s.labels.ForEach([](std::string_view, std::string_view) {});
      }
    } v;
    ParseReport r = ParsePrometheusText(text, v);
    EXPECT_EQ(v.n, r.samples);
    EXPECT_LE(r.samples + r.skipped + static_cast<int>(r.errors.size()), r.lines);
    EXPECT_GE(r.samples, 50) << "round " << round;  // a few edits spoil a few lines only
  }
}

}  // namespace
}  // namespace kvroute::metrics
