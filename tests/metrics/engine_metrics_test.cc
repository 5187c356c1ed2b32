#include "core/metrics/engine_metrics.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

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

// ---- LoRA (vllm:lora_requests_info) ----

// The adapters of one list, as AdapterKeys, in the order listed.
std::vector<uint64_t> Keys(std::initializer_list<std::string_view> names) {
  std::vector<uint64_t> out;
  for (std::string_view n : names) out.push_back(AdapterKey(n));
  return out;
}
std::vector<uint64_t> Running(const EngineMetrics& m) {
  return {m.running_loras.begin(), m.running_loras.begin() + m.n_running_loras};
}
std::vector<uint64_t> Waiting(const EngineMetrics& m) {
  return {m.waiting_loras.begin(), m.waiting_loras.begin() + m.n_waiting_loras};
}
std::string LoraLine(std::string_view max_lora, std::string_view running,
                     std::string_view waiting, std::string_view value) {
  return "vllm:lora_requests_info{max_lora=\"" + std::string(max_lora) +
         "\",running_lora_adapters=\"" + std::string(running) + "\",waiting_lora_adapters=\"" +
         std::string(waiting) + "\"} " + std::string(value) + "\n";
}

// vLLM's exact output: three series (every label combination it ever wrote); the one with
// the largest timestamp (the second) is the current state.
TEST(EngineMetricsLora, VllmFixtureNewestSeries) {
  ParseReport r;
  EngineMetrics m = Extract(ReadTestdata(testing::kLora), EngineType::kVllm, {}, &r);
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(m.Has(EngineMetrics::kLora));
  EXPECT_FALSE(m.Invalid(EngineMetrics::kLora));
  EXPECT_EQ(m.max_lora, 2);
  EXPECT_EQ(Running(m), Keys({"sql-lora", "chat-lora"}));
  EXPECT_EQ(Waiting(m), Keys({"summarize-lora"}));
  EXPECT_FALSE(m.lora_truncated);
  EXPECT_EQ(m.base_model_key, AdapterKey("meta-llama/Llama-3.1-8B-Instruct"));
  EXPECT_EQ(m.running, 6.0);  // the rest of the scrape as usual
  EXPECT_EQ(m.waiting, 2.0);
}

// The family has no model_name label in vLLM: a model filter keeps it; and the filtered
// load series still give the base model.
TEST(EngineMetricsLora, ModelFilterKeepsTheUnlabelledFamily) {
  const std::string text = ReadTestdata(testing::kLora);
  EngineMetrics m = Extract(text, EngineType::kVllm, "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_TRUE(m.Has(EngineMetrics::kLora));
  EXPECT_EQ(Running(m), Keys({"sql-lora", "chat-lora"}));
  EXPECT_EQ(m.base_model_key, AdapterKey("meta-llama/Llama-3.1-8B-Instruct"));
  // A filter naming another model drops the load series (base model unknown) but not the
  // unlabelled LoRA family.
  EngineMetrics other = Extract(text, EngineType::kVllm, "other-model");
  EXPECT_FALSE(other.Has(EngineMetrics::kRunning));
  EXPECT_EQ(other.base_model_key, 0u);
  EXPECT_TRUE(other.Has(EngineMetrics::kLora));
  // Were the family labelled with the model, a series of another model is skipped.
  const std::string labelled =
      "vllm:lora_requests_info{max_lora=\"3\",model_name=\"base-a\",running_lora_adapters=\"x\","
      "waiting_lora_adapters=\"\"} 20\n"
      "vllm:lora_requests_info{max_lora=\"1\",model_name=\"base-b\",running_lora_adapters=\"y\","
      "waiting_lora_adapters=\"\"} 30\n";
  EngineMetrics a = Extract(labelled, EngineType::kVllm, "base-a");
  EXPECT_EQ(a.max_lora, 3);
  EXPECT_EQ(Running(a), Keys({"x"}));
  EngineMetrics all = Extract(labelled, EngineType::kVllm);
  EXPECT_EQ(all.max_lora, 1);
  EXPECT_EQ(Running(all), Keys({"y"}));
}

TEST(EngineMetricsLora, MissingFamilyIsAbsentNotInvalid) {
  EngineMetrics m = Extract(ReadTestdata(kV010), EngineType::kVllm);
  EXPECT_FALSE(m.Has(EngineMetrics::kLora));
  EXPECT_FALSE(m.Invalid(EngineMetrics::kLora));
  EXPECT_EQ(m.n_running_loras, 0);
  // SGLang has no such family: nothing is read even when the vLLM series is there.
  EngineMetrics s = Extract(ReadTestdata(testing::kLora), EngineType::kSglang);
  EXPECT_FALSE(s.Has(EngineMetrics::kLora));
  EXPECT_FALSE(s.Invalid(EngineMetrics::kLora));
}

// NaN, Inf and negative values are not timestamps: such series are skipped; only garbage
// makes the field invalid.
TEST(EngineMetricsLora, GarbageValues) {
  EngineMetrics skip = Extract(LoraLine("2", "a", "", "NaN") + LoraLine("2", "b", "", "5") +
                                   LoraLine("2", "c", "", "+Inf") + LoraLine("2", "d", "", "-9"),
                               EngineType::kVllm);
  EXPECT_TRUE(skip.Has(EngineMetrics::kLora));
  EXPECT_EQ(Running(skip), Keys({"b"}));
  for (std::string_view v : {"NaN", "+Inf", "-Inf", "-1"}) {
    EngineMetrics m = Extract(LoraLine("2", "a", "", v), EngineType::kVllm);
    EXPECT_FALSE(m.Has(EngineMetrics::kLora)) << v;
    EXPECT_TRUE(m.Invalid(EngineMetrics::kLora)) << v;
    EXPECT_EQ(m.n_running_loras, 0) << v;
  }
  // max_lora must be a non-negative integer.
  for (std::string_view max : {"", "-1", "two", "1.5", "None", "99999999999999999999"}) {
    EngineMetrics m = Extract(LoraLine(max, "a", "", "5"), EngineType::kVllm);
    EXPECT_FALSE(m.Has(EngineMetrics::kLora)) << max;
    EXPECT_TRUE(m.Invalid(EngineMetrics::kLora)) << max;
  }
  EngineMetrics zero = Extract(LoraLine("0", "", "", "5"), EngineType::kVllm);
  EXPECT_TRUE(zero.Has(EngineMetrics::kLora));
  EXPECT_EQ(zero.max_lora, 0);
  // The newest series decides, even when an older one was well formed.
  EngineMetrics newest_bad =
      Extract(LoraLine("2", "a", "", "5") + LoraLine("x", "b", "", "6"), EngineType::kVllm);
  EXPECT_TRUE(newest_bad.Invalid(EngineMetrics::kLora));
  // The label missing altogether is as bad as a garbage value.
  EngineMetrics no_max = Extract("vllm:lora_requests_info{running_lora_adapters=\"a\"} 5\n",
                                 EngineType::kVllm);
  EXPECT_TRUE(no_max.Invalid(EngineMetrics::kLora));
}

TEST(EngineMetricsLora, ListsSplitTrimmedAndTruncated) {
  EngineMetrics m = Extract(LoraLine("4", " a , ,b,,\tc ", ",", "5"), EngineType::kVllm);
  EXPECT_EQ(Running(m), Keys({"a", "b", "c"}));
  EXPECT_EQ(m.n_waiting_loras, 0);
  EXPECT_FALSE(m.lora_truncated);
  // Escaped label values hash as their decoded names.
  EngineMetrics esc = Extract(LoraLine("4", "q\\\"x,b\\\\s", "", "5"), EngineType::kVllm);
  EXPECT_EQ(Running(esc), Keys({"q\"x", "b\\s"}));
  // More than kMaxLoraListed: the first ones kept, the flag set.
  std::string many;
  std::vector<uint64_t> first;
  for (size_t i = 0; i < EngineMetrics::kMaxLoraListed + 3; ++i) {
    const std::string name = "lora-" + std::to_string(i);
    many += (i ? "," : "") + name;
    if (i < EngineMetrics::kMaxLoraListed) first.push_back(AdapterKey(name));
  }
  EngineMetrics t = Extract(LoraLine("64", "", many, "5"), EngineType::kVllm);
  EXPECT_TRUE(t.Has(EngineMetrics::kLora));
  EXPECT_TRUE(t.lora_truncated);
  EXPECT_EQ(t.n_running_loras, 0);
  EXPECT_EQ(Waiting(t), first);
}

TEST(EngineMetricsLora, NameOverrides) {
  MetricNames names = MetricNames::For(EngineType::kVllm);
  ASSERT_TRUE(names.Set("lora_info", "my:adapters"));
  ASSERT_TRUE(names.Set("max_lora_label", "cap"));
  ASSERT_TRUE(names.Set("running_loras_label", "run"));
  ASSERT_TRUE(names.Set("waiting_loras_label", "wait"));
  EngineMetrics m;
  ExtractEngineMetrics("my:adapters{cap=\"3\",run=\"a,b\",wait=\"c\"} 7\n" +
                           LoraLine("2", "z", "", "9"),
                       names, {}, m);
  EXPECT_EQ(m.max_lora, 3);
  EXPECT_EQ(Running(m), Keys({"a", "b"}));
  EXPECT_EQ(Waiting(m), Keys({"c"}));
  // An empty family name turns the reading off.
  ASSERT_TRUE(names.Set("lora_info", ""));
  ExtractEngineMetrics("my:adapters{cap=\"3\",run=\"a,b\",wait=\"c\"} 7\n", names, {}, m);
  EXPECT_FALSE(m.Has(EngineMetrics::kLora));
  EXPECT_FALSE(m.Invalid(EngineMetrics::kLora));
}

TEST(EngineMetrics, EngineTypeNames) {
  EXPECT_EQ(ParseEngineType("vllm"), EngineType::kVllm);
  EXPECT_EQ(ParseEngineType("sglang"), EngineType::kSglang);
  EXPECT_EQ(ParseEngineType("trt"), std::nullopt);
  EXPECT_EQ(EngineTypeName(EngineType::kSglang), "sglang");
}

}  // namespace
}  // namespace kvroute::metrics
