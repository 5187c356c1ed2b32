#include "apps/simulate/simulate_main.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "simkit/report/writers.h"
#include "core/sched/registry.h"
#include "config/scenario_config.h"
#include "apps/simulate/simulator.h"
#include "apps/simulate/suite_run.h"
#include "apps/simulate/sweep.h"

namespace kvroute::simulate {
namespace {

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// "10,15,20" -> {10, 15, 20}; empty on a malformed, non-positive or non-ascending list.
std::vector<double> ParseRates(const std::string& s) {
  std::vector<double> rates;
  for (const std::string& part : SplitComma(s)) {
    char* end = nullptr;
    const double v = std::strtod(part.c_str(), &end);
    if (end == part.c_str() || *end != '\0' || !(v > 0) || (!rates.empty() && v <= rates.back()))
      return {};
    rates.push_back(v);
  }
  return rates;
}

bool WriteFile(const std::filesystem::path& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
  return f.good();
}

// The command line of `kvroute simulate` (AddFlags says what each field is).
struct Options {
  std::string scenario_path;
  std::string suite_path;
  uint64_t suite_seed = 0;
  bool suite_seed_given = false;
  bool suite_detail = false;
  bool suite_write = false;
  std::string policies_arg;
  std::string out_dir = "simulate-out";
  uint64_t seed = 0;
  bool seed_given = false;  // --seed was on the command line (0 is a seed too)
  int64_t requests = 0;
  int replicas = 0;
  bool quiet = false;
  bool sweep = false;
  std::string rates_arg;
  double ttft_bound = 0.0;
  std::string kv_events_arg;
  double kv_loss = -1.0;
  std::string kv_replay_arg;
  int router_replicas = 0;
};

// Every flag but --help, into `o` (o.seed_given is left to the caller: app.count("--seed")).
void AddFlags(CLI::App& app, Options& o) {
  app.add_option("--scenario", o.scenario_path,
                 "scenario YAML file (see examples/scenarios/; faults: crash, slow, restart "
                 "per replica, examples/scenarios/faults.yaml, docs/FAULTS.md)");
  app.add_option("--suite", o.suite_path,
                 "a suite file instead of --scenario: scenario files and generated families "
                 "under every policy, one table (docs/SUITE.md, examples/suites/broad.yaml)");
  app.add_option("--suite-seed", o.suite_seed, "--suite: override the generator's seed (held-out runs)");
  app.add_flag("--suite-write", o.suite_write,
               "--suite: write each generated scenario as a scenario file into --out and run "
               "nothing (to run one of them alone with --scenario)");
  app.add_flag("--suite-detail", o.suite_detail,
               "--suite: also print every policy's figures per scenario (always in --out's suite.md)");
  app.add_option("--policies", o.policies_arg,
                 "comma-separated policies, each optionally with +local-only (on the router "
                 "region's replicas only; local-only alone: kvroute+local-only) and then "
                 "+flow (flow control on), or a peer followed by +admission (its own admission "
                 "turned on: dynamo-kv, llm-d-sticky, llm-d-precise); default: the scenario's "
                 "list, else all built-in");
  app.add_option("--out", o.out_dir, "output directory for report.json/.md and charts")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "override the scenario's seed");
  app.add_option("--requests", o.requests, "override arrivals.num_requests");
  app.add_option("--replicas", o.replicas, "override fleet.replicas (flat fleet: form only)");
  app.add_option("--kv-events", o.kv_events_arg,
                 "on|off: override kv_events.enabled (KV-cache events from the engines, "
                 "precise prefix routing; scenario_config.h, docs/BENCHMARKS.md issue 23)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--kv-events-loss", o.kv_loss,
                 "override kv_events.loss: fraction of event batches lost in transit, 0..1")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--kv-events-replay", o.kv_replay_arg,
                 "on|off: override kv_events.replay (off: every gap is unrepaired)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--router-replicas", o.router_replicas,
                 "override router.replicas: router replicas (routing cores), requests "
                 "round-robin across them, every scrape and event batch to each")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--quiet", o.quiet, "no progress line");
  app.add_flag("--sweep", o.sweep, "rate sweep over the scenario's sweep.rates");
  app.add_option("--rates", o.rates_arg,
                 "rate sweep: comma-separated ascending constant rates (req/s), e.g. 10,15,20; "
                 "each policy runs the scenario once per rate (same request count)");
  app.add_option("--ttft-p99-bound", o.ttft_bound,
                 "sweep: p99 TTFT bound in seconds for 'max sustainable rate' (default: the "
                 "scenario's sweep.ttft_p99_bound_s, else slo.ttft_s, else 2)");
}

// The scenario file with the command line's overrides; nullopt, after saying why on
// stderr, when it cannot be loaded or an override does not fit it.
std::optional<config::Scenario> LoadScenario(const Options& o) {
  config::ConfigOr<config::Scenario> load = config::LoadScenarioFile(o.scenario_path);
  if (!load.ok()) {
    std::fprintf(stderr, "kvroute simulate: %s\n", load.error.ToString().c_str());
    return std::nullopt;
  }
  config::Scenario& sc = *load.value;
  if (o.seed_given) sc.seed = o.seed;
  if (o.requests > 0) sc.arrivals.num_requests = o.requests;
  if (o.replicas > 0 && !sc.fleet.groups.empty()) {
    std::fprintf(stderr, "kvroute simulate: --replicas: %s has fleet.groups; set replicas per "
                 "group\n", sc.source.c_str());
    return std::nullopt;
  }
  if (o.replicas > 0) sc.fleet.replicas = o.replicas;
  if (!o.kv_events_arg.empty()) sc.kv_events.enabled = o.kv_events_arg == "on";
  if (o.kv_loss >= 0) sc.kv_events.loss = o.kv_loss;
  if (!o.kv_replay_arg.empty()) sc.kv_events.replay = o.kv_replay_arg == "on";
  if (o.router_replicas > 0) sc.router_replicas = o.router_replicas;
  if (sc.router_replicas > 1 && sc.flow.enabled) {
    std::fprintf(stderr, "kvroute simulate: %s: flow control is not modelled with several "
                 "router replicas\n", sc.source.c_str());
    return std::nullopt;
  }
  return std::move(load.value);
}

// The policies to run: --policies, else the scenario's list, else every built-in one.
// False, after saying why on stderr, when one is unknown or cannot run local-only.
bool ResolvePolicies(const Options& o, const config::Scenario& sc,
                     std::vector<std::string>* out) {
  std::vector<std::string>& policies = *out;
  policies = SplitComma(o.policies_arg);
  if (policies.empty()) policies = sc.policies;
  if (policies.empty()) {
    for (std::string_view p : sched::PolicyNames()) policies.emplace_back(p);
  }
  for (const std::string& p : policies) {
    sched::BuildResult b = sched::BuildPolicy(BasePolicy(p));
    if (!b.ok()) {
      std::fprintf(stderr, "kvroute simulate: unknown policy '%s'\n", p.c_str());
      return false;
    }
    Status gate;
    GateOptions(sc, p, &gate);
    if (!gate.ok()) {
      std::fprintf(stderr, "kvroute simulate: %s\n", gate.message().c_str());
      return false;
    }
    config::Scenario local;
    if (IsLocalOnly(p)) {
      if (const Status st = LocalOnlyScenario(sc, &local); !st.ok()) {
        std::fprintf(stderr, "kvroute simulate: policy %s: %s\n", p.c_str(), st.message().c_str());
        return false;
      }
    }
  }
  return true;
}

// --sweep or --rates: every policy at every rate, the table on stdout and sweep.json and
// sweep.md in the output directory. Returns the exit code.
int RunSweep(const Options& o, const config::Scenario& sc,
             const std::vector<std::string>& policies) {
  std::vector<double> rates = sc.sweep_rates;
  if (!o.rates_arg.empty()) {
    rates = ParseRates(o.rates_arg);
    if (rates.empty()) {
      std::fprintf(stderr, "kvroute simulate: --rates: expected ascending positive numbers\n");
      return 2;
    }
  }
  if (rates.empty()) {
    std::fprintf(stderr, "kvroute simulate: --sweep: the scenario has no sweep.rates\n");
    return 2;
  }
  double bound = o.ttft_bound > 0                ? o.ttft_bound
                 : sc.sweep_ttft_p99_bound_s > 0 ? sc.sweep_ttft_p99_bound_s
                 : sc.slo.ttft_s > 0             ? sc.slo.ttft_s
                                                 : 2.0;
  std::vector<PolicySweep> sweeps;
  sweeps.reserve(policies.size());
  for (const std::string& p : policies) sweeps.push_back({p, {}});
  for (double rate : rates) {
    const config::Scenario at = WithRate(sc, rate);
    const double oracle = ComputeOracleHitRate(at);
    for (PolicySweep& ps : sweeps) {
      const auto start = std::chrono::steady_clock::now();
      SimulationResult r = RunSimulation(at, ps.policy, oracle);
      if (!r.error.empty()) {
        std::fprintf(stderr, "kvroute simulate: policy %s: %s\n", ps.policy.c_str(),
                     r.error.c_str());
        return 1;
      }
      r.report.wall_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!o.quiet) {
        std::fprintf(stderr, "  rate %-6g %-20s TTFT p99 %8.3f s  %.2f s wall\n", rate,
                     ps.policy.c_str(), r.report.ttft_s.p99, r.report.wall_s);
      }
      const SteadyThroughput steady = MeasureSteadyThroughput(r.records);
      ps.points.push_back({rate, std::move(r.report), steady});
    }
  }
  const std::string md = SweepMarkdown(sc.name, sweeps, bound);
  std::fputs(md.c_str(), stdout);
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  const std::filesystem::path dir(o.out_dir);
  if (ec || !WriteFile(dir / "sweep.json", SweepJson(sc.name, sweeps, bound)) ||
      !WriteFile(dir / "sweep.md", md)) {
    std::fprintf(stderr, "kvroute simulate: cannot write to %s\n", o.out_dir.c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s/sweep.json, sweep.md\n", o.out_dir.c_str());
  return 0;
}

// Every policy on the scenario, one after the other, with a progress line on a terminal
// unless --quiet; their reports into `*reports` in order, and the request count of the
// last into `*total_requests`. False, after saying why on stderr, when a policy cannot run.
bool RunPolicies(const Options& o, const config::Scenario& sc,
                 const std::vector<std::string>& policies,
                 std::vector<report::PolicyReport>* reports, int64_t* total_requests) {
  const bool tty = !o.quiet && isatty(STDERR_FILENO);
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  const double oracle = ComputeOracleHitRate(sc);
  std::fprintf(stderr, "scenario %s: %d replicas, oracle prefix hit rate %.1f%% (%.2f s)\n",
               sc.name.c_str(), sc.fleet.replicas, oracle * 100,
               std::chrono::duration<double>(Clock::now() - t0).count());

  for (const std::string& p : policies) {
    const auto start = Clock::now();
    auto last_print = start;
    ProgressFn progress;
    if (tty) {
      progress = [&](double now_s, int64_t sent, int64_t finished) {
        const auto wall = Clock::now();
        if (wall - last_print < std::chrono::milliseconds(250)) return;
        last_print = wall;
        std::fprintf(stderr, "\r  %-20s virtual %8.1f s  sent %9lld  done %9lld  wall %6.1f s",
                     p.c_str(), now_s, static_cast<long long>(sent),
                     static_cast<long long>(finished),
                     std::chrono::duration<double>(wall - start).count());
        std::fflush(stderr);
      };
    }
    SimulationResult r = RunSimulation(sc, p, oracle, progress);
    if (!r.error.empty()) {
      std::fprintf(stderr, "\nkvroute simulate: policy %s: %s\n", p.c_str(), r.error.c_str());
      return false;
    }
    r.report.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
    *total_requests = r.report.requests;
    std::fprintf(stderr, "%s  %-20s %lld requests, %lld steps, %lld events in %.2f s wall\n",
                 tty ? "\r\033[K" : "", p.c_str(), static_cast<long long>(r.report.requests),
                 static_cast<long long>(r.steps), static_cast<long long>(r.events),
                 r.report.wall_s);
    reports->push_back(std::move(r.report));
  }
  return true;
}

// The report's header: scenario, seed, SLOs and the run's setting (`total_requests`: the
// last policy's request count).
report::ReportMeta ReportMetaFor(const config::Scenario& sc, int64_t total_requests) {
  report::ReportMeta meta;
  meta.scenario = sc.name;
  meta.seed = sc.seed;
  meta.slo = sc.slo;
  meta.info = {{"scenario_file", sc.source},
               {"replicas", std::to_string(sc.fleet.replicas)},
               {"engine_preset", sc.fleet.engine_preset},
               {"kv_blocks", std::to_string(sc.fleet.EngineConfigFor().num_gpu_blocks)},
               {"requests", std::to_string(total_requests)},
               {"scrape_interval_s", std::to_string(sc.fleet.scrape_interval_s)},
               {"network_delay_s", std::to_string(sc.fleet.network_delay_s)}};
  if (sc.kv_events.enabled) {
    meta.info.emplace_back("kv_events",
                           fmt::format("delay {} s, loss {}, replay {}, buffer_steps {}",
                                       sc.kv_events.delay_s, sc.kv_events.loss,
                                       sc.kv_events.replay ? "on" : "off",
                                       sc.kv_events.buffer_steps));
  }
  if (sc.router_replicas != 1) {
    meta.info.emplace_back("router_replicas", std::to_string(sc.router_replicas));
  }
  if (!sc.fleet.groups.empty()) {
    // One line per group instead: "4 x llama3-8b-h100 (2048 blocks) in us-east, 0.0005 s".
    std::string groups;
    for (const config::FleetGroup& g : sc.fleet.groups) {
      groups += (groups.empty() ? "" : "; ") + std::to_string(g.replicas) + " x " +
                g.engine_preset + " (" + std::to_string(g.EngineConfigFor().num_gpu_blocks) +
                " blocks) in " + (g.region.empty() ? "no region" : g.region) +
                (g.zone.empty() ? "" : "/" + g.zone) + ", " + std::to_string(g.network_delay_s) +
                " s";
    }
    meta.info.erase(std::remove_if(meta.info.begin(), meta.info.end(),
                                   [](const auto& kv) {
                                     return kv.first == "engine_preset" ||
                                            kv.first == "kv_blocks" ||
                                            kv.first == "network_delay_s";
                                   }),
                    meta.info.end());
    meta.info.emplace_back("groups", groups);
    meta.info.emplace_back("router_region", sc.router_region);
  }
  return meta;
}

// The comparison's table on stdout, and report.json, report.md, ttft_cdf.svg and
// kv_usage.svg in `out_dir`. Returns the exit code.
int WriteReports(const std::string& out_dir, const report::ReportMeta& meta,
                 const std::vector<report::PolicyReport>& reports) {
  const std::string md = report::ReportMarkdown(meta, reports);
  std::fputs(md.c_str(), stdout);

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  const std::filesystem::path dir(out_dir);
  if (ec || !WriteFile(dir / "report.json", report::ReportJson(meta, reports)) ||
      !WriteFile(dir / "report.md", md) ||
      !WriteFile(dir / "ttft_cdf.svg", report::TtftCdfSvg(reports)) ||
      !WriteFile(dir / "kv_usage.svg", report::KvUsageSvg(reports))) {
    std::fprintf(stderr, "kvroute simulate: cannot write to %s\n", out_dir.c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s/report.json, report.md, ttft_cdf.svg, kv_usage.svg\n",
               out_dir.c_str());
  return 0;
}

// The run the command line asks for: a rate sweep, or every policy once and its report.
// Returns the exit code.
int RunSuiteCommand(const Options& o) {
  config::ConfigOr<config::SuiteSpec> spec = config::LoadSuiteFile(o.suite_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "kvroute simulate: %s\n", spec.error.ToString().c_str());
    return 2;
  }
  if (o.suite_write) {
    std::vector<std::string> written;
    const Status st = WriteSuiteScenarios(
        *spec.value, o.suite_seed_given ? std::optional<uint64_t>(o.suite_seed) : std::nullopt, o.out_dir,
        &written);
    if (!st.ok()) {
      std::fprintf(stderr, "kvroute simulate: --suite-write: %s\n", st.message().c_str());
      return 2;
    }
    if (!o.quiet) std::fprintf(stderr, "wrote %zu scenarios into %s\n", written.size(), o.out_dir.c_str());
    return 0;
  }
  const SuiteResult result =
      RunSuite(*spec.value, o.suite_seed_given ? std::optional<uint64_t>(o.suite_seed) : std::nullopt,
               SplitComma(o.policies_arg), !o.quiet);
  const std::string md = SuiteMarkdown(result, spec.value->reference, o.suite_detail);
  std::fwrite(md.data(), 1, md.size(), stdout);
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (!WriteFile(o.out_dir + "/suite.md", SuiteMarkdown(result, spec.value->reference, true)) ||
      !WriteFile(o.out_dir + "/suite.json", SuiteJson(result))) {
    std::fprintf(stderr, "kvroute simulate: cannot write %s/suite.md and suite.json\n", o.out_dir.c_str());
    return 2;
  }
  if (!o.quiet) std::fprintf(stderr, "wrote %s/suite.md, suite.json\n", o.out_dir.c_str());
  for (const SuiteRun& r : result.runs) {
    if (!r.error.empty()) return 1;
  }
  return 0;
}

int Run(const Options& o) {
  if (o.scenario_path.empty() == o.suite_path.empty()) {
    std::fprintf(stderr, "kvroute simulate: give --scenario FILE or --suite FILE (one of them)\n");
    return 2;
  }
  if (!o.suite_path.empty()) return RunSuiteCommand(o);
  std::optional<config::Scenario> scenario = LoadScenario(o);
  if (!scenario) return 2;
  const config::Scenario& sc = *scenario;
  std::vector<std::string> policies;
  if (!ResolvePolicies(o, sc, &policies)) return 2;
  if (o.sweep || !o.rates_arg.empty()) return RunSweep(o, sc, policies);
  std::vector<report::PolicyReport> reports;
  int64_t total_requests = 0;
  if (!RunPolicies(o, sc, policies, &reports, &total_requests)) return 1;
  return WriteReports(o.out_dir, ReportMetaFor(sc, total_requests), reports);
}

}  // namespace

int SimulateMain(int argc, char** argv) {
  CLI::App app{
      "Compare routing policies on a scenario, in virtual time (the routing core kvroute "
      "serve and epp ship, over simulated vLLM engines)",
      "kvroute simulate"};
  Options options;
  AddFlags(app, options);
  CLI11_PARSE(app, argc, argv);
  options.seed_given = app.count("--seed") > 0;
  options.suite_seed_given = app.count("--suite-seed") > 0;
  return Run(options);
}

}  // namespace kvroute::simulate
