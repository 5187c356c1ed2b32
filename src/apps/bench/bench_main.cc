#include "apps/bench/bench_main.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
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
  std::string url, model, scenario_path, out_dir, label = "bench";
  std::string workload_kind = "shared-prefix", endpoint = "completions";
  int64_t num_groups = 8, prompts_per_group = 16;
  std::string system_len = "1000", question_len = "100", output_len = "64", input_len = "256";
  int max_turns = 5;
  double think_time = 0.0;
  std::string trace_path;
  double trace_time_scale = 1.0;
  int64_t prefix_len = 0;
  std::string arrival = "poisson", stages, slo_text, fleet_list, fleet_ports, fleet_host;
  double burstiness = 1.0, rate = 10.0, duration = 0.0;
  int64_t num_requests = 0, max_concurrency = 0;
  uint64_t seed = 1;
  double scrape_interval = 0.25, timeout = 600.0, drain = 120.0;
  bool quiet = false, progress = false;
  std::vector<std::string> header_texts;

  app.add_option("--url", url, "Target, e.g. http://127.0.0.1:8080")->required();
  app.add_option("--model", model, "Model name to send (default: first of GET /v1/models)");
  app.add_option("--header,-H", header_texts,
                 "Extra header NAME:VALUE sent on every request to --url (repeatable), e.g. "
                 "-H x-gateway-inference-objective:batch")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  auto* o_scenario = app.add_option("--scenario", scenario_path,
                                    "Scenario YAML (workload, arrivals, seed, slo), as for simulate")
                         ->check(CLI::ExistingFile);
  auto* o_kind = app.add_option("--workload", workload_kind,
                                "shared-prefix | multi-turn | random | trace")
                     ->capture_default_str();
  auto* o_endpoint = app.add_option("--endpoint", endpoint, "completions | chat")
                         ->capture_default_str();
  auto* o_groups = app.add_option("--num-groups", num_groups, "shared-prefix/multi-turn groups")
                       ->capture_default_str();
  auto* o_ppg = app.add_option("--prompts-per-group", prompts_per_group,
                               "Prompts (or conversations) per group")
                    ->capture_default_str();
  auto* o_sys = app.add_option("--system-len", system_len,
                               "Shared system prompt tokens: N or mean:sd[:min:max]")
                    ->capture_default_str();
  auto* o_q = app.add_option("--question-len", question_len, "Question tokens")
                  ->capture_default_str();
  auto* o_out = app.add_option("--output-len", output_len, "Output tokens (sent as max_tokens "
                                                           "with ignore_eos)")
                    ->capture_default_str();
  auto* o_in = app.add_option("--input-len", input_len, "random: prompt tokens")
                   ->capture_default_str();
  auto* o_turns = app.add_option("--max-turns", max_turns, "multi-turn: turns per conversation")
                      ->capture_default_str();
  auto* o_think = app.add_option("--think-time", think_time,
                                 "multi-turn: seconds between an answer and the next question");
  auto* o_trace = app.add_option("--trace", trace_path, "trace: Azure-format CSV")
                      ->check(CLI::ExistingFile);
  auto* o_tscale = app.add_option("--trace-time-scale", trace_time_scale,
                                  "trace: replay speed (2 = twice as fast)");
  auto* o_plen = app.add_option("--prefix-len", prefix_len, "trace: shared prefix tokens per group");
  auto* o_arrival = app.add_option("--arrival", arrival, "poisson | gamma | constant")
                        ->capture_default_str();
  auto* o_burst = app.add_option("--burstiness", burstiness, "gamma shape (1 = Poisson)");
  auto* o_rate = app.add_option("--rate", rate, "Requests per second")->capture_default_str();
  auto* o_stages = app.add_option("--stages", stages,
                                  "Rate sweep 'rate:seconds,rate:seconds,...' (replaces --rate)");
  auto* o_n = app.add_option("--num-requests,-n", num_requests, "Stop after this many requests");
  auto* o_dur = app.add_option("--duration", duration, "Stop sending after this many seconds");
  auto* o_conc = app.add_option("--max-concurrency", max_concurrency,
                                "Hold requests back while this many are in flight (0: none)");
  auto* o_seed = app.add_option("--seed", seed, "Workload and arrival seed")->capture_default_str();
  auto* o_slo = app.add_option("--slo", slo_text, "Goodput SLOs, e.g. ttft=2s,tpot=50ms");
  app.add_option("--fleet", fleet_list, "Replicas whose /metrics to read: host:port,host:port");
  app.add_option("--fleet-ports", fleet_ports, "Replica port range P-Q (host: --fleet-host)");
  app.add_option("--fleet-host", fleet_host, "Host for --fleet-ports (default: the --url host)");
  app.add_option("--scrape-interval", scrape_interval, "Seconds between /metrics reads")
      ->capture_default_str();
  app.add_option("--timeout", timeout, "Seconds to wait for a response's first byte")
      ->capture_default_str();
  app.add_option("--drain", drain, "Seconds in-flight requests get after the last arrival")
      ->capture_default_str();
  app.add_option("--out", out_dir, "Write report.json, report.md and SVG charts here");
  app.add_option("--label", label, "Name of this run in the report")->capture_default_str();
  app.add_flag("--quiet,-q", quiet, "No progress line");
  app.add_flag("--progress", progress, "Progress line even when stderr is not a terminal");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "kvroute bench: %s\n", msg.c_str());
    return 2;
  };

  BenchConfig cfg;
  std::string err;
  auto target = ParseUrl(url, &err);
  if (!target) return fail(err);
  cfg.target = *target;
  cfg.model = model;
  cfg.label = label;
  for (const std::string& text : header_texts) {
    auto h = ParseHeader(text, &err);
    if (!h) return fail("--header: " + err);
    cfg.headers.emplace_back(std::move(h->name), std::move(h->value));
  }

  report::ReportMeta meta;
  meta.tool = "kvroute bench";
  meta.scenario = "flags";
  if (o_scenario->count()) {
    config::ConfigOr<config::Scenario> load = config::LoadScenarioFile(scenario_path);
    if (!load.ok()) return fail(load.error.ToString());
    cfg.workload = load.value->workload;
    cfg.arrivals = load.value->arrivals;
    cfg.seed = load.value->seed;
    cfg.slo = load.value->slo;
    meta.scenario = load.value->name;
  } else {
    // Flag defaults describe a complete workload.
    cfg.workload.num_groups = num_groups;
    cfg.workload.num_prompts_per_group = prompts_per_group;
    cfg.arrivals.stages = {{rate, std::numeric_limits<double>::infinity()}};
    if (!o_n->count() && !o_dur->count()) cfg.arrivals.num_requests = 100;
  }
  // Explicit flags override the scenario (or the defaults above).
  bool ok = true;
  if (o_kind->count() || !o_scenario->count()) {
    cfg.workload.kind = ParseKind(workload_kind, &ok);
    if (!ok) return fail("unknown --workload '" + workload_kind + "'");
  }
  if (o_endpoint->count() || !o_scenario->count()) {
    if (endpoint != "completions" && endpoint != "chat") {
      return fail("unknown --endpoint '" + endpoint + "'");
    }
    cfg.workload.endpoint =
        endpoint == "chat" ? api::Endpoint::kChatCompletions : api::Endpoint::kCompletions;
  }
  if (o_groups->count()) cfg.workload.num_groups = num_groups;
  if (o_ppg->count()) cfg.workload.num_prompts_per_group = prompts_per_group;
  auto set_len = [&](CLI::Option* o, const std::string& text, workload::LengthDist* dst) {
    if (!ok || (!o->count() && o_scenario->count())) return;
    auto d = ParseLength(text, &err);
    if (!d) {
      ok = false;
      err = o->get_name() + ": " + err;
      return;
    }
    *dst = *d;
  };
  set_len(o_sys, system_len, &cfg.workload.system_prompt_len);
  set_len(o_q, question_len, &cfg.workload.question_len);
  set_len(o_out, output_len, &cfg.workload.output_len);
  set_len(o_in, input_len, &cfg.workload.input_len);
  if (!ok) return fail(err);
  if (o_turns->count() || !o_scenario->count()) cfg.workload.max_turns = max_turns;
  if (o_think->count()) cfg.workload.think_time_s = think_time;
  if (o_tscale->count()) cfg.workload.time_scale = trace_time_scale;
  if (o_plen->count()) cfg.workload.prefix_len = prefix_len;
  if (o_trace->count()) {
    std::ifstream f(trace_path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    workload::TraceParseResult parsed = workload::ParseTraceCsv(ss.str(), trace_path);
    if (!parsed.ok()) return fail(parsed.error);
    cfg.workload.trace =
        std::make_shared<const std::vector<workload::TraceRow>>(std::move(parsed.rows));
  }
  if (cfg.workload.kind == workload::WorkloadKind::kTrace && !cfg.workload.trace) {
    return fail("--workload trace needs --trace FILE");
  }
  if (o_arrival->count()) {
    if (arrival == "poisson") {
      cfg.arrivals.kind = workload::ArrivalKind::kPoisson;
    } else if (arrival == "gamma") {
      cfg.arrivals.kind = workload::ArrivalKind::kGamma;
    } else if (arrival == "constant") {
      cfg.arrivals.kind = workload::ArrivalKind::kConstant;
    } else {
      return fail("unknown --arrival '" + arrival + "'");
    }
  }
  if (o_burst->count()) {
    cfg.arrivals.burstiness = burstiness;
    if (!o_arrival->count()) cfg.arrivals.kind = workload::ArrivalKind::kGamma;
  }
  if (o_stages->count()) {
    auto s = ParseStages(stages, &err);
    if (!s) return fail("--stages: " + err);
    cfg.arrivals.stages = *s;
  } else if (o_rate->count()) {
    cfg.arrivals.stages = {{rate, std::numeric_limits<double>::infinity()}};
  }
  if (o_n->count()) cfg.arrivals.num_requests = num_requests;
  if (o_dur->count()) cfg.arrivals.duration_s = duration;
  if (o_conc->count()) cfg.arrivals.max_concurrency = max_concurrency;
  if (o_seed->count()) cfg.seed = seed;
  if (o_slo->count()) {
    auto slo = ParseSlo(slo_text, &err);
    if (!slo) return fail("--slo: " + err);
    cfg.slo = *slo;
  }
  if (!fleet_list.empty()) {
    auto f = ParseFleetList(fleet_list, cfg.target.host, &err);
    if (!f) return fail("--fleet: " + err);
    cfg.fleet = *f;
  }
  if (!fleet_ports.empty()) {
    auto f = ParsePortRange(fleet_ports, fleet_host.empty() ? cfg.target.host : fleet_host, &err);
    if (!f) return fail("--fleet-ports: " + err);
    cfg.fleet.insert(cfg.fleet.end(), f->begin(), f->end());
  }
  cfg.scrape_interval_s = scrape_interval;
  cfg.first_byte_timeout_s = timeout;
  cfg.drain_timeout_s = drain;
  if (Status st = cfg.workload.Validate(); !st.ok()) return fail("workload: " + st.message());
  if (Status st = cfg.arrivals.Validate(); !st.ok()) return fail("arrivals: " + st.message());

  const bool show_progress = !quiet && (progress || isatty(STDERR_FILENO));
  if (show_progress) cfg.on_progress = PrintProgress;
  cfg.stop = &g_stop;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);

  BenchResult result = RunBench(cfg);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (show_progress) std::fprintf(stderr, "\n");
  if (!result.error.empty()) return fail(result.error);

  meta.seed = cfg.seed;
  meta.slo = cfg.slo;
  meta.info.emplace_back("target", cfg.target.ToString());
  // The extra headers, one info key per name ("header.x-tenant" = "a"); a repeated name's
  // values joined as HTTP would combine them.
  for (const auto& [name, value] : cfg.headers) {
    const std::string key = "header." + name;
    auto it = std::find_if(meta.info.begin(), meta.info.end(),
                           [&key](const auto& kv) { return kv.first == key; });
    if (it == meta.info.end()) {
      meta.info.emplace_back(key, value);
    } else {
      it->second += ", " + value;
    }
  }
  AddRunInfo(result, "", &meta);
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
    std::printf("fleet: prefix hit rate %.1f%% (cached/prompt %.1f%%), KV usage min %.2f max %.2f "
                "peak %.2f, waiting mean %.1f max %.0f, preemptions %lld\n",
                100 * rep.prefix_hit_rate, 100 * rep.request_cached_fraction, rep.kv_usage_min,
                rep.kv_usage_max, rep.kv_usage_peak, rep.waiting_mean, rep.waiting_max,
                static_cast<long long>(rep.preemptions));
  }
  for (const auto& [cause, n] : result.error_details) {
    std::printf("errors: %s %lld\n", cause.c_str(), static_cast<long long>(n));
  }
  if (!out_dir.empty()) {
    std::string werr;
    auto files = WriteReportFiles(out_dir, meta, {&rep, 1}, &werr);
    for (const std::string& f : files) std::printf("wrote %s\n", f.c_str());
    if (!werr.empty()) {
      std::fprintf(stderr, "kvroute bench: %s\n", werr.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace kvroute::bench
