// What an endpoint picker spends per request outside gRPC (issue 8, item 7): the OpenAI
// body parsed as `serve` and `epp` parse it, the scheduler's request built from it, and
// the routing core's pick at 100 endpoints (kvroute policy: prefix hashing of the whole
// prompt, saturation filter, scorers), then the request's end.
//
// BM_PickerCpu/<prompt bytes>
//   Parse + Pick + OnFinished for one request whose prompt is 4 KB, 220 KB or 1 MB, in
//   64 prefix groups. The time per iteration is the picker's CPU for the request
//   (single thread; gRPC framing and protobuf decoding not included: see
//   docs/BENCHMARKS.md for the end-to-end figures).
//
// BM_SchedulingLatency/<endpoints>
//   Wall time of RoutingCore::Pick alone (4 KB prompts), as percentiles: p50_us, p99_us.
// BM_SloPickLatency/<endpoints>/<policy>: the same for kvroute and kvroute-slo with a
//   trained latency model (below).
// BM_PdPickLatency/<endpoints>/<prefill endpoints>: the same in a P/D pool (below).
//
//   build/bench/picker_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "core/api/openai.h"
#include "core/routing/routing_core.h"
#include "core/sched/types.h"

namespace {

using kvroute::routing::CoreOptions;
using kvroute::routing::EndpointSpec;
using kvroute::routing::PickRequest;
using kvroute::routing::PickResult;
using kvroute::routing::RoutingCore;
using kvroute::routing::ScrapeResult;
namespace api = kvroute::api;

ScrapeResult Scrape(uint32_t id) {
  ScrapeResult r;
  r.ok = true;
  r.sent_at_s = 0.0;
  r.metrics.kv_usage = 0.1 + 0.005 * (id % 100);
  r.metrics.waiting = id % 3;
  r.metrics.running = 4 + id % 5;
  r.metrics.num_gpu_blocks = 26304;
  r.metrics.block_size = 16;
  using F = kvroute::metrics::EngineMetrics;
  r.metrics.present = F::kKvUsage | F::kWaiting | F::kRunning | F::kNumGpuBlocks | F::kBlockSize;
  return r;
}

std::unique_ptr<RoutingCore> MakeCore(int endpoints, const char* policy = "kvroute",
                                     double slo_ttft_s = 0.0, int prefill = 0) {
  auto core = std::make_unique<RoutingCore>();
  CoreOptions o;
  o.scheduling.policy = policy;
  o.default_slo_ttft_s = slo_ttft_s;
  o.health.staleness_s = 1e9;  // virtual time stands still here
  std::vector<EndpointSpec> eps;
  for (int i = 0; i < endpoints; ++i) {
    EndpointSpec e;
    e.port = static_cast<uint16_t>(10000 + i);
    e.host = "10.0." + std::to_string(i / 250) + "." + std::to_string(1 + i % 250);
    e.address = e.host + ":8000";
    // The first `prefill` endpoints are prefill ones, the rest decode (issue 25).
    if (prefill > 0) e.labels = {{"llm-d.ai/role", i < prefill ? "prefill" : "decode"}};
    eps.push_back(e);
  }
  if (!core->Configure(o, eps, 0.0).ok()) std::abort();
  for (int i = 0; i < endpoints; ++i) core->OnScrape(static_cast<uint32_t>(i), Scrape(i), 0.0);
  return core;
}

// A completions body whose prompt is `bytes` long: a group's shared prefix (half the
// prompt), then text of its own.
std::string Body(std::size_t bytes, int group, int i) {
  std::string prompt = "system prompt of group " + std::to_string(group) + ". ";
  while (prompt.size() < bytes / 2) prompt += static_cast<char>('a' + (group * 7 + prompt.size()) % 26);
  prompt += " request " + std::to_string(i) + " ";
  while (prompt.size() < bytes) prompt += static_cast<char>('a' + (i * 13 + prompt.size()) % 26);
  std::string body = "{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"max_tokens\":128,\"prompt\":";
  api::AppendJsonString(body, prompt);
  body += "}";
  body.reserve(body.size() + api::kJsonPadding);
  return body;
}

void BM_PickerCpu(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  auto core = MakeCore(100);
  std::vector<std::string> bodies;
  for (int i = 0; i < 64; ++i) bodies.push_back(Body(bytes, i % 16, i));
  std::size_t k = 0;
  double now = 1.0;
  for (auto _ : state) {
    const std::string& body = bodies[k++ % bodies.size()];
    api::ParseResult parsed = api::ParseRequestPadded(api::Endpoint::kCompletions, body);
    if (!parsed.ok()) std::abort();
    PickRequest pr;
    pr.request = kvroute::sched::FromParsed(*parsed.request);
    pr.dispatch_first = true;
    PickResult r = core->Pick(pr, now);
    if (!r.ok()) std::abort();
    core->OnFinished(r.handle, r.ranked[0], 200, now);
    now += 1e-4;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_PickerCpu)->Arg(4 << 10)->Arg(220 << 10)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

// 256 parsed 4 KB completion bodies in 32 groups (`bodies` keeps the text they view).
void ParseBodies(bool stream, std::vector<std::string>& bodies,
                 std::vector<api::ParsedRequest>& parsed) {
  for (int i = 0; i < 256; ++i) bodies.push_back(Body(4 << 10, i % 32, i));
  for (const std::string& b : bodies) {
    api::ParseResult p = api::ParseRequestPadded(api::Endpoint::kCompletions, b);
    if (!p.ok()) std::abort();
    p.request->stream = stream;
    parsed.push_back(std::move(*p.request));
  }
}

// Times RoutingCore::Pick alone over the benchmark's iterations (4 KB prompts in 32
// groups) and reports p50_us and p99_us. With `answer`, every request streams and is
// answered (first token 20-60 ms after dispatch, 10 tokens), so the latency model trains;
// otherwise it just ends.
void TimePicks(benchmark::State& state, RoutingCore& core, bool answer) {
  std::vector<std::string> bodies;
  std::vector<api::ParsedRequest> parsed;
  ParseBodies(answer, bodies, parsed);
  std::vector<double> us;
  us.reserve(1 << 20);
  std::size_t k = 0;
  double now = 1.0;
  for (auto _ : state) {
    PickRequest pr;
    pr.request = kvroute::sched::FromParsed(parsed[k++ % parsed.size()]);
    pr.dispatch_first = true;
    auto t0 = std::chrono::steady_clock::now();
    PickResult r = core.Pick(pr, now);
    auto t1 = std::chrono::steady_clock::now();
    if (!r.ok()) std::abort();
    if (r.disaggregated()) core.OnPrefillDone(r.prefill, r.prefill_tokens);
    if (answer) {
      const double first = now + 0.02 + 0.04 * static_cast<double>(k % 7) / 7.0;
      core.OnFirstToken(r.handle, first);
      core.OnTokens(r.handle, 10, first + 0.1);
      core.OnFinished(r.handle, r.ranked[0], 200, first + 0.1);
    } else {
      core.OnFinished(r.handle, r.ranked[0], 200, now);
    }
    if (us.size() < us.capacity()) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    now += 1e-4;
  }
  std::sort(us.begin(), us.end());
  auto pct = [&](double q) { return us.empty() ? 0.0 : us[static_cast<std::size_t>(q * (us.size() - 1))]; };
  state.counters["p50_us"] = pct(0.50);
  state.counters["p99_us"] = pct(0.99);
}

void BM_SchedulingLatency(benchmark::State& state) {
  auto core = MakeCore(static_cast<int>(state.range(0)));
  TimePicks(state, *core, false);
}
BENCHMARK(BM_SchedulingLatency)->Arg(8)->Arg(100)->Unit(benchmark::kMicrosecond);

// BM_SloPickLatency/<endpoints>/<policy: 0 kvroute, 1 kvroute-slo>
//   As BM_SchedulingLatency, with a 1 s TTFT objective and every request answered, so the
//   latency model is trained and kvroute-slo predicts at every pick (issue 24: p99 at 100
//   endpoints at most 2x kvroute's).
void BM_SloPickLatency(benchmark::State& state) {
  const bool slo = state.range(1) == 1;
  auto core = MakeCore(static_cast<int>(state.range(0)), slo ? "kvroute-slo" : "kvroute", 1.0);
  TimePicks(state, *core, true);
  // A long run must have had the model predicting (short calibration runs may not).
  if (state.iterations() > 1000 && core->latency_stats().ttft_errors.n == 0) std::abort();
}
BENCHMARK(BM_SloPickLatency)->Args({8, 0})->Args({8, 1})->Args({100, 0})->Args({100, 1})
    ->Unit(benchmark::kMicrosecond);

// BM_PdPickLatency/<endpoints>/<prefill endpoints>
//   As BM_SchedulingLatency in a pool where the first <prefill endpoints> are labelled
//   llm-d.ai/role=prefill and the rest decode (issue 25): every 4 KB prompt (about 1,000
//   tokens, half of them a group's shared prefix) is a pair, so each pick adds the
//   decider and the prefill choice (its prefix chain, every prefill endpoint's held
//   blocks). /<n>/0 is the same pool unlabelled, in the same run.
void BM_PdPickLatency(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto core = MakeCore(n, "kvroute", 0.0, static_cast<int>(state.range(1)));
  TimePicks(state, *core, false);
}
BENCHMARK(BM_PdPickLatency)->Args({8, 0})->Args({8, 4})->Args({100, 0})->Args({100, 50})
    ->Unit(benchmark::kMicrosecond);

// BM_SloWaitBudget/<endpoints>
//   What flow control adds to the admission of a request that will probably wait (issue
//   24): its prefix chain (RoutingCore::PrefixKey, computed for a waiting request before
//   issue 24 too) and RoutingCore::SloWaitBudget (every ready endpoint's held blocks, one
//   prediction), on a kvroute core whose model was trained by 2,000 answered picks over
//   the same 4 KB prompts. Compare with BM_SloPickLatency/<endpoints>/0 in the same run.
void BM_SloWaitBudget(benchmark::State& state) {
  auto core = MakeCore(static_cast<int>(state.range(0)), "kvroute", 1.0);
  std::vector<std::string> bodies;
  std::vector<api::ParsedRequest> parsed;
  ParseBodies(true, bodies, parsed);
  double now = 1.0;
  for (int i = 0; i < 2000; ++i, now += 1e-4) {
    PickRequest pr;
    pr.request = kvroute::sched::FromParsed(parsed[i % parsed.size()]);
    pr.dispatch_first = true;
    PickResult r = core->Pick(pr, now);
    if (!r.ok()) std::abort();
    core->OnFirstToken(r.handle, now + 0.03);
    core->OnTokens(r.handle, 10, now + 0.13);
    core->OnFinished(r.handle, r.ranked[0], 200, now + 0.13);
  }
  if (core->latency_stats().ttft_errors.n == 0) std::abort();  // the model predicts
  std::vector<uint64_t> key;
  std::vector<double> us;
  us.reserve(1 << 20);
  std::size_t k = 0;
  for (auto _ : state) {
    const kvroute::sched::SchedRequest req = kvroute::sched::FromParsed(parsed[k++ % parsed.size()]);
    auto t0 = std::chrono::steady_clock::now();
    core->PrefixKey(req, key);
    auto budget = core->SloWaitBudget(req, key);
    auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(budget);
    if (!budget || !budget->predicted) std::abort();
    if (us.size() < us.capacity()) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  auto pct = [&](double q) { return us.empty() ? 0.0 : us[static_cast<std::size_t>(q * (us.size() - 1))]; };
  state.counters["p50_us"] = pct(0.50);
  state.counters["p99_us"] = pct(0.99);
}
BENCHMARK(BM_SloWaitBudget)->Arg(8)->Arg(100)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
