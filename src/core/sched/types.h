// The values the scheduler reads on every pick: one EndpointState per endpoint (what was
// scraped plus what the router knows), one SchedRequest per request, and the seeded random
// source. Pure data, no I/O.
#pragma once

#include "core/common/rng.h"
#include "core/metrics/engine_metrics.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvroute::api {
struct ParsedRequest;
}
namespace kvroute::kvevents {
class EventIndex;
}

namespace kvroute::sched {

class LatencyTrainer;  // latency_trainer.h

// Identifies one request between Pick and OnFinished. 0 is never a valid handle.
using RequestHandle = uint64_t;
inline constexpr RequestHandle kNoHandle = 0;

// What the scheduler sees of one endpoint. The router keeps a vector of these, updates the
// scraped fields in place after each scrape (then calls Scheduler::OnMetricsUpdated) and
// passes the vector as a span to every Pick.
struct EndpointState {
  // Dense and stable for the endpoint's lifetime: its index in the router's endpoint table.
  // Schedulers size per-endpoint tables by the largest id seen, so keep ids small.
  uint32_t id = 0;
  std::string name;  // "10.0.0.7:8000"; for logs and observability only
  std::vector<std::pair<std::string, std::string>> labels;
  // From the labels (SetLabels: RegionOf / ZoneOf); empty when the labels say nothing. An
  // endpoint without a region counts as local to the router (locality-filter).
  std::string region;
  std::string zone;
  // RegionKey(region), set with it by SetLabels; 0 when there is no region or it was never
  // computed (then the name itself is compared). Lets the locality filter classify an
  // endpoint with one integer compare per pick.
  uint64_t region_key = 0;

  // The router's own view (health check, circuit breaker). Unhealthy endpoints are never
  // picked, whatever the policy.
  bool healthy = true;

  // Scraped from /metrics (vllm:kv_cache_usage_perc, num_requests_waiting/_running,
  // cache_config_info).
  double kv_usage = 0.0;       // 0..1
  double waiting = 0.0;
  double running = 0.0;
  int64_t num_gpu_blocks = 0;  // 0 when unknown
  int64_t block_size = 0;      // tokens per KV block, 0 when unknown
  // Every engine signal of the last good scrape, as the parser (metrics::
  // ExtractEngineMetrics) or the simulated engine produced it, with which fields are
  // present (usable) and which invalid. The load fields above are the health-judged view
  // of three of them (an unknown or stale load counts as full there); a signal a policy
  // reads only from here is added as one field of EngineMetrics with its producer, and
  // reaches every scheduler through health and the routing core with no other edit. A
  // field that is not present is unknown, never zero.
  metrics::EngineMetrics engine;
  // When the last successful scrape was taken (the time the scrape request was sent, on the
  // caller's clock); negative when the endpoint was never scraped.
  double scraped_at_s = -1.0;
  bool scrape_ok = false;  // the last scrape attempt succeeded

  // Seconds since the scraped values were taken; +inf when never scraped.
  double MetricsAge(double now_s) const;
  // Scraped at least once, last attempt succeeded, and not older than `stale_after_s`.
  bool MetricsFresh(double now_s, double stale_after_s) const;
  // Sets `labels` and the region and zone they name. Whoever builds the endpoint table
  // calls this (not `labels =`), so a label change is a region change.
  void SetLabels(std::vector<std::pair<std::string, std::string>> l);
  // Copies what a scrape reports (usage, queue, capacity, scrape time and outcome) from
  // `o`; identity, labels and health stay as they are.
  void CopyScrapedFrom(const EndpointState& o) {
    kv_usage = o.kv_usage;
    waiting = o.waiting;
    running = o.running;
    num_gpu_blocks = o.num_gpu_blocks;
    block_size = o.block_size;
    engine = o.engine;
    scraped_at_s = o.scraped_at_s;
    scrape_ok = o.scrape_ok;
  }
};

using Labels = std::vector<std::pair<std::string, std::string>>;
// The endpoint's region: label `region`, else `topology.kubernetes.io/region`; empty when
// neither is set. ZoneOf likewise with `zone` and `topology.kubernetes.io/zone`.
std::string_view RegionOf(const Labels& labels);
std::string_view ZoneOf(const Labels& labels);
// A non-zero 64-bit hash of a region name (this process only); 0 for "".
uint64_t RegionKey(std::string_view region);

// Where a pick went relative to the router's region, and why (locality-filter,
// docs/POLICIES.md "Locality"). Reported per pick (PickResult::locality) and counted
// (LocalityStats).
enum class Locality : uint8_t {
  kOff = 0,         // no locality-filter in the policy, or no router region configured
  kLocal,           // a local candidate had room (or no local load is known): local only
  kLocalSaturated,  // every local candidate saturated, but no remote one could take it
  kSpillSaturated,  // every local candidate saturated (or the spill's hysteresis): remote
  kSpillWait,       // expected local wait > remote round trip + remote wait: remote
  kSpillSticky,     // this prompt's prefix spilled to that remote replica < stickySeconds ago
  kNoLocal,         // no healthy local candidate: remote
};
inline constexpr size_t kLocalityReasons = 7;
// "off", "local", "local_saturated", "spill_saturated", "spill_wait", "spill_sticky",
// "no_local" (metric label values).
std::string_view LocalityName(Locality l);
// The spill reasons: kSpillSaturated, kSpillWait, kSpillSticky and kNoLocal.
bool IsRemote(Locality l);

// A locality-filter's counters since the scheduler was built (carried across reloads).
struct LocalityStats {
  std::array<uint64_t, kLocalityReasons> picks{};  // committed picks by reason (index = enum)
  uint64_t spills_started = 0;  // times the spill mode turned on (kSpillSaturated/kSpillWait)
  bool spilling = false;        // the spill mode is on now
  uint64_t Picks(Locality l) const { return picks[static_cast<size_t>(l)]; }
};

// What a scorer measures: each row of PickResult::scores has one (Scheduler::scorer_roles),
// declared by the scorer itself (Plugin::role) or by a dedicated policy. The routing core
// finds the prefix row (a request's cached share) by it. kOther: none of the others.
enum class ScorerRole { kPrefix, kKvCache, kQueue, kLoad, kCost, kOther };

// What the scheduler needs of one request. Views: the caller keeps the strings alive for
// the duration of the Pick call (the scheduler copies what it keeps, as hashes).
struct SchedRequest {
  std::string_view model;
  // The prompt as text: completions' `prompt`, or chat messages rendered by
  // kvroute::api (ParsedRequest::prompt_text). Hashed for prefix affinity.
  std::string_view prompt;
  std::string_view cache_salt;
  int64_t priority = 0;       // vLLM extra; lower is more important; < 0 is sheddable
  int64_t max_tokens = -1;    // -1 when the request did not say
  int64_t prompt_tokens = -1; // -1: estimated from the text (about 4 characters a token)
  // The request's latency objectives in seconds (headers x-llm-d-slo-ttft-ms and
  // x-llm-d-slo-tpot-ms, or the pool default scheduling.slo); <= 0: none.
  double slo_ttft_s = 0.0;
  double slo_tpot_s = 0.0;
  // Seconds it already waited in the router's flow queue before this pick: counted against
  // its TTFT objective (the client waited), never learned from (the model predicts from
  // dispatch).
  double queued_s = 0.0;
  // The answer streams its tokens, so the first response byte is the first token (TTFT and
  // the token cadence are observable). A non-streamed answer arrives whole: its first byte
  // is the end, and the latency model learns nothing from it.
  bool streaming = true;
  // Prefill/decode disaggregation may split it (completions and chat: api::Disaggregable);
  // embeddings, responses and every other forwarded path are served whole by one endpoint.
  bool disaggregable = true;
  // The prompt's token ids as the engines' tokenizer gives them (a front end's tokenizer
  // adapter, or the simulated engine's); empty when unknown. Precise prefix scoring keys
  // them; without them policies use their approximate model.
  std::span<const uint32_t> token_ids;

  // Set by the routing core for one pick, never by front ends: the engines' reported cache
  // (KV-cache events) and this request's keys in it (EventIndex::RequestKeys of token_ids),
  // read under the index's shared lock. Null/empty: no precise state for this pick.
  const kvevents::EventIndex* events = nullptr;
  std::span<const uint64_t> event_keys;
  // Set by the routing core for one pick: the latency model's predictions (read under the
  // core's scheduler lock, shared). Null: no predictions (a picker that uses them falls
  // back to its scores). slo_ttft_s/slo_tpot_s then already hold the pool default.
  const LatencyTrainer* latency = nullptr;

  // prompt_tokens when given, else ceil(prompt.size() / 4).
  int64_t EstimatedPromptTokens() const;
};

// A SchedRequest viewing `r`'s strings (r must outlive the returned value).
SchedRequest FromParsed(const api::ParsedRequest& r);

// The injected random source (core/common/rng.h): same seed, same sequence everywhere.
using Rng = ::kvroute::Rng;

}  // namespace kvroute::sched
