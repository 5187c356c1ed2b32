#include "apps/epp/epp_main.h"

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>

#include "config/router_config.h"
#include "apps/epp/epp.h"
#include "config/yaml_reader.h"
#include "adapters/tls/pki.h"

namespace kvroute::epp {

namespace {

constexpr const char* kHelpFooter = R"(The configuration file is the one `kvroute serve` reads (see kvroute serve --help).
Keys the picker reads:
  pool.*                        endpoints, endpoints_file, discovery.kubernetes, engine_type,
                                model, metric_names, scrape_interval, staleness,
                                stale_policy: the pool, scraped as by serve
  scheduling (or top-level policy / plugins / schedulingProfiles / schedulingProfile)
  limits.max_body_bytes: 16MiB  a larger request body -> immediate 413
  timeouts.connect: 2s          scrape connections
  outlier_detection.*, retries.budget_*   routing-core options, as for serve
  epp:
    body_mode: full_duplex_streamed   # full_duplex_streamed | streamed | buffered: the
                                      #   request body mode assumed when Envoy sends no
                                      #   protocol_config (Envoy's own setting wins)
    fallbacks: 2                # endpoints after the winner in the header (0..7)
    stream_timeout: 60s         # an ext_proc stream open longer is ended
                                #   (DEADLINE_EXCEEDED; its request is finished)
    objectives:                 # x-gateway-inference-objective /
      batch: -1                 #   x-llm-d-inference-objective name -> priority; unknown
                                #   or absent: 0. Below 0 is sheddable: 429 while every
                                #   ready endpoint is saturated (waiting >= 5 or KV >= 0.8)
      chat: {priority: 0, slo: {ttft: 500ms, tpot: 40ms}}
                                # an objective's own latency objectives: for its requests
                                #   without x-llm-d-slo-* (or x-slo-*) headers (before
                                #   scheduling.slo: {ttft: 2s, tpot: 50ms}, as for serve)
                                # scheduling.pd (prefill/decode pairs) as for serve
  flow:                         # flow control, as for serve (off by default; read at start):
    enabled: true               #   a stream reaching its pick while every ready endpoint
                                #   is saturated waits, its answer held back, and is picked
                                #   when capacity frees (a request finished, a scrape)
    max_requests, max_bytes, ttl, no_endpoint_ttl, fairness, ordering, flow_header,
    affinity_window, max_affinity_skips, sheddable_reserve, slo_aware, slo_admit_fraction,
    slo_release_fraction
                                # as in kvroute serve --help; shed, over a bound or past
                                #   ttl: immediate 429 with retry-after; no_endpoint_ttl: 503
  locality:                     # several regions, as for serve (docs/REGIONS.md):
    region: us-east             #   the picker's region (--region overrides; "" = off); picks
                                #   stay there until every local endpoint is saturated
    rtt: {eu-west: 80ms}        # round trip per remote region; wins over measured
    measure_rtt: true           # smoothed scrape round trips per region (EWMA 0.2)
  sessions:                     # session affinity, as for serve (docs/POLICIES.md
    enabled, ttl, max_sessions, #   "Sessions"): the request's x-session-id (header) and
    header, token_header        #   x-session-token (token_header) go to the pick; the
                                #   response headers get token_header: base64 of the served
                                #   endpoint's ip:port (needs response_header_mode SEND)
Keys only `kvroute serve` honours are refused (file, line and key): %SERVE_ONLY%

ext_proc (envoy.service.ext_proc.v3.ExternalProcessor/Process), one stream per request:
  request headers (:path, content-type, x-request-id, x-gateway-inference-objective /
  x-llm-d-inference-objective, x-gateway-model-name), then the body; the OpenAI body is
  parsed as serve parses it (/v1/completions, /v1/chat/completions; other paths are
  routed on the model alone). The pick: header x-gateway-destination-endpoint = winner
  then fallbacks ("ip:port,ip:port,..."), the same value in dynamic metadata
  envoy.lb / x-gateway-destination-endpoint, clear_route_cache. FULL_DUPLEX_STREAMED:
  answered after the body's end (headers response with Content-Length, then the body
  re-emitted in chunks of at most 62,000 bytes); BUFFERED and STREAMED: headers answered
  at once, the pick in the last body chunk's response. Subset hint: filter metadata
  envoy.lb / x-gateway-destination-endpoint-subset. Served endpoint read back from
  x-gateway-destination-endpoint-served. Prefill/decode: with endpoints labelled
  llm-d.ai/role: prefill (pod label or config), the destination is a decode endpoint and
  a long, uncached prompt also gets x-prefiller-host-port: ip:port of a prefill endpoint
  (scheduling.pd; the decode pod's sidecar runs the prefill leg); a client's
  x-prefiller-host-port is removed. Errors are immediate responses with an
  OpenAI-shaped JSON body: 400 bad body, 413 too large, 429 shed (or refused by flow
control, with retry-after), 503 no endpoint.
Kubernetes discovery (--pool-name, or pool.discovery.kubernetes in the file): the
InferencePool (inference.networking.k8s.io/v1 or the x-k8s.io v1alpha2 form) is listed
and watched; every Ready pod it selects that is not being deleted is an endpoint per
target port (labels = the pod's labels); changes apply without a restart. Its
InferenceObjectives (llm-d.ai/v1alpha2, and the older inference.networking.x-k8s.io)
set the priority of requests naming them, over the epp.objectives table. Credentials:
--kubeconfig, else the in-cluster service account. RBAC: get, list, watch on pods,
inferencepools and inferenceobjectives. No pool: no endpoints, readiness NOT_SERVING,
watched until it exists. kvroute_k8s_* on /metrics; each API failure is one log line.
gRPC health (grpc.health.v1) on the health port: liveness, readiness (SERVING once an
endpoint has fresh metrics), envoy.service.ext_proc.v3.ExternalProcessor (as readiness).
Metrics port: GET /metrics (kvroute_* series plus llm-d Router v1.0's names, each beside
its older twin where the reference picker has one: llm_d_epp_request_total
(inference_objective_request_total), llm_d_epp_request_error_total (..._request_error_total),
the llm_d_epp_request_* series by {model_name, target_model_name, fairness_id, priority}
(fairness_id: the flow header's value, else x-llm-d-inference-fairness-id, else
default-flow; at most 32 per model, the rest as "other"; the older twins keep
{model_name, target_model_name}),
llm_d_epp_average_kv_cache_utilization, llm_d_epp_average_queue_size (inference_pool_*),
llm_d_epp_average_running_requests, llm_d_epp_std_dev_kv_cache_utilization,
llm_d_epp_std_dev_queue_size, llm_d_epp_ready_endpoints (inference_pool_ready_pods),
llm_d_epp_per_endpoint_queue_size (inference_pool_per_pod_queue_size),
llm_d_epp_scheduler_e2e_duration_seconds (inference_extension_scheduler_e2e_duration_seconds),
llm_d_epp_scheduler_attempts_total{status}, llm_d_epp_plugin_duration_seconds
{extension_point (Filter, Scorer, Picker), plugin_type, plugin_name}
(inference_extension_plugin_duration_seconds), llm_d_epp_request_duration_seconds,
llm_d_epp_request_ttft_seconds, llm_d_epp_request_ntpot_seconds (response bodies sent),
llm_d_epp_request_input_tokens, _output_tokens, _cached_tokens, llm_d_epp_request_running,
llm_d_epp_flow_control_pool_saturation, and with flow control llm_d_epp_flow_control_queue_size,
_request_queue_duration_seconds, _requests_total{outcome,priority};
llm_d_epp_request_predicted_ttft_seconds, llm_d_epp_request_predicted_tpot_seconds,
llm_d_epp_request_slo_violation_total; inference_objective_input_tokens_total,
inference_objective_output_tokens_total; kvroute_locality_picks_total{decision},
kvroute_locality_spill_ratio, kvroute_locality_requests_total{region},
kvroute_locality_rtt_seconds{region,source}), GET /healthz, GET /readyz.
TLS (as the reference picker): ext_proc is served over TLS unless --secure-serving=false.
Without --cert-path a self-signed certificate (CN kvroute-epp; localhost, 127.0.0.1, ::1,
the host name) is made at start; gateways do not verify it; --self-signed-cert-out FILE
writes it for a client that does. --cert-path DIR serves DIR/tls.crt and DIR/tls.key; with
--enable-cert-reload DIR is polled every --cert-reload-interval and a changed pair that
loads and matches is served to new connections (within a second more); one that does not
is rejected with one log line and the running pair kept. kvroute_tls_cert_reloads_total
{result="applied"|"rejected"} and kvroute_tls_cert_expiry_timestamp_seconds (notAfter)
on /metrics. A connection without a finished handshake after --handshake-timeout is
closed. The health and metrics ports are plaintext (kubelet probes).
On start one line goes to stderr:
  kvroute epp: ext_proc on HOST:PORT (TRANSPORT), health on HOST:PORT, metrics on HOST:PORT
  TRANSPORT: plaintext | tls, self-signed, sha256 FINGERPRINT | tls, DIR[, reloaded], sha256 FINGERPRINT
Headers read: x-llm-d-inference-objective (x-gateway-inference-objective), the flow's
x-llm-d-inference-fairness-id (x-gateway-inference-fairness-id) unless flow.flow_header is
set, x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms (x-slo-*), x-session-id and x-session-token
(sessions.header, sessions.token_header), x-llm-d-model-name-rewrite (the request is
scheduled and sent as that model: the body's "model" replaced in the buffered and full-duplex
body modes; in streamed mode the body goes as it came; the header is removed). Refusals
carry x-llm-d-request-dropped-reason: rejected-saturated, rejected-no-endpoints,
rejected-ttl-expired, rejected-shutting-down (a request held in the flow queue when the
picker stops; a request whose client left while queued gets no answer: its stream is gone,
counted as cancelled in llm_d_epp_flow_control_requests_total).
SIGHUP reloads the file (a bad one is rejected with file:line; the running configuration
stays); SIGINT and SIGTERM stop it.)";

std::string HostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

// What `kvroute epp`'s command line sets: the picker's options (EppOptions, bound to their
// flags directly) and the flag values checked or converted after parsing (FinishFlags).
struct EppMainOptions {
  std::string config_path;
  EppOptions options;
  int grpc_port = 9002, health_port = 9003, metrics_port = 9090;
  bool check = false;
  std::string region;
  bool region_given = false;  // --region was on the command line (set after parsing)
  std::string reload_interval = "5s", handshake_timeout = "10s", cert_out;
};

// Registers every flag of `kvroute epp` on `app`, bound to `o`.
void AddFlags(CLI::App& app, EppMainOptions& o) {
  app.add_option("--config,-c", o.config_path,
                 "Configuration file (YAML, as for kvroute serve); optional with --pool-name "
                 "(defaults: the kvroute policy)")
      ->check(CLI::ExistingFile);
  config::KubernetesDiscoveryConfig& k8s = o.options.kubernetes;
  k8s.group.clear();  // only a given flag overrides the file
  app.add_option("--pool-name", k8s.inference_pool,
                 "InferencePool to follow (Kubernetes discovery; overrides "
                 "pool.discovery.kubernetes.inference_pool)");
  app.add_option("--pool-namespace", k8s.namespace_name,
                 "Its namespace (default: the kubeconfig context's, in a cluster the service account's)");
  app.add_option("--pool-group", k8s.group,
                 "Its API group: inference.networking.k8s.io (v1, default) or "
                 "inference.networking.x-k8s.io (v1alpha2)")
      ->check(CLI::IsMember({std::string(config::kPoolGroupV1), std::string(config::kPoolGroupV1Alpha2)}));
  app.add_option("--kubeconfig", k8s.kubeconfig,
                 "kubeconfig file (default: the in-cluster service account)")
      ->check(CLI::ExistingFile);
  app.add_option("--grpc-port", o.grpc_port, "ext_proc gRPC port (0 = any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--grpc-health-port", o.health_port, "gRPC health port (0 = any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--metrics-port", o.metrics_port, "Prometheus /metrics HTTP port (0 = any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--host", o.options.host, "Address every port binds to")->capture_default_str();
  app.add_option("--region", o.region,
                 "The picker's region (overrides locality.region; \"\" = locality off)");
  EppTlsOptions& tls = o.options.tls;
  tls.secure_serving = true;
  app.add_flag("--secure-serving", tls.secure_serving,
               "TLS on the ext_proc port (default true; --secure-serving=false: plaintext h2c). The "
               "health and metrics ports stay plaintext");
  app.add_option("--cert-path", tls.cert_path,
                 "Directory holding tls.crt and tls.key to serve (default: a self-signed "
                 "certificate made at start)");
  app.add_flag("--enable-cert-reload", tls.enable_cert_reload,
               "Watch --cert-path and serve a changed pair to new connections (a pair that does "
               "not load is rejected, the old one kept, with one log line)");
  app.add_option("--cert-reload-interval", o.reload_interval,
                 "How often --enable-cert-reload looks at the files")
      ->capture_default_str();
  app.add_option("--handshake-timeout", o.handshake_timeout,
                 "A connection to the ext_proc port that has not completed its TLS handshake "
                 "(and HTTP/2 preface) within this time is closed")
      ->capture_default_str();
  app.add_option("--self-signed-cert-out", o.cert_out,
                 "Write the self-signed certificate (PEM) to this file at start, for a client "
                 "that verifies it");
  app.add_flag("--check", o.check, "Validate the configuration file and exit (0 when valid)");
}

// The help footer: kHelpFooter with the keys only serve honours filled in. The refused
// keys come from the one list the config loader checks.
std::string HelpFooter() {
  std::string footer = kHelpFooter;
  std::string serve_only;
  for (std::string_view k : config::kServeOnlyKeys) {
    serve_only += serve_only.empty() ? "" : ", ";
    serve_only += k;
  }
  footer.replace(footer.find("%SERVE_ONLY%"), 12, serve_only);
  return footer;
}

// Checks the flags against each other and converts the ones that are more than a value
// (region, durations) into `o.options`. Returns false, with the reason on stderr, when
// they do not go together (exit code 2); a combination that only does nothing is warned
// about.
bool FinishFlags(EppMainOptions& o) {
  config::KubernetesDiscoveryConfig& k8s = o.options.kubernetes;
  EppTlsOptions& tls = o.options.tls;
  const bool flags_k8s = !k8s.inference_pool.empty();
  if (!flags_k8s && (!k8s.namespace_name.empty() || !k8s.group.empty() || !k8s.kubeconfig.empty())) {
    std::fprintf(stderr, "kvroute epp: --pool-namespace, --pool-group and --kubeconfig need --pool-name\n");
    return false;
  }
  if (o.config_path.empty() && !flags_k8s) {
    std::fprintf(stderr, "kvroute epp: give --config FILE or --pool-name NAME (see --help)\n");
    return false;
  }
  k8s.kubeconfig_path = k8s.kubeconfig;
  if (o.region_given) {
    if (Status st = config::CheckRegionName(o.region); !st.ok()) {
      std::fprintf(stderr, "kvroute epp: --region: %s\n", st.message().c_str());
      return false;
    }
    o.options.region = o.region;
  }
  for (auto [flag, text, out] : {std::tuple{"--cert-reload-interval", &o.reload_interval, &tls.reload_interval_s},
                                 std::tuple{"--handshake-timeout", &o.handshake_timeout, &tls.handshake_timeout_s}}) {
    std::optional<double> d = config::ParseDuration(*text);
    if (!d) {
      std::fprintf(stderr, "kvroute epp: %s: not a duration: '%s' (e.g. 10s, 500ms)\n", flag, text->c_str());
      return false;
    }
    *out = *d;
  }
  if (!tls.secure_serving && (!tls.cert_path.empty() || tls.enable_cert_reload || !o.cert_out.empty())) {
    std::fprintf(stderr,
                 "kvroute epp: --cert-path, --enable-cert-reload and --self-signed-cert-out need "
                 "--secure-serving (on by default)\n");
    return false;
  }
  if (tls.enable_cert_reload && tls.cert_path.empty() && tls.secure_serving) {
    std::fprintf(stderr, "kvroute epp: --enable-cert-reload without --cert-path: the self-signed certificate is not reloaded\n");
  }
  if (!o.cert_out.empty() && !tls.cert_path.empty()) {
    std::fprintf(stderr, "kvroute epp: --self-signed-cert-out writes the generated certificate: not with --cert-path\n");
    return false;
  }
  return true;
}

// The configuration to start with: the file (the epp reader: serve-only keys refused),
// or the defaults without one, with the command line's Kubernetes discovery applied.
// Nullopt, with the reason on stderr, when either fails.
std::optional<config::RouterConfig> LoadConfig(const EppMainOptions& o) {
  config::ConfigOr<config::RouterConfig> loaded;
  if (o.config_path.empty()) {
    loaded.value.emplace();  // the defaults
  } else {
    loaded = config::LoadRouterConfig(o.config_path, config::ConfigReader::kEpp);
    if (!loaded.ok()) {
      std::fprintf(stderr, "kvroute epp: %s\n", loaded.error.ToString().c_str());
      return std::nullopt;
    }
  }
  if (Status st = ApplyKubernetesFlags(o.options.kubernetes, *loaded.value); !st.ok()) {
    std::fprintf(stderr, "kvroute epp: %s\n", st.message().c_str());
    return std::nullopt;
  }
  return std::move(*loaded.value);
}

// --check's answer for a configuration that loaded.
void PrintCheck(const EppMainOptions& o, const config::RouterConfig& config) {
  const config::PoolConfig& p = config.pool;
  if (p.kubernetes.enabled()) {
    std::printf("%s: ok (Kubernetes discovery: InferencePool %s%s%s, group %s)\n",
                o.config_path.empty() ? "flags" : o.config_path.c_str(),
                p.kubernetes.namespace_name.c_str(), p.kubernetes.namespace_name.empty() ? "" : "/",
                p.kubernetes.inference_pool.c_str(), p.kubernetes.group.c_str());
  } else {
    std::printf("%s: ok (%zu endpoints)\n", o.config_path.c_str(), p.endpoints.size());
  }
}

// The ext_proc port's transport for the start line ("plaintext", "tls, self-signed,
// sha256 ..." or "tls, DIR[, reloaded], sha256 ..."); writes the self-signed certificate
// to --self-signed-cert-out when given. Nullopt, with the reason on stderr, when that
// file cannot be written.
std::optional<std::string> DescribeTransport(const EppMainOptions& o, Epp& epp) {
  const EppTlsOptions& tls = o.options.tls;
  std::string how = "plaintext";
  if (tls.secure_serving) {
    const std::string pem = epp.serving_cert_pem();
    Result<tls::CertificateInfo> info = tls::DescribeCertificate(pem);
    const std::string fp = info.ok() ? info->sha256_fingerprint : std::string("?");
    if (tls.cert_path.empty()) {
      how = "tls, self-signed, sha256 " + fp;
      if (!o.cert_out.empty()) {
        std::FILE* f = std::fopen(o.cert_out.c_str(), "w");
        const bool ok = f && std::fwrite(pem.data(), 1, pem.size(), f) == pem.size();
        if (f) std::fclose(f);
        if (!ok) {
          std::fprintf(stderr, "kvroute epp: --self-signed-cert-out: cannot write %s\n", o.cert_out.c_str());
          return std::nullopt;
        }
      }
    } else {
      how = "tls, " + tls.cert_path + (tls.enable_cert_reload ? ", reloaded" : "") + ", sha256 " + fp;
    }
  }
  return how;
}

// Loads the configuration and answers --check, or runs the picker until SIGINT or
// SIGTERM. Returns the exit code.
int Run(const EppMainOptions& o) {
  std::optional<config::RouterConfig> config = LoadConfig(o);
  if (!config) return 2;
  if (o.check) {
    PrintCheck(o, *config);
    return 0;
  }
  EppOptions options = o.options;
  options.config_path = o.config_path;
  options.grpc_port = static_cast<uint16_t>(o.grpc_port);
  options.health_port = static_cast<uint16_t>(o.health_port);
  options.metrics_port = static_cast<uint16_t>(o.metrics_port);
  options.handle_signals = true;

  // As for serve: long prompts are gathered into one buffer per stream; keep such blocks
  // on the heap rather than mmap'ing each anew.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);

  Epp epp(std::move(*config), options);
  if (Status st = epp.Start(); !st.ok()) {
    std::fprintf(stderr, "kvroute epp: %s\n", st.message().c_str());
    epp.Stop();
    return 1;
  }
  std::optional<std::string> how = DescribeTransport(o, epp);
  if (!how) {
    epp.Stop();
    return 1;
  }
  std::fprintf(stderr, "kvroute epp: ext_proc on %s (%s), health on %s, metrics on %s\n",
               HostPort(options.host, epp.grpc_port()).c_str(), how->c_str(),
               HostPort(options.host, epp.health_port()).c_str(),
               HostPort(options.host, epp.metrics_port()).c_str());
  epp.WaitForShutdown();
  epp.Stop();
  return 0;
}

}  // namespace

int EppMain(int argc, char** argv) {
  CLI::App app{"The endpoint picker for Envoy-based gateways (Gateway API Inference Extension): an\n"
               "ext_proc gRPC server that picks the endpoint for each request over the same\n"
               "routing core and configuration file as `kvroute serve`.",
               "kvroute epp"};
  EppMainOptions opts;
  AddFlags(app, opts);
  app.footer(HelpFooter());
  CLI11_PARSE(app, argc, argv);
  opts.region_given = app.count("--region") > 0;
  if (!FinishFlags(opts)) return 2;
  return Run(opts);
}

}  // namespace kvroute::epp
