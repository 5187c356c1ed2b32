// A fixed amount of routing-core work, for instruction counts that do not depend on the
// machine's load: N requests (Pick, OnDispatched, OnFirstToken, OnFinished) over 8
// endpoints with the kvroute policy and 4 KB prompts in 32 prefix groups, one thread.
// Prints the mean wall time of each step; run it under callgrind for instructions:
//
//   valgrind --tool=callgrind build/bench/routing_cycle 20000   # Ir / 20000 per request
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/routing/routing_core.h"

using kvroute::routing::CoreOptions;
using kvroute::routing::EndpointSpec;
using kvroute::routing::PickRequest;
using kvroute::routing::PickResult;
using kvroute::routing::RoutingCore;
using kvroute::routing::ScrapeResult;

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 200000;
  RoutingCore core;
  CoreOptions o;
  o.scheduling.policy = "kvroute";
  o.health.staleness_s = 1e9;
  std::vector<EndpointSpec> eps;
  for (int i = 0; i < 8; ++i) {
    EndpointSpec e;
    e.port = static_cast<uint16_t>(10000 + i);
    e.host = "10.0.0.1";
    e.address = "10.0.0.1:" + std::to_string(e.port);
    eps.push_back(e);
  }
  if (!core.Configure(o, eps, 0).ok()) return 1;
  for (uint32_t i = 0; i < 8; ++i) {
    ScrapeResult r;
    r.ok = true;
    using F = kvroute::metrics::EngineMetrics;
    r.metrics.present = F::kKvUsage | F::kWaiting | F::kRunning;
    r.metrics.kv_usage = 0.1;
    core.OnScrape(i, r, 0);
  }
  std::vector<std::string> prompts;
  for (int g = 0; g < 32; ++g) {
    for (int i = 0; i < 8; ++i) {
      std::string p = "system prompt " + std::to_string(g) + " ";
      while (p.size() < 3072) p += static_cast<char>('a' + (g + p.size()) % 26);
      p += " question " + std::to_string(i) + " ";
      while (p.size() < 4096) p += static_cast<char>('a' + (i + p.size()) % 26);
      prompts.push_back(std::move(p));
    }
  }
  double pick = 0, dispatch = 0, rest = 0;
  for (int k = 0; k < n; ++k) {
    PickRequest pr;
    pr.request.model = "m";
    pr.request.prompt = prompts[k % prompts.size()];
    pr.request.max_tokens = 128;
    auto t0 = std::chrono::steady_clock::now();
    PickResult r = core.Pick(pr, 1.0);
    auto t1 = std::chrono::steady_clock::now();
    core.OnDispatched(r.handle, r.ranked[0], 1.0);
    auto t2 = std::chrono::steady_clock::now();
    core.OnFirstToken(r.handle, 1.0);
    core.OnFinished(r.handle, r.ranked[0], 200, 1.0);
    auto t3 = std::chrono::steady_clock::now();
    pick += std::chrono::duration<double, std::nano>(t1 - t0).count();
    dispatch += std::chrono::duration<double, std::nano>(t2 - t1).count();
    rest += std::chrono::duration<double, std::nano>(t3 - t2).count();
  }
  std::printf("%d requests: pick %.0f ns, dispatch %.0f ns, first token + finished %.0f ns (means)\n",
              n, pick / n, dispatch / n, rest / n);
  return 0;
}
