// `kvroute doctor`'s pure half: the seed article's diagnosis as code. Scrapes of each
// replica's /metrics (text in, taken at times the caller passes) become per-replica and
// fleet figures over a window, and rules turn the figures into findings, each with the
// numbers that fired it and the kvroute configuration that addresses it.
//
// No sockets, no clock reads: the I/O half (src/apps/doctor/) scrapes and passes bodies and
// times here, so every rule is tested on fixtures in virtual time.
//
// Unknown is not zero: a series that is absent, NaN, infinite, negative or implausible is
// unknown (std::nullopt) and recorded in Scrape::garbage; a figure computed from unknown
// inputs is unknown; a rule never fires or clears on unknown figures. A counter that goes
// down inside the window (a restarted replica) makes its rate unknown for that window.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::doctor {

// A cumulative Prometheus histogram as scraped: upper bounds ascending (the last is
// +Inf), cumulative counts, sum and count. Empty when the series is absent or garbage.
struct Histogram {
  std::vector<double> upper;
  std::vector<double> cumulative;
  double sum = 0;
  double count = 0;
  bool empty() const { return upper.empty(); }
};

// One scrape of one replica, parsed. Series are summed over engines (data-parallel
// ranks, label `engine`); kv_usage is the mean over engines.
struct Scrape {
  double t_s = 0;          // the caller's clock when the body was read
  bool reachable = false;  // a 200 with a body was read
  std::string error;       // when !reachable: "connect: Connection refused", "HTTP 503", ...
  std::optional<double> running, waiting, kv_usage;
  // Counters: vllm:prefix_cache_{queries,hits}_total, else the old vllm:gpu_prefix_cache_*.
  std::optional<double> prefix_queries, prefix_hits;
  std::optional<double> hit_rate_gauge;  // old vllm:gpu_prefix_cache_hit_rate, 0..1
  std::optional<double> preemptions;     // vllm:num_preemptions_total
  std::optional<double> prompt_tokens, generation_tokens;  // vllm:*_tokens_total
  std::optional<double> requests_finished;  // vllm:request_success_total, every reason
  Histogram ttft;        // vllm:time_to_first_token_seconds
  Histogram prompt_len;  // vllm:request_prompt_tokens
  Histogram output_len;  // vllm:request_generation_tokens
  // vllm:cache_config_info labels.
  std::optional<int64_t> block_size, num_gpu_blocks;
  std::optional<bool> prefix_caching;  // enable_prefix_caching="True"/"False"
  std::string model;                   // model_name label, "" when none
  // Engine series present but unusable, one line each: "vllm:kv_cache_usage_perc = NaN
  // (line 12)". Text that is not an exposition at all (an HTML page) is one entry.
  // Also: a histogram that cannot be summed ("vllm:request_prompt_tokens: bucket bounds
  // differ across engines (engine 1)"), a capacity label that is not a count, and a few
  // bad lines among good ones ("line 24: ...", a truncated body). At most 16 entries.
  std::vector<std::string> garbage;
  bool any_engine_series = false;  // some vllm: series was read (else: not a vLLM /metrics)
  // A kvroute router's own series (serve's or epp's /metrics; issue 24), index 0 TTFT,
  // 1 TPOT: kvroute_latency_predictions_scored_total{kind},
  // kvroute_latency_prediction_abs_error_seconds_total{kind},
  // kvroute_latency_prediction_abs_relative_error_total{kind},
  // kvroute_slo_requests_total{type}, kvroute_slo_violations_total{type}.
  struct RouterSeries {
    std::optional<double> scored[2], abs_error_s[2], abs_rel_error[2];
    std::optional<double> slo_requests[2], slo_violations[2];
    bool flow_control = false;  // kvroute_flow_dispatched_total is exported (flow.enabled)
  };
  RouterSeries router;
  bool any_router_series = false;  // some kvroute_ series above was read
};

// Parses one /metrics body taken at t_s. Never throws; garbage lands in Scrape::garbage.
Scrape ParseScrape(std::string_view body, double t_s);
// A scrape that failed at the transport or HTTP level.
Scrape FailedScrape(std::string error, double t_s);

// One KV-cache event batch (vLLM's ZMQ publisher, REFERENCE.md section 5) as doctor's
// event probe received it.
struct EventBatchSeen {
  double t_s = 0;  // the caller's clock when it arrived (the clock of Scrape::t_s)
  // The block_size of the batch's BlockStored events, each distinct value once (empty: the
  // batch stored nothing, only removals or a clear).
  std::vector<int32_t> block_sizes;
};

// What doctor's event probe saw of one replica's KV-cache events while it scraped: the
// probe subscribes to the replica's publisher before the first scrape and listens until a
// little after the last one (the caller's grace). Present only for replicas whose events are
// configured (per endpoint `kv_events`, pool.kv_events.port, or --kv-events-port).
struct EventProbe {
  std::string address;                  // "tcp://10.0.0.7:5557"
  std::vector<EventBatchSeen> batches;  // oldest first
  int64_t decode_errors = 0;            // messages that were not a decodable batch
  std::string error;                    // the probe could not subscribe ("" when it did)
};

// Every scrape of one replica in the window, oldest first.
struct ReplicaHistory {
  std::string name;  // as the user gave it: "127.0.0.1:18001", or a pod name
  std::string address;  // host:port
  std::vector<Scrape> scrapes;
  std::optional<EventProbe> events = std::nullopt;  // no KV events configured for it
};

// Rule thresholds. Defaults are the documented rules (docs/DOCTOR.md).
struct DoctorOptions {
  double window_s = 30;               // what the caller intended; reported
  double low_hit_rate = 0.5;          // fleet hit rate below this: prefix-reuse-lost
  double min_queried_tokens = 10000;  // fewer queried tokens in the window: no hit-rate rule
  // lopsided-kv reads each scrape round (the i-th scrape of every replica, as Collect takes
  // them), since that is where the article's symptom lives: at one instant a replica
  // under pressure (waiting >= queue_busy, a preemption since its previous scrape, or KV >=
  // kv_hot with waiting > queue_idle) while a sibling idles (waiting <= queue_idle, KV <=
  // kv_cold) at least kv_spread below it. Over a window a round-robin fleet's means are
  // even (every replica gets the same mix), so window means hide it. Spread alone never
  // counts: a prefix-affine router legitimately leaves KV uneven with no queue anywhere.
  // The rule fires when at least lopsided_share of the rounds with two or more known
  // replicas are lopsided.
  double kv_hot = 0.9;
  double kv_cold = 0.6;
  double kv_spread = 0.3;
  double lopsided_share = 0.2;
  double queue_busy = 2.0;            // queue-imbalance: mean waiting at/above this
  double queue_idle = 0.5;            // ... while another's is at/below this
  double preemptions_per_s = 0.1;     // preemptions finding (which replicas)
  // KV-event rules (replicas with an EventProbe). The tokens a replica computed over a
  // stretch of the window: Δ vllm:prompt_tokens_total − Δ prefix-cache hits (Δ prompt
  // tokens when the hit counter is unknown); a replica that computed at least
  // event_min_blocks blocks' worth (its cache_config_info block_size, else
  // router_block_size, else 16) must have stored a block, so it must have published.
  double event_min_blocks = 1;
  // The router's pool.kv_events.block_size (0: unknown, e.g. --endpoints): the events'
  // block size must be a multiple of it or the router cannot use them.
  int32_t router_block_size = 0;
  // The router's latency model and objectives (--router): latency-model-inaccurate fires
  // at a mean relative TTFT or TPOT error above latency_max_mape, with a mean absolute
  // error above latency_min_abs_error_s (tens of percent of a 13 ms TTFT change no
  // decision), over at least latency_min_predictions scored predictions in the window;
  // slo-missed when more than slo_max_violation of at least slo_min_requests requests with
  // an objective missed it.
  double latency_max_mape = 0.5;
  double latency_min_abs_error_s = 0.05;
  double latency_min_predictions = 50;
  double slo_max_violation = 0.1;
  double slo_min_requests = 50;
};

// A quantile from histogram buckets; nullopt when unknown or no observations.
struct Quantiles {
  std::optional<double> p50, p99;
};

struct ReplicaFigures {
  std::string name, address;
  bool reachable = false;        // the last scrape was read
  std::string error;             // the last failure, "" when none
  int scrapes = 0, failures = 0;
  std::optional<double> running, waiting;  // the last scrape
  std::optional<double> kv_now, kv_mean, kv_max;  // last, mean and max over the window
  std::optional<double> waiting_mean;
  std::optional<double> hit_rate;     // window: d(hits)/d(queries); else the old gauge
  // "counters", "counters-lifetime" (one scrape: hits/queries since start), "gauge", ""
  // (unknown).
  std::string hit_rate_source;
  // d(queries) over the window (lifetime queries with one scrape; with the gauge: d(prompt
  // tokens), the nearest thing old vLLM counts).
  std::optional<double> queried_tokens;
  std::optional<double> preemptions_per_s, tokens_per_s, requests_per_s;
  Quantiles ttft_s;                   // from the window's bucket deltas
  std::optional<bool> prefix_caching;
  std::optional<int64_t> block_size, num_gpu_blocks;
  std::vector<std::string> garbage;   // from the last scrape
  // From the EventProbe (nullopt: events not configured). tokens_computed: the rule's
  // reading over the window (see DoctorOptions::event_min_blocks).
  struct Events {
    std::string address, error;
    int64_t batches = 0, decode_errors = 0;
    std::optional<double> last_batch_s;     // the newest batch's time
    std::vector<int32_t> block_sizes;       // distinct BlockStored block sizes, ascending
    std::optional<double> tokens_computed;  // over the window
  };
  std::optional<Events> events;
};

struct FleetFigures {
  int replicas = 0, reachable = 0;
  std::optional<double> hit_rate;         // sum of hit deltas / sum of query deltas
  // "counters" (window deltas), "counters-lifetime" (one scrape each: totals since start),
  // "gauge" (old vLLM: mean of the replicas' hit-rate gauges), "" (unknown).
  std::string hit_rate_source;
  std::optional<double> queried_tokens;   // the tokens behind hit_rate
  std::optional<double> kv_min, kv_max, kv_spread;  // over replicas' window means
  std::optional<double> waiting_total;    // last scrapes
  std::optional<double> waiting_max, waiting_min;   // over replicas' window means
  std::optional<double> preemptions_per_s;
  std::optional<double> tokens_per_s, requests_per_s;
  Quantiles ttft_s;                       // merged bucket deltas
  std::vector<std::string> preempting;    // replicas above options.preemptions_per_s
  // Scrape rounds with at least two replicas' KV and waiting known, and of those the
  // rounds where some replica was under pressure while a sibling idled (lopsided-kv).
  int rounds = 0, lopsided_rounds = 0;
};

// The router's view (--router): its latency model's prediction errors and the requests'
// attainment of their latency objectives over the window (counter deltas between the first
// and last usable scrapes; with one scrape, totals since the router started).
struct RouterFigures {
  std::string name, address;
  bool reachable = false;  // the last scrape was read
  std::string error;       // the last failure, "" when none
  int scrapes = 0, failures = 0;
  bool kvroute = false;    // some kvroute latency series was read (else: not a kvroute router)
  bool flow_control = false;
  struct Kind {
    std::optional<double> predictions;  // scored in the window
    std::optional<double> mape;         // mean |predicted - observed| / observed
    std::optional<double> mean_abs_error_s;
    std::optional<double> slo_requests, slo_violations;  // with an objective, and missed
    std::optional<double> attainment;   // 1 - violations / requests
  };
  Kind ttft, tpot;
};

struct Finding {
  std::string rule;     // "prefix-reuse-lost", "lopsided-kv", "queue-imbalance",
                        // "prefix-caching-off", "preemptions", "unreachable",
                        // "garbage-metrics", "not-vllm", "kv-events-silent",
                        // "kv-events-stale", "kv-events-block-size",
                        // "latency-model-inaccurate", "slo-missed"
  std::string severity;  // "warning" | "error"
  std::string summary;   // one line with the numbers: "fleet prefix-cache hit rate 7.0% ..."
  std::string condition;  // the rule that fired, as text: "hit rate < 50% with >= 10000 ..."
  std::string remedy;    // what to do, naming kvroute config: "scheduling: {policy: kvroute}"
  std::vector<std::string> replicas;  // the replicas concerned
  bool routing = false;  // a routing finding (prefix-reuse-lost, lopsided-kv, queue-imbalance)
};

struct Report {
  double intended_window_s = 0;  // DoctorOptions::window_s
  double window_s = 0;   // actual: last scrape time - first scrape time
  double at_s = 0;       // the last scrape's time
  std::vector<ReplicaFigures> replicas;
  FleetFigures fleet;
  std::optional<RouterFigures> router;  // --router only
  std::vector<Finding> findings;  // empty: healthy
  bool readable = false;  // some replica gave a usable vLLM scrape
  // 0 healthy, 1 findings, 2 nothing readable.
  int ExitCode() const { return !readable ? 2 : (findings.empty() ? 0 : 1); }
};

// `router`: the router's scrapes (--router), or null.
Report Diagnose(const std::vector<ReplicaHistory>& replicas, const DoctorOptions& options,
                const ReplicaHistory* router = nullptr);

// Prometheus histogram_quantile over cumulative buckets: linear inside the bucket that
// holds rank q * total (the first bucket starts at 0); a rank in the +Inf bucket gives the
// highest finite bound. nullopt when empty or without observations. q in [0, 1].
std::optional<double> HistogramQuantile(const Histogram& h, double q);
// later - earlier bucket-wise (sum and count too). nullopt when the bounds differ or a
// bucket went down (a restart); `earlier` empty gives `later` as is.
std::optional<Histogram> HistogramDelta(const Histogram& later, const Histogram& earlier);

// The report as JSON (schema in docs/DOCTOR.md, "schema": "kvroute-doctor/1"); unknown
// figures are null.
std::string ReportJson(const Report& report);
// The report as text for a terminal: a per-replica table, the fleet line, then each
// finding with its numbers, rule and remedy (or "healthy").
std::string ReportText(const Report& report);
// The --watch screen: one row per replica with a KV bar, waiting, running, hit rate,
// preemptions/s; fits `width` columns; plain text (the caller adds ANSI clear codes).
std::string WatchView(const Report& report, int width);

// A `kvroute simulate` scenario (YAML) approximating the observed traffic: request rate,
// prompt and output length distributions from the request-size histograms, fleet size and
// KV blocks from cache_config_info. Empty with *error set when the window has no requests.
std::string ScenarioYaml(const Report& report, const std::vector<ReplicaHistory>& replicas,
                         std::string* error);

}  // namespace kvroute::doctor
