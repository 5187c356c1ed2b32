// `kvroute bench`'s engine: an open-loop load generator for any OpenAI-compatible
// endpoint. Requests come from simkit/workload (arrival times fixed in advance, so a slow
// server does not slow the offered load), are sent as streaming requests over keep-alive
// connections, and are measured per token. Every replica's /metrics is read before, during
// and after the run for the engine-side view (prefix-cache hits, KV usage, waiting,
// preemptions).
//
// Asynchronous on one Asio io_context: no thread per request. RunBench runs that context
// on the calling thread until the run is over.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/bench/options.h"
#include "simkit/report/summary.h"
#include "simkit/workload/arrivals.h"
#include "simkit/workload/workload.h"
#include "core/metrics/engine_metrics.h"

namespace kvroute::bench {

// A snapshot of a run in progress, for a live progress line.
struct Progress {
  double elapsed_s = 0.0;
  int64_t sent = 0;
  int64_t finished = 0;  // ok or failed
  int64_t in_flight = 0;
  int64_t errors = 0;
  int64_t output_tokens = 0;  // of finished successful requests
  double last_ttft_p50_s = 0.0;  // over the requests that finished since the last snapshot
  double kv_min = 0.0, kv_max = 0.0;  // latest scrape; 0 without a fleet
  double hit_rate = -1.0;             // prefix-cache hit rate so far; -1 without a fleet
};

struct BenchConfig {
  HostPort target;    // the OpenAI-compatible server (router or replica)
  std::string model;  // empty: the first id of GET /v1/models (fallback: the sim's default)
  workload::WorkloadSpec workload;
  workload::ArrivalSpec arrivals;
  uint64_t seed = 1;
  report::Slo slo;
  std::string label = "bench";  // the policy name in the report
  // Extra header fields (name, value) sent on every request to `target` (the generation
  // requests and GET /v1/models; not the fleet's /metrics reads), e.g. the objective
  // header that gives a run's requests their priority at the router. Names as
  // ParseHeader accepts them.
  std::vector<std::pair<std::string, std::string>> headers;

  // Replicas whose /metrics are scraped (may be empty).
  std::vector<HostPort> fleet;
  metrics::EngineType engine_type = metrics::EngineType::kVllm;
  double scrape_interval_s = 0.25;

  double connect_timeout_s = 2.0;
  double first_byte_timeout_s = 600.0;  // queueing + prefill may be long under overload
  double idle_timeout_s = 60.0;         // between streamed chunks
  // After the last arrival, in-flight requests get this long to finish; the rest are
  // cancelled and recorded as aborted. Dependent turns not yet sent are dropped.
  double drain_timeout_s = 120.0;

  // Called on the run's thread every progress_interval_s while the run is active.
  std::function<void(const Progress&)> on_progress;
  double progress_interval_s = 0.5;
  // Polled every 100 ms; when it becomes true the run stops sending and drains with no
  // grace (in-flight requests are cancelled). Not owned; may be null.
  const std::atomic<bool>* stop = nullptr;
};

// Per-replica engine counters at the first and last successful scrape.
struct ReplicaScrape {
  HostPort address;
  bool ok_before = false, ok_after = false;
  metrics::EngineMetrics before, after;
  int64_t scrapes_ok = 0, scrapes_failed = 0;
};

struct BenchResult {
  std::string error;  // set when the run could not start (bad config); then nothing else is
  std::string model;
  std::vector<report::RequestRecord> records;  // one per request sent, in send order
  report::GapHistogram gaps;
  std::unique_ptr<report::FleetRecorder> fleet;  // null without a fleet
  std::vector<ReplicaScrape> replicas;
  report::FleetTotals totals;     // deltas between first and last scrape (summed)
  double waiting_after = 0.0;     // fleet total waiting at the final scrape
  // Failure causes in more detail than report::ErrorKind: "connect_refused", "http_503",
  // "stream_error", "truncated", "first_byte_timeout", ...
  std::map<std::string, int64_t> error_details;
  int64_t not_sent = 0;           // generated but dropped (drain ended, stop requested)
  double wall_s = 0.0;
  report::PolicyReport summary;   // report::Summarize over the above
};

// Runs one benchmark to completion on the calling thread. Never throws on network
// errors: they become error records. Returns with `error` set only when `config` is
// unusable (workload or arrivals fail validation).
BenchResult RunBench(const BenchConfig& config);

// Prefix-cache hit rate from two sets of counters: sum of hit deltas over sum of query
// deltas across replicas where both scrapes succeeded; -1 when no tokens were queried.
double HitRateFromScrapes(const std::vector<ReplicaScrape>& replicas);

}  // namespace kvroute::bench
