#include "apps/serve/serve_main.h"

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <string_view>

#include "config/endpoints_file.h"
#include "config/router_config.h"
#include "core/metrics/engine_metrics.h"
#include "adapters/pool/endpoints_watch.h"
#include "apps/serve/api_key_auth.h"
#include "adapters/pool/pool.h"
#include "adapters/certs/listener_certs.h"
#include "apps/serve/router.h"

namespace kvroute::router {

namespace {

constexpr const char* kFileFormat = R"(Configuration file (YAML; every key optional, unknown keys are errors):

  listen: 0.0.0.0:8080          # host:port ([v6]:port accepted); --listen overrides;
                                #   "off": HTTPS only (needs listen_tls)
  listen_tls:                   # HTTPS listener, beside listen or instead of it:
    address: 0.0.0.0:8443       #   read at start
    cert: tls.crt               # PEM certificate chain and key; relative paths against
    key: tls.key                #   this file's directory. Watched (stat every poll, and
    poll: 1s                    #   SIGHUP): a changed pair serves new connections; one
                                #   that does not load keeps the last good (logged once)
  upstream_tls:                 # for https://HOST:PORT endpoints (proxy, scrape, tokenize)
    ca: ca.pem                  # trusted CAs; default: the system's store
    cert: client.crt            # client certificate and key, for replicas requiring one
    key: client.key
    verify: true                # false: accept any certificate (still encrypted)
  threads: 0                    # worker threads, 0 = one per core; --threads overrides
  pool:
    engine_type: vllm           # vllm | sglang: default metric names
    model: ""                   # only read metric series of this model_name
    metric_names: {waiting: "my:queue"}   # per-field overrides of the metric names
                                #   ("" = not exported), by key:
%METRIC_NAME_KEYS%
    scrape_interval: 50ms       # durations: "250us", "50ms", "2s", "1m", or seconds
    staleness: 2s               # metrics older than this are stale (>= scrape_interval)
    stale_policy: exclude       # exclude | saturated: what a stale endpoint counts as
    endpoints:
      - address: 127.0.0.1:18001
        name: a                 # defaults to the address; unique
        labels: {region: eu}
      - 127.0.0.1:18002         # shorthand: just the address
      - https://10.0.0.7:8443   # https://: TLS to it (upstream_tls); http:// is plain
    endpoints_file: eps.yaml    # or (not both) file discovery: a YAML list of the same
                                #   entries; relative to this file's directory. Polled
                                #   (mtime/size/inode; rename-into-place and ConfigMap
                                #   symlink swaps seen) and re-read on SIGHUP; a change is
                                #   applied keeping surviving endpoints' state; a broken
                                #   file keeps the last good set (one log line, file:line;
                                #   kvroute_discovery_* on /metrics); [] = no endpoints (503)
    endpoints_file_poll: 1s     # how often its metadata is checked
    discovery:                  # or (not with endpoints / endpoints_file) Kubernetes: the
      kubernetes:               #   Ready pods an InferencePool selects, one endpoint per
        inference_pool: NAME    #   pod IP x target port, labels = pod labels; listed and
        namespace: NS           #   watched (changes apply at once). namespace defaults to
        group: inference.networking.k8s.io  # the kubeconfig context's; group or
        kubeconfig: PATH        #   inference.networking.x-k8s.io (v1alpha2); no
        context: NAME           #   kubeconfig = the in-cluster service account. A missing
        objectives: true        #   pool is no endpoints (readyz 503 says so), watched
                                #   until it exists; kvroute_k8s_* on /metrics
  scheduling:                   # or the same keys at top level (EndpointPickerConfig style)
    policy: kvroute             # round-robin | random | least-request | gie-default |
                                #   sglang-cache-aware | dynamo-cost | dynamo-kv |
                                #   llm-d-sticky | llm-d-precise | kvroute |
                                #   kvroute-slo (kvroute, picking by predicted latency),
                                #   kvroute-lora-blind (kvroute without adapter affinity)
    plugins: [{type, name?, parameters?}]
    schedulingProfiles: [{name, plugins: [{pluginRef, weight?}]}]
    slo: {ttft: 2s, tpot: 50ms}  # objectives of requests without x-llm-d-slo-ttft-ms /
                                #   x-llm-d-slo-tpot-ms headers (or the older x-slo-ttft-ms /
                                #   x-slo-tpot-ms; counted on /metrics, never forwarded)
    pd: {non_cached_tokens: 256, prompt_tokens: 256}
                                # prefill/decode disaggregation, when some endpoint is
                                #   labelled llm-d.ai/role: prefill (then prefill endpoints
                                #   are never the pick; the pick decodes): a prompt of
                                #   prompt_tokens or more with non_cached_tokens or more not
                                #   cached on the pick gets a prefill endpoint too
                                #   (kvroute_pd_decisions_total, kvroute_pd_pairs_total)
  limits:                       # client side, read at start; each refusal has an
    max_connections: 16384      #   OpenAI-shaped body and closes. 0 = unlimited; past it 503
    max_body_bytes: 16MiB       # -> 413
    max_header_bytes: 64KiB     # -> 431
    max_headers: 100            # -> 431
  timeouts:
    connect: 2s                 # upstream TCP connect
    first_byte: 120s            # upstream request sent -> response head
    idle: 60s                   # no bytes either way on an upstream exchange
    request_read: 30s           # client request head+body must arrive in this -> 408
    keepalive_idle: 60s         # idle kept-alive client connection: closed silently
  retries:                      # a failed attempt goes to the next-ranked endpoint while
    max_attempts: 2             #   the client has had no byte (5xx answers are buffered)
    budget_ratio: 0.2           # retries in budget_window <= budget_min_retries +
    budget_min_retries: 10      #   budget_ratio x requests; connect-failure retries free
    budget_window: 10s
  outlier_detection:            # eject between scrapes: connect failures, resets,
    consecutive_failures: 5     #   timeouts and 5xx in a row (0 = off)
    base_ejection: 5s           # doubles per repeat (max_ejection), decays when calm
    max_ejection: 300s
    max_ejection_percent: 50    # never more of the pool at once (at least one of two)
  allow_routing_headers: false  # honour x-gateway-destination-endpoint from clients
  epp:                          # `kvroute epp`'s (kvroute epp --help); serve reads objectives
    body_mode: full_duplex_streamed   # | streamed | buffered, when Envoy sends none
    fallbacks: 2                # endpoints after the winner in the pick header
    stream_timeout: 60s         # an ext_proc stream open longer is ended
    objectives:                 # objective -> priority; below 0 is shed (429) when saturated
      batch: -1                 #   (in serve: flow control's bands, with flow.enabled)
      chat: {priority: 0, slo: {ttft: 500ms, tpot: 40ms}}
                                # an objective's own latency objectives: for its requests
                                #   without x-llm-d-slo-* headers (before scheduling.slo)
  flow:                         # flow control, read at start: while the pool is saturated
    enabled: false              #   (every ready endpoint at >= 5 waiting or >= 80% KV, or
    max_requests: 5000          #   none ready) requests wait here, not in the engines, and
    max_bytes: 1GiB             #   are picked when a request finishes or a scrape shows
    ttl: 30s                    #   room. Bounds per priority band: over one -> 429. Past
    no_endpoint_ttl: 5s         #   ttl -> 429 (Retry-After); past no_endpoint_ttl (arrived
                                #   with no endpoint ready) -> 503
    fairness: round_robin       # round_robin | global: across flows inside a band
    ordering: fcfs              # fcfs | earliest_deadline: inside a flow
    flow_header: x-tenant-id    # the header naming the flow (reloadable); default:
                                #   x-llm-d-inference-fairness-id (or the older
                                #   x-gateway-inference-fairness-id), else the objective
    affinity_window: 16         # late binding (1..64): the replica that freed (or has the
    max_affinity_skips: 8       #   most room) takes the waiting request of these it holds
                                #   the most prefix of; passed over 8 times goes first
    sheddable_reserve: 0        # 0..4: sheddable requests are also shed unless some replica
                                #   has more than this many of its 5 queue slots free
    slo_aware: true             # with a TTFT objective (x-llm-d-slo-ttft-ms, scheduling.slo):
                                #   a waiting request predicted to miss it (its wait plus the
                                #   latency model's TTFT) goes behind those that can still
                                #   meet theirs, and is served after them within ttl; a
                                #   sheddable one already predicted to miss: 429 at once
    slo_admit_fraction: 0.5     # 0..1: a request predicted to start within this share of
                                #   its objective goes at once even while the detector says
                                #   saturated (0: the detector alone)
    slo_release_fraction: 0.15  # 0..1: a waiting request predicted to start within this
                                #   share of what is left of its objective is released
                                #   although the detector has no room (0: its room alone)
    # Priority (strict; higher first): the objective in x-gateway-inference-objective or
    # x-llm-d-inference-objective (epp.objectives, Kubernetes InferenceObjectives; unknown:
    # 0), else minus the body's vLLM `priority`. Below 0 is sheddable: 429 at once while
    # the pool is saturated. A client that disconnects while waiting is dropped at once.
    # kvroute_flow_* on /metrics.
  sessions:                     # session affinity (docs/POLICIES.md "Sessions"; reloadable)
    enabled: true               # a request with x-session-id stays on the replica that
    ttl: 300s                   #   served its session while that one is a candidate and not
    max_sessions: 100000        #   saturated (>= 5 waiting or >= 80% KV); else it moves to
    header: x-session-id        #   the policy's pick, once. Bindings idle for ttl expire;
    token_header: x-session-token  # past max_sessions the oldest-idle goes. Every proxied
                                #   response carries token_header: base64 of the serving
                                #   replica's host:port; a request sending it back goes there
                                #   (an unusable or bad token is ignored). kvroute_sessions,
                                #   kvroute_session_picks_total{outcome} on /metrics
  locality:                     # several regions (docs/REGIONS.md): picks stay in this
    region: us-east             #   region; they spill to a remote one only when every local
                                #   endpoint is saturated or the local wait exceeds the remote
                                #   round trip + wait. --region overrides; absent or "" = off.
                                #   An endpoint's region: its label `region` (or the pod label
                                #   topology.kubernetes.io/region); none = local
    rtt: {eu-west: 80ms}        # round trip per remote region (0 allowed); wins over measured
    measure_rtt: true           # time scrapes (request -> response head, kept-alive
                                #   connections) and smooth them per region (EWMA 0.2) for
                                #   regions rtt does not name; a region with neither is never
                                #   a spill target
    # kvroute_locality_picks_total{decision}, kvroute_locality_spill_ratio,
    # kvroute_locality_requests_total{region}, kvroute_locality_rtt_seconds{region,source}
    # on /metrics.
  capture:                      # traffic capture (read at start; docs/TRACES.md): each
    path: capture.jsonl         #   routed request as a Mooncake JSON line, the prompt as
    block_size: 512             #   keyed block hashes numbered per file (never content);
    max_bytes: 256MiB           #   rotates to path.1 .. path.<max_files>; a writer thread
    max_files: 5                #   of its own, a full buffer drops and counts
    sample: 1.0                 #   (kvroute_capture_lines_total{result})
    buffer_lines: 8192
  auth:                         # API keys (read at start): every path under /v1 needs
    api_keys_file: keys.txt     #   `Authorization: Bearer <key>`, else 401
                                #   {"error":"Unauthorized"} (vLLM's). One key per line,
                                #   `KEY` or `NAME KEY` (unnamed: line-N), # comments; a
                                #   duplicate, a third field or no key at all is an error.
                                #   Re-read on change and on SIGHUP; a broken file keeps the
                                #   running keys (one log line). Keys are never logged
    api_keys_poll: 1s           # how often the key files' metadata is checked
    upstream_authorization: forward  # | replace | drop: the Authorization replicas see
    upstream_api_key_file: up.key    # with replace: its first non-empty line, sent as
                                #   Bearer (re-read with the keys file)
    # kvroute_auth_requests_total{key}, kvroute_auth_rejected_total{reason},
    # kvroute_auth_keys, kvroute_auth_reloads_total{result} on /metrics.

Endpoints served: POST /v1/completions, POST /v1/chat/completions (streamed through chunk by
chunk), POST /v1/embeddings and POST /v1/responses (parsed, picked prefix-aware, never
split into P/D legs), GET /v1/models (the union of the usable replicas' listings, each
model once), POST /v1/load_lora_adapter and /v1/unload_lora_adapter (sent to every usable
replica; x-kvroute-fanout: <2xx>/<sent>), and forwarded as they came to one picked
replica (prefix-aware on the body's prompt/input/query/text_1, load-aware without):
POST /v1/score, /v1/rerank, /v1/audio/transcriptions, /v1/audio/translations, /tokenize,
/detokenize, /pooling, /classify, /score, /rerank, /v2/rerank, /invocations,
GET /v1/responses/{id}, POST /v1/responses/{id}/cancel. Any other path: an OpenAI-shaped
404 at once (a wrong method: 405). GET /metrics (the router's own), GET /healthz,
GET /readyz.
Request headers reach the replica end to end (traceparent, tracestate, baggage, vLLM's
and the application's), except hop-by-hop ones (Connection and what it names, Keep-Alive,
TE, Transfer-Encoding, Upgrade, Proxy-Authorization, Trailer) and the router's own
control headers (routing hint, x-llm-d-slo-*, session id and token, model-name rewrite).
Responses carry x-kvroute-endpoint, and x-kvroute-attempts: N after a retry; refusals
(429, 503) carry x-llm-d-request-dropped-reason: rejected-saturated, rejected-no-endpoints
or rejected-ttl-expired. x-llm-d-model-name-rewrite: the request is scheduled and sent as
that model (the body's "model" replaced; the header is not forwarded). Every picked
request's scheduler plugins are timed: llm_d_epp_plugin_duration_seconds
{extension_point, plugin_type, plugin_name} (and inference_extension_plugin_duration_seconds)
on /metrics. SIGHUP reloads the file; a bad file is rejected (the
running configuration stays) with file:line in the log.)";

// What `kvroute serve`'s command line says.
struct ServeOptions {
  std::string config_path;
  std::string listen;         // "": the file's listen
  int threads = -1;           // -1: the file's threads
  std::string region;         // with region_given: overrides locality.region ("" = off)
  bool region_given = false;  // --region was on the command line (set after parsing)
  bool check = false;
};

// The configuration file's --help text, with the metric-name keys from their one list
// (metrics::MetricNames::Keys), wrapped under the comment column.
std::string FileFormat() {
  constexpr std::string_view kIndent = "                                #     ";
  std::string keys, line;
  for (std::string_view k : metrics::MetricNames::Keys()) {
    if (!line.empty() && kIndent.size() + line.size() + k.size() + 2 > 92) {
      keys.append(kIndent).append(line).append("\n");
      line.clear();
    }
    line.append(line.empty() ? "" : " ").append(k);
  }
  keys.append(kIndent).append(line).append("\n");
  std::string text = kFileFormat;
  const std::string_view marker = "%METRIC_NAME_KEYS%\n";
  if (const auto at = text.find(marker); at != std::string::npos) text.replace(at, marker.size(), keys);
  return text;
}

// Declares serve's flags on `app`, each parsed into `opts`.
void AddFlags(CLI::App& app, ServeOptions& opts) {
  app.add_option("--config,-c", opts.config_path, "Configuration file (YAML, format below)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--listen,-l", opts.listen, "HOST:PORT to listen on (overrides the file's listen)");
  app.add_option("--threads,-t", opts.threads,
                 "Worker threads (overrides the file's threads; 0 = one per core)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--region", opts.region,
                 "The router's region (overrides locality.region; \"\" = locality off)");
  app.add_flag("--check", opts.check, "Validate the configuration file and exit (0 when valid)");
  app.footer(FileFormat());
}

// The command-line overrides as RouterOptions; false (the reason printed) when --listen or
// --region is not valid.
bool BuildRouterOptions(const ServeOptions& opts, RouterOptions& options) {
  options.config_path = opts.config_path;
  options.handle_signals = true;
  if (!opts.listen.empty()) {
    std::string error;
    auto hp = config::ParseHostPort(opts.listen, &error);
    if (!hp) {
      std::fprintf(stderr, "kvroute serve: --listen %s: %s\n", opts.listen.c_str(), error.c_str());
      return false;
    }
    options.listen = *hp;
  }
  if (opts.threads >= 0) options.threads = opts.threads;
  if (opts.region_given) {
    if (Status st = config::CheckRegionName(opts.region); !st.ok()) {
      std::fprintf(stderr, "kvroute serve: --region: %s\n", st.message().c_str());
      return false;
    }
    options.region = opts.region;
  }
  return true;
}

// --check: loads what serve would load at start besides the file itself (the endpoints
// file, the API key files, the TLS files) and prints a one-line summary. Returns the exit
// code: 0 when all of it is valid, else 2 (the reason printed).
int Check(const std::string& config_path, const config::RouterConfig& cfg) {
  std::size_t endpoints = cfg.pool.endpoints.size();
  if (const std::string& file = cfg.pool.endpoints_file_path; !file.empty()) {
    config::ConfigOr<std::string> text = config::ReadConfigFile(file);
    config::ConfigOr<std::vector<config::EndpointConfig>> eps;
    if (text.ok()) eps = config::ParseEndpointsFile(*text.value, file);
    if (!text.ok() || !eps.ok()) {
      std::fprintf(stderr, "kvroute serve: %s\n",
                   (text.ok() ? eps.error : text.error).ToString().c_str());
      return 2;
    }
    endpoints = eps.value->size();
  }
  if (const config::AuthConfig& auth = cfg.auth; auth.enabled()) {
    ApiKeyAuth keys(auth, 1, pool::RealFileSystem(), nullptr);
    if (Status st = keys.Load(); !st.ok()) {
      std::fprintf(stderr, "kvroute serve: auth: %s\n", st.message().c_str());
      return 2;
    }
  }
  // The TLS files as serve would load them: the listener's pair, the upstream trust.
  if (const config::ListenTlsConfig& t = cfg.listen_tls; !t.address.empty()) {
    auto certs = ListenerCerts::Load(t.cert_path, t.key_path, pool::RealFileSystem(), nullptr);
    if (!certs.ok()) {
      std::fprintf(stderr, "kvroute serve: %s\n", certs.status().message().c_str());
      return 2;
    }
  }
  if (auto up = pool::LoadUpstreamTls(cfg.upstream_tls); !up.ok()) {
    std::fprintf(stderr, "kvroute serve: %s\n", up.status().message().c_str());
    return 2;
  }
  if (const auto& k = cfg.pool.kubernetes; k.enabled()) {
    std::printf("%s: ok (Kubernetes discovery: InferencePool %s%s%s, group %s)\n", config_path.c_str(),
                k.namespace_name.c_str(), k.namespace_name.empty() ? "" : "/", k.inference_pool.c_str(),
                k.group.c_str());
    return 0;
  }
  std::printf("%s: ok (%zu endpoints)\n", config_path.c_str(), endpoints);
  return 0;
}

// Starts the router and serves until SIGINT or SIGTERM. Returns the exit code.
int Serve(config::RouterConfig cfg, const RouterOptions& options) {
  // Request bodies, their parsed prompt and simdjson's padded copy are each the prompt's
  // size; with glibc's default 128 KiB mmap threshold every long-prompt request would
  // mmap, page-fault and munmap them anew (about 2.5 ms of CPU per 220 KB prompt here).
  // Keep such blocks on the heap so they are reused.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);

  Router router(std::move(cfg), options);
  if (Status st = router.Start(); !st.ok()) {
    std::fprintf(stderr, "kvroute serve: %s\n", st.message().c_str());
    return 1;
  }
  // One line per listener; tools wait for "listening on port N" (plaintext) or
  // "listening on https port N".
  if (router.port() != 0) std::fprintf(stderr, "kvroute serve: listening on port %u\n", router.port());
  if (router.tls_port() != 0) {
    std::fprintf(stderr, "kvroute serve: listening on https port %u\n", router.tls_port());
  }
  router.WaitForShutdown();
  router.Stop();
  return 0;
}

// Loads the file, applies the command line, then checks (--check) or serves.
int Run(const ServeOptions& opts) {
  config::ConfigOr<config::RouterConfig> loaded = config::LoadRouterConfig(opts.config_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvroute serve: %s\n", loaded.error.ToString().c_str());
    return 2;
  }
  RouterOptions options;
  if (!BuildRouterOptions(opts, options)) return 2;
  if (opts.check) return Check(opts.config_path, *loaded.value);
  return Serve(std::move(*loaded.value), options);
}

}  // namespace

int ServeMain(int argc, char** argv) {
  CLI::App app{"Route OpenAI-compatible requests across a pool of vLLM/SGLang replicas, picking\n"
               "the endpoint per request from scraped KV-cache/queue metrics, prefix affinity and\n"
               "in-flight accounting.",
               "kvroute serve"};
  ServeOptions opts;
  AddFlags(app, opts);
  CLI11_PARSE(app, argc, argv);
  opts.region_given = app.count("--region") > 0;
  return Run(opts);
}

}  // namespace kvroute::router
