// `kvroute demo`: the seed article's story, live. For each routing policy it starts a
// fresh in-process fleet of simulated vLLM replicas (cold caches) and the router
// configured with that policy, drives the seed-8x traffic through the router with the
// load generator, and compares the policies side by side.
//
// The scenario's traffic is scaled down so that one machine with two cores can run eight
// replicas, the router and the load generator in real time: fewer requests per second,
// shorter outputs and a proportionally smaller KV cache per replica (see DemoOptions), so
// the pressure on each replica's cache stays comparable to the scenario's.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "bench/load_generator.h"
#include "core/report/writers.h"

namespace kvroute::demo {

struct DemoOptions {
  std::string scenario_path;  // empty: examples/scenarios/seed-8x.yaml, found near the binary
  std::vector<std::string> policies = {"round-robin", "least-request", "kvroute"};
  // Defaults: three policies of 40 s traffic plus at most 15 s drain stay under 3 minutes.
  double duration_s = 40.0;   // seconds of arrivals per policy
  double drain_s = 15.0;      // then at most this long for in-flight requests
  double rate = 12.0;         // requests per second (the scenario's 30, scaled down)
  double output_scale = 0.3;  // output lengths x this (the scenario's 2,000-token answers)
  // KV blocks per replica (0: the scenario's 4,096). A quarter of the scenario's, with
  // 0.4 x its rate and 0.3 x its output lengths: 16 system prompts (~4,000 blocks) cannot
  // all stay cached on one replica, 2-4 can.
  int kv_blocks = 1024;
  double time_scale = 1.0;    // sim wall seconds per engine second
  int replicas = 0;           // 0: the scenario's
  uint64_t seed = 0;          // 0: the scenario's
  std::string out_dir = "out/demo";
  // Progress of the current policy's run (on the load generator's thread); may be empty.
  std::function<void(const std::string& policy, const bench::Progress&)> on_progress;
  // Log lines ("starting fleet...") ; may be empty.
  std::function<void(const std::string&)> log;
  const std::atomic<bool>* stop = nullptr;  // polled; cancels the current run
};

struct DemoResult {
  std::string error;  // set when the demo could not run (no scenario, bind failure...)
  report::ReportMeta meta;
  std::vector<report::PolicyReport> policies;
  // Per policy: requests each replica served (from the router's x-kvroute-endpoint).
  std::vector<std::vector<int64_t>> served;
  std::vector<std::string> notes;  // facts to print with the table (errors, scaling)
  std::vector<std::string> files;  // written into out_dir
};

// Runs every policy in turn and writes report.md, report.json, ttft_cdf.svg and
// kv_usage.svg into options.out_dir. Blocking; uses 3 threads (fleet, router, load).
DemoResult RunDemo(const DemoOptions& options);

// The side-by-side table printed at the end (fixed-width text, one row per policy).
std::string DemoTable(const DemoResult& result);

// Finds the default scenario file: ./examples/scenarios/seed-8x.yaml, then relative to
// the running binary (build/kvroute -> ../examples/...). Empty when not found.
std::string FindSeedScenario();

}  // namespace kvroute::demo
