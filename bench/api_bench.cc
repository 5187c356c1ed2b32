// ParseRequest cost as a function of prompt size: the router parses every body once, so
// this is its per-request floor for long prompts (the EPP's known pain point is ~286 ms
// per 220 KB prompt, mostly buffering).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "core/api/openai.h"

namespace {

using kvroute::api::Endpoint;

// Prose-like text of `bytes` characters: words of 3-8 letters, some punctuation and a
// newline now and then (escaped as \n in the JSON, like real prompts).
std::string MakeText(size_t bytes) {
  std::string s;
  s.reserve(bytes);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  while (s.size() < bytes) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const int len = 3 + static_cast<int>(x % 6);
    for (int i = 0; i < len; ++i) s.push_back(static_cast<char>('a' + (x >> (8 + i * 5)) % 26));
    s.push_back((x >> 50) % 29 == 0 ? '\n' : (x >> 50) % 17 == 0 ? '.' : ' ');
  }
  s.resize(bytes);
  return s;
}

std::string CompletionsBody(size_t prompt_bytes) {
  std::string body = R"({"model":"meta-llama/Llama-3.1-8B-Instruct","max_tokens":256,)"
                     R"("stream":true,"stream_options":{"include_usage":true},"prompt":)";
  kvroute::api::AppendJsonString(body, MakeText(prompt_bytes));
  body += "}";
  return body;
}

std::string ChatBody(size_t prompt_bytes) {
  std::string body = R"({"model":"meta-llama/Llama-3.1-8B-Instruct","max_completion_tokens":256,)"
                     R"("messages":[{"role":"system","content":)";
  kvroute::api::AppendJsonString(body, MakeText(prompt_bytes * 3 / 4));
  body += R"(},{"role":"user","content":[{"type":"text","text":)";
  kvroute::api::AppendJsonString(body, MakeText(prompt_bytes / 4));
  body += "}]}]}";
  return body;
}

void Run(benchmark::State& state, const std::string& body, Endpoint ep) {
  for (auto _ : state) {
    auto r = kvroute::api::ParseRequest(ep, body);
    if (!r.ok()) state.SkipWithError(r.error.message.c_str());
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
  state.counters["body_bytes"] = static_cast<double>(body.size());
}

// Argument: prompt size in tokens at ~4 characters per token.
void BM_ParseCompletions(benchmark::State& state) {
  Run(state, CompletionsBody(static_cast<size_t>(state.range(0)) * 4), Endpoint::kCompletions);
}
BENCHMARK(BM_ParseCompletions)->Arg(1000)->Arg(4000)->Arg(100000);

void BM_ParseChat(benchmark::State& state) {
  Run(state, ChatBody(static_cast<size_t>(state.range(0)) * 4), Endpoint::kChatCompletions);
}
BENCHMARK(BM_ParseChat)->Arg(1000)->Arg(4000)->Arg(100000);

// The 220 KB prompt from the EPP issue report.
void BM_ParseCompletions220KB(benchmark::State& state) {
  Run(state, CompletionsBody(220 * 1024), Endpoint::kCompletions);
}
BENCHMARK(BM_ParseCompletions220KB);

// Same, with a padded receive buffer: no copy into simdjson's buffer.
void BM_ParseCompletions220KBPadded(benchmark::State& state) {
  std::string body = CompletionsBody(220 * 1024);
  const size_t n = body.size();
  body.append(kvroute::api::kJsonPadding, ' ');
  for (auto _ : state) {
    auto r = kvroute::api::ParseRequestPadded(Endpoint::kCompletions, std::string_view(body.data(), n));
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(BM_ParseCompletions220KBPadded);

}  // namespace

BENCHMARK_MAIN();
