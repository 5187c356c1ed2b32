#include "apps/demo/demo_main.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>

#include "apps/demo/demo.h"

namespace kvroute::demo {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// What `kvroute demo`'s command line sets: the demo's options (bound to their flags
// directly) and the flags that shape them after parsing (DemoOptionsFrom).
struct DemoMainOptions {
  DemoOptions demo;
  std::string policies;  // comma-separated; empty: DemoOptions' default list
  bool quiet = false;
  bool no_scaling = false;
};

// Registers every flag of `kvroute demo` on `app`, bound to `opts`.
void AddFlags(CLI::App& app, DemoMainOptions& opts) {
  DemoOptions& o = opts.demo;
  app.add_option("--duration", o.duration_s, "Seconds of traffic per policy")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rate", o.rate, "Requests per second")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--out", o.out_dir, "Output directory")->capture_default_str();
  app.add_option("--policies", opts.policies,
                 "Comma-separated policies (default round-robin,least-request,kvroute)");
  app.add_option("--scenario", o.scenario_path, "Scenario file (default seed-8x.yaml)")
      ->check(CLI::ExistingFile);
  app.add_option("--drain", o.drain_s, "Seconds in-flight requests get after the traffic")
      ->capture_default_str();
  app.add_option("--output-scale", o.output_scale, "Output lengths x this")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--kv-blocks", o.kv_blocks, "KV blocks per replica (0: the scenario's)")
      ->capture_default_str();
  app.add_option("--time-scale", o.time_scale, "Simulator wall seconds per engine second")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--replicas", o.replicas, "Replicas (0: the scenario's)");
  app.add_option("--seed", o.seed, "Workload seed (0: the scenario's)");
  app.add_flag("--no-scaling", opts.no_scaling, "Skip the scaling runs in virtual time");
  app.add_option("--scaling-rate", o.scaling_options.rate_per_replica,
                 "Scaling runs: offered requests/s per replica")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--scaling-requests", o.scaling_options.requests_per_replica,
                 "Scaling runs: requests per replica")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--doctor-warmup", o.doctor_warmup_s,
                 "Seconds of traffic before kvroute doctor starts scraping")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--doctor-window", o.doctor_window_s,
                 "Seconds kvroute doctor scrapes during each live run (0: no doctor)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--records", o.records,
               "Also write requests-<policy>.csv (per request: send time, replica, TTFT...)");
  app.add_flag("--quiet,-q", opts.quiet, "No progress output");
}

// The demo's options from the flags: scaling on unless --no-scaling, the --policies list,
// and (unless --quiet) log lines on stderr, with a live progress line on a terminal
// (`tty`).
DemoOptions DemoOptionsFrom(const DemoMainOptions& opts, bool tty) {
  DemoOptions o = opts.demo;
  o.scaling = !opts.no_scaling;
  const std::string& policies = opts.policies;
  if (!policies.empty()) {
    o.policies.clear();
    size_t start = 0;
    while (start <= policies.size()) {
      size_t end = policies.find(',', start);
      if (end == std::string::npos) end = policies.size();
      if (end > start) o.policies.push_back(policies.substr(start, end - start));
      start = end + 1;
    }
  }
  if (!opts.quiet) {
    o.log = [tty](const std::string& line) {
      std::fprintf(stderr, "%s%s\n", tty ? "\r\033[K" : "", line.c_str());
    };
    if (tty) {
      o.on_progress = [](const std::string& policy, const bench::Progress& p) {
        std::fprintf(stderr,
                     "\r\033[K[%s %5.1fs] sent %lld done %lld in-flight %lld err %lld | hit %s | "
                     "kv %.2f-%.2f",
                     policy.c_str(), p.elapsed_s, static_cast<long long>(p.sent),
                     static_cast<long long>(p.finished), static_cast<long long>(p.in_flight),
                     static_cast<long long>(p.errors),
                     p.hit_rate >= 0 ? (std::to_string(static_cast<int>(100 * p.hit_rate)) + "%").c_str()
                                     : "-",
                     p.kv_min, p.kv_max);
        std::fflush(stderr);
      };
    }
  }
  return o;
}

// Runs the demo (SIGINT and SIGTERM stop it) and prints what it found. Returns the exit
// code: 0, or 1 when the demo could not run.
int Run(const DemoMainOptions& opts) {
  const bool tty = isatty(STDERR_FILENO);
  DemoOptions o = DemoOptionsFrom(opts, tty);
  o.stop = &g_stop;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  DemoResult r = RunDemo(o);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!opts.quiet && tty) std::fprintf(stderr, "\r\033[K");
  if (!r.error.empty()) {
    std::fprintf(stderr, "kvroute demo: %s\n", r.error.c_str());
    return 1;
  }
  std::printf("\n%s\n", DemoText(r).c_str());
  for (const std::string& n : r.notes) std::printf("note: %s\n", n.c_str());
  for (const std::string& f : r.files) std::printf("wrote %s\n", f.c_str());
  return 0;
}

}  // namespace

int DemoMain(int argc, char** argv) {
  CLI::App app{
      "The seed article's story. First, in virtual time: seed-8x on 2, 4 and 8 replicas\n"
      "under round-robin and kvroute at capacity (throughput and TTFT p99 per fleet size).\n"
      "Then live, for each policy: a fresh in-process fleet of 8 simulated vLLM replicas,\n"
      "the router configured with that policy, the load generator sending seed-8x (scaled\n"
      "down to run live on two cores) and kvroute doctor diagnosing the replicas during the\n"
      "traffic. Prints the scaling table, the diagnoses and a side-by-side table; writes\n"
      "report.md, report.json, report.html and SVG charts.",
      "kvroute demo"};
  DemoMainOptions opts;
  AddFlags(app, opts);
  CLI11_PARSE(app, argc, argv);
  return Run(opts);
}

}  // namespace kvroute::demo
