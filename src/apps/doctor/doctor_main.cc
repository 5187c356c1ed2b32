#include "apps/doctor/doctor_main.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>

#include "config/endpoints_file.h"
#include "config/router_config.h"
#include "config/yaml_reader.h"
#include "apps/doctor/diagnosis/doctor.h"
#include "apps/doctor/event_probe.h"
#include "adapters/k8s/kubeconfig.h"
#include "adapters/pool/kubernetes_discovery.h"
#include "adapters/pool/pool.h"

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

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

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

std::vector<Target> TargetsOf(const std::vector<config::EndpointConfig>& eps) {
  std::vector<Target> out;
  for (const config::EndpointConfig& e : eps) {
    out.push_back(Target{e.name.empty() ? e.address : e.name, e.host_port.host, e.host_port.port,
                         e.kv_events});
  }
  return out;
}

// The pods an InferencePool selects, listed once: the discovery delivers the set after
// its first pool list (possibly empty while the pods are still being listed), so a
// non-empty set ends the wait, an empty one waits on until the deadline. InvalidArgument
// when the cluster access cannot be loaded, DeadlineExceeded when the pool was not listed
// in time, Unavailable when discovery gives no endpoints (with its status when it has one).
Status KubernetesTargets(const config::KubernetesDiscoveryConfig& k, double timeout_s,
                         std::vector<Target>& out) {
  config::ConfigOr<k8s::ClusterAccess> access =
      k.kubeconfig_path.empty() ? k8s::LoadInCluster()
                                : k8s::LoadKubeconfig(k.kubeconfig_path, k.context);
  if (!access.ok()) {
    std::string why = access.error.ToString();
    return Status::InvalidArgument(
        k.kubeconfig_path.empty() ? "pool.discovery.kubernetes without a kubeconfig: " + why : why);
  }
  pool::KubernetesDiscoveryOptions o;
  o.pool_name = k.inference_pool;
  o.namespace_name = k.namespace_name.empty() ? access.value->namespace_name : k.namespace_name;
  if (o.namespace_name.empty()) o.namespace_name = "default";
  o.group = k.group;
  o.objectives = false;  // priorities do not matter to a diagnosis
  const std::string where = "InferencePool " + o.namespace_name + "/" + o.pool_name;

  boost::asio::io_context ctx;
  std::optional<std::vector<routing::EndpointSpec>> got;
  const pool::KubernetesDiscovery* self = nullptr;
  pool::KubernetesDiscovery::Callbacks cb;
  cb.on_endpoints = [&](std::vector<routing::EndpointSpec> eps) {
    // Pods found, or the pool itself is missing (a status says so): nothing to wait for.
    const bool done = !eps.empty() || (self != nullptr && !self->status().empty());
    got = std::move(eps);
    if (done) ctx.stop();
  };
  pool::KubernetesDiscovery discovery(ctx, std::move(*access.value), o, std::move(cb));
  self = &discovery;
  boost::asio::steady_timer deadline(ctx);
  deadline.expires_after(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  deadline.async_wait([&](boost::system::error_code ec) {
    if (!ec) ctx.stop();
  });
  discovery.Start();
  ctx.run();
  const std::string status = discovery.status();
  discovery.Stop();
  if (!got || got->empty()) {
    if (!status.empty()) return Status::Unavailable("kubernetes: " + status);
    if (got) return Status::Unavailable("kubernetes: " + where + " selects no ready pods");
    return Status::DeadlineExceeded("kubernetes: " + where + ": not listed within " +
                                    std::to_string(std::lround(timeout_s)) + "s");
  }
  for (const routing::EndpointSpec& e : *got) {
    out.push_back(Target{e.name, e.host, e.port, e.kv_events});
  }
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

}  // namespace

Status ParseEndpointList(std::string_view list, std::vector<Target>& out) {
  out.clear();
  std::size_t start = 0;
  int index = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    const std::string entry = Trim(list.substr(start, end - start));
    start = end + 1;
    ++index;
    if (entry.empty()) continue;  // "a,,b" and a trailing comma are harmless
    std::string error;
    std::optional<config::HostPort> hp = config::ParseHostPort(entry, &error);
    if (!hp) {
      return Status::InvalidArgument("--endpoints entry " + std::to_string(index) + " '" + entry +
                                     "': " + error);
    }
    out.push_back(Target{entry, hp->host, hp->port});
  }
  if (out.empty()) return Status::InvalidArgument("--endpoints: no HOST:PORT given");
  return Status::Ok();
}

void ApplyKvEventsPort(uint16_t port, std::vector<Target>& targets) {
  config::KvEventsConfig k;
  k.port = port;
  std::vector<routing::EndpointSpec> specs;
  for (const Target& t : targets) {
    routing::EndpointSpec e;
    e.host = t.host;
    e.port = t.port;
    e.kv_events = t.kv_events;
    specs.push_back(std::move(e));
  }
  pool::ApplyKvEvents(k, specs);
  for (size_t i = 0; i < targets.size(); ++i) targets[i].kv_events = specs[i].kv_events;
}

Status ApplyKvEventsList(std::string_view list, std::vector<Target>& targets) {
  std::vector<std::string> urls;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    urls.push_back(Trim(list.substr(start, end - start)));
    start = end + 1;
  }
  if (urls.size() != targets.size()) {
    return Status::InvalidArgument("--kv-events: " + std::to_string(urls.size()) +
                                   " entries for " + std::to_string(targets.size()) +
                                   " --endpoints (one each, in order; an empty entry for none)");
  }
  for (std::size_t i = 0; i < urls.size(); ++i) {
    if (urls[i].empty()) continue;
    if (Status st = config::CheckKvEventsUrl(urls[i], false); !st.ok()) {
      return Status::InvalidArgument("--kv-events entry " + std::to_string(i + 1) + " '" +
                                     urls[i] + "': " + st.message());
    }
    targets[i].kv_events = urls[i];
  }
  return Status::Ok();
}

namespace {

// The router's own derivation of each endpoint's events address (pool::ApplyKvEvents),
// except the centralized bind: doctor cannot subscribe to the replicas there.
Status WithKvEvents(const config::KvEventsConfig& k, Status st, std::vector<Target>& out,
                    ConfigKvEvents* kv) {
  if (!st.ok()) return st;
  if (k.bind.empty() && k.port != 0) ApplyKvEventsPort(k.port, out);
  if (kv != nullptr) {
    kv->bind = k.bind;
    const bool any = !k.bind.empty() || std::any_of(out.begin(), out.end(), [](const Target& t) {
      return !t.kv_events.empty();
    });
    kv->block_size = any ? k.block_size : 0;
  }
  return st;
}

}  // namespace

Status TargetsFromConfig(const std::string& path, double discovery_timeout_s,
                         std::vector<Target>& out, ConfigKvEvents* kv) {
  out.clear();
  config::ConfigOr<config::RouterConfig> loaded = config::LoadRouterConfig(path);
  if (!loaded.ok()) return loaded.status();
  const config::PoolConfig& pool = loaded.value->pool;
  const config::KvEventsConfig& k = pool.kv_events;
  if (pool.kubernetes.enabled()) {
    return WithKvEvents(k, KubernetesTargets(pool.kubernetes, discovery_timeout_s, out), out, kv);
  }
  if (!pool.endpoints_file_path.empty()) {
    config::ConfigOr<std::string> text = config::ReadConfigFile(pool.endpoints_file_path);
    if (!text.ok()) return text.status();
    config::ConfigOr<std::vector<config::EndpointConfig>> eps =
        config::ParseEndpointsFile(*text.value, pool.endpoints_file_path);
    if (!eps.ok()) return eps.status();
    out = TargetsOf(*eps.value);
    if (out.empty()) {
      return Status::InvalidArgument(pool.endpoints_file_path +
                                     ": the endpoints file lists no endpoints");
    }
    return WithKvEvents(k, Status::Ok(), out, kv);
  }
  out = TargetsOf(pool.endpoints);
  if (out.empty()) {
    return Status::InvalidArgument(path + ": pool.endpoints: the configuration lists no endpoints");
  }
  return WithKvEvents(k, Status::Ok(), out, kv);
}

int DoctorMain(int argc, char** argv) {
  CLI::App app{
      "Diagnose a live fleet of vLLM replicas the way the seed article did by hand: scrape\n"
      "every replica's /metrics for a window, read the prefix-cache hit rate, the spread of\n"
      "KV-cache usage and queues across replicas, preemptions and TTFT, and say whether\n"
      "routing (not hardware) caps throughput, naming the kvroute configuration that fixes\n"
      "each finding.",
      "kvroute doctor"};
  std::string endpoints, config_path, window_text = "30s", interval_text = "2s",
                                      timeout_text = "2s";
  std::string scenario_out, json_out;
  bool json = false, watch = false, quiet = false;
  int kv_events_port = 0;
  std::string kv_events_list, router_addr;
  app.add_option("--endpoints,-e", endpoints, "Replicas to diagnose: HOST:PORT,HOST:PORT,...");
  app.add_option("--config,-c", config_path,
                 "A serve/epp configuration whose pool to diagnose (endpoints, endpoints_file, "
                 "Kubernetes discovery)");
  app.add_option("--window,-w", window_text,
                 "How long to scrape; counters and histograms are rates over it (0: one scrape)")
      ->capture_default_str();
  app.add_option("--interval,-i", interval_text, "Between scrape rounds (and --watch refreshes)")
      ->capture_default_str();
  app.add_option("--timeout", timeout_text,
                 "Per scrape: connect + complete response (a Kubernetes listing waits 5x this, at "
                 "least 10s)")
      ->capture_default_str();
  app.add_flag("--json", json,
               "Print the report as JSON (schema kvroute-doctor/1, docs/DOCTOR.md)");
  app.add_option("--json-out", json_out,
                 "Also write the JSON report to FILE (stdout keeps the text; for scripts)");
  app.add_flag("--watch", watch,
               "Live view refreshed every --interval over the last --window, until Ctrl-C");
  app.add_option("--scenario-out", scenario_out,
                 "Also write a `kvroute simulate` scenario of the observed traffic to FILE");
  app.add_option("--kv-events-port", kv_events_port,
                 "With --endpoints: every replica publishes KV-cache events on tcp://<its "
                 "host>:PORT (the same port on every replica, as in Kubernetes); doctor listens "
                 "while it scrapes")
      ->check(CLI::Range(1, 65535));
  app.add_option("--kv-events", kv_events_list,
                 "With --endpoints: each replica's KV-cache event publisher, in the same order: "
                 "tcp://HOST:PORT,... (an empty entry: none)");
  app.add_option("--router", router_addr,
                 "Also scrape a kvroute router's /metrics (serve's listen address, epp's metrics "
                 "address) for its latency model's errors and the requests' objectives met");
  app.add_flag("--quiet,-q", quiet, "No progress on stderr");
  app.footer(std::string(kFooter) + "\n" + RulesText());
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Usage(e.what());
  }

  double window_s = 0, interval_s = 0, timeout_s = 0;
  for (const Status& st : {FlagDuration("--window", window_text, true, window_s),
                           FlagDuration("--interval", interval_text, false, interval_s),
                           FlagDuration("--timeout", timeout_text, false, timeout_s)}) {
    if (!st.ok()) return Usage(st.message());
  }
  if (endpoints.empty() == config_path.empty()) {
    return Usage(endpoints.empty() ? "give the replicas: --endpoints HOST:PORT,... or --config FILE"
                                   : "--endpoints and --config: give one of them, not both");
  }
  if (watch && json) return Usage("--watch and --json: pick one (--json prints one report)");
  if (watch && (!scenario_out.empty() || !json_out.empty())) {
    return Usage("--watch writes no files: drop --scenario-out / --json-out");
  }

  if ((kv_events_port != 0 || !kv_events_list.empty()) && endpoints.empty()) {
    return Usage(std::string(kv_events_port != 0 ? "--kv-events-port" : "--kv-events") +
                 " goes with --endpoints (a config names its events itself: kv_events, "
                 "pool.kv_events.port)");
  }
  if (kv_events_port != 0 && !kv_events_list.empty()) {
    return Usage("--kv-events and --kv-events-port: give one of them, not both");
  }

  CollectOptions co;
  ConfigKvEvents kv;
  if (!endpoints.empty()) {
    if (Status st = ParseEndpointList(endpoints, co.targets); !st.ok()) {
      return Usage(st.message());
    }
    if (kv_events_port != 0) ApplyKvEventsPort(static_cast<uint16_t>(kv_events_port), co.targets);
    if (!kv_events_list.empty()) {
      if (Status st = ApplyKvEventsList(kv_events_list, co.targets); !st.ok()) {
        return Usage(st.message());
      }
    }
  } else if (Status st = TargetsFromConfig(config_path, std::max(10.0, 5 * timeout_s),
                                           co.targets, &kv);
             !st.ok()) {
    std::fprintf(stderr, "kvroute doctor: %s\n", st.message().c_str());
    return 2;
  }
  if (!kv.bind.empty() && !quiet) {
    std::fprintf(stderr,
                 "kvroute doctor: pool.kv_events.bind (%s): the replicas connect to the router, "
                 "so their KV events are not probed\n",
                 kv.bind.c_str());
  }
  // The router, scraped with the replicas as one more target (the last), diagnosed apart.
  const bool has_router = !router_addr.empty();
  if (has_router) {
    std::vector<Target> r;
    if (Status st = ParseEndpointList(router_addr, r); !st.ok() || r.size() != 1) {
      return Usage("--router: " + (st.ok() ? std::string("give one HOST:PORT") : st.message()));
    }
    co.targets.push_back(r.front());
  }
  // Histories to (replicas, the router's).
  auto split = [has_router](std::vector<ReplicaHistory> h) {
    std::optional<ReplicaHistory> router;
    if (has_router && !h.empty()) {
      router = std::move(h.back());
      h.pop_back();
    }
    return std::make_pair(std::move(h), std::move(router));
  };
  auto diagnose = [&](std::vector<ReplicaHistory> h, const DoctorOptions& d) {
    auto [replicas, router] = split(std::move(h));
    return Diagnose(replicas, d, router ? &*router : nullptr);
  };
  co.window_s = window_s;
  co.interval_s = interval_s;
  co.timeout_s = timeout_s;
  co.stop = &g_stop;

  DoctorOptions dopt;
  dopt.window_s = window_s;
  dopt.router_block_size = kv.block_size;

  // KV-cache events: subscribe before the first scrape (same clock as the scrapes), so a
  // replica's tokens and its batches cover the same window. A single scrape (--window 0)
  // has no window to compare, so nothing is probed then.
  const auto origin = std::chrono::steady_clock::now();
  co.origin = origin;
  EventsProbe probe(origin, co.targets.size());
  if (window_s > 0) {
    for (size_t i = 0; i < co.targets.size(); ++i) {
      const Target& t = co.targets[i];
      if (!t.kv_events.empty()) probe.Listen(i, t.name, t.kv_events);
    }
  }
  const bool probing = probe.any();
  // The probe's snapshot into histories: batches from the oldest kept scrape on.
  auto with_events = [&probe, probing](std::vector<ReplicaHistory> h, bool trim) {
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
  };
  const bool err_tty = isatty(STDERR_FILENO) != 0;
  const bool out_tty = isatty(STDOUT_FILENO) != 0;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);

  if (watch) {
    co.window_s = std::numeric_limits<double>::infinity();
    co.keep_s = window_s > 0 ? window_s : 1e-9;  // 0: only the newest scrape of each
    int last_exit = 2;
    co.on_round = [&](const std::vector<ReplicaHistory>& h) {
      Report r = diagnose(probing ? with_events(h, true) : h, dopt);
      last_exit = r.ExitCode();
      const int width = TerminalWidth();
      std::string frame = out_tty ? "\033[H\033[2J" : "";
      char head[256];
      std::snprintf(
          head, sizeof head,
          "kvroute doctor --watch: %zu replicas, window %.0fs (have %.0fs), every %gs%s\n\n",
          r.replicas.size(), window_s, r.window_s, interval_s,
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

  if (!quiet) {
    if (err_tty) {
      co.on_round = [&, rounds = 0](const std::vector<ReplicaHistory>& h) mutable {
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
                   co.targets.size(), window_s, interval_s);
      if (probing) {
        int n = 0;
        for (const Target& t : co.targets) n += t.kv_events.empty() ? 0 : 1;
        std::fprintf(stderr, "kvroute doctor: listening to %d replicas' KV-cache events\n", n);
      }
    }
  }
  std::vector<ReplicaHistory> histories = Collect(co);
  if (probing) {
    // Batches for the work the last round saw are on their way: a short grace, then stop.
    if (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(kEventGraceMs));
    probe.Stop();
    histories = with_events(std::move(histories), false);
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!quiet && err_tty) std::fprintf(stderr, "\r\033[K");
  if (g_stop.load() && !quiet)
    std::fprintf(stderr, "kvroute doctor: interrupted; diagnosing what was collected\n");

  Report report = diagnose(histories, dopt);
  if (has_router) histories.pop_back();  // the scenario is the replicas' traffic
  const std::string text = json ? ReportJson(report) : ReportText(report);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
  std::fflush(stdout);

  if (!json_out.empty() && !WriteFile(json_out, ReportJson(report))) {
    std::fprintf(stderr, "kvroute doctor: --json-out %s: cannot write the file\n",
                 json_out.c_str());
    return 2;
  }
  if (!scenario_out.empty()) {
    std::string error;
    const std::string yaml = ScenarioYaml(report, histories, &error);
    if (yaml.empty()) {
      std::fprintf(stderr, "kvroute doctor: --scenario-out %s: %s\n", scenario_out.c_str(),
                   error.empty() ? "nothing to write" : error.c_str());
      return 2;
    }
    if (!WriteFile(scenario_out, yaml)) {
      std::fprintf(stderr, "kvroute doctor: --scenario-out %s: cannot write the file\n",
                   scenario_out.c_str());
      return 2;
    }
    if (!quiet) {
      std::fprintf(stderr, "kvroute doctor: wrote %s (kvroute simulate --scenario %s)\n",
                   scenario_out.c_str(), scenario_out.c_str());
    }
  }
  return report.ExitCode();
}

}  // namespace kvroute::doctor
