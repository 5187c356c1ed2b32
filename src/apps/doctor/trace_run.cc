#include "apps/doctor/trace_run.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include "apps/doctor/trace_compare.h"
#include "apps/simulate/simulator.h"
#include "config/scenario_config.h"
#include "config/yaml_reader.h"
#include "core/sched/registry.h"
#include "simkit/workload/trace.h"

namespace kvroute::doctor {

namespace {

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

int RunTraceCompare(const TraceRun& run, CollectOptions* collect) {
  // The fleet: --fleet's file as it is, else one scrape of the live replicas.
  std::optional<FleetShape> shape;
  std::string fleet_text, header;
  if (!run.fleet_file.empty()) {
    config::ConfigOr<std::string> text = config::ReadConfigFile(run.fleet_file);
    if (!text.ok()) {
      std::fprintf(stderr, "kvroute doctor --trace: %s\n", text.error.ToString().c_str());
      return 2;
    }
    fleet_text = std::move(*text.value);
    header = "Fleet: " + run.fleet_file;
  } else {
    collect->window_s = 0;
    if (!run.quiet) std::fprintf(stderr, "kvroute doctor: reading %zu replicas' shape\n", collect->targets.size());
    const std::vector<ReplicaHistory> h = Collect(*collect);
    std::string why;
    shape = ShapeFromScrapes(h, &why);
    if (!shape) {
      std::fprintf(stderr, "kvroute doctor --trace: %s\n", why.c_str());
      return 1;
    }
    header = "Fleet: " + shape->note;
  }
  const std::string format(workload::TraceFormatName(
      run.format.empty() ? workload::DefaultTraceFormat(run.trace)
                         : workload::TraceFormatNamed(run.format).value_or(workload::TraceFormat::kMooncake)));
  const std::string trace_path = std::filesystem::absolute(run.trace).string();
  const std::string yaml = TraceScenarioYaml(trace_path, format, run.block_size, run.time_scale,
                                             shape ? &*shape : nullptr, fleet_text);
  const std::string source = run.fleet_file.empty() ? "doctor --trace" : run.fleet_file;
  const std::string base =
      run.fleet_file.empty() ? std::string(".") : std::filesystem::path(run.fleet_file).parent_path().string();
  config::ConfigOr<config::Scenario> sc = config::ParseScenario(yaml, source, base.empty() ? "." : base);
  if (!sc.ok()) {
    std::fprintf(stderr, "kvroute doctor --trace: %s\n", sc.error.ToString().c_str());
    return 2;
  }
  std::vector<std::string> policies = SplitComma(run.policies);
  if (policies.empty()) {
    for (std::string_view p : sched::PolicyNames()) policies.emplace_back(p);
  }
  const double oracle = simulate::ComputeOracleHitRate(*sc.value);
  std::vector<report::PolicyReport> reports;
  for (const std::string& p : policies) {
    const auto start = std::chrono::steady_clock::now();
    simulate::SimulationResult r = simulate::RunSimulation(*sc.value, p, oracle);
    if (!r.error.empty()) {
      std::fprintf(stderr, "kvroute doctor --trace: policy %s: %s\n", p.c_str(), r.error.c_str());
      return 1;
    }
    if (!run.quiet) {
      std::fprintf(stderr, "kvroute doctor: %-20s %lld requests simulated in %.1f s\n", p.c_str(),
                   static_cast<long long>(r.report.requests),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    reports.push_back(std::move(r.report));
  }
  // The trace was read whole by the scenario; its outcome fields are read here.
  config::ConfigOr<std::string> trace_text = config::ReadConfigFile(run.trace);
  const TraceObserved observed = ObserveTrace(trace_text.ok() ? *trace_text.value : std::string());
  header = "### " + run.trace + "\n\n" + header +
           "; simulated on the routing core serve and epp ship (kvroute simulate)";
  const std::string table = RenderTraceComparison(observed, reports, header);
  std::fwrite(table.data(), 1, table.size(), stdout);
  return 0;
}

}  // namespace kvroute::doctor
