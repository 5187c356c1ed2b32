#include "core/metrics/prom_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/metrics/prom_parser.h"

namespace kvroute::metrics {
namespace {

TEST(PromValue, PythonRepr) {
  EXPECT_EQ(FormatPromValue(41.0), "41.0");
  EXPECT_EQ(FormatPromValue(0.0), "0.0");
  EXPECT_EQ(FormatPromValue(-0.0), "-0.0");
  EXPECT_EQ(FormatPromValue(1.0), "1.0");
  EXPECT_EQ(FormatPromValue(-3.5), "-3.5");
  EXPECT_EQ(FormatPromValue(0.1), "0.1");
  EXPECT_EQ(FormatPromValue(0.9812345679012346), "0.9812345679012346");
  EXPECT_EQ(FormatPromValue(1627.4655051726118), "1627.4655051726118");
  EXPECT_EQ(FormatPromValue(0.0001), "0.0001");
  EXPECT_EQ(FormatPromValue(9.75e-06), "9.75e-06");
  EXPECT_EQ(FormatPromValue(1e-05), "1e-05");
  EXPECT_EQ(FormatPromValue(1.5e-300), "1.5e-300");
  EXPECT_EQ(FormatPromValue(123456.0), "123456.0");
  EXPECT_EQ(FormatPromValue(-12345678.0), "-12345678.0");  // negatives keep repr
  EXPECT_EQ(FormatPromValue(1e16), "1e+16");
  EXPECT_EQ(FormatPromValue(2.5e20), "2.5e+20");
  EXPECT_EQ(FormatPromValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatPromValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatPromValue(std::nan("")), "NaN");
}

TEST(PromValue, PrometheusClientGoStyleExponent) {
  // floatToGoString: positive values whose repr has more than 6 integer digits.
  EXPECT_EQ(FormatPromValue(82634112.0), "8.2634112e+07");
  EXPECT_EQ(FormatPromValue(5784384.0), "5.784384e+06");
  EXPECT_EQ(FormatPromValue(1000000.0), "1e+06");
  EXPECT_EQ(FormatPromValue(1764391224.517), "1.764391224517e+09");
  EXPECT_EQ(FormatPromValue(3412295680.0), "3.41229568e+09");
  EXPECT_EQ(FormatPromValue(12345678901.0), "1.2345678901e+010");  // the "e+0" quirk
  EXPECT_EQ(FormatPromValue(999999.0), "999999.0");
}

TEST(PromValue, RoundTripsExactly) {
  const double values[] = {41.0, 0.9812345679012346, 9.75e-06, 82634112.0, 12345678901.5,
                           1e300, 5e-324, 0.30000000000000004, 123.456};
  for (double v : values) {
    const std::string text = "m " + FormatPromValue(v) + "\n";
    auto all = ParseAllSamples(text);
    ASSERT_EQ(all.size(), 1u) << text;
    EXPECT_EQ(all[0].value, v) << text;
  }
}

TEST(PromWriter, GaugeCounterExactText) {
  std::string out;
  const Label labels[] = {{"model_name", "m"}, {"engine", "0"}};
  AppendGauge(out, "vllm:num_requests_running", "Number of requests in model execution batches.",
              labels, 41);
  AppendCounter(out, "vllm:num_preemptions_total", "Cumulative\nnumber \\ of preemptions.", {},
                1874);
  EXPECT_EQ(out,
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 41.0\n"
            "# HELP vllm:num_preemptions_total Cumulative\\nnumber \\\\ of preemptions.\n"
            "# TYPE vllm:num_preemptions_total counter\n"
            "vllm:num_preemptions_total 1874.0\n");
}

TEST(PromWriter, HistogramExactText) {
  std::string out;
  AppendHeader(out, "lat", "Latency.", MetricType::kHistogram);
  const Label labels[] = {{"m", "x"}};
  const double bounds[] = {0.005, 0.1, 1};
  const uint64_t counts[] = {1, 0, 2, 3};
  AppendHistogramSeries(out, "lat", labels, bounds, counts, 12.25);
  EXPECT_EQ(out,
            "# HELP lat Latency.\n"
            "# TYPE lat histogram\n"
            "lat_bucket{m=\"x\",le=\"0.005\"} 1.0\n"
            "lat_bucket{m=\"x\",le=\"0.1\"} 1.0\n"
            "lat_bucket{m=\"x\",le=\"1.0\"} 3.0\n"
            "lat_bucket{m=\"x\",le=\"+Inf\"} 6.0\n"
            "lat_count{m=\"x\"} 6.0\n"
            "lat_sum{m=\"x\"} 12.25\n");
}

TEST(PromWriter, RoundTripsThroughParser) {
  std::string out;
  const std::string nasty = "a\\b \"quoted\"\nnext line, {braces} = yes";
  const Label labels[] = {{"model_name", nasty}, {"engine", "1"}};
  AppendGauge(out, "g", "A gauge.", labels, 0.5);
  AppendCounter(out, "c_total", "A counter.", labels, 7);
  AppendHeader(out, "h", "A histogram.", MetricType::kHistogram);
  const double bounds[] = {0.1, 1};
  const uint64_t counts[] = {2, 3, 4};
  AppendHistogramSeries(out, "h", labels, bounds, counts, 9.75e-06);

  ParseReport r;
  auto all = ParseAllSamples(out, &r);
  ASSERT_TRUE(r.ok()) << r.errors.front().message;
  ASSERT_EQ(all.size(), 7u);
  for (const OwnedSample& s : all) {
    ASSERT_GE(s.labels.size(), 2u) << s.name;
    EXPECT_EQ(s.labels[0].first, "model_name");
    EXPECT_EQ(s.labels[0].second, nasty);
    EXPECT_EQ(s.labels[1].second, "1");
  }
  EXPECT_EQ(all[0].name, "g");
  EXPECT_EQ(all[0].type, MetricType::kGauge);
  EXPECT_EQ(all[0].value, 0.5);
  EXPECT_EQ(all[1].type, MetricType::kCounter);
  EXPECT_EQ(all[1].value, 7.0);
  const double want_cum[] = {2, 5, 9};
  const char* want_le[] = {"0.1", "1.0", "+Inf"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(all[2 + i].name, "h_bucket");
    EXPECT_EQ(all[2 + i].family, "h");
    EXPECT_EQ(all[2 + i].type, MetricType::kHistogram);
    EXPECT_EQ(all[2 + i].labels[2].second, want_le[i]);
    EXPECT_EQ(all[2 + i].value, want_cum[i]);
  }
  EXPECT_EQ(all[5].name, "h_count");
  EXPECT_EQ(all[5].value, 9.0);
  EXPECT_EQ(all[6].name, "h_sum");
  EXPECT_EQ(all[6].value, 9.75e-06);
}

}  // namespace
}  // namespace kvroute::metrics
