// `kvroute serve` configuration: YAML text to a typed, validated RouterConfig.
// Loading is a pure function of the text: either the whole config or one error naming
// file, line and field ("seed.yaml:12: schedulingProfile[1].weight: weight must be >= 0
// (got -1)"); nothing is ever half applied.
//
// Read through config/yaml_reader.h, like every kvroute config format.
//
// File shape (every key optional; unknown keys are errors, with a did-you-mean for a
// near miss: "unknown key 'scrape_intervl' (did you mean 'scrape_interval'?)"):
//
//   listen: 0.0.0.0:8080          # host:port ([v6]:port accepted); "off": no plaintext
//                                 #   listener (then listen_tls is required)
//   listen_tls:                   # an HTTPS listener beside (or, with listen: off,
//     address: 0.0.0.0:8443       #   instead of) the plaintext one; read at start
//     cert: tls.crt               # PEM certificate (then intermediates); relative paths
//     key: tls.key                #   against this file's directory. Both files are
//     poll: 1s                    #   watched (stat every poll, and on SIGHUP): a changed
//                                 #   pair serves new connections, open ones keep theirs;
//                                 #   a pair that does not load keeps the last good one
//                                 #   (logged once)
//   upstream_tls:                 # replicas addressed https://HOST:PORT (proxy, scrape,
//     ca: ca.pem                  #   tokenize): trusted CAs (default: the system's store)
//     cert: client.crt            # a client certificate and key for replicas that
//     key: client.key             #   require one (both or neither)
//     verify: true                # false: accept any certificate (still encrypted)
//                                 # The files are read at start and on every reload.
//   threads: 0                    # worker threads, 0 = one per core
//   pool:
//     engine_type: vllm           # vllm | sglang: default metric names
//     model: ""                   # only read metric series of this model_name
//     metric_names: {waiting: "my:queue"}   # overrides, keys of metrics::MetricNames::Set
//     scrape_interval: 50ms       # durations: "250us", "50ms", "2s", "1m", or seconds
//     staleness: 2s               # metrics older than this are stale (>= scrape_interval)
//     stale_policy: exclude       # exclude | saturated: what a stale endpoint counts as
//     endpoints:
//       - address: 127.0.0.1:18001
//         name: a                 # defaults to the address; unique
//         labels: {region: eu}
//         kv_events: tcp://127.0.0.1:5557         # where it publishes vLLM KV-cache events
//         kv_events_replay: tcp://127.0.0.1:5558  #   and its replay socket (optional)
//       - 127.0.0.1:18002         # shorthand: just the address
//       - https://10.0.0.7:8443   # https://: TLS to it (upstream_tls); http:// is plain
//     kv_events:                  # precise prefix routing from KV-cache events (issue 23)
//       port: 5557                # every endpoint without its own kv_events publishes on
//       replay_port: 5558         #   tcp://<its host>:<port> (Kubernetes pods), replay on
//                                 #   replay_port (optional)
//       bind: tcp://*:5557        # or (not with port) centralized: one socket the replicas
//                                 #   connect to, each naming itself by topic
//                                 #   kv@<its host>@<model>
//       block_size: 16            # tokens per key of the router's index; engines' block
//                                 #   sizes must be multiples of it
//       speculative_ttl: 2s       # a dispatch counts as cached there until its events come
//       stale_after: 10s          # work dispatched and no events for this long: stale
//       resync: 10s               # after a gap replay cannot fill: approximate for this long
//       replay_timeout: 1s        # a replay that does not answer within it failed
//       tokenizer: 10.0.0.9:8000  # who tokenizes prompts (POST /tokenize); default: a
//                                 #   ready replica (the request then takes one round trip)
//       tokenize_timeout: 2s      # past it the request is routed by the approximate model
//     endpoints_file: eps.yaml    # or (not both) file discovery: a YAML list of the same
//                                 #   entries (config/endpoints_file.h); relative paths are
//                                 #   against this file's directory. Watched: re-read on
//                                 #   change (mtime/size/inode, ConfigMap symlink swaps and
//                                 #   rename-into-place included) and on SIGHUP; applied
//                                 #   keeping surviving endpoints' state; a broken file
//                                 #   keeps the last good set (logged once, counted)
//     endpoints_file_poll: 1s     # how often its metadata is checked
//     discovery:                  # or (not with endpoints / endpoints_file) Kubernetes:
//       kubernetes:               #   the pods an InferencePool selects (adapters/pool/kubernetes_discovery.h)
//         inference_pool: NAME    # required
//         namespace: NS           # default: the kubeconfig context's namespace, in a
//                                 #   cluster the service account's
//         group: inference.networking.k8s.io   # or inference.networking.x-k8s.io (v1alpha2)
//         kubeconfig: PATH        # default: the in-cluster service account; relative
//                                 #   paths are against this file's directory
//         context: NAME           # a kubeconfig context other than current-context
//         objectives: true        # follow InferenceObjectives (priorities) too
//   scheduling:                   # or the same keys at top level (EndpointPickerConfig
//     policy: kvroute             #   style), not both
//     plugins: [{type, name?, parameters?}]
//     schedulingProfiles: [{name, plugins: [{pluginRef, weight?}]}]
//     schedulingProfile: [{pluginRef, weight?}]   # the seed article's form, one profile
//     slo: {ttft: 2s, tpot: 50ms}   # objectives of requests without SLO headers (issue 24)
//     pd: {non_cached_tokens: 256, prompt_tokens: 256}   # P/D decider (issue 25): with
//                                   # endpoints labelled llm-d.ai/role=prefill, disaggregate
//                                   # when the prompt and its tokens uncached on the decode
//                                   # endpoint reach these (core/routing/pd.h)
//   limits:                       # client side, read at start (a reload keeps the running
//                                 #   ones); each refusal answers with an OpenAI-shaped error
//                                 #   body and closes the connection
//     max_connections: 16384      # open connections, 0 = unlimited; past it a new
//                                 #   connection gets 503 at once, unread
//     max_body_bytes: 16MiB       # larger request body -> 413
//     max_header_bytes: 64KiB     # request line + headers -> 431
//     max_headers: 100            # header fields -> 431
//   timeouts:
//     connect: 2s                 # TCP connect to an endpoint
//     first_byte: 120s            # request sent -> response head (queueing + prefill)
//     idle: 60s                   # no bytes either way on an open upstream exchange
//     request_read: 30s           # (read at start, like limits) a client request's
//                                 #   head+body must arrive within this
//                                 #   (from its first byte; on a new connection from the
//                                 #   accept) -> 408 (slow senders, slowloris)
//     keepalive_idle: 60s         # kept-alive client connection with no request started:
//                                 #   closed silently
//   retries:                      # attempts per request, first included; a retry goes to
//     max_attempts: 2             #   the next-ranked endpoint, only before the client got
//     budget_ratio: 0.2           #   a byte; retries in budget_window < budget_min_retries
//     budget_min_retries: 10      #   + budget_ratio * requests (connect-failure retries
//     budget_window: 10s          #   are free: no engine saw the request)
//   outlier_detection:            # passive ejection between scrapes (core/health/outlier.h)
//     consecutive_failures: 5     # connect failures, resets, timeouts, 5xx in a row; 0 off
//     base_ejection: 5s           # first ejection; doubles per repeat, decays when calm
//     max_ejection: 300s
//     max_ejection_percent: 50    # panic threshold: never more of the pool (at least 1)
//   allow_routing_headers: false  # honour client-supplied routing headers
//   epp:                          # `kvroute epp` (the ext_proc endpoint picker); serve
//                                 #   reads objectives for flow control
//     body_mode: full_duplex_streamed  # full_duplex_streamed | streamed | buffered: the
//                                 #   request body mode assumed when Envoy sends no
//                                 #   protocol_config
//     fallbacks: 2                # endpoints after the winner in
//                                 #   x-gateway-destination-endpoint (0..7)
//     stream_timeout: 60s         # an ext_proc stream open longer is ended (never hangs)
//     objectives: {batch: -1}     # InferenceObjective name -> priority (default 0);
//                                 #   below 0 is sheddable: 429 when the pool is saturated;
//                                 #   or NAME: {priority: 0, slo: {ttft: 500ms, tpot: 40ms}}
//                                 #   for the objective's latency objectives (issue 24)
//   flow:                         # flow control (serve and epp; core/flow/flow_queue.h):
//                                 #   requests wait at the router while the pool is
//                                 #   saturated, bound to an endpoint when capacity frees
//     enabled: false              # off: every request is dispatched at arrival
//     max_requests: 5000          # waiting requests per priority band; over it -> 429
//     max_bytes: 1GiB             # waiting request bodies per band; over it -> 429
//     ttl: 30s                    # longest wait; then 429 with Retry-After
//     no_endpoint_ttl: 5s         # the same for a request that arrived with no endpoint
//                                 #   ready; then 503
//     fairness: round_robin       # round_robin | global: across flows inside a band
//     ordering: fcfs              # fcfs | earliest_deadline: inside a flow
//     flow_header: x-tenant-id    # the header naming a request's flow; default:
//                                 #   x-llm-d-inference-fairness-id (else
//                                 #   x-gateway-inference-fairness-id), else the objective
//     affinity_window: 16         # late binding: waiting requests a freed endpoint's
//                                 #   prefix is compared against (1..64)
//     max_affinity_skips: 8       # passed over this often for affinity: goes first
//   locality:                     # several regions (docs/REGIONS.md "Live router"; serve
//                                 #   and epp): keep picks in this region, spill to a
//                                 #   remote one only when the local pool is saturated
//     region: us-east             # the router's region ("" or absent: locality off);
//                                 #   --region overrides. Endpoints' regions: label
//                                 #   `region` or topology.kubernetes.io/region
//     rtt: {eu-west: 80ms}        # round trip per remote region (a duration, 0 allowed);
//                                 #   wins over a measured one
//     measure_rtt: true           # smooth scrape round trips per region into the round
//                                 #   trip of regions rtt does not name
//   sessions:                     # session affinity (docs/POLICIES.md "Sessions"; serve
//                                 #   and epp): a request naming a session goes where the
//                                 #   session was served while that endpoint is a candidate
//                                 #   and not saturated
//     enabled: true               # a request must send the header to be affected
//     ttl: 300s                   # a binding unused this long expires
//     max_sessions: 100000        # bindings kept; the oldest-idle one makes room
//     header: x-session-id        # the request header naming the session (router-side
//                                 #   binding)
//     token_header: x-session-token  # written on every response (base64 of the serving
//                                 #   endpoint's address), followed when a request sends it
//   auth:                         # API keys (serve; docs/SERVE.md "API keys"): paths under
//                                 #   /v1 need `Authorization: Bearer <key>`, else 401
//                                 #   {"error":"Unauthorized"}; other paths stay open
//     api_keys_file: keys.txt     # required in the block: one key per line, `KEY` or `NAME
//                                 #   KEY` (config/api_keys.h); relative paths are against
//                                 #   this file's directory. Watched like endpoints_file and
//                                 #   re-read on SIGHUP; a broken file keeps the last good
//                                 #   keys (logged once). Read at start: a bad one fails it
//     api_keys_poll: 1s           # how often its metadata (and the upstream key file's) is
//                                 #   checked
//     upstream_authorization: forward   # forward | replace | drop: the client's
//                                 #   Authorization goes to the replica as sent, is
//                                 #   replaced by upstream_api_key_file's key, or not sent
//     upstream_api_key_file: up.key   # with replace (and only then): its first non-empty
//                                 #   line is sent as `Authorization: Bearer <key>`;
//                                 #   re-read with the keys file
//   The auth block itself is read at start (a reload re-reads the key files it names).
//   capture:                      # traffic capture (serve and epp; docs/TRACES.md
//                                 #   "Capture"): each routed request appended as a
//                                 #   Mooncake JSON line, prompts as keyed block hashes
//                                 #   remapped to integers per file, never content
//     path: capture.jsonl         # required in the block; relative: this file's directory
//     block_size: 512             # prompt tokens per hash id
//     max_bytes: 256MiB           # a larger file rotates to path.1 (bytes; K/M/G, KiB/
//                                 #   MiB/GiB suffixes)
//     max_files: 5                # rotated files kept (path.1 .. path.N)
//     sample: 1.0                 # fraction of requests written, in (0, 1]
//     buffer_lines: 8192          # lines waiting for the writer; more are dropped and
//                                 #   counted (kvroute_capture_lines_total)
//   The capture block is read at start; a reload keeps the file open as it was.
//   A request's priority (its band; higher goes first) is its objective's in
//   epp.objectives (unknown: 0), else minus the body's vLLM `priority` field; below 0 it
//   is sheddable: 429 at once while the pool is saturated.
//
// Scheduling is checked with sched::ValidateSchedulingSpec (plugin types, parameters,
// references), its errors mapped back to the file's lines and key names.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/yaml_reader.h"
#include "core/capture/capture.h"
#include "core/flow/flow_queue.h"
#include "core/routing/pd.h"
#include "core/routing/sessions.h"
#include "core/sched/profile_spec.h"
#include "core/metrics/engine_metrics.h"

namespace kvroute::config {

struct HostPort {
  std::string host;  // without brackets for IPv6
  uint16_t port = 0;
  // "host:port", "[v6]:port" for hosts containing ':'.
  std::string ToString() const;
  bool operator==(const HostPort&) const = default;
};

// Parses "host:port" / "[v6]:port". Port 1-65535, host not empty and free of spaces,
// slashes and '@'. On failure returns nullopt and sets `*error` when given.
std::optional<HostPort> ParseHostPort(std::string_view s, std::string* error = nullptr);

enum class StalePolicy {
  kExclude,    // stale endpoints are not candidates (unless all are stale)
  kSaturated,  // stale endpoints stay candidates but count as saturated
};

struct EndpointConfig {
  std::string address;  // as written
  HostPort host_port;
  bool tls = false;     // written https://HOST:PORT
  std::string name;     // defaults to address
  std::map<std::string, std::string> labels;
  std::string kv_events;         // "tcp://HOST:PORT" or empty
  std::string kv_events_replay;  // "tcp://HOST:PORT" or empty (needs kv_events)
  int line = 0;
};

// Ok when `url` is a KV-event socket address the router can use: "tcp://HOST:PORT" (port
// 1-65535; "[v6]:PORT" for IPv6 hosts). `bind`: the router binds it, so HOST may be `*`.
// Else InvalidArgument saying what is wrong.
Status CheckKvEventsUrl(std::string_view url, bool bind);

// pool.kv_events: precise prefix routing from vLLM's KV-cache events.
struct KvEventsConfig {
  uint16_t port = 0;         // per-endpoint default: tcp://<host>:<port>; 0 = none
  uint16_t replay_port = 0;  // with port: tcp://<host>:<replay_port>; 0 = none
  std::string bind;          // centralized mode; empty = none (exclusive with port)
  int block_size = 16;
  double speculative_ttl_s = 2.0;
  double stale_after_s = 10.0;
  double resync_s = 10.0;
  double replay_timeout_s = 1.0;
  // Who tokenizes prompts (vLLM's POST /tokenize): this host:port, else a ready replica.
  std::optional<HostPort> tokenizer;
  double tokenize_timeout_s = 2.0;
  bool operator==(const KvEventsConfig&) const = default;
};

// Kubernetes discovery: the pods an InferencePool selects become the endpoints.
inline constexpr std::string_view kPoolGroupV1 = "inference.networking.k8s.io";
inline constexpr std::string_view kPoolGroupV1Alpha2 = "inference.networking.x-k8s.io";
struct KubernetesDiscoveryConfig {
  std::string inference_pool;  // empty: Kubernetes discovery is off
  std::string namespace_name;  // empty: the kubeconfig context's / service account's
  std::string group = std::string(kPoolGroupV1);
  std::string kubeconfig;       // as written; empty: in-cluster service account
  std::string kubeconfig_path;  // resolved against the config's directory
  std::string context;
  bool objectives = true;
  bool enabled() const { return !inference_pool.empty(); }
  bool operator==(const KubernetesDiscoveryConfig&) const = default;
};

// Ok when the pool name, namespace and group are valid Kubernetes values, else
// InvalidArgument saying what is wrong, naming the field ("inference_pool: 'Bad_Name' is not
// a Kubernetes object name ..."). The config loader and `kvroute epp`'s flags share it.
Status CheckKubernetesDiscovery(const KubernetesDiscoveryConfig& k);

// Ok when `region` may name a region (empty included: no region), else InvalidArgument
// saying why not. The `locality:` loader and the --region flags of serve and epp share it.
Status CheckRegionName(std::string_view region);

struct PoolConfig {
  std::vector<EndpointConfig> endpoints;
  KubernetesDiscoveryConfig kubernetes;  // pool.discovery.kubernetes
  // File discovery (config/endpoints_file.h); exclusive with `endpoints`. Empty: none.
  std::string endpoints_file;       // as written
  std::string endpoints_file_path;  // relative ones resolved against the config's directory
  double endpoints_file_poll_s = 1.0;
  metrics::EngineType engine_type = metrics::EngineType::kVllm;
  // MetricNames::For(engine_type) with the file's overrides applied.
  metrics::MetricNames metric_names = metrics::MetricNames::For(metrics::EngineType::kVllm);
  std::string model;  // metric series filter; empty = all
  double scrape_interval_s = 0.050;
  double staleness_s = 2.0;
  StalePolicy stale_policy = StalePolicy::kExclude;
  KvEventsConfig kv_events;
};

struct LimitsConfig {
  uint32_t max_connections = 16384;  // open client connections; 0 = unlimited
  uint64_t max_body_bytes = 16ull << 20;
  uint64_t max_header_bytes = 64ull << 10;
  uint32_t max_headers = 100;
};

struct TimeoutsConfig {
  double connect_s = 2.0;       // TCP connect to an endpoint
  double first_byte_s = 120.0;  // request sent -> response headers (covers queueing+prefill)
  double idle_s = 60.0;         // no bytes either way on an open exchange
  double request_read_s = 30.0;    // client request head+body read (slow senders: 408)
  double keepalive_idle_s = 60.0;  // kept-alive client connection, no request: closed
};

struct RetryConfig {
  int max_attempts = 2;  // first attempt included; retries go to another endpoint
  double budget_ratio = 0.2;
  int budget_min_retries = 10;
  double budget_window_s = 10.0;
};

struct OutlierConfig {
  int consecutive_failures = 5;  // 0: off
  double base_ejection_s = 5.0;
  double max_ejection_s = 300.0;
  double max_ejection_percent = 50.0;
};

// scheduling.slo: the latency objectives of requests that state none (issue 24); also an
// objective's own (epp.objectives NAME: {slo: ...}).
struct SloConfig {
  double ttft_s = 0.0;  // 0: none
  double tpot_s = 0.0;
  bool operator==(const SloConfig&) const = default;
};

// `kvroute epp`'s own settings (the `epp:` section); `kvroute serve` reads only
// `objectives` and `objective_slos`.
enum class EppBodyMode { kFullDuplexStreamed, kStreamed, kBuffered };
struct EppConfig {
  EppBodyMode body_mode = EppBodyMode::kFullDuplexStreamed;
  int fallbacks = 2;  // 0..7
  double stream_timeout_s = 60.0;
  std::map<std::string, int64_t, std::less<>> objectives;  // name -> priority
  // name -> latency objectives (`NAME: {priority: P, slo: {ttft: 500ms, tpot: 40ms}}`): for
  // a request naming the objective and stating none in its headers (before scheduling.slo).
  std::map<std::string, SloConfig, std::less<>> objective_slos;
};

// Flow control (the `flow:` section), off unless enabled. `options` passed flow::Validate.
struct FlowConfig {
  bool enabled = false;
  flow::FlowOptions options;
  // The header whose value names a request's flow (compared case-sensitively, hashed);
  // empty: the fairness id header (llm-d's, then the older one), else the objective.
  std::string flow_header;
};

// Several regions (the `locality:` section). Read by serve and epp alike.
struct LocalityConfig {
  std::string region;  // the router's region; empty: locality off
  std::vector<std::pair<std::string, double>> rtt_s;  // region -> seconds, file order
  bool measure_rtt = true;
};


// `listen_tls:`: serve's HTTPS listener. Absent when `address` is empty.
struct ListenTlsConfig {
  std::string address;  // as written; empty: no HTTPS listener
  HostPort addr;
  std::string cert, key;            // as written
  std::string cert_path, key_path;  // resolved against the config's directory
  double poll_s = 1.0;
};

// `upstream_tls:`: how serve speaks TLS to https:// endpoints.
struct UpstreamTlsConfig {
  std::string ca_path;  // resolved; empty: the system's trust store
  std::string cert_path, key_path;
  bool verify = true;
  bool operator==(const UpstreamTlsConfig&) const = default;
};

// API keys (the `auth:` section; serve only). Enabled when api_keys_file is set.
enum class UpstreamAuthorization { kForward, kReplace, kDrop };
struct AuthConfig {
  std::string api_keys_file;       // as written; empty: auth off
  std::string api_keys_file_path;  // resolved against the config's directory
  double api_keys_poll_s = 1.0;
  UpstreamAuthorization upstream_authorization = UpstreamAuthorization::kForward;
  std::string upstream_api_key_file;       // as written; set exactly with kReplace
  std::string upstream_api_key_file_path;  // resolved
  bool enabled() const { return !api_keys_file.empty(); }
  bool operator==(const AuthConfig&) const = default;
};


struct RouterConfig {
  std::string listen = "0.0.0.0:8080";
  HostPort listen_addr{"0.0.0.0", 8080};
  bool listen_plain = true;  // false: `listen: off`
  ListenTlsConfig listen_tls;
  UpstreamTlsConfig upstream_tls;
  int threads = 0;
  PoolConfig pool;
  sched::SchedulingSpec scheduling;  // empty = the kvroute default policy
  SloConfig slo;                     // scheduling.slo
  routing::PdOptions pd;             // scheduling.pd (issue 25)
  LimitsConfig limits;
  TimeoutsConfig timeouts;
  RetryConfig retries;
  OutlierConfig outlier;
  bool allow_routing_headers = false;
  EppConfig epp;
  FlowConfig flow;
  LocalityConfig locality;
  routing::SessionOptions sessions;  // `sessions:` (serve and epp)
  AuthConfig auth;                   // `auth:` (serve)
  capture::CaptureOptions capture;   // `capture:` (serve and epp)
};

// Which command reads the configuration. serve and epp share one format, but some keys
// only serve honours (kServeOnlyKeys): for epp they are an error naming file, line and
// key, so that nobody believes the picker applies them (API keys, listeners, timeouts of
// a proxy it is not).
enum class ConfigReader : uint8_t { kServe, kEpp };
inline constexpr std::string_view kServeOnlyKeys[] = {
    "listen",              "listen_tls",           "threads",
    "limits.max_connections", "limits.max_header_bytes", "limits.max_headers",
    "timeouts.first_byte", "timeouts.idle",        "timeouts.request_read",
    "timeouts.keepalive_idle", "retries.max_attempts", "allow_routing_headers",
    "auth"};

// Both return the config, or the error naming file, line and field (ConfigOr and
// ConfigError: config/yaml_reader.h). Never throw.
//
// Parses `text`; `filename` is used in error messages only.
ConfigOr<RouterConfig> ParseRouterConfig(std::string_view text,
                                         std::string_view filename = "<config>",
                                         ConfigReader reader = ConfigReader::kServe);

// Reads and parses the file at `path` (named as given in errors).
ConfigOr<RouterConfig> LoadRouterConfig(const std::string& path,
                                        ConfigReader reader = ConfigReader::kServe);

}  // namespace kvroute::config
