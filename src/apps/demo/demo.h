// `kvroute demo`: the seed article's story in two acts.
//
// 1. Scaling, in virtual time (`kvroute simulate`'s simulator): the seed-8x traffic on 2, 4
//    and 8 replicas under round-robin and under kvroute, at a load that reaches each
//    fleet's capacity (see ScalingOptions): throughput and TTFT p99 per fleet size, and
//    what each policy gains from 2 to 8 replicas.
// 2. Live: for each routing policy a fresh in-process fleet of simulated vLLM replicas
//    (cold caches) and the router configured with that policy; the load generator drives
//    the seed-8x traffic through the router while `kvroute doctor`'s collector scrapes the
//    replicas on its own thread, and the doctor's diagnosis of each policy is printed with
//    the side-by-side comparison.
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

#include "apps/bench/load_generator.h"
#include "simkit/report/scaling.h"
#include "simkit/report/writers.h"
#include "apps/demo/scaling.h"

namespace kvroute::demo {

struct DemoOptions {
  std::string scenario_path;  // empty: examples/scenarios/seed-8x.yaml, found near the binary
  std::vector<std::string> policies = {"round-robin", "least-request", "kvroute"};
  // Act 1 (virtual time); off: no scaling table.
  bool scaling = true;
  ScalingOptions scaling_options;
  // `kvroute doctor` during each live run: its collector starts doctor_warmup_s after the
  // traffic (cold caches fill first) and scrapes every doctor_interval_s for
  // doctor_window_s, inside the traffic, so it adds no wall time. 0 window: no doctor.
  double doctor_warmup_s = 10.0;
  double doctor_window_s = 20.0;
  double doctor_interval_s = 1.0;
  // Also write requests-<policy>.csv (one row per request: when, which replica, TTFT...).
  bool records = false;
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

// One policy's diagnosis by `kvroute doctor` during its live run.
struct Diagnosis {
  std::string policy;
  std::string text;   // doctor::ReportText
  std::string json;   // doctor::ReportJson
  int exit_code = 2;  // 0 healthy, 1 findings, 2 nothing readable
  std::vector<std::string> findings;  // the rules that fired ("prefix-reuse-lost", ...)
  bool routing_finding = false;       // one of them is a routing finding
};

struct DemoResult {
  std::string error;  // set when the demo could not run (no scenario, bind failure...)
  std::vector<report::ScalingPoint> scaling;  // act 1, policy-major
  std::vector<Diagnosis> diagnoses;           // act 2, one per live policy (when run)
  report::ReportMeta meta;
  std::vector<report::PolicyReport> policies;
  // Per policy: requests each replica served (from the router's x-kvroute-endpoint).
  std::vector<std::vector<int64_t>> served;
  std::vector<std::string> notes;  // facts to print with the table (errors, scaling)
  std::vector<std::string> files;  // written into out_dir
};

// Runs act 1, then every live policy in turn, and writes report.md, report.json,
// report.html, ttft_cdf.svg, kv_heatmap.svg and scaling.svg (and with `records`,
// requests-<policy>.csv) into options.out_dir. Blocking; the live runs use 4 threads
// (fleet, router, load generator, doctor's collector).
DemoResult RunDemo(const DemoOptions& options);

// The live side-by-side table printed at the end (fixed-width text, one row per policy).
std::string DemoTable(const DemoResult& result);

// Everything printed at the end: the scaling table, each diagnosis, the live table.
std::string DemoText(const DemoResult& result);

// Finds the default scenario file: ./examples/scenarios/seed-8x.yaml, then relative to
// the running binary (build/kvroute -> ../examples/...). Empty when not found.
std::string FindSeedScenario();

}  // namespace kvroute::demo
