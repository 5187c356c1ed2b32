#include "apps/bench/bench_main.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "apps/bench/load_generator.h"
#include "apps/bench/options.h"
#include "apps/bench/output.h"
#include "config/scenario_config.h"
#include "simkit/report/writers.h"

namespace kvroute::bench {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

void PrintProgress(const Progress& p) {
  char line[256];
  int n = std::snprintf(line, sizeof line,
                        "\r[%6.1fs] sent %lld done %lld in-flight %lld err %lld | %.0f out tok/s"
                        " | ttft p50 %.3fs",
                        p.elapsed_s, static_cast<long long>(p.sent),
                        static_cast<long long>(p.finished), static_cast<long long>(p.in_flight),
                        static_cast<long long>(p.errors),
                        p.elapsed_s > 0 ? p.output_tokens / p.elapsed_s : 0.0, p.last_ttft_p50_s);
  if (p.hit_rate >= 0 && n > 0 && n < static_cast<int>(sizeof line)) {
    n += std::snprintf(line + n, sizeof line - n, " | hit %.0f%% kv %.2f-%.2f",
                       100 * p.hit_rate, p.kv_min, p.kv_max);
  }
  std::fprintf(stderr, "%s\033[K", line);
  std::fflush(stderr);
}

workload::WorkloadKind ParseKind(const std::string& s, bool* ok) {
  *ok = true;
  if (s == "shared-prefix") return workload::WorkloadKind::kSharedPrefix;
  if (s == "multi-turn") return workload::WorkloadKind::kMultiTurn;
  if (s == "random") return workload::WorkloadKind::kRandom;
  if (s == "trace") return workload::WorkloadKind::kTrace;
  *ok = false;
  return workload::WorkloadKind::kRandom;
}

// The target and what every request carries: --url, --model, --label, --header.
bool ApplyTargetFlags(const BenchOptions& o, BenchConfig* cfg, std::string* err) {
  auto target = ParseUrl(o.url, err);
  if (!target) return false;
  cfg->target = *target;
  cfg->model = o.model;
  cfg->label = o.label;
  for (const std::string& text : o.header_texts) {
    auto h = ParseHeader(text, err);
    if (!h) {
      *err = "--header: " + *err;
      return false;
    }
    cfg->headers.emplace_back(std::move(h->name), std::move(h->value));
  }
  return true;
}

// The scenario file's workload, arrivals, seed and SLOs (--scenario), else the flags'
// defaults, which describe a complete workload.
bool LoadScenarioOrDefaults(const BenchOptions& o, BenchConfig* cfg, report::ReportMeta* meta,
                            std::string* err) {
  if (o.given.scenario) {
    config::ConfigOr<config::Scenario> load = config::LoadScenarioFile(o.scenario_path);
    if (!load.ok()) {
      *err = load.error.ToString();
      return false;
    }
    cfg->workload = load.value->workload;
    cfg->arrivals = load.value->arrivals;
    cfg->seed = load.value->seed;
    cfg->slo = load.value->slo;
    meta->scenario = load.value->name;
  } else {
    // Flag defaults describe a complete workload.
    cfg->workload.num_groups = o.num_groups;
    cfg->workload.num_prompts_per_group = o.prompts_per_group;
    cfg->arrivals.stages = {{o.rate, std::numeric_limits<double>::infinity()}};
    if (!o.given.num_requests && !o.given.duration) cfg->arrivals.num_requests = 100;
  }
  return true;
}

// The workload flags, over the scenario (or the defaults): each given flag wins; without
// a scenario the kind, endpoint, lengths and turns are always the flags'.
bool ApplyWorkloadFlags(const BenchOptions& o, BenchConfig* cfg, std::string* err) {
  const BenchOptions::Given& given = o.given;
  workload::WorkloadSpec& w = cfg->workload;
  bool ok = true;
  if (given.trace && !given.workload) {
    w.kind = workload::WorkloadKind::kTrace;
  } else if (given.workload || !given.scenario) {
    w.kind = ParseKind(o.workload_kind, &ok);
    if (!ok) {
      *err = "unknown --workload '" + o.workload_kind + "'";
      return false;
    }
  }
  if (given.endpoint || !given.scenario) {
    if (o.endpoint != "completions" && o.endpoint != "chat") {
      *err = "unknown --endpoint '" + o.endpoint + "'";
      return false;
    }
    w.endpoint = o.endpoint == "chat" ? api::Endpoint::kChatCompletions : api::Endpoint::kCompletions;
  }
  if (given.num_groups) w.num_groups = o.num_groups;
  if (given.prompts_per_group) w.num_prompts_per_group = o.prompts_per_group;
  auto set_len = [&](bool flag_given, const char* flag, const std::string& text,
                     workload::LengthDist* dst) {
    if (!ok || (!flag_given && given.scenario)) return;
    auto d = ParseLength(text, err);
    if (!d) {
      ok = false;
      *err = std::string(flag) + ": " + *err;
      return;
    }
    *dst = *d;
  };
  set_len(given.system_len, "--system-len", o.system_len, &w.system_prompt_len);
  set_len(given.question_len, "--question-len", o.question_len, &w.question_len);
  set_len(given.output_len, "--output-len", o.output_len, &w.output_len);
  set_len(given.input_len, "--input-len", o.input_len, &w.input_len);
  if (!ok) return false;
  if (given.max_turns || !given.scenario) w.max_turns = o.max_turns;
  if (given.think_time) w.think_time_s = o.think_time;
  if (given.trace_time_scale) w.time_scale = o.trace_time_scale;
  if (given.prefix_len) w.prefix_len = o.prefix_len;
  if (given.block_size) w.block_size = o.block_size;
  if (given.trace) {
    workload::TraceFormat format = workload::DefaultTraceFormat(o.trace_path);
    if (given.trace_format) {
      const std::optional<workload::TraceFormat> named = workload::TraceFormatNamed(o.trace_format);
      if (!named) {
        *err = "unknown --trace-format '" + o.trace_format + "' (mooncake or azure)";
        return false;
      }
      format = *named;
    }
    if (w.block_size < 1) {
      *err = "--block-size: must be >= 1";
      return false;
    }
    std::ifstream f(o.trace_path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    workload::TraceParseResult parsed =
        workload::ParseTrace(format, ss.str(), o.trace_path, w.block_size);
    if (!parsed.ok()) {
      *err = parsed.error;
      return false;
    }
    w.trace = std::make_shared<const std::vector<workload::TraceRow>>(std::move(parsed.rows));
  }
  if (w.kind == workload::WorkloadKind::kTrace && !w.trace) {
    *err = "--workload trace needs --trace FILE";
    return false;
  }
  // A trace given by flag replays whole unless -n or --duration truncates it.
  if (given.trace && !given.scenario && !given.num_requests && !given.duration) {
    cfg->arrivals.num_requests = static_cast<int64_t>(w.trace->size());
  }
  return true;
}

// The arrival flags (process, rates, limits, seed) and the SLOs, over the scenario.
bool ApplyArrivalFlags(const BenchOptions& o, BenchConfig* cfg, std::string* err) {
  const BenchOptions::Given& given = o.given;
  workload::ArrivalSpec& a = cfg->arrivals;
  if (given.arrival) {
    if (o.arrival == "poisson") {
      a.kind = workload::ArrivalKind::kPoisson;
    } else if (o.arrival == "gamma") {
      a.kind = workload::ArrivalKind::kGamma;
    } else if (o.arrival == "constant") {
      a.kind = workload::ArrivalKind::kConstant;
    } else {
      *err = "unknown --arrival '" + o.arrival + "'";
      return false;
    }
  }
  if (given.burstiness) {
    a.burstiness = o.burstiness;
    if (!given.arrival) a.kind = workload::ArrivalKind::kGamma;
  }
  if (given.stages) {
    auto s = ParseStages(o.stages, err);
    if (!s) {
      *err = "--stages: " + *err;
      return false;
    }
    a.stages = *s;
  } else if (given.rate) {
    a.stages = {{o.rate, std::numeric_limits<double>::infinity()}};
  }
  if (given.num_requests) a.num_requests = o.num_requests;
  if (given.duration) a.duration_s = o.duration;
  if (given.max_concurrency) a.max_concurrency = o.max_concurrency;
  if (given.seed) cfg->seed = o.seed;
  if (given.slo) {
    auto slo = ParseSlo(o.slo_text, err);
    if (!slo) {
      *err = "--slo: " + *err;
      return false;
    }
    cfg->slo = *slo;
  }
  return true;
}

// The replicas whose /metrics are read: --fleet, then --fleet-ports.
bool ApplyFleetFlags(const BenchOptions& o, BenchConfig* cfg, std::string* err) {
  if (!o.fleet_list.empty()) {
    auto f = ParseFleetList(o.fleet_list, cfg->target.host, err);
    if (!f) {
      *err = "--fleet: " + *err;
      return false;
    }
    cfg->fleet = *f;
  }
  if (!o.fleet_ports.empty()) {
    auto f = ParsePortRange(o.fleet_ports, o.fleet_host.empty() ? cfg->target.host : o.fleet_host, err);
    if (!f) {
      *err = "--fleet-ports: " + *err;
      return false;
    }
    cfg->fleet.insert(cfg->fleet.end(), f->begin(), f->end());
  }
  return true;
}

// The run's configuration from the flags (and the scenario file they name), and the
// report's tool and scenario. Returns false with the first error in `*err`, checked in
// the order above (target, scenario, workload, arrivals, fleet, then validation).
bool BuildConfig(const BenchOptions& o, BenchConfig* cfg, report::ReportMeta* meta,
                 std::string* err) {
  if (!ApplyTargetFlags(o, cfg, err)) return false;
  meta->tool = "kvroute bench";
  meta->scenario = "flags";
  if (!LoadScenarioOrDefaults(o, cfg, meta, err)) return false;
  // Explicit flags override the scenario (or the defaults above).
  if (!ApplyWorkloadFlags(o, cfg, err)) return false;
  if (!ApplyArrivalFlags(o, cfg, err)) return false;
  if (!ApplyFleetFlags(o, cfg, err)) return false;
  cfg->scrape_interval_s = o.scrape_interval;
  cfg->first_byte_timeout_s = o.timeout;
  cfg->drain_timeout_s = o.drain;
  if (Status st = cfg->workload.Validate(); !st.ok()) {
    *err = "workload: " + st.message();
    return false;
  }
  if (Status st = cfg->arrivals.Validate(); !st.ok()) {
    *err = "arrivals: " + st.message();
    return false;
  }
  return true;
}

// Runs the benchmark with SIGINT and SIGTERM stopping it (and the progress line on
// stderr when `show_progress`).
BenchResult RunWithSignals(BenchConfig& cfg, bool show_progress) {
  if (show_progress) cfg.on_progress = PrintProgress;
  cfg.stop = &g_stop;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);

  BenchResult result = RunBench(cfg);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (show_progress) std::fprintf(stderr, "\n");
  return result;
}

// The report's seed, SLOs, target and extra headers.
void AddConfigInfo(const BenchConfig& cfg, report::ReportMeta* meta) {
  meta->seed = cfg.seed;
  meta->slo = cfg.slo;
  meta->info.emplace_back("target", cfg.target.ToString());
  // The extra headers, one info key per name ("header.x-tenant" = "a"); a repeated name's
  // values joined as HTTP would combine them.
  for (const auto& [name, value] : cfg.headers) {
    const std::string key = "header." + name;
    auto it = std::find_if(meta->info.begin(), meta->info.end(),
                           [&key](const auto& kv) { return kv.first == key; });
    if (it == meta->info.end()) {
      meta->info.emplace_back(key, value);
    } else {
      it->second += ", " + value;
    }
  }
}

// The report on stdout: the Markdown report, then the one-line summaries (requests,
// latency, the fleet's view) and the error causes.
void PrintReport(const BenchConfig& cfg, const BenchResult& result, const report::ReportMeta& meta) {
  const report::PolicyReport& rep = result.summary;
  std::printf("%s", report::ReportMarkdown(meta, {&rep, 1}).c_str());
  std::printf("\nrequests %lld ok %lld good %lld | %.2f req/s, %.1f output tok/s, goodput %.2f req/s\n",
              static_cast<long long>(rep.requests), static_cast<long long>(rep.succeeded),
              static_cast<long long>(rep.good), rep.requests_per_s, rep.output_tokens_per_s,
              rep.goodput_requests_per_s);
  std::printf("ttft mean %.3fs p50 %.3fs p90 %.3fs p99 %.3fs | tpot p50 %.4fs p99 %.4fs | "
              "e2e p50 %.3fs p99 %.3fs\n",
              rep.ttft_s.mean, rep.ttft_s.p50, rep.ttft_s.p90, rep.ttft_s.p99, rep.tpot_s.p50,
              rep.tpot_s.p99, rep.e2e_s.p50, rep.e2e_s.p99);
  if (!cfg.fleet.empty() && HitRateFromScrapes(result.replicas) < 0) {
    int64_t failed = 0;
    for (const ReplicaScrape& s : result.replicas) failed += s.scrapes_failed;
    std::printf("fleet: no prefix-cache queries seen in /metrics (%lld scrapes failed)\n",
                static_cast<long long>(failed));
  } else if (!cfg.fleet.empty()) {
    const std::string cached = rep.request_cached_fraction >= 0
                                   ? fmt::format("{:.1f}%", 100 * rep.request_cached_fraction)
                                   : std::string("not reported");
    std::printf("fleet: prefix hit rate %.1f%% (cached/prompt %s), KV usage min %.2f max %.2f "
                "peak %.2f, waiting mean %.1f max %.0f, preemptions %lld\n",
                100 * rep.prefix_hit_rate, cached.c_str(), rep.kv_usage_min,
                rep.kv_usage_max, rep.kv_usage_peak, rep.waiting_mean, rep.waiting_max,
                static_cast<long long>(rep.preemptions));
  }
  for (const auto& [cause, n] : result.error_details) {
    std::printf("errors: %s %lld\n", cause.c_str(), static_cast<long long>(n));
  }
}

// Builds the configuration, runs it and reports. Returns the exit code: 0, 1 when the
// report files cannot be written, 2 on a bad flag, scenario or start.
int Run(const BenchOptions& o) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "kvroute bench: %s\n", msg.c_str());
    return 2;
  };
  BenchConfig cfg;
  report::ReportMeta meta;
  std::string err;
  if (!BuildConfig(o, &cfg, &meta, &err)) return fail(err);

  const bool show_progress = !o.quiet && (o.progress || isatty(STDERR_FILENO));
  BenchResult result = RunWithSignals(cfg, show_progress);
  if (!result.error.empty()) return fail(result.error);

  AddConfigInfo(cfg, &meta);
  AddRunInfo(result, "", &meta);
  PrintReport(cfg, result, meta);
  if (!o.out_dir.empty()) {
    std::string werr;
    auto files = WriteReportFiles(o.out_dir, meta, {&result.summary, 1}, &werr);
    for (const std::string& f : files) std::printf("wrote %s\n", f.c_str());
    if (!werr.empty()) {
      std::fprintf(stderr, "kvroute bench: %s\n", werr.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int BenchMain(int argc, char** argv) {
  CLI::App app{
      "Open-loop load generator for an OpenAI-compatible endpoint (a router or one replica).\n"
      "Requests are streamed (stream=true, include_usage) over keep-alive connections; per\n"
      "request it measures TTFT, inter-token gaps, TPOT, end-to-end latency, tokens and cached\n"
      "tokens. With --fleet/--fleet-ports it reads every replica's /metrics before, during and\n"
      "after the run: prefix-cache hit rate, KV usage spread, waiting, preemptions.\n"
      "Workload and arrivals come from flags or a scenario file (--scenario); flags given\n"
      "explicitly override the file.",
      "kvroute bench"};
  BenchOptions opts;
  AddFlags(app, opts);
  CLI11_PARSE(app, argc, argv);
  NoteGivenFlags(app, opts);
  return Run(opts);
}

}  // namespace kvroute::bench
