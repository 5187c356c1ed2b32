// The routing core: one pool of endpoints and everything that decides where a request
// goes, shared by every front end (the HTTP proxy of `kvroute serve`, the ext_proc
// endpoint picker of `kvroute epp`, and `kvroute simulate`, which drives it in virtual
// time with its simulated engines' state as scrape results). It knows nothing of HTTP,
// gRPC, sockets or clocks: front ends translate their protocol into these calls and pass
// the time in.
//
// RoutingCore is the façade and the contract. It keeps the endpoint table, the scraped
// state and health (core_health.cc), the scheduler and its lock, and the pick; each other
// feature is a component with its own header under core/routing/, owning its state (and
// its lock where it has one), to which the calls below are forwarded:
//   KvEventInput     kv_event_input.h    the precise prefix index fed by KV-cache events
//   PdCoordinator    pd_coordinator.h    prefill/decode pairs (the rules: pd.h)
//   SessionAffinity  session_affinity.h  session bindings and their placement (sessions.h)
//   LatencyFeed      latency_feed.h      the latency model's training and predictions
//   CoreMetrics      core_metrics.h      the router's own counters and /metrics sections
//
// Every call, by feature (the component that carries it out in brackets):
//
// Configuration (every component follows it)
//   Configure(options, endpoints, now)     the endpoint set and the scheduling, health,
//                                          P/D, session and locality settings; again on
//                                          every reload (state of surviving endpoints kept)
//   OnReloadFailed()                       a reload was rejected before reaching Configure
//   set_pick_timer(seconds)                the clock that times picks for the histogram
// Engine signals
//   OnScrape(id, result, now)              a scraper's result for one endpoint
// KV-cache events [KvEventInput]
//   OnKvEvents(id, batch, now)             a decoded batch of an endpoint's events
//   OnKvEventsGap / OnKvEventsRestart / OnKvEventsDecodeError   what the transport found
//   OnRouteReceipt(id, predicted, reported) cached tokens predicted vs reported
//   KvEventStats(id, now), kv_events_active()
// A request's life (the scheduler ranks; [SessionAffinity] places a session, [PdCoordinator]
// decides the pair, [LatencyFeed] predicts and learns)
//   Pick(request, now) -> PickResult       ranked endpoints and a handle
//   OnDispatched(handle, endpoint, now)    sent there (again for a retry elsewhere)
//   OnFirstToken(handle, now)              first response byte
//   OnTokens(handle, generated, now)       output so far (optional; per chunk or step)
//   OnFinished(handle, endpoint, code, now) done, whatever the outcome; exactly once
// Failures and lifecycle decisions (core/routing/lifecycle.h)
//   OnAttemptFailed(failure, now) -> retry on ranked[i] | end
//   OnPrefillFailed(failure, now) -> move the prefill leg to X | prefill locally
//   OnUpstreamFailure(id, failure, now)    counts a failure (health, outlier ejection)
//   OnAttemptSucceeded(id)                 a head below 500: failures start over
//   AllowRetry(now, free)                  the retry budget alone
// Prefill/decode disaggregation [PdCoordinator]
//   OnPrefillDone(prefill, tokens, handle, answered, now)   a prefill leg ended
//   PickPrefill(request, decode, exclude, out)              another prefill endpoint
// Pool views (published state; for requests without a pick, shedding and gauges)
//   AnyUsable(now, out, max), AnyUp(now), Ready(now), Load(now), Gauges(now),
//   table(), Health(id, now), policy(), reloads()
// Flow control's probes (core/flow)
//   PrefixKey(request, out), HeldBlocks(key, endpoint), SloWaitBudget(request, key)
// Sessions [SessionAffinity]
//   session_picks(outcome), sessions()
// Latency model [LatencyFeed]
//   latency_stats()
// Locality (docs/REGIONS.md)
//   SetRegionRtt(region, seconds), measured_rtt()
// Exposition [CoreMetrics, with each component's own series]
//   AppendMetrics(out, now)                the router's own Prometheus series
//
// Threads. Every method may be called from any thread. What a pick reads about endpoints
// (the endpoint table, scraped values, health inputs) is published by OnScrape and
// Configure without the scheduler's lock. The scheduler's state (prefix index, in-flight
// accounting: one affinity map and one load picture for all workers, by design) sits
// behind a reader/writer lock: picks rank concurrently under the shared side
// (Scheduler::Rank, for policies that support it: every plugin-profile policy, kvroute's
// included), and only the short commits take it exclusively: the pick's handle, one
// lifecycle call, folding in the scrapes that arrived since the last pick. The same lock
// guards PdCoordinator's and LatencyFeed's state (they have none of their own);
// SessionAffinity's and KvEventInput's locks are their own. Nothing under it allocates in
// steady state or does I/O. Scrapes never take it (they publish and mark
// the endpoint dirty). AppendMetrics reads atomics and published state, takes each
// endpoint's and CoreMetrics' small mutexes, sweeps expired sessions, and formats its
// plugin-timing and P/D-pair sections under the scheduler lock's shared side.
// sglang-cache-aware and dynamo-cost rank under the exclusive side (their ranking changes
// their state).
//
// Reloads. Configure keeps, for every endpoint whose address survives, its id, scraped
// state, prefix-index entries and in-flight accounting; the new scheduler adopts the old
// one's state (Scheduler::AdoptStateFrom), so new weights, a new scrape interval or even
// a new policy reset nothing. Removed endpoints are dropped from the prefix model; their
// in-flight requests finish normally.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/common/published.h"
#include "core/common/rw_spin_lock.h"
#include "core/common/status.h"
#include "core/health/endpoint_health.h"
#include "core/kvevents/event_index.h"
#include "core/health/outlier.h"
#include "core/routing/endpoint_table.h"
#include "core/routing/latency_feed.h"
#include "core/routing/lifecycle.h"
#include "core/routing/pd.h"
#include "core/routing/retry_budget.h"
#include "core/routing/sessions.h"
#include "core/sched/profile_spec.h"
#include "core/sched/scheduler.h"
#include "core/metrics/engine_metrics.h"

namespace kvroute::routing {

// The components (see the table above).
class KvEventInput;     // core/routing/kv_event_input.h
class PdCoordinator;    // core/routing/pd_coordinator.h
class SessionAffinity;  // core/routing/session_affinity.h
class CoreMetrics;      // core/routing/core_metrics.h

inline constexpr std::size_t kMaxRanked = 8;

struct CoreOptions {
  sched::SchedulingSpec scheduling;  // empty: the kvroute policy
  health::HealthOptions health;
  health::OutlierOptions outlier;   // passive ejection (consecutive failures)
  RetryBudgetOptions retry_budget;  // retries as a share of recent requests
  std::size_t max_ranked = kMaxRanked;  // 1..kMaxRanked
  uint64_t seed = 1;
  // Locality (docs/POLICIES.md "Locality", docs/REGIONS.md "Live router"): the router's
  // region ("" = none: locality off) and the configured round trips to remote regions
  // (seconds, finite, >= 0), passed to the scheduler as SchedulerOptions::region and
  // region_rtt_s. A configured round trip wins over a measured one (SetRegionRtt).
  std::string region;
  std::vector<std::pair<std::string, double>> region_rtt_s;
  // When set, Configure builds the scheduler with this instead of
  // sched::BuildScheduler(scheduling, ...): an embedder's own Scheduler (a test that
  // observes the calls the core makes, a plugin under development). It gets the options
  // the core would build with and must return a fresh scheduler (never null).
  std::function<std::unique_ptr<sched::Scheduler>(const sched::SchedulerOptions&)> scheduler_factory;
  // The precise prefix index fed by KV-cache events (OnKvEvents): key block size,
  // speculative TTL, staleness, bounds (kvevents::IndexOptions).
  kvevents::IndexOptions kv_events;
  // Latency objectives of requests that state none (seconds; <= 0: none): scheduling.slo,
  // or a simulate scenario's slo block (issue 24).
  double default_slo_ttft_s = 0.0;
  double default_slo_tpot_s = 0.0;
  // Prefill/decode disaggregation (scheduling.pd; issue 25, core/routing/pd.h): applies
  // when some endpoint is labelled llm-d.ai/role=prefill.
  PdOptions pd;
  // Session affinity (docs/POLICIES.md "Sessions"; issue 26): the idle TTL and bound of
  // the session table, and the header names the front ends use.
  SessionOptions sessions;
};

// The outcome of one scrape attempt, as the scraper adapter reports it.
struct ScrapeResult {
  bool ok = false;
  bool connect_failed = false;  // meaningful when !ok
  double sent_at_s = 0.0;       // when the scrape request was sent
  metrics::EngineMetrics metrics;  // valid when ok
};

struct PickRequest {
  sched::SchedRequest request;
  // Client-supplied preferred endpoints (names or addresses, comma-separated), tried
  // before the scheduler's ranking when the front end allows routing hints; down ones are
  // skipped. Empty: none.
  std::string_view hint;
  // Also record the dispatch to the best endpoint in the same exclusive section as the
  // pick's commit (saves the front end one OnDispatched call and one lock round trip).
  bool dispatch_first = false;
  // Endpoint ids the pick must choose among (the ext_proc gateway's subset hint); ids not
  // in the table are ignored. Empty: every endpoint. A restricted pick ranks under the
  // exclusive side of the lock (rare: only gateways that send a subset).
  std::span<const uint32_t> only;
  // Session affinity (CoreOptions::sessions; ignored when disabled). `session_id`: the
  // client's conversation id (x-session-id), bound router-side to the endpoint that serves
  // it. `session_token`: the x-session-token header as the client sent it (base64 of an
  // endpoint's address, SessionToken); one that does not decode or names no endpoint is
  // ignored. Either puts its endpoint first in ranked[] while that endpoint is a candidate
  // (in the table, healthy, in `only` when given, passed the policy's filters) and not
  // saturated (PoolLoad's rule, with the in-flight estimate; unknown or stale load counts
  // as saturated); otherwise the policy's ranking stands and the session is rebound to its
  // ranked[0]. A valid token wins over the id's binding; a routing hint wins over both.
  std::string_view session_id;
  std::string_view session_token;
};

// What a pick did with the request's session (PickResult::session).
enum class SessionOutcome : uint8_t {
  kNone = 0,         // no session id or token (or sessions disabled, or a hint decided)
  kBound,            // the id's bound endpoint was still usable: it goes first
  kNew,              // an id without a binding: bound to the pick
  kMovedGone,        // its endpoint is no longer a candidate: rebound to the pick
  kMovedSaturated,   // its endpoint is saturated and the pick is not: rebound
  kToken,            // the token's endpoint was usable: it goes first
};
inline constexpr std::size_t kNumSessionOutcomes = 6;
std::string_view SessionOutcomeName(SessionOutcome o);

struct PickResult {
  // Ok, or Unavailable with why ("every endpoint is saturated or filtered out", "no
  // healthy endpoint is available").
  Status status;
  sched::RequestHandle handle = sched::kNoHandle;  // pass to OnDispatched..OnFinished
  std::array<uint32_t, kMaxRanked> ranked{};       // endpoint ids, best first
  std::size_t n_ranked = 0;
  bool dispatched = false;  // dispatch_first was honoured: ranked[0] is recorded as sent
  // Where the pick went relative to the router's region, and why (the scheduler's
  // PickResult::locality; kOff without a router region or a locality-filter).
  sched::Locality locality = sched::Locality::kOff;
  // The table the ids refer to; holds every ranked endpoint alive for the request.
  std::shared_ptr<const EndpointTable> table;
  // Route receipt (dispatched picks with token ids only): the prompt tokens the engines'
  // reported cache says ranked[0] holds (a multiple of the index's block size, before this
  // request's speculative entries), when its KV-cache events are live; -1 otherwise.
  int64_t predicted_cached_tokens = -1;
  // The latency model's prediction for the dispatched request on ranked[0] (seconds), once
  // it has samples and the endpoint's signals are known; -1 otherwise (issue 24).
  double predicted_ttft_s = -1.0;
  double predicted_tpot_s = -1.0;
  // Prefill/decode disaggregation (issue 25): with prefill endpoints in the pool, ranked[]
  // holds decode-capable endpoints only, and `pd` says whether ranked[0] decodes after a
  // prefill on `prefill` (kDisaggregate) or serves the request alone. `prefill_tokens`:
  // the prefill work charged to `prefill` (pass both to OnPrefillDone when that leg ends).
  PdDecision pd = PdDecision::kOff;
  uint32_t prefill = 0xffffffffu;
  double prefill_tokens = 0.0;
  // What the request's session id or token did (SessionOutcome).
  SessionOutcome session = SessionOutcome::kNone;

  bool ok() const { return status.ok(); }
  const Endpoint& endpoint(std::size_t i) const { return *table->by_id[ranked[i]]; }
  bool disaggregated() const { return pd == PdDecision::kDisaggregate; }
  const Endpoint& prefill_endpoint() const { return *table->by_id[prefill]; }
};

// The session token a front end writes on a response served by `ep` (its
// SessionOptions::token_header): base64 of the endpoint's address, stable across reloads.
inline std::string SessionToken(const Endpoint& ep) { return EncodeSessionToken(ep.spec.address); }

class RoutingCore {
 public:
  // `log` receives one line per health transition and reload (may be empty). It is
  // called outside the scheduler's lock, on whichever thread noticed the transition.
  explicit RoutingCore(std::function<void(std::string_view)> log = {});
  ~RoutingCore();
  RoutingCore(const RoutingCore&) = delete;
  RoutingCore& operator=(const RoutingCore&) = delete;

  // Applies a configuration: builds the scheduler from options.scheduling (outside the
  // lock), maps endpoints to ids (surviving addresses keep theirs), then swaps. Returns
  // InvalidArgument ("field: message") when the scheduling spec is invalid or two
  // endpoints share an address; the running configuration is then unchanged.
  Status Configure(const CoreOptions& options, std::vector<EndpointSpec> endpoints,
                   double now_s);

  // A scrape of endpoint `id` (ids from table()). Ignored for ids not in the table.
  // Never takes the scheduler's lock.
  void OnScrape(uint32_t id, const ScrapeResult& result, double now_s);

  // KV-cache events of endpoint `id`, as its subscriber adapter decoded them (a batch in
  // sequence order, after any replay), and what the transport found: a gap (`repaired`
  // when replay filled it), a publisher restart (its sequence went back), an undecodable
  // batch. Applied to the precise index under its own lock (never the scheduler's); each
  // change of the endpoint's event state is logged once. Ignored for ids without
  // EndpointSpec::kv_events.
  void OnKvEvents(uint32_t id, const kvevents::KvEventBatch& batch, double now_s);
  void OnKvEventsGap(uint32_t id, bool repaired, double now_s);
  void OnKvEventsRestart(uint32_t id, double now_s);
  void OnKvEventsDecodeError(uint32_t id, double now_s);
  // A route receipt: the answer to a pick with PickResult::predicted_cached_tokens =
  // `predicted` (>= 0; ignored otherwise) on `endpoint_id` reported `reported` cached
  // prompt tokens (usage.prompt_tokens_details.cached_tokens; -1: the answer carried
  // none). Counted for kvroute_route_receipt* (error histogram, mispredicted requests).
  // Atomics, after one Published::load of the options (a mutex held for a reference count).
  void OnRouteReceipt(uint32_t endpoint_id, int64_t predicted, int64_t reported);
  // The index's view of endpoint `id` (state, counters, blocks).
  kvevents::EndpointEventStats KvEventStats(uint32_t id, double now_s) const;
  // True when some endpoint has KV-cache events configured: front ends then tokenize
  // requests (SchedRequest::token_ids) for precise picks.
  bool kv_events_active() const;

  // Ranks the endpoints for one request at `now_s`. On success the handle must get
  // OnFinished exactly once (also when the front end gives up before dispatching).
  PickResult Pick(const PickRequest& request, double now_s);

  void OnDispatched(sched::RequestHandle handle, uint32_t endpoint_id, double now_s);
  void OnFirstToken(sched::RequestHandle handle, double now_s);
  // The request has produced `generated_tokens` output tokens so far (cumulative, as the
  // stream shows them): Scheduler::OnTokens, for policies that follow generation. One
  // short exclusive section; front ends call it per streamed chunk or engine step.
  void OnTokens(sched::RequestHandle handle, int64_t generated_tokens, double now_s);
  // Releases the handle (kNoHandle: only counts) and counts the request under
  // `endpoint_id` (kNoEndpoint: answered without an endpoint) and `code` (HTTP status;
  // 499 for a client that left). `generated_tokens`: the answer's final token count when the
  // front end counted it only at the end (serve's and epp's streamed chunks), so it needs
  // no OnTokens call (and no second exclusive section); -1: the last OnTokens holds it.
  static constexpr uint32_t kNoEndpoint = 0xffffffffu;
  void OnFinished(sched::RequestHandle handle, uint32_t endpoint_id, int code, double now_s,
                  int64_t generated_tokens = -1);
  // A disaggregated pick's prefill leg on `prefill_id` ended (answered, failed or given
  // up): its `tokens` (PickResult::prefill_tokens) no longer count as queued prefill work
  // there. A front end that moves the leg to another prefill endpoint picks that one with
  // PickPrefill. With the pick's `handle`, the latency model takes the leg off that
  // endpoint's queue, and learns its TTFT when it `answered` at `now_s` (a leg moved by
  // PickPrefill is not learned).
  void OnPrefillDone(uint32_t prefill_id, double tokens, sched::RequestHandle handle = sched::kNoHandle,
                     bool answered = false, double now_s = 0.0);
  // Another prefill endpoint for a disaggregated request whose prefill leg failed on the
  // ones in `exclude`: the same rule as the pick's (core/routing/pd.h), charged the same
  // way. False when none is ready (the decode endpoint then prefills alone).
  bool PickPrefill(const sched::SchedRequest& request, uint32_t decode_id,
                   std::span<const uint32_t> exclude, PickResult& out);
  // How many TTFT and TPOT samples the latency model has learned from, and its prediction
  // errors (each dispatched pick's prediction against what came back). Lock-free.
  LatencyStats latency_stats() const;
  // An attempt on `endpoint_id` failed (counted by kind); a connect failure marks the
  // endpoint down until its next good scrape. Every failure counts toward passive outlier
  // ejection (CoreOptions::outlier): the endpoint's consecutive failures reaching the
  // threshold eject it (logged, counted) unless the panic threshold forbids it.
  void OnUpstreamFailure(uint32_t endpoint_id, const UpstreamFailure& failure, double now_s);
  // An attempt on `endpoint_id` got a response head below 500: its consecutive failures
  // start over. One Published::load of the endpoint slots (a mutex held for a reference
  // count), then one relaxed load when there were no failures.
  void OnAttemptSucceeded(uint32_t endpoint_id);
  // Whether a failed attempt may be retried on a fallback endpoint at `now_s`, under the
  // retry budget (CoreOptions::retry_budget); counts the retry when allowed, the denial
  // when not. `free`: the failed attempt never reached an engine (connect failure), so the
  // retry costs no generation work and is not charged to the budget.
  bool AllowRetry(double now_s, bool free);
  // Lifecycle decisions (core/routing/lifecycle.h): the front end reports what failed and
  // carries out the answer. OnAttemptFailed counts the failure (OnUpstreamFailure) and says
  // whether the request moves to the pick's next-ranked endpoint: only when nothing reached
  // the client, the failure is retryable, the client is still there, the pick has another
  // endpoint within the front end's attempt limit, and the retry budget allows it
  // (AllowRetry; a connect failure is free). OnPrefillFailed (after the front end's
  // OnPrefillDone for the failed leg): for the endpoint's fault, counts it, adds it to
  // `tried` and moves the leg to another prefill endpoint (PickPrefill) within the retry
  // budget; otherwise, or when none is ready, the decode endpoint prefills locally.
  AttemptDecision OnAttemptFailed(const AttemptFailure& failure, double now_s);
  PrefillDecision OnPrefillFailed(const PrefillFailure& failure, double now_s);
  // A reload was rejected before reaching Configure (bad file).
  void OnReloadFailed();

  // Up to `max` endpoint ids usable at `now_s` (round-robin start), for requests that
  // need any endpoint (GET /v1/models). Returns how many were written.
  std::size_t AnyUsable(double now_s, uint32_t* out, std::size_t max);
  // An endpoint that is not down at `now_s` (round-robin start), from published health
  // only: no scheduler lock, fit for a request's path (the replica asked to tokenize a
  // prompt). kNoEndpoint when every endpoint is down or there is none.
  uint32_t AnyUp(double now_s) const;
  // True when at least one endpoint's metrics are fresh (readiness).
  bool Ready(double now_s) const;

  // The pool's load at `now_s` from published state, after folding in pending scrapes (a
  // short exclusive section of the scheduler lock, as a pick's), for the ext_proc
  // picker's shedding decision and its pool gauges. An endpoint is ready when its metrics
  // are fresh and it is not down or ejected; a ready endpoint is saturated when, with the
  // router's in-flight estimate added, waiting >= 5 or KV usage >= 0.8 (the reference
  // picker's saturation detector: max(waiting/5, kv/0.8) >= 1), except that a queue waiting
  // for adapter slots (metrics::AdapterBound) is not saturation: room 1 there.
  struct PoolLoad {
    std::size_t endpoints = 0;   // in the table
    std::size_t ready = 0;
    std::size_t saturated = 0;   // among the ready ones
    double kv_usage_sum = 0.0;   // over ready endpoints whose KV usage is known
    std::size_t kv_known = 0;
    double waiting_sum = 0.0;    // over ready endpoints whose queue is known
    std::size_t waiting_known = 0;
    // The detector's room: over ready endpoints that are not saturated, the requests each
    // can take before its waiting reaches 5 (ceil(5 - waiting); 1 when its queue is
    // unknown). What flow control may release at once.
    int64_t room = 0;
    int64_t max_room = 0;  // the most room one endpoint has
    // The endpoint with the most room (lowest id on ties); kNoEndpoint when none has any.
    uint32_t roomiest = 0xffffffffu;
    // No ready endpoint, or every ready one saturated: sheddable requests get 429.
    bool saturated_pool() const { return ready == 0 || saturated == ready; }
  };
  // Folds in pending scrapes first (a short exclusive section, as a pick does).
  PoolLoad Load(double now_s);

  // What the peers' admission reads of each endpoint in the pool (flow/peer_admission.h):
  // every endpoint not down or ejected, with its last scrape's values as scraped (no
  // in-flight estimate: the peers' detectors read metrics) and the scheduler's count of
  // its active prefill tokens (-1 when the policy keeps none: only dynamo-* do).
  struct PeerSignal {
    uint32_t id = 0;
    double scraped_at_s = -1.0;  // < 0: never scraped
    bool kv_known = false, waiting_known = false;
    double kv_usage = 0.0, waiting = 0.0;
    int64_t active_prefill_tokens = -1;
  };
  // Fills `out` (cleared first). Folds in pending scrapes first, as Load does.
  void PeerSignals(double now_s, std::vector<PeerSignal>& out);

  // The pool as a picker's /metrics reports it (llm_d_epp_* and inference_pool_*): over
  // the ready endpoints (fresh, not down, not ejected), the mean and spread of each known
  // signal (KV usage and queue with the in-flight estimate, running as scraped) and each
  // one's queue. Copies each endpoint's state under its lock: for rendering, not for the
  // request path.
  struct Moments {
    std::size_t n = 0;
    double sum = 0.0, sum_sq = 0.0;
    void Add(double x) {
      ++n;
      sum += x;
      sum_sq += x * x;
    }
    double Mean() const { return n ? sum / static_cast<double>(n) : 0.0; }
    // Population standard deviation; 0 below two values.
    double StdDev() const;
  };
  struct PoolGauges {
    std::size_t ready = 0;
    std::size_t saturated = 0;  // of the ready ones, by the detector's rule (Load)
    Moments kv_usage, waiting, running;
    struct Queue {
      std::string name, address;
      double waiting = 0.0;  // NaN: unknown
    };
    std::vector<Queue> queues;  // ready endpoints, by id
  };
  PoolGauges Gauges(double now_s);

  // Flow control's prefix probe (Scheduler::PrefixKey / HeldBlocks), under the shared side
  // of the scheduler lock: a waiting request's chain, computed once, and how many of its
  // leading blocks endpoint `endpoint_id` holds by what the policy has learned. A chain
  // computed before a reload that changed the hashing simply matches less. 0 without a
  // configured policy or one without a hashed prefix model.
  void PrefixKey(const sched::SchedRequest& request, std::vector<uint64_t>& out) const;
  std::size_t HeldBlocks(std::span<const uint64_t> key, uint32_t endpoint_id) const;

  // Flow control by predicted miss (issue 24): how long `request` (its prefix chain `key`)
  // may still wait at the router and meet its TTFT objective, in seconds (>= 0): the
  // objective (the request's, else the pool default) minus the latency model's TTFT for it
  // on the ready endpoint holding most of its chain (ties: the fewest requests queued by
  // the router), in that endpoint's present state; the objective alone when the model has
  // no prediction. nullopt when the request has no objective.
  struct SloBudget {
    double wait_s = 0.0;     // >= 0
    bool predicted = false;  // the model predicted (else wait_s is the whole objective)
    double objective_s = 0.0;  // the objective it was computed from
  };
  std::optional<SloBudget> SloWaitBudget(const sched::SchedRequest& request,
                                         std::span<const uint64_t> key) const;

  std::shared_ptr<const EndpointTable> table() const { return table_.load(); }
  // The verdict of endpoint `id` at `now_s` (from published state; no scheduler lock).
  health::Verdict Health(uint32_t id, double now_s) const;
  std::string_view policy() const;
  uint64_t reloads() const;
  // Picks counted under a session outcome (kvroute_session_picks_total), and session ids
  // bound (expired ones count until a lookup, a bind in their shard or AppendMetrics drops
  // them).
  uint64_t session_picks(SessionOutcome outcome) const;
  std::size_t sessions() const;

  // Appends the router's metrics: requests by endpoint and code, upstream errors, retries,
  // pick failures, the scheduling-time histogram, scorer summaries, reloads, and per
  // endpoint its scraped and adjusted load, in-flight count, scrape age, health and
  // whether each signal is known (kvroute_endpoint_signal_known{signal}); an unknown
  // value is written as NaN, never as 0. Locality: kvroute_locality_picks_total{decision},
  // kvroute_locality_spill_ratio, kvroute_locality_spilling,
  // kvroute_locality_spills_started_total, kvroute_locality_requests_total{region} and
  // kvroute_locality_rtt_seconds{region,source} (docs/REGIONS.md, "Live router").
  void AppendMetrics(std::string& out, double now_s) const;

  // A measured (smoothed) round trip to `region`, in seconds, used by the scheduler from
  // the next pick on unless CoreOptions::region_rtt_s configures that region (the
  // configured value wins; the measured one is still kept and reported). Remembered
  // across Configure: a new scheduler gets every measured value again. A negative or
  // non-finite value forgets the region's measurement. Takes the scheduler's lock
  // exclusively (call it at a measurement's pace, not per request).
  void SetRegionRtt(std::string_view region, double seconds);
  // The measured round trips as last set (region, seconds), in region order.
  std::vector<std::pair<std::string, double>> measured_rtt() const;

  // Injects the monotonic clock (seconds) used only to time Scheduler::Pick for the
  // scheduling histogram; the core reads no clock of its own. Without one the histogram
  // stays empty.
  void set_pick_timer(std::function<double()> seconds);

 private:
  struct Slot;         // per endpoint id: published scrape state and health inputs
  struct SchedState;   // guarded by sched_mu_

  void SyncLocked(double now_s, std::vector<std::string>* logs);
  void RefreshHealthLocked(double now_s, std::vector<std::string>* logs);
  void UpdateStatsLocked(uint32_t id);
  // Slot health at `now_s` with its ejection applied. Caller holds the slot's mutex.
  static health::Verdict AssessSlot(const Slot& slot, double now_s, const health::HealthOptions& h);
  void MarkDirty(uint32_t id, Slot& slot);
  void MaybeEject(uint32_t id, Slot& slot, std::string_view kind, double now_s);
  // The front end's ranking: hinted endpoints (not down) first, then the scheduler's.
  // Caller holds sched_mu_ (either side).
  // Returns how many endpoints the hints placed.
  std::size_t RankLocked(const PickRequest& request, const sched::PickResult& r, PickResult& out) const;
  // The share of the prompt the policy's prefix model believes cached on `id` (its first
  // prefix row in `r`); 0 for policies without a prefix model or ids not ranked. Caller
  // holds sched_mu_.
  double CachedShareLocked(const sched::PickResult& r, uint32_t id) const;
  // After a pick in a pool with prefill endpoints: the decision and the prefill endpoint
  // (PdCoordinator). Caller holds sched_mu_ exclusively.
  void PdLocked(const sched::SchedRequest& req, const sched::PickResult& r, PickResult& out);
  // The first ranked endpoint recorded as sent: the scheduler's accounting and the latency
  // model's predictions (LatencyFeed). Caller holds sched_mu_ exclusively.
  void DispatchFirstLocked(const sched::SchedRequest& req, const sched::PickResult& r, PickResult& out,
                           double now_s);
  void Log(std::vector<std::string>& logs);
  // Configure's first step: ids for the new endpoint set.
  struct NewTable;
  NewTable AssignIds(std::vector<EndpointSpec> endpoints, const EndpointTable& old_table);
  // AppendMetrics's per-endpoint section: each endpoint's row copied from its slot.
  void AppendEndpointMetrics(std::string& out, const EndpointTable& table, double now_s) const;

  std::function<void(std::string_view)> log_;
  Published<EndpointTable> table_;
  Published<CoreOptions> options_;

  // Slots by id; the vector is replaced (copy-on-write) only by Configure, under
  // config_mu_. Readers load the pointer.
  Published<std::vector<std::shared_ptr<Slot>>> slots_;
  std::atomic<uint64_t> scrape_epoch_{0};
  // Ids that scraped since the last sync (each at most once: Slot::dirty).
  std::mutex dirty_mu_;
  std::vector<uint32_t> dirty_;

  std::mutex config_mu_;  // serialises Configure calls (never held by a pick)
  // Shared: concurrent Rank calls (schedulers with concurrent_picks). Exclusive: everything
  // that changes the scheduler's state (commits, lifecycle calls, folding in scrapes).
  mutable RwSpinLock sched_mu_;
  std::unique_ptr<SchedState> sched_;  // guarded by sched_mu_
  struct ScratchPool;  // per-pick buffers for concurrent picks, leased lock-free
  std::unique_ptr<ScratchPool> scratch_;
  // Whether a pick at `now_s` must fold in scrapes or re-judge health first (lock-free).
  bool SyncDue(double now_s) const;
  // When due, folds in the scrapes since the last sync (a short exclusive section) and logs
  // what changed: the views' first step (Load, PeerSignals).
  void FoldPendingScrapes(double now_s);

  // The components (see the table at the top), made by the constructor, never replaced.
  // The KV-cache event input: the precise prefix index behind its own lock (event batches
  // never take the scheduler's). Order: sched_mu_ before the index's lock when both are
  // held (a pick ranks under both shared sides); never the other way round.
  std::unique_ptr<KvEventInput> events_;
  // P/D: its state guarded by sched_mu_.
  std::unique_ptr<PdCoordinator> pd_;
  // Session bindings (its own sharded locks; never held with sched_mu_).
  std::unique_ptr<SessionAffinity> sessions_;
  // The latency model's trainer: guarded by sched_mu_; its published counters lock-free.
  std::unique_ptr<LatencyFeed> latency_;
  // The router's own counters and exposition sections.
  std::unique_ptr<CoreMetrics> metrics_;

  std::mutex eject_mu_;  // serialises ejection decisions (the panic threshold's count)
  mutable std::atomic<uint64_t> models_rr_{0};
  // Measured round trips (SetRegionRtt), sorted by region. Written under sched_mu_
  // exclusively; published for AppendMetrics.
  Published<std::vector<std::pair<std::string, double>>> measured_rtt_;
};

}  // namespace kvroute::routing
