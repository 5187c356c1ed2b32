// Micro-benchmarks of the simulated engine. The target: one core drives 8 replicas of
// 256 decoding sequences each at time-scale 1, i.e. 8 engine steps must cost far less
// than one simulated step (~7-35 ms at batch 256, by the H100 step model).
#include <benchmark/benchmark.h>

#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/engine/tokenizer.h"

namespace kvroute::engine {
namespace {

constexpr int kPromptTokens = 512;
constexpr int kMaxOutput = 1024;  // 256 x (512 + 1024) tokens fit in 26303 blocks

// An H100 replica kept at `seqs` running decoders: finished requests are replaced.
class SteadyReplica {
 public:
  SteadyReplica(int seqs, uint64_t seed) : engine_(*PresetConfig("llama3-8b-h100")), rng_(seed) {
    for (int i = 0; i < seqs; ++i) Add();
    // Warm up until every sequence is past prefill.
    while (stats_decode_ < seqs) {
      Step();
      stats_decode_ = result_.decode_seqs;
    }
  }

  void Step() {
    engine_.Step(now_, &result_);
    now_ += result_.duration_s;
    for (const RequestOutput& o : result_.outputs) {
      if (o.finished) Add();
    }
  }

  const StepResult& result() const { return result_; }
  double now() const { return now_; }

 private:
  void Add() {
    EngineRequest r;
    r.id = next_id_++;
    r.prompt_tokens.resize(kPromptTokens);
    // Distinct prompts with a shared 256-token system prefix, as chat traffic has.
    std::iota(r.prompt_tokens.begin(), r.prompt_tokens.end(), 0u);
    for (int i = 256; i < kPromptTokens; ++i) r.prompt_tokens[i] = static_cast<uint32_t>(rng_());
    r.max_tokens = 1 + static_cast<int>(rng_() % kMaxOutput);
    r.arrival_s = now_;
    engine_.AddRequest(std::move(r));
  }

  Engine engine_;
  std::mt19937_64 rng_;
  StepResult result_;
  uint64_t next_id_ = 0;
  double now_ = 0;
  int stats_decode_ = 0;
};

void BM_DecodeStep256(benchmark::State& state) {
  SteadyReplica replica(256, 1);
  double sim = 0;
  int64_t steps = 0;
  for (auto _ : state) {
    const double before = replica.now();
    replica.Step();
    sim += replica.now() - before;
    ++steps;
  }
  state.SetItemsProcessed(steps * 256);  // tokens generated
  state.counters["sim_ms_per_step"] = sim / static_cast<double>(steps) * 1e3;
  state.counters["running"] = replica.result().num_scheduled;
}
BENCHMARK(BM_DecodeStep256);

// 8 replicas stepped round-robin by one thread: the `kvroute sim` load at time-scale 1.
void BM_DecodeStep8x256(benchmark::State& state) {
  std::vector<std::unique_ptr<SteadyReplica>> replicas;
  for (int i = 0; i < 8; ++i) replicas.push_back(std::make_unique<SteadyReplica>(256, 100 + i));
  double sim = 0;
  int64_t rounds = 0;
  for (auto _ : state) {
    double longest = 0;
    for (auto& r : replicas) {
      const double before = r->now();
      r->Step();
      longest = std::max(longest, r->now() - before);
    }
    sim += longest;
    ++rounds;
  }
  state.SetItemsProcessed(rounds * 8 * 256);
  // Real-time headroom = sim_ms_per_round / (measured time per round).
  state.counters["sim_ms_per_round"] = sim / static_cast<double>(rounds) * 1e3;
}
BENCHMARK(BM_DecodeStep8x256);

// Admission with prefix hits: a 2048-token prompt sharing 1792 tokens with earlier ones,
// prefilled and finished (max_tokens 1) on a small batch; measures the lookup/allocation
// path rather than decode.
void BM_AdmitPrefillFinish(benchmark::State& state) {
  Engine engine(*PresetConfig("llama3-8b-h100"));
  std::vector<uint32_t> prompt(2048);
  std::iota(prompt.begin(), prompt.end(), 0u);
  uint64_t id = 0;
  double now = 0;
  StepResult result;
  for (auto _ : state) {
    EngineRequest r;
    r.id = id++;
    r.prompt_tokens = prompt;
    for (int i = 1792; i < 2048; ++i) r.prompt_tokens[i] = static_cast<uint32_t>(id * 4096 + i);
    r.max_tokens = 1;
    engine.AddRequest(std::move(r));
    while (engine.HasWork()) {
      engine.Step(now, &result);
      now += result.duration_s;
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["hit_rate"] =
      static_cast<double>(engine.Stats().prefix_hits_tokens) /
      static_cast<double>(std::max<int64_t>(1, engine.Stats().prefix_queries_tokens));
}
BENCHMARK(BM_AdmitPrefillFinish);

void BM_Tokenize4KiB(benchmark::State& state) {
  std::string text;
  while (text.size() < 4096) text += "The quick brown fox jumps over the lazy dog. ";
  text.resize(4096);
  std::vector<uint32_t> ids;
  for (auto _ : state) {
    ids.clear();
    TokenizeInto(text, &ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(text.size()));
}
BENCHMARK(BM_Tokenize4KiB);

}  // namespace
}  // namespace kvroute::engine

BENCHMARK_MAIN();
