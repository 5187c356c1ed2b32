// `kvroute doctor`'s command line: the flags (an Options struct and AddFlags), their
// checks, and Run's steps: resolve the targets (targets.cc), listen to KV-cache events,
// collect, diagnose, and print the report or the --watch view.
#include "apps/doctor/doctor_main.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>
#include <utility>

#include "config/yaml_reader.h"
#include "apps/doctor/diagnosis/doctor.h"
#include "apps/doctor/event_probe.h"
#include "apps/doctor/trace_run.h"
#include "simkit/workload/trace.h"

namespace kvroute::doctor {
namespace {

std::atomic<bool> g_stop{false};
// After the last scrape, how long the event probe keeps listening for batches of the work
// that scrape counted (a vLLM engine publishes within a step, milliseconds).
constexpr int kEventGraceMs = 500;
void OnSignal(int) { g_stop.store(true); }

// The rules as the help prints them, from the defaults themselves so the text cannot
// drift from what Diagnose applies.
std::string RulesText() {
  const DoctorOptions d;
  char buf[5632];
  std::snprintf(
      buf, sizeof buf,
      "Rules (defaults; docs/DOCTOR.md explains each and its remedy):\n"
      "  prefix-reuse-lost   fleet prefix-cache hit rate over the window < %.0f%%, with at\n"
      "                      least %.0f prompt tokens looked up in the cache (routing)\n"
      "  lopsided-kv         in >= %.0f%% of the scrape rounds, a replica under pressure\n"
      "                      (waiting >= %g, a preemption since its previous scrape, or KV\n"
      "                      >= %.0f%% with waiting > %g) while a sibling idles (waiting <= %g,\n"
      "                      KV <= %.0f%%) at least %.0f points lower (routing)\n"
      "  queue-imbalance     a replica's mean waiting >= %g while another's is <= %g\n"
      "                      (routing)\n"
      "  preemptions         a replica preempting more than %g requests/s\n"
      "  prefix-caching-off  a replica's cache_config_info says enable_prefix_caching=False\n"
      "  unreachable         a replica whose last scrape failed (connect error, timeout,\n"
      "                      non-200 status, body over 16 MiB)\n"
      "  garbage-metrics     NaN, infinite, negative or implausible engine series, or a body\n"
      "                      that is not a Prometheus exposition\n"
      "  not-vllm            a 200 /metrics without any vllm: series (an HTML page, another\n"
      "                      exporter, a router's own /metrics)\n"
      "  kv-events-silent    KV events configured, no batch received in the window, while\n"
      "                      the replica computed >= %g block(s) of prompt tokens (prompt\n"
      "                      tokens minus prefix-cache hits)\n"
      "  kv-events-stale     batches early in the window, none in its second half while\n"
      "                      the replica computed >= %g block(s) of prompt tokens there\n"
      "  kv-events-block-size  BlockStored block_size differs from cache_config_info's, or\n"
      "                      is not a multiple of pool.kv_events.block_size\n"
      "With --router (a kvroute serve/epp /metrics):\n"
      "  latency-model-inaccurate  the router's TTFT or TPOT predictions off by more than\n"
      "                      %.0f%% and %g s on average over >= %.0f scored predictions\n"
      "  slo-missed          more than %.0f%% of >= %.0f requests with an objective missed it\n"
      "                      (routing)\n"
      "  router-unreadable   --router answered without kvroute's latency series, or not at all\n"
      "Counters and histograms are read as rates over the window (hit rate from the\n"
      "prefix-cache query/hit counters, new and old names, else the old hit-rate gauge;\n"
      "TTFT p50/p99 from the histogram buckets); a counter that goes down inside the window\n"
      "(a restart) makes that rate unknown, and a rule never fires on unknown figures.\n",
      100 * d.low_hit_rate, d.min_queried_tokens, 100 * d.lopsided_share, d.queue_busy,
      100 * d.kv_hot, d.queue_idle, d.queue_idle, 100 * d.kv_cold, 100 * d.kv_spread, d.queue_busy,
      d.queue_idle, d.preemptions_per_s, d.event_min_blocks, d.event_min_blocks,
      100 * d.latency_max_mape, d.latency_min_abs_error_s, d.latency_min_predictions, 100 * d.slo_max_violation,
      d.slo_min_requests);
  return buf;
}

constexpr const char* kFooter = R"(
Targets (exactly one of):
  --endpoints HOST:PORT,...   the replicas' own addresses (their /metrics), not a router's
  --config FILE               the pool of a `kvroute serve` / `kvroute epp` configuration:
                              pool.endpoints, pool.endpoints_file (read once), or
                              pool.discovery.kubernetes (the InferencePool's pods, listed once
                              through the kubeconfig or the in-cluster service account)

KV-cache events: from a config, every endpoint with `kv_events` (or all of them with
pool.kv_events.port) is subscribed to for the window while doctor scrapes; with
--endpoints, --kv-events-port P subscribes to tcp://<each host>:P (the same port on every
replica, as in Kubernetes), or --kv-events tcp://HOST:PORT,... names each replica's
publisher in --endpoints order (`kvroute sim --kv-events-port P` publishes replica i on
P+i: list them). Not with --window 0,
nor with the centralized pool.kv_events.bind (the replicas connect to the router).

Durations: "30s", "500ms", "2m", "1h", or a number of seconds. --window 0 scrapes each
replica once: rates are then unknown, and the hit rate and TTFT quantiles come from the
counters and buckets since each replica started (reported as counters-lifetime).
Every round scrapes all replicas at once, so a round takes at most --timeout however many
are down. Ctrl-C during the window diagnoses what was collected so far.

--watch: a live view, refreshed every --interval, one row per replica (KV bar, waiting,
running, hit rate, preemptions/s) over the last --window of scrapes, until Ctrl-C. Plain
ANSI (clear screen and home), fine over ssh; when stdout is not a terminal each refresh
is printed as a frame, without the codes. Exits with the last frame's status.

--scenario-out FILE writes a `kvroute simulate` scenario approximating the observed traffic
(request rate, prompt and output lengths from vLLM's request-size histograms, fleet size
and KV blocks from cache_config_info): `kvroute simulate --scenario FILE` then shows what
each policy would do. It needs requests finished in the window; without any it is an error.

Exit status: 0 healthy, 1 findings, 2 nothing readable (no replica gave a usable vLLM
/metrics), a usage or configuration error, or --scenario-out / --json-out could not be
written.
Progress goes to stderr (a countdown line when it is a terminal); reports to stdout.
)";

// Parses a duration flag: ok, or InvalidArgument naming the flag.
Status FlagDuration(const char* flag, const std::string& text, bool zero_ok, double& out) {
  std::optional<double> d = config::ParseDuration(text);
  if (!d || !std::isfinite(*d)) {
    return Status::InvalidArgument(
        std::string(flag) + " '" + text +
        "': expected a duration (\"30s\", \"500ms\", \"2m\", or seconds)");
  }
  if (!zero_ok && *d <= 0) {
    return Status::InvalidArgument(std::string(flag) + " '" + text + "': must be > 0");
  }
  out = *d;
  return Status::Ok();
}

int TerminalWidth() {
  winsize ws{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    int n = std::atoi(c);
    if (n > 20) return n;
  }
  return 100;
}

// Replicas whose newest scrape was a usable vLLM one, for the progress line.
int Readable(const std::vector<ReplicaHistory>& h) {
  int n = 0;
  for (const ReplicaHistory& r : h) {
    if (!r.scrapes.empty() && r.scrapes.back().reachable && r.scrapes.back().any_engine_series) ++n;
  }
  return n;
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  return static_cast<bool>(f);
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "kvroute doctor: %s\n(kvroute doctor --help for the flags)\n",
               message.c_str());
  return 2;
}

// The command line as given: the flags' values before they are checked.
struct Options {
  std::string endpoints, config_path;
  std::string window_text = "30s", interval_text = "2s", timeout_text = "2s";
  std::string scenario_out, json_out;
  bool json = false, watch = false, quiet = false;
  int kv_events_port = 0;
  std::string kv_events_list, router_addr;
  // --trace: replay a capture or public trace under every policy (trace_compare.h).
  std::string trace, trace_format, fleet_file, policies;
  int64_t block_size = 512;
  double time_scale = 1.0;
};

// The flags, their help and the footer (targets, durations, rules) into `app`, bound to `opt`.
void AddFlags(CLI::App& app, Options& opt) {
  app.add_option("--endpoints,-e", opt.endpoints, "Replicas to diagnose: HOST:PORT,HOST:PORT,...");
  app.add_option("--config,-c", opt.config_path,
                 "A serve/epp configuration whose pool to diagnose (endpoints, endpoints_file, "
                 "Kubernetes discovery)");
  app.add_option("--window,-w", opt.window_text,
                 "How long to scrape; counters and histograms are rates over it (0: one scrape)")
      ->capture_default_str();
  app.add_option("--interval,-i", opt.interval_text,
                 "Between scrape rounds (and --watch refreshes)")
      ->capture_default_str();
  app.add_option("--timeout", opt.timeout_text,
                 "Per scrape: connect + complete response (a Kubernetes listing waits 5x this, at "
                 "least 10s)")
      ->capture_default_str();
  app.add_flag("--json", opt.json,
               "Print the report as JSON (schema kvroute-doctor/1, docs/DOCTOR.md)");
  app.add_option("--json-out", opt.json_out,
                 "Also write the JSON report to FILE (stdout keeps the text; for scripts)");
  app.add_flag("--watch", opt.watch,
               "Live view refreshed every --interval over the last --window, until Ctrl-C");
  app.add_option("--scenario-out", opt.scenario_out,
                 "Also write a `kvroute simulate` scenario of the observed traffic to FILE");
  app.add_option("--kv-events-port", opt.kv_events_port,
                 "With --endpoints: every replica publishes KV-cache events on tcp://<its "
                 "host>:PORT (the same port on every replica, as in Kubernetes); doctor listens "
                 "while it scrapes")
      ->check(CLI::Range(1, 65535));
  app.add_option("--kv-events", opt.kv_events_list,
                 "With --endpoints: each replica's KV-cache event publisher, in the same order: "
                 "tcp://HOST:PORT,... (an empty entry: none)");
  app.add_option("--router", opt.router_addr,
                 "Also scrape a kvroute router's /metrics (serve's listen address, epp's metrics "
                 "address) for its latency model's errors and the requests' objectives met");
  app.add_option("--trace", opt.trace,
                 "Replay this capture (serve's or epp's capture:) or public Mooncake trace in "
                 "simulate under every policy on a fleet shaped like the live one, and compare "
                 "(docs/TRACES.md)")
      ->check(CLI::ExistingFile);
  app.add_option("--trace-format", opt.trace_format,
                 "mooncake | azure (default: mooncake for a .jsonl file, else azure)");
  app.add_option("--block-size", opt.block_size, "--trace: prompt tokens per hash id")
      ->capture_default_str();
  app.add_option("--time-scale", opt.time_scale, "--trace: replay speed (2 = twice as fast)")
      ->capture_default_str();
  app.add_option("--fleet", opt.fleet_file,
                 "--trace: a YAML file with the simulated fleet (simulate's `fleet:` block) "
                 "instead of the live replicas' shape")
      ->check(CLI::ExistingFile);
  app.add_option("--policies", opt.policies,
                 "--trace: comma-separated policies to compare (default: every built-in one)");
  app.add_flag("--quiet,-q", opt.quiet, "No progress on stderr");
  app.footer(std::string(kFooter) + "\n" + RulesText());
}

// --window, --interval and --timeout in seconds.
struct Durations {
  double window_s = 0, interval_s = 0, timeout_s = 0;
};

// Parses the durations into `d` and checks that the flags go together. Returns ok, else
// InvalidArgument with the usage error (the first one, in the order below).
Status CheckFlags(const Options& opt, Durations& d) {
  for (const Status& st : {FlagDuration("--window", opt.window_text, true, d.window_s),
                           FlagDuration("--interval", opt.interval_text, false, d.interval_s),
                           FlagDuration("--timeout", opt.timeout_text, false, d.timeout_s)}) {
    if (!st.ok()) return st;
  }
  const bool trace_with_fleet = !opt.trace.empty() && !opt.fleet_file.empty();
  if (!trace_with_fleet && opt.endpoints.empty() == opt.config_path.empty()) {
    return Status::InvalidArgument(
        opt.endpoints.empty() ? "give the replicas: --endpoints HOST:PORT,... or --config FILE"
                              : "--endpoints and --config: give one of them, not both");
  }
  if (trace_with_fleet && !(opt.endpoints.empty() && opt.config_path.empty())) {
    return Status::InvalidArgument("--trace with --fleet reads no replicas: drop --endpoints / --config");
  }
  if (!opt.trace.empty() && (opt.watch || opt.json || !opt.scenario_out.empty())) {
    return Status::InvalidArgument("--trace prints its comparison table: drop --watch, --json, --scenario-out");
  }
  if (!opt.trace_format.empty() && !workload::TraceFormatNamed(opt.trace_format)) {
    return Status::InvalidArgument("unknown --trace-format '" + opt.trace_format + "' (mooncake or azure)");
  }
  if (opt.block_size < 1 || !(opt.time_scale > 0)) {
    return Status::InvalidArgument("--block-size must be >= 1 and --time-scale > 0");
  }
  if (opt.watch && opt.json) {
    return Status::InvalidArgument("--watch and --json: pick one (--json prints one report)");
  }
  if (opt.watch && (!opt.scenario_out.empty() || !opt.json_out.empty())) {
    return Status::InvalidArgument("--watch writes no files: drop --scenario-out / --json-out");
  }

  if ((opt.kv_events_port != 0 || !opt.kv_events_list.empty()) && opt.endpoints.empty()) {
    return Status::InvalidArgument(
        std::string(opt.kv_events_port != 0 ? "--kv-events-port" : "--kv-events") +
        " goes with --endpoints (a config names its events itself: kv_events, "
        "pool.kv_events.port)");
  }
  if (opt.kv_events_port != 0 && !opt.kv_events_list.empty()) {
    return Status::InvalidArgument("--kv-events and --kv-events-port: give one of them, not both");
  }
  return Status::Ok();
}

// The targets to scrape into `targets`: the replicas (from --endpoints and its events flags,
// or the configuration's pool, whose KV-event settings land in `kv`), then the router
// (--router) as the last one. Returns false after printing the error (exit code 2).
bool ResolveTargets(const Options& opt, const Durations& d, std::vector<Target>& targets,
                    ConfigKvEvents& kv) {
  if (!opt.endpoints.empty()) {
    if (Status st = ParseEndpointList(opt.endpoints, targets); !st.ok()) {
      Usage(st.message());
      return false;
    }
    if (opt.kv_events_port != 0) {
      ApplyKvEventsPort(static_cast<uint16_t>(opt.kv_events_port), targets);
    }
    if (!opt.kv_events_list.empty()) {
      if (Status st = ApplyKvEventsList(opt.kv_events_list, targets); !st.ok()) {
        Usage(st.message());
        return false;
      }
    }
  } else if (Status st = TargetsFromConfig(opt.config_path, std::max(10.0, 5 * d.timeout_s),
                                           targets, &kv);
             !st.ok()) {
    std::fprintf(stderr, "kvroute doctor: %s\n", st.message().c_str());
    return false;
  }
  if (!kv.bind.empty() && !opt.quiet) {
    std::fprintf(stderr,
                 "kvroute doctor: pool.kv_events.bind (%s): the replicas connect to the router, "
                 "so their KV events are not probed\n",
                 kv.bind.c_str());
  }
  // The router, scraped with the replicas as one more target (the last), diagnosed apart.
  if (!opt.router_addr.empty()) {
    std::vector<Target> r;
    if (Status st = ParseEndpointList(opt.router_addr, r); !st.ok() || r.size() != 1) {
      Usage("--router: " + (st.ok() ? std::string("give one HOST:PORT") : st.message()));
      return false;
    }
    targets.push_back(r.front());
  }
  return true;
}

// Histories to (replicas, the router's), diagnosed.
Report DiagnoseHistories(std::vector<ReplicaHistory> h, const DoctorOptions& d,
                         bool has_router) {
  std::optional<ReplicaHistory> router;
  if (has_router && !h.empty()) {
    router = std::move(h.back());
    h.pop_back();
  }
  return Diagnose(h, d, router ? &*router : nullptr);
}

// The probe's snapshot into histories: batches from the oldest kept scrape on (with `trim`;
// else every batch). `h` as is when nothing is probed.
std::vector<ReplicaHistory> WithEvents(EventsProbe& probe, bool probing,
                                       std::vector<ReplicaHistory> h, bool trim) {
  if (!probing) return h;
  std::optional<double> since;
  if (trim) {
    for (const ReplicaHistory& r : h) {
      if (!r.scrapes.empty()) since = std::min(since.value_or(r.scrapes.front().t_s),
                                               r.scrapes.front().t_s);
    }
  }
  std::vector<std::optional<EventProbe>> seen = probe.Snapshot(since);
  for (size_t i = 0; i < h.size() && i < seen.size(); ++i) h[i].events = std::move(seen[i]);
  return h;
}

// --watch: a frame per round on stdout until Ctrl-C. Returns the last frame's exit code.
int RunWatch(const Durations& d, CollectOptions co, const DoctorOptions& dopt,
             EventsProbe& probe, bool probing, bool has_router) {
  const bool out_tty = isatty(STDOUT_FILENO) != 0;
  co.window_s = std::numeric_limits<double>::infinity();
  co.keep_s = d.window_s > 0 ? d.window_s : 1e-9;  // 0: only the newest scrape of each
  int last_exit = 2;
  co.on_round = [&](const std::vector<ReplicaHistory>& h) {
    Report r = DiagnoseHistories(probing ? WithEvents(probe, probing, h, true) : h, dopt,
                                 has_router);
    last_exit = r.ExitCode();
    const int width = TerminalWidth();
    std::string frame = out_tty ? "\033[H\033[2J" : "";
    char head[256];
    std::snprintf(
        head, sizeof head,
        "kvroute doctor --watch: %zu replicas, window %.0fs (have %.0fs), every %gs%s\n\n",
        r.replicas.size(), d.window_s, r.window_s, d.interval_s,
        out_tty ? "   Ctrl-C to stop" : "");
    frame += head;
    frame += WatchView(r, width);
    if (!out_tty) frame += "\n";
    std::fwrite(frame.data(), 1, frame.size(), stdout);
    std::fflush(stdout);
  };
  Collect(co);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  return last_exit;
}

// Progress on stderr while Collect runs (none with --quiet): a countdown line per round when
// stderr is a terminal, else one line saying what is scraped (and which events are heard).
void ShowProgress(const Options& opt, const Durations& d, bool err_tty, bool probing,
                  CollectOptions& co) {
  if (opt.quiet) return;
  if (err_tty) {
    co.on_round = [window_s = d.window_s, rounds = 0](
                      const std::vector<ReplicaHistory>& h) mutable {
      ++rounds;
      double t = 0;
      for (const ReplicaHistory& r : h) {
        if (!r.scrapes.empty()) t = std::max(t, r.scrapes.back().t_s);
      }
      std::fprintf(stderr,
                   "\r\033[Kkvroute doctor: %zu replicas, %d readable, round %d, %.0fs left",
                   h.size(), Readable(h), rounds, std::max(0.0, window_s - t));
      std::fflush(stderr);
    };
  } else {
    std::fprintf(stderr, "kvroute doctor: scraping %zu replicas for %gs every %gs\n",
                 co.targets.size(), d.window_s, d.interval_s);
    if (probing) {
      int n = 0;
      for (const Target& t : co.targets) n += t.kv_events.empty() ? 0 : 1;
      std::fprintf(stderr, "kvroute doctor: listening to %d replicas' KV-cache events\n", n);
    }
  }
}

// The report on stdout (text or --json), then --json-out and --scenario-out. `histories`:
// the replicas' alone. Returns the report's exit code, or 2 when a file was not written.
int WriteReport(const Options& opt, const Report& report,
                const std::vector<ReplicaHistory>& histories) {
  const std::string text = opt.json ? ReportJson(report) : ReportText(report);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
  std::fflush(stdout);

  if (!opt.json_out.empty() && !WriteFile(opt.json_out, ReportJson(report))) {
    std::fprintf(stderr, "kvroute doctor: --json-out %s: cannot write the file\n",
                 opt.json_out.c_str());
    return 2;
  }
  if (!opt.scenario_out.empty()) {
    std::string error;
    const std::string yaml = ScenarioYaml(report, histories, &error);
    if (yaml.empty()) {
      std::fprintf(stderr, "kvroute doctor: --scenario-out %s: %s\n", opt.scenario_out.c_str(),
                   error.empty() ? "nothing to write" : error.c_str());
      return 2;
    }
    if (!WriteFile(opt.scenario_out, yaml)) {
      std::fprintf(stderr, "kvroute doctor: --scenario-out %s: cannot write the file\n",
                   opt.scenario_out.c_str());
      return 2;
    }
    if (!opt.quiet) {
      std::fprintf(stderr, "kvroute doctor: wrote %s (kvroute simulate --scenario %s)\n",
                   opt.scenario_out.c_str(), opt.scenario_out.c_str());
    }
  }
  return report.ExitCode();
}

// One window: scrape (with progress), wait for the events' grace, diagnose, report.
int RunOnce(const Options& opt, const Durations& d, CollectOptions co,
            const DoctorOptions& dopt, EventsProbe& probe, bool probing, bool has_router) {
  const bool err_tty = isatty(STDERR_FILENO) != 0;
  ShowProgress(opt, d, err_tty, probing, co);
  std::vector<ReplicaHistory> histories = Collect(co);
  if (probing) {
    // Batches for the work the last round saw are on their way: a short grace, then stop.
    if (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(kEventGraceMs));
    probe.Stop();
    histories = WithEvents(probe, probing, std::move(histories), false);
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!opt.quiet && err_tty) std::fprintf(stderr, "\r\033[K");
  if (g_stop.load() && !opt.quiet)
    std::fprintf(stderr, "kvroute doctor: interrupted; diagnosing what was collected\n");

  Report report = DiagnoseHistories(histories, dopt, has_router);
  if (has_router) histories.pop_back();  // the scenario is the replicas' traffic
  return WriteReport(opt, report, histories);
}

// The command once its flags are parsed: check them, resolve the targets, start the event
// probe, then one window (RunOnce) or --watch (RunWatch). Returns the exit code.
int Run(const Options& opt) {
  Durations d;
  if (Status st = CheckFlags(opt, d); !st.ok()) return Usage(st.message());

  CollectOptions co;
  ConfigKvEvents kv;
  if (!opt.trace.empty() && !opt.fleet_file.empty()) {
    TraceRun tr{opt.trace, opt.trace_format, opt.block_size, opt.time_scale, opt.fleet_file, opt.policies,
                opt.quiet};
    return RunTraceCompare(tr, nullptr);
  }
  if (!ResolveTargets(opt, d, co.targets, kv)) return 2;
  const bool has_router = !opt.router_addr.empty();
  co.window_s = d.window_s;
  co.interval_s = d.interval_s;
  co.timeout_s = d.timeout_s;
  co.stop = &g_stop;

  DoctorOptions dopt;
  dopt.window_s = d.window_s;
  dopt.router_block_size = kv.block_size;

  // KV-cache events: subscribe before the first scrape (same clock as the scrapes), so a
  // replica's tokens and its batches cover the same window. A single scrape (--window 0)
  // has no window to compare, so nothing is probed then.
  const auto origin = std::chrono::steady_clock::now();
  co.origin = origin;
  EventsProbe probe(origin, co.targets.size());
  if (d.window_s > 0) {
    for (size_t i = 0; i < co.targets.size(); ++i) {
      const Target& t = co.targets[i];
      if (!t.kv_events.empty()) probe.Listen(i, t.name, t.kv_events);
    }
  }
  const bool probing = probe.any();
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);

  if (!opt.trace.empty()) {
    TraceRun tr{opt.trace, opt.trace_format, opt.block_size, opt.time_scale, opt.fleet_file, opt.policies,
                opt.quiet};
    return RunTraceCompare(tr, &co);
  }
  if (opt.watch) return RunWatch(d, std::move(co), dopt, probe, probing, has_router);
  return RunOnce(opt, d, std::move(co), dopt, probe, probing, has_router);
}

}  // namespace

int DoctorMain(int argc, char** argv) {
  CLI::App app{
      "Diagnose a live fleet of vLLM replicas the way the seed article did by hand: scrape\n"
      "every replica's /metrics for a window, read the prefix-cache hit rate, the spread of\n"
      "KV-cache usage and queues across replicas, preemptions and TTFT, and say whether\n"
      "routing (not hardware) caps throughput, naming the kvroute configuration that fixes\n"
      "each finding.",
      "kvroute doctor"};
  Options opt;
  AddFlags(app, opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Usage(e.what());
  }
  return Run(opt);
}

}  // namespace kvroute::doctor
