// Latency and throughput arithmetic for a load run (live or simulated): per-request
// records in, a per-policy summary out. Pure, deterministic, no I/O.
//
// Definitions (also in docs/REPORT_SCHEMA.md):
//   TTFT  = first token time - send time; E2E = last token time - send time.
//   TPOT  = (E2E - TTFT) / (output_tokens - 1), defined for output_tokens >= 2.
//   Percentiles use the nearest-rank method: the p-th percentile of n values is the
//   value at 1-based rank ceil(p/100 * n) of the ascending order (rank 1 when p = 0).
//   It is always one of the observed values; no interpolation.
//   Span  = last finish - first send, over every record. Rates divide by the span.
//   A request is "good" if it succeeded and meets every SLO that is set.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvroute::report {

enum class ErrorKind : uint8_t {
  kNone,
  kRejected,    // the engine refused it (prompt too long, cannot fit), HTTP 4xx
  kNoEndpoint,  // the router had nowhere to send it (503)
  kShed,        // load shedding (429)
  kUpstream,    // 5xx, connection reset, truncated stream
  kTimeout,
  kAborted,  // cancelled by the client/driver
};
inline constexpr int kNumErrorKinds = 7;
std::string_view ErrorKindName(ErrorKind kind);  // "none", "rejected", "no_endpoint", ...

struct RequestRecord {
  uint64_t id = 0;
  double send_s = 0.0;     // when the client sent it
  double ttft_s = -1.0;    // -1 when no token arrived
  double e2e_s = -1.0;     // -1 when it did not finish
  double max_itl_s = 0.0;  // largest gap between consecutive tokens
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;  // prefix-cache hit tokens; -1 when the server did not say
  int32_t endpoint = -1;      // where it was served; -1 when unknown
  int32_t retries = 0;        // attempts after the first (another endpoint, before any byte)
  ErrorKind error = ErrorKind::kNone;
  // Prefill/decode disaggregation (simulate): the replica whose prefill leg the decode leg
  // took over (-1: served without one), and how long its KV pull took (-1: no pull).
  int32_t prefill_endpoint = -1;
  double kv_transfer_s = -1.0;

  bool ok() const { return error == ErrorKind::kNone; }
  // TPOT as defined above; -1 when output_tokens < 2 or the request failed.
  double Tpot() const;
};

// Service-level objectives; 0 means "not set".
struct Slo {
  double ttft_s = 0.0;
  double tpot_s = 0.0;
  double e2e_s = 0.0;
};
// Succeeded and meets every set SLO (TPOT is not checked for single-token outputs).
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

// The nearest-rank percentile (p in [0, 100]) of `values`, which it reorders
// (nth_element). Returns 0 for an empty span.
double Percentile(std::span<double> values, double p);

struct Stats {
  int64_t count = 0;
  double mean = 0.0, min = 0.0, max = 0.0;
  double p50 = 0.0, p90 = 0.0, p99 = 0.0;
};
// Summary of `values` (sorted in place). All zero when empty.
Stats Summarize(std::vector<double>& values);

// Inter-token gaps of a whole run without storing each one: a histogram with
// logarithmic buckets, kBucketsPerDecade per factor of 10, from 1 us to 1000 s. Bucket
// i holds gaps in [lo * 10^(i/k), lo * 10^((i+1)/k)); values below lo go to bucket 0,
// above the top to the last. Percentile(p) returns the upper edge of the bucket holding
// the nearest-rank sample, so it overestimates by less than one bucket (2.3%). The mean
// is exact.
class GapHistogram {
 public:
  static constexpr int kBucketsPerDecade = 100;
  static constexpr double kLowest = 1e-6;
  static constexpr int kDecades = 9;
  static constexpr int kNumBuckets = kBucketsPerDecade * kDecades;

  void Add(double gap_s);
  void Merge(const GapHistogram& other);
  int64_t count() const { return count_; }
  double Mean() const { return count_ ? sum_ / count_ : 0.0; }
  double Percentile(double p) const;
  static double BucketUpperEdge(int bucket);

 private:
  std::array<int64_t, kNumBuckets> counts_{};
  // The last gap's bucket: a simulator adds the same gap for every request of a step.
  double last_gap_ = -1.0;
  int last_bucket_ = 0;
  int64_t count_ = 0;
  double sum_ = 0.0;
};

// Scraped fleet state over time. Aggregates every sample; keeps per-replica KV series
// for the first `max_series` replicas, decimated to at most `max_points` points each
// (when full, every other point is dropped and the keep interval doubles).
class FleetRecorder {
 public:
  explicit FleetRecorder(int num_replicas, int max_series = 16, size_t max_points = 1000);

  // One scrape of every replica at time t_s. Spans have num_replicas entries.
  void AddSample(double t_s, std::span<const double> kv_usage, std::span<const double> waiting);

  int64_t samples() const { return samples_; }
  // Means over samples of the fleet's min (and max) KV usage across replicas.
  double KvMinMean() const { return samples_ ? kv_min_sum_ / samples_ : 0.0; }
  double KvMaxMean() const { return samples_ ? kv_max_sum_ / samples_ : 0.0; }
  double KvPeak() const { return kv_peak_; }
  // Mean over samples of the fleet's total waiting requests, and its maximum.
  double WaitingMean() const { return samples_ ? waiting_sum_ / samples_ : 0.0; }
  double WaitingMax() const { return waiting_max_; }

  const std::vector<double>& series_times() const { return times_; }
  // series()[r][k]: replica r's KV usage at series_times()[k].
  const std::vector<std::vector<double>>& series() const { return series_; }

 private:
  int num_replicas_;
  size_t max_points_;
  int64_t samples_ = 0;
  int64_t keep_every_ = 1;
  double kv_min_sum_ = 0.0, kv_max_sum_ = 0.0, kv_peak_ = 0.0;
  double waiting_sum_ = 0.0, waiting_max_ = 0.0;
  std::vector<double> times_;
  std::vector<std::vector<double>> series_;
};

// Engine-side totals a driver knows at the end (summed over replicas).
struct FleetTotals {
  int64_t prefix_queries_tokens = 0;
  int64_t prefix_hits_tokens = 0;
  int64_t preemptions = 0;
  double oracle_hit_rate = -1.0;  // -1 when not computed
};

// One tenant's share of a run (simulate's `tenants:`), over its own records.
struct TenantReport {
  std::string name;
  int64_t priority = 0;
  int64_t requests = 0;
  int64_t succeeded = 0;
  int64_t shed = 0;  // rejected or expired by flow control (errors of kind shed)
  double ttft_p50_s = 0.0, ttft_p99_s = 0.0;  // its succeeded requests
  double goodput_requests_per_s = 0.0;        // its good requests over the run's span
};

// The requests one region's replicas served (simulate with fleet.groups regions): by the
// replica of each request's last attempt; requests that never reached a replica (no
// endpoint, shed at the router) are in no region.
struct RegionReport {
  std::string region;  // "" for replicas without a region
  bool local = true;   // no router region, no region of its own, or the router's
  int64_t replicas = 0;
  int64_t requests = 0;
  int64_t succeeded = 0;
  double share = 0.0;                         // requests / the run's requests
  double ttft_p50_s = 0.0, ttft_p99_s = 0.0;  // its succeeded requests
};

// Requests of one kind in a P/D run: served disaggregated (a prefill leg on a prefill
// replica, then the decode leg) or aggregated (one replica did both).
struct PdClassReport {
  int64_t requests = 0;
  int64_t succeeded = 0;
  Stats ttft_s, tpot_s, e2e_s;                // succeeded requests only
  double itl_mean_s = 0.0, itl_p99_s = 0.0;   // their inter-token gaps
};

// Replicas of one P/D role ("prefill", "decode", "prefill-decode", "none").
struct PdRoleReport {
  std::string role;
  int64_t replicas = 0;
  double busy_s = 0.0;       // seconds of engine steps, summed over its replicas
  double utilization = 0.0;  // busy_s / (span * replicas)
  double kv_usage_mean = 0.0;  // its replicas' scraped KV usage, mean over scrapes and replicas
};

// Prefill/decode disaggregation in simulate (issue 25).
// What the legs of disaggregated requests did, counted as the run goes (the simulator
// keeps these and the report takes them whole).
struct PdLegCounts {
  int64_t disaggregated = 0;    // decode legs that reached their replica with a prefill answer
  int64_t pulls = 0;            // of which pulled KV from the prefill replica
  int64_t recomputed = 0;       // of which had too little to pull and recomputed it
  int64_t pull_failures = 0;    // of which found the prefill replica down or its hold gone
  int64_t prefill_retries = 0;  // prefill legs moved to another prefill replica
  int64_t local_prefills = 0;   // disaggregate decisions the decode replica prefilled alone
};

struct PdReport : PdLegCounts {
  // The routing core's decision per pick, by its name (off, short_prompt, cached,
  // disaggregate, no_prefill), in that order.
  std::vector<std::pair<std::string, int64_t>> decisions;
  int64_t holds_released = 0, holds_expired = 0;  // prefill holds ended by pulls / leases
  PdClassReport disaggregated_requests, aggregated_requests;
  Stats transfer_s;  // the pulls' transfer times
  std::vector<PdRoleReport> roles;  // in fleet group order
};

struct PolicyReport {
  std::string policy;
  int64_t requests = 0;  // records (sent)
  int64_t succeeded = 0;
  int64_t good = 0;                               // succeeded and within SLOs
  std::map<std::string, int64_t> errors_by_kind;  // only kinds that occurred
  double span_s = 0.0;
  double requests_per_s = 0.0;       // succeeded / span
  double output_tokens_per_s = 0.0;  // succeeded requests' output tokens / span
  double input_tokens_per_s = 0.0;
  double goodput_requests_per_s = 0.0;
  Stats ttft_s, tpot_s, e2e_s;                                // succeeded requests only
  double itl_mean_s = 0.0, itl_p50_s = 0.0, itl_p99_s = 0.0;  // from a GapHistogram
  double max_itl_p99_s = 0.0;  // p99 over requests of their largest gap
  // Prefix cache: engine counters (hits/queries, preemption re-queries included) and
  // per request (sum cached / sum prompt over succeeded requests).
  double prefix_hit_rate = 0.0;
  // -1 when no succeeded request reported its cached tokens (vLLM reports them only with
  // --enable-prompt-tokens-details): unknown, not zero.
  double request_cached_fraction = -1.0;
  double oracle_hit_rate = -1.0;
  double oracle_ratio = -1.0;  // request_cached_fraction / oracle_hit_rate
  double kv_usage_min = 0.0, kv_usage_max = 0.0, kv_usage_peak = 0.0;
  double waiting_mean = 0.0, waiting_max = 0.0;
  int64_t preemptions = 0;
  int64_t retried = 0;  // requests sent again after a failed attempt (any outcome)
  int64_t retries = 0;  // the extra attempts, summed
  double wall_s = 0.0;  // how long producing it took (simulator speed), 0 if unknown
  // Flow control (router-side queue, simulate): off unless flow_enabled.
  bool flow_enabled = false;
  int64_t flow_queued = 0;   // requests that waited at the router
  int64_t flow_shed = 0;     // rejected at admission (sheddable, band full)
  int64_t flow_expired = 0;  // left the queue past their TTL
  int64_t flow_affinity = 0; // released to the replica that freed because it held their prefix
  int64_t flow_late = 0;     // moved behind the on-time ones: predicted to miss their TTFT objective
  // Router wait of every request flow control dispatched (0 when dispatched at once).
  double router_wait_mean_s = 0.0, router_wait_p99_s = 0.0;
  std::vector<TenantReport> tenants;  // empty without tenants
  std::vector<RegionReport> regions;  // in fleet group order; empty when no group has a region
  // KV-cache events and router replicas (simulate, issue 23); written only when
  // kv_events_reported (events on, or more than one router replica).
  bool kv_events_reported = false;
  bool kv_events_enabled = false;
  int64_t router_replicas = 1;
  int64_t kv_batches = 0;          // batches published (engine steps with events)
  int64_t kv_lost = 0;             // deliveries lost in transit (batch x router replica)
  int64_t kv_gaps = 0, kv_gaps_unrepaired = 0, kv_restarts = 0;  // summed over routers
  int64_t kv_replayed = 0;         // batches delivered by replay
  int64_t receipt_picks = 0;       // dispatched picks
  int64_t receipts = 0;            // of which had a prediction (and an admission to compare)
  double receipt_mae_tokens = -1;  // mean |predicted - actual cached tokens|; -1 none
  double receipt_off_block_share = -1;  // share of receipts off by more than one block
  // The routing core's latency model (issue 24): samples learned from, and its predictions
  // scored against what came back (mean absolute percentage error; -1 when none scored).
  int64_t latency_ttft_samples = 0;
  int64_t latency_tpot_samples = 0;
  int64_t latency_ttft_scored = 0;
  int64_t latency_tpot_scored = 0;
  double latency_ttft_mape = -1;
  double latency_tpot_mape = -1;
  double latency_ttft_mae_s = -1;  // mean |predicted - observed|, seconds; -1 none scored
  double latency_tpot_mae_s = -1;
  // LoRA adapters (simulate with workload.adapters); written only when lora_reported.
  bool lora_reported = false;
  int64_t lora_loads = 0;      // adapter loads over the fleet (each cost the group's load_s)
  int64_t lora_evictions = 0;  // adapters the full caches dropped (LRU)
  double lora_adapters_per_replica = 0.0;  // distinct adapters a replica served, mean
  // P/D (simulate with fleet roles); written only when pd_reported.
  bool pd_reported = false;
  PdReport pd;
  // For charts: up to 200 (ttft, cumulative fraction) points, ascending.
  std::vector<std::pair<double, double>> ttft_cdf;
  std::vector<double> kv_times;
  std::vector<std::vector<double>> kv_series;
};

// Builds a PolicyReport from the records. `gaps` and `fleet` may be null.
PolicyReport Summarize(std::string policy, std::span<const RequestRecord> records, const Slo& slo,
                       const FleetTotals& totals, const GapHistogram* gaps,
                       const FleetRecorder* fleet);

}  // namespace kvroute::report
