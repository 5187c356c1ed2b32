// The routing core under concurrency (issue 7): what a front end pays per request and
// whether observability or scrapes stall it.
//
// BM_RequestCycle/<endpoints>/threads:N
//   Pick + OnDispatched + OnFirstToken + OnFinished on one shared RoutingCore (kvroute
//   policy, 4k-character prompts in 32 prefix groups), from 1 or 2 threads at once, with
//   a scrape fed in every 64 requests. items_per_second is the whole core's request rate
//   (all threads together).
//
// BM_PickWhileMetricsRendered/<endpoints>/<mode>
//   Wall-time percentiles of one Pick (p50_us, p99_us) on one thread while a second
//   thread does, in a loop:
//     mode 0: nothing (the reference, measured in the same run)
//     mode 1: RoutingCore::AppendMetrics, as GET /metrics does now (no scheduler lock)
//     mode 2: AppendMetrics inside a mutex that picks also take: the old router's design,
//             where /metrics formatted under the lock every pick needed
//   renders_per_s says how hard the renderer pushed.
//
//   build/bench/routing_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/routing/routing_core.h"

namespace {

using kvroute::routing::CoreOptions;
using kvroute::routing::EndpointSpec;
using kvroute::routing::PickRequest;
using kvroute::routing::PickResult;
using kvroute::routing::RoutingCore;
using kvroute::routing::ScrapeResult;

std::vector<std::string> Prompts() {
  std::vector<std::string> out;
  for (int g = 0; g < 32; ++g) {
    std::string shared = "system prompt " + std::to_string(g) + " ";
    while (shared.size() < 3072) shared += static_cast<char>('a' + (g * 11 + shared.size()) % 26);
    for (int i = 0; i < 8; ++i) {
      std::string p = shared + " question " + std::to_string(i) + " ";
      while (p.size() < 4096) p += static_cast<char>('a' + (i * 7 + p.size()) % 26);
      out.push_back(std::move(p));
    }
  }
  return out;
}

ScrapeResult Scrape(uint32_t id, double at) {
  ScrapeResult r;
  r.ok = true;
  r.sent_at_s = at;
  r.metrics.kv_usage = 0.1 + 0.01 * (id % 50);
  r.metrics.waiting = id % 3;
  r.metrics.running = 4 + id % 5;
  r.metrics.num_gpu_blocks = 26304;
  r.metrics.block_size = 16;
  using F = kvroute::metrics::EngineMetrics;
  r.metrics.present = F::kKvUsage | F::kWaiting | F::kRunning | F::kNumGpuBlocks | F::kBlockSize;
  return r;
}

std::unique_ptr<RoutingCore> MakeCore(int endpoints) {
  auto core = std::make_unique<RoutingCore>();
  CoreOptions o;
  o.scheduling.policy = "kvroute";
  o.health.staleness_s = 1e9;  // virtual time stands still here
  std::vector<EndpointSpec> eps;
  for (int i = 0; i < endpoints; ++i) {
    EndpointSpec e;
    e.port = static_cast<uint16_t>(10000 + i);
    e.host = "10.0.0.1";
    e.address = "10.0.0.1:" + std::to_string(e.port);
    eps.push_back(e);
  }
  core->Configure(o, eps, 0.0);
  for (int i = 0; i < endpoints; ++i) core->OnScrape(i, Scrape(i, 0.0), 0.0);
  return core;
}

const std::vector<std::string>& SharedPrompts() {
  static const std::vector<std::string> p = Prompts();
  return p;
}

// One request as the HTTP front end drives it. Adds the wall time of the Pick call and of
// the rest (first token, finished) to `pick_ns` / `rest_ns`.
void Cycle(RoutingCore& core, const std::string& prompt, double now, double& pick_ns,
           double& rest_ns) {
  PickRequest pr;
  pr.request.model = "m";
  pr.request.prompt = prompt;
  pr.request.max_tokens = 128;
  pr.dispatch_first = true;  // as the HTTP front end does
  auto t0 = std::chrono::steady_clock::now();
  PickResult r = core.Pick(pr, now);
  auto t1 = std::chrono::steady_clock::now();
  core.OnFirstToken(r.handle, now);
  core.OnFinished(r.handle, r.ranked[0], 200, now);
  auto t2 = std::chrono::steady_clock::now();
  pick_ns += std::chrono::duration<double, std::nano>(t1 - t0).count();
  rest_ns += std::chrono::duration<double, std::nano>(t2 - t1).count();
}

RoutingCore* g_core = nullptr;

void BM_RequestCycle(benchmark::State& state) {
  const int endpoints = static_cast<int>(state.range(0));
  static std::unique_ptr<RoutingCore> holder;
  if (state.thread_index() == 0) {
    holder = MakeCore(endpoints);
    g_core = holder.get();
  }
  // Google Benchmark starts every thread's loop together, after the set-up above.
  const auto& prompts = SharedPrompts();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 7919;
  uint64_t n = 0;
  double pick_ns = 0, rest_ns = 0;
  for (auto _ : state) {
    Cycle(*g_core, prompts[i++ % prompts.size()], 1.0, pick_ns, rest_ns);
    if (++n % 64 == 0) {
      uint32_t id = static_cast<uint32_t>(n / 64 % endpoints);
      g_core->OnScrape(id, Scrape(id, 1.0), 1.0);
    }
  }
  state.SetItemsProcessed(state.iterations());
  // Per thread, averaged over threads by the library.
  state.counters["pick_ns"] = benchmark::Counter(pick_ns / static_cast<double>(n), benchmark::Counter::kAvgThreads);
  state.counters["rest_ns"] = benchmark::Counter(rest_ns / static_cast<double>(n), benchmark::Counter::kAvgThreads);
}
BENCHMARK(BM_RequestCycle)->Arg(8)->Arg(100)->Threads(1)->Threads(2)->UseRealTime();

void BM_PickWhileMetricsRendered(benchmark::State& state) {
  const int endpoints = static_cast<int>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  auto core = MakeCore(endpoints);
  const auto& prompts = SharedPrompts();
  std::mutex old_design_lock;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> renders{0};
  std::thread renderer;
  if (mode != 0) {
    renderer = std::thread([&] {
      std::string out;
      while (!stop.load(std::memory_order_relaxed)) {
        out.clear();
        if (mode == 2) {
          std::lock_guard<std::mutex> lock(old_design_lock);
          core->AppendMetrics(out, 1.0);
        } else {
          core->AppendMetrics(out, 1.0);
        }
        benchmark::DoNotOptimize(out.data());
        renders.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::vector<double> us;
  us.reserve(1 << 20);
  std::size_t i = 0;
  const auto t_start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    PickRequest pr;
    pr.request.model = "m";
    pr.request.prompt = prompts[i++ % prompts.size()];
    pr.request.max_tokens = 128;
    auto t0 = std::chrono::steady_clock::now();
    PickResult r;
    if (mode == 2) {
      std::lock_guard<std::mutex> lock(old_design_lock);
      r = core->Pick(pr, 1.0);
    } else {
      r = core->Pick(pr, 1.0);
    }
    auto t1 = std::chrono::steady_clock::now();
    if (us.size() < us.capacity()) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    core->OnDispatched(r.handle, r.ranked[0], 1.0);
    core->OnFinished(r.handle, r.ranked[0], 200, 1.0);
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  stop = true;
  if (renderer.joinable()) renderer.join();
  std::sort(us.begin(), us.end());
  auto pct = [&](double q) {
    return us.empty() ? 0.0 : us[std::min(us.size() - 1, static_cast<std::size_t>(q * us.size()))];
  };
  state.counters["p50_us"] = pct(0.50);
  state.counters["p99_us"] = pct(0.99);
  state.counters["p999_us"] = pct(0.999);
  state.counters["renders_per_s"] = elapsed > 0 ? static_cast<double>(renders.load()) / elapsed : 0;
}
BENCHMARK(BM_PickWhileMetricsRendered)
    ->ArgsProduct({{8, 100}, {0, 1, 2}})
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
