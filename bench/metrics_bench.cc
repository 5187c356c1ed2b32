// Cost of reading one vLLM scrape: the router does this per endpoint every scrape
// interval (50 ms by default), so 100 endpoints means 2000 parses a second.
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/metrics/engine_metrics.h"
#include "core/metrics/prom_parser.h"
#include "core/metrics/prom_writer.h"

namespace {

using namespace kvroute::metrics;

// The fixture sits next to the tests, under the configured source root (not found from
// __FILE__: with the compiler cache's relative paths that names no fixed place).
std::string Fixture() {
  std::ifstream in(std::string(KVROUTE_SOURCE_DIR) +
                   "/tests/metrics/testdata/metrics-v0.10-engine-label.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The scraper's path: extract the router's numbers, skipping everything else.
void BM_ExtractVllmV010(benchmark::State& state) {
  const std::string text = Fixture();
  if (text.empty()) state.SkipWithError("fixture not found");
  const MetricNames names = MetricNames::For(EngineType::kVllm);
  for (auto _ : state) {
    EngineMetrics m;
    ParseReport r = ExtractEngineMetrics(text, names, {}, m);
    benchmark::DoNotOptimize(m);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_ExtractVllmV010);

// Every line fully validated (labels scanned, values parsed), nothing kept.
void BM_ParseEverySampleV010(benchmark::State& state) {
  const std::string text = Fixture();
  struct Count : SampleVisitor {
    double sum = 0;
    void OnSample(const Sample& s) override { sum += s.value; }
  } v;
  for (auto _ : state) {
    ParseReport r = ParsePrometheusText(text, v);
    benchmark::DoNotOptimize(r);
  }
  benchmark::DoNotOptimize(v.sum);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_ParseEverySampleV010);

// A simulated replica writing its /metrics: 6 gauges/counters and 3 histograms.
void BM_WriteReplicaMetrics(benchmark::State& state) {
  const Label labels[] = {{"engine", "0"}, {"model_name", "meta-llama/Llama-3.1-8B-Instruct"}};
  const double bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                           1,     2.5,   5,    7.5,  10,   20,   40,   80,  160, 640, 2560};
  uint64_t counts[23] = {};
  for (int i = 0; i < 23; ++i) counts[i] = static_cast<uint64_t>(i * 7);
  std::string out;
  for (auto _ : state) {
    out.clear();
    AppendGauge(out, "vllm:num_requests_running", "Running.", labels, 41);
    AppendGauge(out, "vllm:num_requests_waiting", "Waiting.", labels, 132);
    AppendGauge(out, "vllm:kv_cache_usage_perc", "KV usage.", labels, 0.9812345679012346);
    AppendCounter(out, "vllm:prefix_cache_queries_total", "Queries.", labels, 82634112);
    AppendCounter(out, "vllm:prefix_cache_hits_total", "Hits.", labels, 5784384);
    AppendCounter(out, "vllm:num_preemptions_total", "Preemptions.", labels, 1874);
    for (const char* h : {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                          "vllm:e2e_request_latency_seconds"}) {
      AppendHeader(out, h, "Histogram.", MetricType::kHistogram);
      AppendHistogramSeries(out, h, labels, bounds, counts, 1627.4655051726118);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * out.size()));
}
BENCHMARK(BM_WriteReplicaMetrics);

}  // namespace

BENCHMARK_MAIN();
