// Scheduler cost per request: Pick (prefix hashing, index lookup, scoring, ranking) plus
// OnDispatched (recording the prefix, in-flight accounting) and OnFinished, for several
// policies, fleet sizes (8, 100, 1,000 endpoints) and prompt lengths (1k, 4k, 100k tokens at
// about 4 characters per token). Prompts come in 32 groups that share 3/4 of their text, so
// the prefix index is warm and realistic.
//
// Besides Google Benchmark's mean (of the whole Pick+OnDispatched+OnFinished cycle), every
// run reports p50_us/p99_us (wall time of the Pick call alone), cpu_p50_us/cpu_p99_us (the
// thread's CPU time for the Pick call: robust to preemption on a shared machine) and
// cycle_p99_us (wall time of the whole cycle), timed per iteration.
//
//   build-sched/bench/sched_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <string>
#include <vector>

#include "core/sched/registry.h"

namespace {

// This thread's CPU time: unlike wall time, it excludes time the thread was preempted, so
// its percentiles show the scheduler's own cost on a shared machine.
double ThreadCpuUs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

using kvroute::sched::BuildPolicy;
using kvroute::sched::EndpointState;
using kvroute::sched::PickResult;
using kvroute::sched::SchedRequest;

// A request to `model` with `prompt` and max_tokens 128 (the benchmarks' shape).
SchedRequest Request(std::string_view model, std::string_view prompt) {
  SchedRequest r;
  r.model = model;
  r.prompt = prompt;
  r.max_tokens = 128;
  return r;
}

constexpr const char* kPolicies[] = {"kvroute", "gie-default", "sglang-cache-aware",
                                     "dynamo-cost", "round-robin"};

std::vector<EndpointState> Fleet(size_t n) {
  std::vector<EndpointState> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i].id = static_cast<uint32_t>(i);
    v[i].name = "10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256) + ":8000";
    v[i].kv_usage = 0.1 + 0.6 * static_cast<double>((i * 37) % 100) / 100.0;
    v[i].waiting = static_cast<double>((i * 13) % 4);
    v[i].running = static_cast<double>((i * 7) % 40);
    v[i].num_gpu_blocks = 26304;
    v[i].block_size = 16;
    v[i].scraped_at_s = 0.0;
    v[i].scrape_ok = true;
  }
  return v;
}

std::vector<std::string> Prompts(size_t tokens, size_t count) {
  const size_t chars = tokens * 4;
  std::vector<std::string> out;
  uint64_t x = 88172645463325252ULL;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  std::vector<std::string> groups(32);
  for (auto& g : groups) {
    g.resize(chars * 3 / 4);
    for (char& c : g) c = static_cast<char>('a' + next() % 26);
  }
  for (size_t i = 0; i < count; ++i) {
    std::string p = groups[i % groups.size()];
    while (p.size() < chars) p.push_back(static_cast<char>('a' + next() % 26));
    out.push_back(std::move(p));
  }
  return out;
}

void BM_Pick(benchmark::State& state) {
  const char* policy = kPolicies[state.range(0)];
  const size_t endpoints = static_cast<size_t>(state.range(1));
  const size_t tokens = static_cast<size_t>(state.range(2));
  auto sched = BuildPolicy(policy).scheduler;
  auto fleet = Fleet(endpoints);
  const auto prompts = Prompts(tokens, 128);
  std::vector<double> pick_us, cycle_us, pick_cpu_us;
  pick_cpu_us.reserve(1 << 16);
  pick_us.reserve(1 << 16);
  cycle_us.reserve(1 << 16);
  double now = 1.0;
  size_t i = 0;
  // Warm the index and the buffers.
  for (size_t w = 0; w < prompts.size(); ++w) {
    SchedRequest r = Request("llama", prompts[w]);
    PickResult p = sched->Pick(r, fleet, now);
    sched->OnDispatched(p.handle, p.ranked[0], now);
    sched->OnFinished(p.handle, now);
  }
  for (auto _ : state) {
    SchedRequest r = Request("llama", prompts[i++ % prompts.size()]);
    now += 1e-4;
    const double c0 = ThreadCpuUs();
    const auto t0 = std::chrono::steady_clock::now();
    PickResult p = sched->Pick(r, fleet, now);
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = ThreadCpuUs();
    sched->OnDispatched(p.handle, p.ranked[0], now);
    sched->OnFinished(p.handle, now);
    const auto t2 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(p.ranked.data());
    if (pick_us.size() < pick_us.capacity()) {
      pick_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      pick_cpu_us.push_back(c1 - c0);
      cycle_us.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
    }
  }
  auto pct = [](std::vector<double>& v, double q) {
    if (v.empty()) return 0.0;
    const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
    std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
    return v[k];
  };
  state.counters["p50_us"] = pct(pick_us, 0.50);
  state.counters["p99_us"] = pct(pick_us, 0.99);
  state.counters["cpu_p50_us"] = pct(pick_cpu_us, 0.50);
  state.counters["cpu_p99_us"] = pct(pick_cpu_us, 0.99);
  state.counters["cycle_p99_us"] = pct(cycle_us, 0.99);
  state.SetLabel(std::string(policy) + " eps=" + std::to_string(endpoints) +
                 " tokens=" + std::to_string(tokens));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t policy = 0; policy < 5; ++policy) {
    for (int64_t eps : {8, 100, 1000}) {
      for (int64_t tokens : {1000, 4000, 100000}) b->Args({policy, eps, tokens});
    }
  }
}

BENCHMARK(BM_Pick)->Apply(Args)->Unit(benchmark::kMicrosecond);

// The kvroute pick with the locality-filter on against the same pick without it (issue 10's
// target: at most 1.1x). Modes: 0 = no router region (the filter is not in the profile),
// 1 = region us-east-1 and every endpoint there (the filter's full pass, nothing removed),
// 2 = half the endpoints in eu-west-1 (0.07 s away), local pool below saturation (stays
// local, so half the candidates are scored),
// 3 = the same with every local endpoint saturated (every pick spills, sticky table in
// use). Same fleet, prompts and loop as BM_Pick; the reported mean is the whole cycle.
void BM_PickLocality(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  const size_t endpoints = static_cast<size_t>(state.range(1));
  const size_t tokens = static_cast<size_t>(state.range(2));
  kvroute::sched::SchedulerOptions options;
  if (mode > 0) {
    options.region = "us-east-1";
    options.region_rtt_s = {{"eu-west-1", 0.07}};
  }
  auto sched = BuildPolicy("kvroute", options).scheduler;
  auto fleet = Fleet(endpoints);
  for (size_t i = 0; i < fleet.size(); ++i) {
    const bool remote = mode >= 2 && i % 2 == 1;
    fleet[i].SetLabels({{"region", remote ? "eu-west-1" : "us-east-1"}});
    if (mode == 3 && !remote) fleet[i].waiting = 6;
  }
  const auto prompts = Prompts(tokens, 128);
  // Metrics scraped "now", and time advancing slowly enough that they stay fresh (the
  // filter and the saturation filter treat metrics older than 1 s as unknown).
  double now = 0.0;
  for (auto& e : fleet) e.scraped_at_s = now;
  for (size_t w = 0; w < prompts.size(); ++w) {
    SchedRequest r = Request("llama", prompts[w]);
    PickResult p = sched->Pick(r, fleet, now);
    sched->OnDispatched(p.handle, p.ranked[0], now);
    sched->OnFinished(p.handle, now);
  }
  size_t i = 0;
  uint64_t remote_picks = 0;
  for (auto _ : state) {
    SchedRequest r = Request("llama", prompts[i++ % prompts.size()]);
    now += 1e-7;
    PickResult p = sched->Pick(r, fleet, now);
    remote_picks += kvroute::sched::IsRemote(p.locality) ? 1 : 0;
    sched->OnDispatched(p.handle, p.ranked[0], now);
    sched->OnFinished(p.handle, now);
    benchmark::DoNotOptimize(p.ranked.data());
  }
  state.counters["remote_share"] =
      static_cast<double>(remote_picks) / static_cast<double>(std::max<size_t>(1, i));
  static constexpr const char* kModes[] = {"off", "on-all-local", "on-half-remote",
                                           "on-spilling"};
  state.SetLabel(std::string("kvroute locality ") + kModes[mode] + " eps=" +
                 std::to_string(endpoints) + " tokens=" + std::to_string(tokens));
}

void LocalityArgs(benchmark::internal::Benchmark* b) {
  for (int64_t eps : {8, 100, 1000}) {
    for (int64_t tokens : {1000, 4000}) {
      for (int64_t mode = 0; mode < 4; ++mode) b->Args({mode, eps, tokens});
    }
  }
}

BENCHMARK(BM_PickLocality)->Apply(LocalityArgs)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
