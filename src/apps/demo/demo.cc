#include "apps/demo/demo.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>

#include "apps/bench/output.h"
#include "config/router_config.h"
#include "config/scenario_config.h"
#include "simkit/report/charts.h"
#include "core/api/openai.h"
#include "simkit/report/html.h"
#include "core/sched/registry.h"
#include "apps/demo/diagnose.h"
#include "apps/serve/router.h"
#include "apps/sim/fleet.h"

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

bool WriteFile(const fs::path& path, const std::string& text, std::string* error) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (f) f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) {
    *error = "cannot write " + path.string();
    return false;
  }
  return true;
}

// One row per request, in send order: what to look at when a tail is slow (which replica,
// when, how much of its prompt was cached).
std::string RecordsCsv(const std::vector<report::RequestRecord>& records) {
  std::string out =
      "id,send_s,ttft_s,e2e_s,endpoint,prompt_tokens,cached_tokens,output_tokens,error\n";
  for (const report::RequestRecord& r : records) {
    out += fmt::format("{},{:.4f},{:.4f},{:.4f},{},{},{},{},{}\n", r.id, r.send_s, r.ttft_s,
                       r.e2e_s, r.endpoint, r.prompt_tokens, r.cached_tokens, r.output_tokens,
                       report::ErrorKindName(r.error));
  }
  return out;
}

// `object` (a JSON object ending in "}\n", as report::ReportJson writes it) with
// `fields` (key, JSON value) added at its end.
std::string WithJsonFields(std::string object,
                           const std::vector<std::pair<std::string, std::string>>& fields) {
  const size_t close = object.rfind('}');
  if (close == std::string::npos || fields.empty()) return object;
  size_t end = close;
  while (end > 0 && (object[end - 1] == '\n' || object[end - 1] == ' ')) --end;
  std::string out = object.substr(0, end);
  for (const auto& [k, v] : fields) out += fmt::format(",\n  \"{}\": {}", k, v);
  out += "\n}\n";
  return out;
}

std::string Pct(double v) { return fmt::format("{:.0f}%", 100 * v); }

// The fewest and most requests one replica served under policy `i` ("lo-hi"), "-" when
// unknown.
std::string ServedRange(const DemoResult& result, size_t i) {
  if (i >= result.served.size() || result.served[i].empty()) return "-";
  const auto [lo, hi] = std::minmax_element(result.served[i].begin(), result.served[i].end());
  return fmt::format("{}-{}", *lo, *hi);
}
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
    const std::string served = ServedRange(result, i);
    out += fmt::format("{:<15} {:>9.0f} {:>7.2f} {:>9} {:>9} {:>7} {:>13} {:>9} {:>9} {:>8} {:>11}\n",
                       p.policy, p.output_tokens_per_s, p.requests_per_s, Secs(p.ttft_s.p50),
                       Secs(p.ttft_s.p99), fmt::format("{:.1f}%", 100 * p.prefix_hit_rate),
                       Pct(p.kv_usage_min) + " / " + Pct(p.kv_usage_max), Pct(p.kv_usage_peak),
                       fmt::format("{:.1f}/{:.0f}", p.waiting_mean, p.waiting_max),
                       p.preemptions, served);
  }
  return out;
}

std::string DemoText(const DemoResult& result) {
  std::string out;
  if (!result.scaling.empty()) {
    out += "Scaling, in virtual time (kvroute simulate, seed-8x at capacity):\n\n";
    out += report::ScalingText(result.scaling) + "\n";
  }
  for (const Diagnosis& d : result.diagnoses) {
    out += fmt::format("kvroute doctor, live fleet behind {} (exit {}):\n\n", d.policy,
                       d.exit_code);
    out += d.text;
    if (!d.text.empty() && d.text.back() != '\n') out += "\n";
    out += "\n";
  }
  if (!result.policies.empty()) out += "Live comparison:\n\n" + DemoTable(result);
  return out;
}

namespace {

// The live table's rows as HTML table cells (the same figures as DemoTable).
report::HtmlBlock LiveTableBlock(const DemoResult& result) {
  report::HtmlBlock b;
  b.kind = report::HtmlBlock::Kind::kTable;
  b.header = {"policy",   "out tok/s", "req/s",   "TTFT p50", "TTFT p99",    "hit rate",
              "KV min / max", "KV peak", "waiting mean / max", "preemptions", "requests per replica"};
  for (size_t i = 0; i < result.policies.size(); ++i) {
    const report::PolicyReport& p = result.policies[i];
    const std::string served = ServedRange(result, i);
    b.rows.push_back({p.policy, fmt::format("{:.0f}", p.output_tokens_per_s),
                      fmt::format("{:.2f}", p.requests_per_s), Secs(p.ttft_s.p50),
                      Secs(p.ttft_s.p99), fmt::format("{:.1f}%", 100 * p.prefix_hit_rate),
                      Pct(p.kv_usage_min) + " / " + Pct(p.kv_usage_max), Pct(p.kv_usage_peak),
                      fmt::format("{:.1f} / {:.0f}", p.waiting_mean, p.waiting_max),
                      std::to_string(p.preemptions), served});
  }
  return b;
}

std::string LiveSetup(const DemoOptions& o, int n, int kv_blocks) {
  return fmt::format(
      "{} replicas (simulated vLLM, {} KV blocks each), router in front, Poisson {:g} req/s for "
      "{:g} s per policy, outputs x{:g} of the scenario's, fresh fleet per policy. kvroute "
      "doctor scrapes the replicas from {:g} s into the traffic for {:g} s.",
      n, kv_blocks, o.rate, o.duration_s, o.output_scale, o.doctor_warmup_s, o.doctor_window_s);
}

constexpr std::string_view kScalingNote =
    "Each fleet size runs at its capacity: the offered load is above what the policy serves, "
    "so output tokens/s (steady state, during arrivals after a warm-up quarter) is the most "
    "the fleet turns out under that policy. Dashed lines: linear scaling from 2 replicas.";

constexpr std::string_view kLiveNote =
    "KV min/max: at each /metrics scrape the lowest and highest KV-cache usage across "
    "replicas, averaged over the run. hit: prefix-cache hit tokens / queried tokens from the "
    "replicas' counters. waiting: fleet total, mean/max. reqs/replica: fewest/most requests "
    "one replica served.";

// report.json (the report schema's, with the scaling runs and the diagnoses added),
// report.md, report.html and the charts.
void WriteFiles(const DemoOptions& o, int n, int kv_blocks, DemoResult* result) {
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) {
    result->error = "cannot create " + o.out_dir + ": " + ec.message();
    return;
  }
  const fs::path dir(o.out_dir);
  std::vector<std::pair<std::string, std::string>> extra;
  if (!result->scaling.empty()) extra.emplace_back("scaling", report::ScalingJson(result->scaling));
  if (!result->diagnoses.empty()) {
    std::string d = "[";
    for (size_t i = 0; i < result->diagnoses.size(); ++i) {
      const Diagnosis& x = result->diagnoses[i];
      std::string policy;
      api::AppendJsonString(policy, x.policy);
      d += fmt::format("{}{{\"policy\": {}, \"exit_code\": {}, \"report\": {}}}", i ? ", " : "",
                       policy, x.exit_code, x.json.empty() ? "null" : x.json);
    }
    extra.emplace_back("doctor", d + "]");
  }
  const std::string scaling_svg = report::ScalingSvg(result->scaling);
  const std::string cdf_svg = report::TtftCdfSvg(result->policies);
  const std::string heat_svg = report::KvHeatmapSvg(result->policies);

  std::string md = "# kvroute demo: " + result->meta.scenario + "\n\n";
  if (!result->scaling.empty()) {
    md += "## 1. Scaling, in virtual time\n\n";
    md += "```\n" + report::ScalingText(result->scaling) + "```\n\n";
    md += std::string(kScalingNote) + "\n\n![Throughput against fleet size](scaling.svg)\n\n";
    md += report::ScalingMarkdown(result->scaling) + "\n";
  }
  md += "## 2. Live\n\n" + LiveSetup(o, n, kv_blocks) + "\n\n";
  for (const Diagnosis& d : result->diagnoses) {
    md += fmt::format("### kvroute doctor, behind {} (exit {})\n\n```\n{}```\n\n", d.policy,
                      d.exit_code, d.text);
  }
  md += "### Live comparison\n\n```\n" + DemoTable(*result) + "```\n\n" + std::string(kLiveNote) +
        "\n\n";
  for (const std::string& note : result->notes) md += "- " + note + "\n";
  if (!result->notes.empty()) md += "\n";
  md += "![TTFT CDF](ttft_cdf.svg)\n\n![KV usage per replica](kv_heatmap.svg)\n\n";
  md += report::ReportMarkdown(result->meta, result->policies);

  using report::HtmlBlock;
  std::vector<report::HtmlSection> sections;
  if (!result->scaling.empty()) {
    report::HtmlSection s{"scaling", "1. Scaling, in virtual time", {}};
    s.blocks.push_back({HtmlBlock::Kind::kPre, report::ScalingText(result->scaling), {}, {}});
    s.blocks.push_back({HtmlBlock::Kind::kParagraph, std::string(kScalingNote), {}, {}});
    s.blocks.push_back({HtmlBlock::Kind::kSvg, scaling_svg, {}, {}});
    sections.push_back(std::move(s));
  }
  for (const Diagnosis& d : result->diagnoses) {
    report::HtmlSection s{"doctor-" + d.policy,
                          fmt::format("2. kvroute doctor, live fleet behind {}", d.policy), {}};
    s.blocks.push_back({HtmlBlock::Kind::kParagraph,
                        fmt::format("Exit status {} ({}).", d.exit_code,
                                    d.exit_code == 0   ? "healthy"
                                    : d.exit_code == 1 ? "findings"
                                                       : "nothing readable"),
                        {}, {}});
    s.blocks.push_back({HtmlBlock::Kind::kPre, d.text, {}, {}});
    sections.push_back(std::move(s));
  }
  {
    report::HtmlSection s{"live", "3. Live comparison", {}};
    s.blocks.push_back({HtmlBlock::Kind::kParagraph, LiveSetup(o, n, kv_blocks), {}, {}});
    s.blocks.push_back(LiveTableBlock(*result));
    s.blocks.push_back({HtmlBlock::Kind::kParagraph, std::string(kLiveNote), {}, {}});
    for (const std::string& note : result->notes) {
      s.blocks.push_back({HtmlBlock::Kind::kParagraph, note, {}, {}});
    }
    sections.push_back(std::move(s));
  }
  {
    report::HtmlSection s{"charts", "4. Charts", {}};
    s.blocks.push_back({HtmlBlock::Kind::kSvg, heat_svg, {}, {}});
    s.blocks.push_back({HtmlBlock::Kind::kSvg, cdf_svg, {}, {}});
    sections.push_back(std::move(s));
  }
  const std::string html =
      report::HtmlPage("kvroute demo: " + result->meta.scenario,
                       "Round-robin against KV-cache-aware routing, on the seed article's traffic",
                       sections);

  const std::pair<const char*, std::string> files[] = {
      {"report.md", md},
      {"report.json", WithJsonFields(report::ReportJson(result->meta, result->policies), extra)},
      {"report.html", html},
      {"scaling.svg", scaling_svg},
      {"ttft_cdf.svg", cdf_svg},
      {"kv_heatmap.svg", heat_svg},
  };
  for (const auto& [name, text] : files) {
    std::string err;
    if (!WriteFile(dir / name, text, &err)) {
      result->error = err;
      return;
    }
    result->files.push_back((dir / name).string());
  }
}

// The scenario file (options.scenario_path, else FindSeedScenario) as loaded, its path
// in `*path`. Every policy named (the live ones and, with scaling, act 1's) must exist.
// Nullopt with `*error` set otherwise.
std::optional<config::Scenario> LoadScenario(const DemoOptions& o, std::string* path,
                                             std::string* error) {
  *path = o.scenario_path.empty() ? FindSeedScenario() : o.scenario_path;
  if (path->empty()) {
    *error = "cannot find examples/scenarios/seed-8x.yaml (run from the repository, or "
             "pass --scenario)";
    return std::nullopt;
  }
  config::ConfigOr<config::Scenario> load = config::LoadScenarioFile(*path);
  if (!load.ok()) {
    *error = load.error.ToString();
    return std::nullopt;
  }
  std::vector<std::string> all = o.policies;
  if (o.scaling) {
    all.insert(all.end(), o.scaling_options.policies.begin(), o.scaling_options.policies.end());
  }
  for (const std::string& p : all) {
    if (std::find(sched::PolicyNames().begin(), sched::PolicyNames().end(), p) ==
        sched::PolicyNames().end()) {
      *error = "unknown policy '" + p + "'";
      return std::nullopt;
    }
  }
  return std::move(*load.value);
}

// The live runs' setup: the scenario, scaled down for a live run on a small machine.
struct LivePlan {
  workload::WorkloadSpec wl;
  workload::ArrivalSpec arrivals;
  uint64_t seed = 0;
  engine::EngineConfig ec;
  int n = 0;  // replicas
  std::vector<sim::ReplicaConfig> replicas;
};

// The scenario scaled down as DemoOptions says (rate, duration, output lengths, KV
// blocks, replicas, seed). False with `*error` set when a replica's configuration is
// invalid.
bool PlanLive(const DemoOptions& o, const config::Scenario& sc, LivePlan* plan,
              std::string* error) {
  plan->wl = sc.workload;
  plan->wl.output_len = ScaleLengths(plan->wl.output_len, o.output_scale);
  workload::ArrivalSpec& arrivals = plan->arrivals;
  arrivals.kind = sc.arrivals.kind;
  arrivals.burstiness = sc.arrivals.burstiness;
  arrivals.stages = {{o.rate, std::numeric_limits<double>::infinity()}};
  arrivals.duration_s = o.duration_s;
  plan->seed = o.seed ? o.seed : sc.seed;
  engine::EngineConfig& ec = plan->ec;
  ec = sc.fleet.EngineConfigFor();
  if (o.kv_blocks > 0) ec.num_gpu_blocks = o.kv_blocks;
  const int n = o.replicas > 0 ? o.replicas : sc.fleet.replicas;
  plan->n = n;
  std::vector<sim::ReplicaConfig>& replicas = plan->replicas;
  replicas.resize(n);
  for (int i = 0; i < n; ++i) {
    replicas[i].name = "replica-" + std::to_string(i);
    replicas[i].host = "127.0.0.1";
    replicas[i].port = 0;
    replicas[i].preset = sc.fleet.engine_preset;
    replicas[i].engine = ec;
    replicas[i].time_scale = o.time_scale;
    replicas[i].enable_prompt_tokens_details = true;  // per-request cached tokens in the CSV
    if (Status s = config::ValidateReplica(replicas[i]); !s.ok()) {
      *error = "replica config: " + s.message();
      return false;
    }
  }
  return true;
}

// The report's meta: tool, scenario, seed, SLOs and the live setup as info keys.
void FillMeta(const DemoOptions& o, const config::Scenario& sc, const std::string& path,
              const LivePlan& plan, report::ReportMeta* meta) {
  meta->tool = "kvroute demo";
  meta->scenario = sc.name + " (live, scaled down)";
  meta->seed = plan.seed;
  meta->slo = sc.slo;
  auto info = [&](const std::string& k, const std::string& v) { meta->info.emplace_back(k, v); };
  info("scenario_file", path);
  info("replicas", std::to_string(plan.n));
  info("kv_blocks_per_replica", std::to_string(plan.ec.num_gpu_blocks));
  info("rate_per_s", fmt::format("{:g}", o.rate));
  info("duration_s", fmt::format("{:g}", o.duration_s));
  info("output_scale", fmt::format("{:g}", o.output_scale));
  info("time_scale", fmt::format("{:g}", o.time_scale));
  info("scenario_rate_per_s",
       sc.arrivals.stages.empty() ? "-" : fmt::format("{:g}", sc.arrivals.stages[0].rate));
  info("scenario_kv_blocks", std::to_string(sc.fleet.kv_blocks));
}

// The router's configuration for one live run: one thread on an ephemeral loopback port,
// fast scrapes, the fleet's replicas as static endpoints (also into `*fleet_addrs`, for
// the load generator's scrapes) and `policy`, as `scheduling: {policy: NAME}` in a file.
config::RouterConfig LiveRouterConfig(const sim::Fleet& fleet, int n, const std::string& policy,
                                      std::vector<bench::HostPort>* fleet_addrs) {
  config::RouterConfig rc;
  rc.threads = 1;
  rc.listen = "127.0.0.1:0";
  rc.listen_addr = {"127.0.0.1", 0};
  rc.pool.scrape_interval_s = 0.05;
  for (int i = 0; i < n; ++i) {
    config::EndpointConfig ep;
    ep.host_port = {"127.0.0.1", fleet.port(i)};
    ep.address = ep.host_port.ToString();
    ep.name = ep.address;
    rc.pool.endpoints.push_back(ep);
    fleet_addrs->push_back({"127.0.0.1", fleet.port(i)});
  }
  // The policy is the router's configuration, as `scheduling: {policy: NAME}` in a file.
  rc.scheduling.policy = policy;
  return rc;
}

// The load generator's configuration for one live run through the router on `port`.
// `policy` must outlive the run (the progress callback refers to it).
bench::BenchConfig LiveBenchConfig(const DemoOptions& o, const config::Scenario& sc,
                                   const LivePlan& plan, const std::string& policy,
                                   uint16_t port, std::vector<bench::HostPort> fleet_addrs) {
  bench::BenchConfig bc;
  bc.target = {"127.0.0.1", port};
  bc.model = plan.ec.model_name;
  bc.workload = plan.wl;
  bc.arrivals = plan.arrivals;
  bc.seed = plan.seed;
  bc.slo = sc.slo;
  bc.label = policy;
  bc.fleet = std::move(fleet_addrs);
  bc.scrape_interval_s = 0.25;
  bc.drain_timeout_s = o.drain_s;
  bc.first_byte_timeout_s = o.duration_s + o.drain_s + 5;
  bc.stop = o.stop;
  if (o.on_progress) {
    bc.on_progress = [&o, &policy](const bench::Progress& p) { o.on_progress(policy, p); };
  }
  return bc;
}

// kvroute doctor on its own thread, against the replicas (not the router), as an
// operator would run it during the traffic: it waits doctor_warmup_s (less if
// `*traffic_over` becomes true), then diagnoses into `*diagnosis`. It ends early if the
// traffic does. Everything referred to must outlive the thread (joined by the caller).
std::thread StartDoctor(const DemoOptions& o, const std::string& policy, const LivePlan& plan,
                        const sim::Fleet& fleet, const std::atomic<bool>* traffic_over,
                        Diagnosis* diagnosis) {
  std::vector<DoctorTarget> targets;
  targets.reserve(static_cast<size_t>(plan.n));
  for (int i = 0; i < plan.n; ++i) {
    targets.push_back({plan.replicas[i].name, "127.0.0.1", fleet.port(i)});
  }
  return std::thread([&o, &policy, traffic_over, diagnosis, targets] {
    const auto start = std::chrono::steady_clock::now();
    while (!traffic_over->load() &&
           std::chrono::steady_clock::now() - start <
               std::chrono::duration<double>(o.doctor_warmup_s)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (o.log) o.log(fmt::format("[{}] kvroute doctor: scraping {} replicas for {:g} s", policy,
                                 targets.size(), o.doctor_window_s));
    *diagnosis = DiagnoseFleet(policy, targets, o.doctor_window_s, o.doctor_interval_s,
                               traffic_over);
  });
}

// Adds one finished live run to `result`: its requests CSV (with `records`), then (unless
// the run failed) the requests each replica served, its failures and unsent requests as
// notes, its run info and its report. False with result->error set on failure.
bool RecordLiveRun(const DemoOptions& o, const std::string& policy, int n,
                   bench::BenchResult& br, DemoResult* result) {
  if (o.records) {
    std::error_code mk;
    fs::create_directories(o.out_dir, mk);
    const fs::path csv = fs::path(o.out_dir) / ("requests-" + policy + ".csv");
    std::string werr;
    if (!WriteFile(csv, RecordsCsv(br.records), &werr)) {
      result->error = werr;
      return false;
    }
    result->files.push_back(csv.string());
  }
  if (!br.error.empty()) {
    result->error = br.error;
    return false;
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
    result->notes.push_back(fmt::format("{}: {} requests failed ({})", policy, count, cause));
  }
  if (br.not_sent > 0) {
    result->notes.push_back(fmt::format("{}: {} requests not sent (stopped)", policy, br.not_sent));
  }
  bench::AddRunInfo(br, policy + ".", &result->meta);
  result->policies.push_back(std::move(br.summary));
  result->served.push_back(std::move(served));
  return true;
}

// One policy's live run: a fresh fleet, the router with `policy` in front, the load
// generator through it, kvroute doctor beside it; then both stopped and the run recorded.
// False with result->error set when something could not start or the run failed.
bool RunLivePolicy(const DemoOptions& o, const config::Scenario& sc, const LivePlan& plan,
                   const std::string& policy, DemoResult* result) {
  const int n = plan.n;
  Log(o, fmt::format("[{}] starting {} simulated replicas and the router", policy, n));
  sim::Fleet fleet(plan.replicas, 1);
  if (Status st = fleet.Start(); !st.ok()) {
    const std::string& e = st.message();
    result->error = "fleet: " + e;
    return false;
  }
  std::vector<bench::HostPort> fleet_addrs;
  config::RouterConfig rc = LiveRouterConfig(fleet, n, policy, &fleet_addrs);
  if (auto err = sched::ValidateSchedulingSpec(rc.scheduling)) {
    result->error = "policy " + policy + ": " + err->message;
    return false;
  }
  router::RouterOptions ro;
  ro.listen = config::HostPort{"127.0.0.1", 0};
  ro.threads = 1;
  ro.log = false;
  router::Router rt(rc, ro);
  if (Status st = rt.Start(); !st.ok()) {
    result->error = "router: " + st.message();
    return false;
  }
  // Wait (bounded) until the router has scraped the fleet.
  for (int i = 0; i < 100 && !rt.Ready(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));

  bench::BenchConfig bc = LiveBenchConfig(o, sc, plan, policy, rt.port(), std::move(fleet_addrs));
  Log(o, fmt::format("[{}] router on 127.0.0.1:{}; {:g} req/s for {:g} s", policy, rt.port(),
                     o.rate, o.duration_s));
  std::atomic<bool> traffic_over{false};
  Diagnosis diagnosis;
  std::thread doctor_thread;
  if (o.doctor_window_s > 0) {
    doctor_thread = StartDoctor(o, policy, plan, fleet, &traffic_over, &diagnosis);
  }
  bench::BenchResult br = bench::RunBench(bc);
  traffic_over.store(true);
  if (doctor_thread.joinable()) doctor_thread.join();
  rt.Stop();
  fleet.Stop();
  if (o.doctor_window_s > 0) {
    Log(o, fmt::format("[{}] kvroute doctor: exit {}{}", policy, diagnosis.exit_code,
                       diagnosis.exit_code == 2 ? std::string(", nothing readable")
                       : diagnosis.findings.empty()
                           ? std::string(", healthy")
                           : fmt::format(", findings: {}", fmt::join(diagnosis.findings, ", "))));
    result->diagnoses.push_back(std::move(diagnosis));
  }
  return RecordLiveRun(o, policy, n, br, result);
}

}  // namespace

DemoResult RunDemo(const DemoOptions& o) {
  DemoResult result;
  std::string path;
  std::optional<config::Scenario> loaded = LoadScenario(o, &path, &result.error);
  if (!loaded) return result;
  const config::Scenario& sc = *loaded;

  // Act 1, in virtual time, on the scenario as written (its KV size, lengths and rates).
  if (o.scaling) {
    Log(o, fmt::format("[scaling] {} in virtual time: {} replicas at {:g} req/s per replica",
                       sc.name, fmt::join(o.scaling_options.fleet_sizes, ", "),
                       o.scaling_options.rate_per_replica));
    std::string err;
    result.scaling = RunScaling(sc, o.scaling_options, &err, o.log);
    if (!err.empty()) {
      result.error = err;
      return result;
    }
  }

  // Act 2: the scenario, scaled down for a live run on a small machine, per policy.
  LivePlan plan;
  if (!PlanLive(o, sc, &plan, &result.error)) return result;
  FillMeta(o, sc, path, plan, &result.meta);
  for (const std::string& policy : o.policies) {
    if (o.stop && o.stop->load()) break;
    if (!RunLivePolicy(o, sc, plan, policy, &result)) return result;
  }

  WriteFiles(o, plan.n, plan.ec.num_gpu_blocks, &result);
  return result;
}

}  // namespace kvroute::demo
