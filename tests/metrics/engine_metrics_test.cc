#include "core/metrics/engine_metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "testdata_util.h"

namespace kvroute::metrics {
namespace {

using testing::kV010;
using testing::kV06;
using testing::ReadTestdata;

EngineMetrics Extract(std::string_view text, EngineType type, std::string_view model = {},
                      ParseReport* report = nullptr) {
  EngineMetrics m;
  ParseReport r = ExtractEngineMetrics(text, MetricNames::For(type), model, m);
  if (report) *report = r;
  return m;
}

TEST(EngineMetrics, VllmV010Fixture) {
  ParseReport r;
  EngineMetrics m = Extract(ReadTestdata(kV010), EngineType::kVllm, {}, &r);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(m.running, 41.0);
  EXPECT_EQ(m.waiting, 132.0);
  EXPECT_EQ(m.kv_usage, 0.9812345679012346);
  EXPECT_EQ(m.prefix_queries, 82634112.0);
  EXPECT_EQ(m.prefix_hits, 5784384.0);
  EXPECT_EQ(m.preemptions, 1874.0);
  EXPECT_EQ(m.block_size, 16);
  EXPECT_EQ(m.num_gpu_blocks, 26304);
  EXPECT_EQ(m.engines, 1);
  EXPECT_EQ(m.present, 0xFFu);
}

TEST(EngineMetrics, VllmV06FixtureOldNames) {
  EngineMetrics m = Extract(ReadTestdata(kV06), EngineType::kVllm);
  EXPECT_EQ(m.running, 12.0);
  EXPECT_EQ(m.waiting, 0.0);
  EXPECT_EQ(m.kv_usage, 0.4011);  // from vllm:gpu_cache_usage_perc
  EXPECT_EQ(m.preemptions, 0.0);
  EXPECT_EQ(m.block_size, 16);
  EXPECT_EQ(m.num_gpu_blocks, 27975);
  EXPECT_EQ(m.engines, 1);
  EXPECT_TRUE(m.Has(EngineMetrics::kKvUsage));
  EXPECT_TRUE(m.Has(EngineMetrics::kPreemptions));
  // v0.6 only has a hit-rate gauge, no query/hit counters.
  EXPECT_FALSE(m.Has(EngineMetrics::kPrefixQueries));
  EXPECT_FALSE(m.Has(EngineMetrics::kPrefixHits));
}

TEST(EngineMetrics, VllmModelFilter) {
  const std::string text = ReadTestdata(kV010);
  EngineMetrics m = Extract(text, EngineType::kVllm, "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_EQ(m.running, 41.0);
  EXPECT_EQ(m.num_gpu_blocks, 26304);  // cache_config_info has no model label: kept
  m = Extract(text, EngineType::kVllm, "other-model");
  EXPECT_FALSE(m.Has(EngineMetrics::kRunning));
  EXPECT_FALSE(m.Has(EngineMetrics::kKvUsage));
  EXPECT_EQ(m.running, 0.0);
  EXPECT_EQ(m.num_gpu_blocks, 26304);
}

constexpr const char* kTwoEngines = R"(# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 10.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.99
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50.0
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 7.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 30.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 20.0
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
vllm:num_preemptions_total{engine="1",model_name="m"} 2.0
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="3000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
)";

TEST(EngineMetrics, MultiEngineSumsAndWeightsUsageByBlocks) {
  EngineMetrics m = Extract(kTwoEngines, EngineType::kVllm);
  EXPECT_EQ(m.running, 15.0);
  EXPECT_EQ(m.waiting, 7.0);
  // New names win over the deprecated ones exported alongside them.
  EXPECT_EQ(m.kv_usage, (0.5 * 3000 + 0.25 * 1000) / 4000);
  EXPECT_EQ(m.prefix_queries, 150.0);
  EXPECT_EQ(m.prefix_hits, 50.0);
  EXPECT_EQ(m.preemptions, 3.0);
  EXPECT_EQ(m.num_gpu_blocks, 4000);
  EXPECT_EQ(m.block_size, 16);
  EXPECT_EQ(m.engines, 2);
}

TEST(EngineMetrics, MultiEngineUnknownCapacityAverages) {
  std::string text = kTwoEngines;
  // Drop engine 1's capacity: usage falls back to the plain mean.
  text.erase(text.find("vllm:cache_config_info{block_size=\"16\",engine=\"1\""));
  EngineMetrics m = Extract(text, EngineType::kVllm);
  EXPECT_EQ(m.kv_usage, (0.5 + 0.25) / 2);
  EXPECT_EQ(m.num_gpu_blocks, 3000);
}

TEST(EngineMetrics, Sglang) {
  const std::string text = R"(# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen"} 7.0
sglang:num_queue_reqs{model_name="qwen"} 2.0
sglang:token_usage{model_name="qwen"} 0.42
sglang:cache_config_info{model_name="qwen",page_size="1",num_pages="500000"} 1.0
vllm:num_requests_running{model_name="qwen"} 99.0
)";
  EngineMetrics m = Extract(text, EngineType::kSglang);
  EXPECT_EQ(m.running, 7.0);
  EXPECT_EQ(m.waiting, 2.0);
  EXPECT_EQ(m.kv_usage, 0.42);
  EXPECT_EQ(m.block_size, 1);
  EXPECT_EQ(m.num_gpu_blocks, 500000);
  EXPECT_EQ(m.present, EngineMetrics::kRunning | EngineMetrics::kWaiting |
                           EngineMetrics::kKvUsage | EngineMetrics::kBlockSize |
                           EngineMetrics::kNumGpuBlocks);
}

TEST(EngineMetrics, NameOverrides) {
  MetricNames names = MetricNames::For(EngineType::kVllm);
  EXPECT_TRUE(names.Set("waiting", "my:queue"));
  EXPECT_TRUE(names.Set("kv_usage", "my:kv"));
  EXPECT_TRUE(names.Set("kv_usage_old", ""));
  EXPECT_FALSE(names.Set("queue", "x"));
  EngineMetrics m;
  ExtractEngineMetrics("my:queue 9\nmy:kv 0.75\nvllm:num_requests_waiting 1\n"
                       "vllm:gpu_cache_usage_perc 0.1\n",
                       names, {}, m);
  EXPECT_EQ(m.waiting, 9.0);
  EXPECT_EQ(m.kv_usage, 0.75);
}

TEST(EngineMetrics, MalformedLinesDoNotSpoilTheRest) {
  const std::string text =
      "vllm:num_requests_running{engine=\"0\",model_name=\"m} 41.0\n"  // unterminated
      "vllm:num_requests_waiting{engine=\"0\"} abc\n"                    // bad value
      "vllm:kv_cache_usage_perc{engine=\"0\"}\n"                         // missing value
      "vllm:num_requests_running{engine=\"1\"} 3.0\n"
      "vllm:kv_cache_usage_perc{engine=\"1\"} NaN\n"
      "vllm:num_requests_waiting{engine=\"1\"} 6\n";
  ParseReport r;
  EngineMetrics m = Extract(text, EngineType::kVllm, {}, &r);
  ASSERT_EQ(r.errors.size(), 3u);
  EXPECT_EQ(r.errors[0].line, 1);
  EXPECT_EQ(r.errors[1].line, 2);
  EXPECT_EQ(r.errors[2].line, 3);
  EXPECT_EQ(m.running, 3.0);
  EXPECT_EQ(m.waiting, 6.0);
  EXPECT_FALSE(m.Has(EngineMetrics::kKvUsage));  // only a NaN sample: invalid
  EXPECT_TRUE(m.Invalid(EngineMetrics::kKvUsage));
}

// Garbage in the real fixture: each bad value makes exactly its field invalid (not
// present, not zero); the rest of the scrape is read as usual.
TEST(EngineMetrics, GarbageValuesMakeTheFieldInvalid) {
  using testing::V010With;
  struct Case {
    std::string running, waiting, kv;
    uint32_t invalid;
  };
  const Case cases[] = {
      {"41.0", "132.0", "NaN", EngineMetrics::kKvUsage},
      {"41.0", "132.0", "+Inf", EngineMetrics::kKvUsage},
      {"41.0", "132.0", "-Inf", EngineMetrics::kKvUsage},
      {"41.0", "132.0", "-0.01", EngineMetrics::kKvUsage},
      {"41.0", "132.0", "1.5", EngineMetrics::kKvUsage},
      {"41.0", "-3", "0.5", EngineMetrics::kWaiting},
      {"41.0", "NaN", "0.5", EngineMetrics::kWaiting},
      {"1e12", "132.0", "0.5", EngineMetrics::kRunning},
      {"-Inf", "+Inf", "NaN",
       EngineMetrics::kRunning | EngineMetrics::kWaiting | EngineMetrics::kKvUsage},
  };
  for (const Case& c : cases) {
    EngineMetrics m = Extract(V010With(c.running, c.waiting, c.kv), EngineType::kVllm);
    EXPECT_EQ(m.invalid, c.invalid) << c.running << " " << c.waiting << " " << c.kv;
    for (auto f : {EngineMetrics::kRunning, EngineMetrics::kWaiting, EngineMetrics::kKvUsage}) {
      EXPECT_EQ(m.Has(f), (c.invalid & f) == 0) << f;
    }
    EXPECT_EQ(m.num_gpu_blocks, 26304);  // the rest of the scrape is unaffected
  }
  // The edges are valid: exactly 0 and exactly 1.
  EngineMetrics edge = Extract(V010With("0", "0", "1"), EngineType::kVllm);
  EXPECT_EQ(edge.invalid, 0u);
  EXPECT_EQ(edge.kv_usage, 1.0);
}

TEST(EngineMetrics, OneEngineGarbageMakesTheAggregateInvalid) {
  EngineMetrics nan = Extract(testing::V010DataParallel("NaN"), EngineType::kVllm);
  EXPECT_TRUE(nan.Invalid(EngineMetrics::kKvUsage));
  EXPECT_FALSE(nan.Has(EngineMetrics::kKvUsage));
  EXPECT_EQ(nan.running, 80.0);
  EXPECT_EQ(nan.waiting, 252.0);
  EngineMetrics ok = Extract(testing::V010DataParallel("0.5"), EngineType::kVllm);
  EXPECT_TRUE(ok.Has(EngineMetrics::kKvUsage));
  EXPECT_EQ(ok.engines, 2);
}

TEST(EngineMetrics, MissingSeriesAreAbsentNotInvalid) {
  std::string text = testing::ReadTestdata(testing::kV010);
  text = testing::ReplaceOnce(text, testing::V010Series("kv_cache_usage_perc", "0") + "0.9812345679012346", "");
  EngineMetrics m = Extract(text, EngineType::kVllm);
  EXPECT_FALSE(m.Has(EngineMetrics::kKvUsage));
  EXPECT_FALSE(m.Invalid(EngineMetrics::kKvUsage));
  EXPECT_EQ(m.waiting, 132.0);
}

TEST(EngineMetrics, OldNamesGarbageIsInvalidToo) {
  EngineMetrics m = Extract(testing::V06WithKv("NaN"), EngineType::kVllm);
  EXPECT_TRUE(m.Invalid(EngineMetrics::kKvUsage));
  EXPECT_EQ(Extract(testing::V06WithKv("0.96"), EngineType::kVllm).kv_usage, 0.96);
}

// Found by fuzz/prom_parser_fuzz (fuzz/corpus/prom_parser/huge-capacity.txt): two engines
// with num_gpu_blocks near INT64_MAX overflowed the int64_t sum (UBSan: signed overflow).
// Garbage capacity is now invalid, like a garbage sample, and usage falls back to the mean.
TEST(EngineMetricsFuzzRegression, HugeCapacityLabelsAreInvalidNotSummed) {
  constexpr std::string_view kText =
      "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"9223372036854775807\"} 1\n"
      "vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"9223372036854775807\"} 1\n"
      "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n"
      "vllm:kv_cache_usage_perc{engine=\"1\"} 1\n";
  EngineMetrics m = Extract(kText, EngineType::kVllm);
  EXPECT_TRUE(m.Invalid(EngineMetrics::kNumGpuBlocks));
  EXPECT_FALSE(m.Has(EngineMetrics::kNumGpuBlocks));
  EXPECT_EQ(m.num_gpu_blocks, 0);
  EXPECT_TRUE(m.Has(EngineMetrics::kBlockSize));
  EXPECT_EQ(m.block_size, 16);
  EXPECT_EQ(m.kv_usage, 0.75);
}

TEST(EngineMetricsFuzzRegression, NegativeCapacityIsInvalidNoneIsUnknown) {
  EngineMetrics neg = Extract(
      "vllm:cache_config_info{block_size=\"-16\",num_gpu_blocks=\"-5\"} 1\n", EngineType::kVllm);
  EXPECT_TRUE(neg.Invalid(EngineMetrics::kNumGpuBlocks));
  EXPECT_TRUE(neg.Invalid(EngineMetrics::kBlockSize));
  EngineMetrics none = Extract(
      "vllm:cache_config_info{block_size=\"None\",num_gpu_blocks=\"None\"} 1\n", EngineType::kVllm);
  EXPECT_EQ(none.invalid, 0u);
  EXPECT_EQ(none.present, 0u);
}

TEST(EngineMetrics, EngineTypeNames) {
  EXPECT_EQ(ParseEngineType("vllm"), EngineType::kVllm);
  EXPECT_EQ(ParseEngineType("sglang"), EngineType::kSglang);
  EXPECT_EQ(ParseEngineType("trt"), std::nullopt);
  EXPECT_EQ(EngineTypeName(EngineType::kSglang), "sglang");
}

}  // namespace
}  // namespace kvroute::metrics
