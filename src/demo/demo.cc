#include "demo/demo.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "bench/output.h"
#include "config/router_config.h"
#include "config/scenario_config.h"
#include "core/sched/registry.h"
#include "router/router.h"
#include "sim/fleet.h"

namespace kvroute::demo {
namespace {

namespace fs = std::filesystem;

void Log(const DemoOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// Output lengths scaled by `f` (every component of the mixture), at least 2 tokens so TPOT
// stays defined.
workload::LengthDist ScaleLengths(workload::LengthDist d, double f) {
  for (workload::LengthComponent& c : d.components) {
    c.min = std::max<int64_t>(2, static_cast<int64_t>(std::llround(c.min * f)));
    c.max = std::max<int64_t>(c.min, static_cast<int64_t>(std::llround(c.max * f)));
    c.mean = std::max(2.0, c.mean * f);
    c.std_dev *= f;
  }
  return d;
}

std::string Pct(double v) { return fmt::format("{:.0f}%", 100 * v); }
std::string Secs(double v) {
  return v < 1.0 ? fmt::format("{:.0f} ms", v * 1000) : fmt::format("{:.2f} s", v);
}

}  // namespace

std::string FindSeedScenario() {
  const char* rel = "examples/scenarios/seed-8x.yaml";
  std::error_code ec;
  if (fs::exists(rel, ec)) return rel;
  // Relative to the binary: build/kvroute -> <repo>/examples/...
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path()) {
      if (fs::exists(dir / rel, ec)) return (dir / rel).string();
    }
  }
  return "";
}

std::string DemoTable(const DemoResult& result) {
  std::string out = fmt::format("{:<15} {:>9} {:>7} {:>9} {:>9} {:>7} {:>13} {:>9} {:>9} {:>8} {:>11}\n",
                                "policy", "out tok/s", "req/s", "TTFT p50", "TTFT p99",
                                "hit", "KV min/max", "KV peak", "waiting", "preempt",
                                "reqs/replica");
  for (size_t i = 0; i < result.policies.size(); ++i) {
    const report::PolicyReport& p = result.policies[i];
    std::string served = "-";
    if (i < result.served.size() && !result.served[i].empty()) {
      const auto [lo, hi] = std::minmax_element(result.served[i].begin(), result.served[i].end());
      served = fmt::format("{}-{}", *lo, *hi);
    }
    out += fmt::format("{:<15} {:>9.0f} {:>7.2f} {:>9} {:>9} {:>7} {:>13} {:>9} {:>9} {:>8} {:>11}\n",
                       p.policy, p.output_tokens_per_s, p.requests_per_s, Secs(p.ttft_s.p50),
                       Secs(p.ttft_s.p99), fmt::format("{:.1f}%", 100 * p.prefix_hit_rate),
                       Pct(p.kv_usage_min) + " / " + Pct(p.kv_usage_max), Pct(p.kv_usage_peak),
                       fmt::format("{:.1f}/{:.0f}", p.waiting_mean, p.waiting_max),
                       p.preemptions, served);
  }
  return out;
}

DemoResult RunDemo(const DemoOptions& o) {
  DemoResult result;
  const std::string path = o.scenario_path.empty() ? FindSeedScenario() : o.scenario_path;
  if (path.empty()) {
    result.error = "cannot find examples/scenarios/seed-8x.yaml (run from the repository, or "
                   "pass --scenario)";
    return result;
  }
  config::ConfigOr<config::Scenario> load = config::LoadScenarioFile(path);
  if (!load.ok()) {
    result.error = load.error.ToString();
    return result;
  }
  const config::Scenario& sc = *load.value;
  for (const std::string& p : o.policies) {
    if (std::find(sched::PolicyNames().begin(), sched::PolicyNames().end(), p) ==
        sched::PolicyNames().end()) {
      result.error = "unknown policy '" + p + "'";
      return result;
    }
  }

  // The scenario, scaled down for a live run on a small machine.
  workload::WorkloadSpec wl = sc.workload;
  wl.output_len = ScaleLengths(wl.output_len, o.output_scale);
  workload::ArrivalSpec arrivals;
  arrivals.kind = sc.arrivals.kind;
  arrivals.burstiness = sc.arrivals.burstiness;
  arrivals.stages = {{o.rate, std::numeric_limits<double>::infinity()}};
  arrivals.duration_s = o.duration_s;
  const uint64_t seed = o.seed ? o.seed : sc.seed;
  engine::EngineConfig ec = sc.fleet.EngineConfigFor();
  if (o.kv_blocks > 0) ec.num_gpu_blocks = o.kv_blocks;
  const int n = o.replicas > 0 ? o.replicas : sc.fleet.replicas;
  std::vector<sim::ReplicaConfig> replicas(n);
  for (int i = 0; i < n; ++i) {
    replicas[i].name = "replica-" + std::to_string(i);
    replicas[i].host = "127.0.0.1";
    replicas[i].port = 0;
    replicas[i].preset = sc.fleet.engine_preset;
    replicas[i].engine = ec;
    replicas[i].time_scale = o.time_scale;
    if (Status s = config::ValidateReplica(replicas[i]); !s.ok()) {
      result.error = "replica config: " + s.message();
      return result;
    }
  }

  result.meta.tool = "kvroute demo";
  result.meta.scenario = sc.name + " (live, scaled down)";
  result.meta.seed = seed;
  result.meta.slo = sc.slo;
  auto info = [&](const std::string& k, std::string v) { result.meta.info.emplace_back(k, v); };
  info("scenario_file", path);
  info("replicas", std::to_string(n));
  info("kv_blocks_per_replica", std::to_string(ec.num_gpu_blocks));
  info("rate_per_s", fmt::format("{:g}", o.rate));
  info("duration_s", fmt::format("{:g}", o.duration_s));
  info("output_scale", fmt::format("{:g}", o.output_scale));
  info("time_scale", fmt::format("{:g}", o.time_scale));
  info("scenario_rate_per_s",
       sc.arrivals.stages.empty() ? "-" : fmt::format("{:g}", sc.arrivals.stages[0].rate));
  info("scenario_kv_blocks", std::to_string(sc.fleet.kv_blocks));

  for (const std::string& policy : o.policies) {
    if (o.stop && o.stop->load()) break;
    Log(o, fmt::format("[{}] starting {} simulated replicas and the router", policy, n));
    sim::Fleet fleet(replicas, 1);
    if (Status st = fleet.Start(); !st.ok()) {
      const std::string e = st.message();
      result.error = "fleet: " + e;
      return result;
    }
    config::RouterConfig rc;
    rc.threads = 1;
    rc.listen = "127.0.0.1:0";
    rc.listen_addr = {"127.0.0.1", 0};
    rc.pool.scrape_interval_s = 0.05;
    std::vector<bench::HostPort> fleet_addrs;
    for (int i = 0; i < n; ++i) {
      config::EndpointConfig ep;
      ep.host_port = {"127.0.0.1", fleet.port(i)};
      ep.address = ep.host_port.ToString();
      ep.name = ep.address;
      rc.pool.endpoints.push_back(ep);
      fleet_addrs.push_back({"127.0.0.1", fleet.port(i)});
    }
    // The policy is the router's configuration, as `scheduling: {policy: NAME}` in a file.
    rc.scheduling.policy = policy;
    if (auto err = sched::ValidateSchedulingSpec(rc.scheduling)) {
      result.error = "policy " + policy + ": " + err->message;
      return result;
    }
    router::RouterOptions ro;
    ro.listen = config::HostPort{"127.0.0.1", 0};
    ro.threads = 1;
    ro.log = false;
    router::Router rt(rc, ro);
    if (Status st = rt.Start(); !st.ok()) {
      result.error = "router: " + st.message();
      return result;
    }
    // Wait (bounded) until the router has scraped the fleet.
    for (int i = 0; i < 100 && !rt.Ready(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150));

    bench::BenchConfig bc;
    bc.target = {"127.0.0.1", rt.port()};
    bc.model = ec.model_name;
    bc.workload = wl;
    bc.arrivals = arrivals;
    bc.seed = seed;
    bc.slo = sc.slo;
    bc.label = policy;
    bc.fleet = fleet_addrs;
    bc.scrape_interval_s = 0.25;
    bc.drain_timeout_s = o.drain_s;
    bc.first_byte_timeout_s = o.duration_s + o.drain_s + 5;
    bc.stop = o.stop;
    if (o.on_progress) {
      bc.on_progress = [&o, &policy](const bench::Progress& p) { o.on_progress(policy, p); };
    }
    Log(o, fmt::format("[{}] router on 127.0.0.1:{}; {:g} req/s for {:g} s", policy, rt.port(),
                       o.rate, o.duration_s));
    bench::BenchResult br = bench::RunBench(bc);
    rt.Stop();
    fleet.Stop();
    if (!br.error.empty()) {
      result.error = br.error;
      return result;
    }
    std::vector<int64_t> served(n, 0);
    int64_t unknown = 0;
    for (const report::RequestRecord& r : br.records) {
      if (r.endpoint >= 0 && r.endpoint < n) {
        ++served[r.endpoint];
      } else {
        ++unknown;
      }
    }
    if (unknown == static_cast<int64_t>(br.records.size())) served.clear();
    for (const auto& [cause, count] : br.error_details) {
      result.notes.push_back(fmt::format("{}: {} requests failed ({})", policy, count, cause));
    }
    if (br.not_sent > 0) {
      result.notes.push_back(fmt::format("{}: {} requests not sent (stopped)", policy, br.not_sent));
    }
    bench::AddRunInfo(br, policy + ".", &result.meta);
    result.policies.push_back(std::move(br.summary));
    result.served.push_back(std::move(served));
  }

  // Files: the report schema's JSON and charts, and a Markdown page with the live table.
  std::string werr;
  result.files = bench::WriteReportFiles(o.out_dir, result.meta, result.policies, &werr);
  if (!werr.empty()) {
    result.error = werr;
    return result;
  }
  std::string md = "# kvroute demo: " + result.meta.scenario + "\n\n";
  md += fmt::format(
      "{} replicas (simulated vLLM, {} KV blocks each), router in front, Poisson {:g} req/s "
      "for {:g} s per policy, outputs x{:g} of the scenario's, fresh fleet per policy.\n\n",
      n, ec.num_gpu_blocks, o.rate, o.duration_s, o.output_scale);
  md += "```\n" + DemoTable(result) + "```\n\n";
  md += "KV min/max: at each /metrics scrape the lowest and highest KV-cache usage across "
        "replicas, averaged over the run. hit: prefix-cache hit tokens / queried tokens from "
        "the replicas' counters. waiting: fleet total, mean/max. reqs/replica: fewest/most "
        "requests one replica served.\n\n";
  for (const std::string& note : result.notes) md += "- " + note + "\n";
  if (!result.notes.empty()) md += "\n";
  md += "![TTFT CDF](ttft_cdf.svg)\n\n![KV usage per replica](kv_usage.svg)\n\n";
  md += report::ReportMarkdown(result.meta, result.policies);
  std::ofstream f(fs::path(o.out_dir) / "report.md", std::ios::trunc);
  f << md;
  if (!f) result.error = "cannot write " + (fs::path(o.out_dir) / "report.md").string();
  return result;
}

}  // namespace kvroute::demo
