// The discrete-event simulator behind `kvroute simulate`: N engine::Engine replicas in
// front of one routing::RoutingCore, the core `kvroute serve` and `kvroute epp` ship,
// driven in virtual time (no sockets, no sleeps, no threads). simulate is the core's third
// front end: it translates its events into the core's calls exactly as serve translates
// HTTP, and keeps no routing rule of its own.
//
// What happens, in virtual time:
//   - a client sends each request at its arrival time (later if it is a follow-up turn
//     waiting for its previous turn plus think time, or if max_concurrency is reached);
//   - with flow control on, the request is admitted by a flow::FlowGate over the core (the
//     gate serve and epp use), and may wait there;
//   - the core picks (RoutingCore::Pick, dispatch recorded with the pick); the request
//     reaches the replica its group's network_delay_s later and is queued in its engine;
//   - each replica runs engine steps back to back while it has work; a step's tokens reach
//     the client and the core (OnFirstToken, OnTokens, OnFinished) the same
//     network_delay_s after the step ends (symmetric: a replica d away adds 2d to TTFT and
//     to E2E beyond what its engine took);
//   - every scrape_interval_s the router scrapes every replica: its engine's state reaches
//     the core as a scrape result (RoutingCore::OnScrape: KV usage, queue, running,
//     prefix and preemption counters, block size and blocks, as vLLM's /metrics carries
//     them); a replica that is down refuses the scrape (a connect failure). The core sees
//     stale figures between scrapes, as in life, and applies its own health, staleness,
//     restart detection, outlier ejection and panic rule;
//   - a refused connection or a request dropped by a crash or restart is an upstream
//     failure (RoutingCore::OnUpstreamFailure); before the first token it is retried on
//     the pick's next-ranked endpoint under serve's default retries.max_attempts and the
//     core's retry budget (RoutingCore::AllowRetry: a refused connection retries free),
//     after it the stream ends with an error, as serve's SSE error frame.
// KV-cache events (scenario kv_events.enabled): engines record the events vLLM would
// publish; each step's are one batch, carried to the core(s) by a simulated transport
// (delay, loss, replay; event_transport.h, scenario_config.h) and applied with
// RoutingCore::OnKvEvents / OnKvEventsGap / OnKvEventsRestart; every pick carries the
// request's engine token ids, so kvroute's prefix scorer is precise where events are live.
// The report's kv_events block counts batches, losses, gaps and the route receipts' error.
// Router replicas (scenario router.replicas): one core per replica, seeds differing,
// requests round-robin in send order, each request's lifecycle on the core that picked
// it, every scrape and event batch to every core. The tap (CoreTap) sees every call but
// the KV-event ones, each with the core it went to.
// Prefill/decode disaggregation (fleet groups' `role`, scenario `pd:`; scenario_config.h,
// "P/D"): a disaggregated pick's prefill leg runs on its prefill replica (max_tokens 1,
// blocks held for the lease), RoutingCore::OnPrefillDone when its answer reaches the
// router, then the decode leg on the decode replica waits for its KV pull
// (engine::PlanKvPull); a failed prefill leg moves with RoutingCore::PickPrefill or is
// prefilled locally, as in serve. The report's `pd` block counts decisions and legs and
// compares requests served disaggregated with the others.
// The core runs with a default RouterConfig's options (config::CoreOptionsFrom), the
// scenario's policy, seed and router region. Deterministic: same scenario, policy and
// seed give the same report.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/scenario_config.h"
#include "core/common/status.h"
#include "core/flow/flow_queue.h"
#include "simkit/report/summary.h"
#include "core/routing/routing_core.h"
#include "core/sched/scheduler.h"

namespace kvroute::simulate {

struct SimulationResult {
  report::PolicyReport report;
  std::string error;   // non-empty when the policy could not be built
  int64_t events = 0;  // events processed
  int64_t steps = 0;   // engine steps run, all replicas
  // One record per request, in completion order (send_s is the actual send time).
  std::vector<report::RequestRecord> records;
};

// Progress: virtual time, requests sent, requests finished. Called every few thousand
// events; may be empty.
using ProgressFn = std::function<void(double now_s, int64_t sent, int64_t finished)>;

// Runs `scenario` under `policy` (a sched::PolicyNames() entry, or one followed by
// "+flow": that policy with flow control on, whatever scenario.flow.enabled says; or by
// "+admission": a peer with its own admission turned on (GateOptions); or a local-only
// run, see BasePolicy). The report's `regions` count requests by the region
// of the replica that served them.
// `oracle_hit_rate` is copied into the report (pass ComputeOracleHitRate's value, or -1).
//
// Flow control (scenario.flow.enabled, or the "+flow" suffix on the policy or label): an
// arriving request is admitted by a flow::FlowGate over the core with the scenario's
// flow options, as serve admits it: the gate reads the core's saturation detector
// (RoutingCore::Load), releases waiting requests after every completion (bound late to
// the replica that freed), every scrape and at their expiry, each picked at that moment.
// Sheddable rejections and TTL expiries end as errors of kind shed (no_endpoint for the
// no-endpoint TTL); the report's flow_* and router_wait_* fields and, with tenants, its
// per-tenant rows count them.
SimulationResult RunSimulation(const config::Scenario& scenario, const std::string& policy,
                               double oracle_hit_rate, const ProgressFn& progress = {});

// `policy` without a trailing "+flow" or "+admission" (the name to build).
std::string PolicyWithoutFlow(const std::string& policy);

// The admission gate a run of `label` gets: kvroute's flow control with the scenario's
// options (scenario.flow.enabled or "+flow"); a peer's own admission as that peer
// configures it ("<peer>+admission": flow::PeerAdmissionOf, with the fleet's
// max_num_batched_tokens; InvalidArgument for a policy without one); the admission a
// peer ships on (llm-d-*: sheddable requests refused while saturated) when the scenario
// has a sheddable tenant; else none (nullopt, error Ok).
std::optional<flow::FlowOptions> GateOptions(const config::Scenario& scenario,
                                             const std::string& label, Status* error);

// Local-only runs: "<name>+local-only" (optionally followed by "+flow") runs <name> on
// the replicas of the router's region alone (LocalOnlyScenario); "local-only" alone is
// "kvroute+local-only". BasePolicy: the sched::PolicyNames() entry to build (both
// suffixes removed; "kvroute" for "local-only"). IsLocalOnly: whether it is such a run.
std::string BasePolicy(const std::string& policy);
bool IsLocalOnly(const std::string& policy);

// `scenario` with only its local fleet groups (region empty or scenario.router_region):
// the remote groups, and the faults on their replicas, removed; the remaining faults'
// replica ids renumbered; fleet.replicas the local total. Into `*out`; InvalidArgument
// saying why not (no router region, no local replica), and `*out` is then unspecified.
Status LocalOnlyScenario(const config::Scenario& scenario, config::Scenario* out);

// The router's side of locality (issue 10) into `opts`: region = scenario.router_region;
// region_rtt_s = each remote region's round trip, twice its groups' network_delay_s (the
// largest when its groups differ); both empty without a router region.
void ApplyRouterRegion(const config::Scenario& scenario, routing::CoreOptions* opts);

// The core's endpoints for `scenario`'s replicas, replica i as endpoint i: address and
// name "replica-<i>", and its group's region, zone and P/D role as labels (as `labels:
// {region: R, zone: Z, llm-d.ai/role: prefill}` on a configured endpoint of `kvroute serve`).
std::vector<routing::EndpointSpec> SimulationEndpoints(const config::Scenario& scenario);

// The routing core's options RunSimulation runs `policy` with on `scenario`: a default
// RouterConfig's (config::CoreOptionsFrom: staleness, outlier ejection, retry budget,
// serve's ranking depth), the policy as the scheduling spec, the scenario's seed, and the
// router's region and round trips (ApplyRouterRegion).
routing::CoreOptions SimulationCoreOptions(const config::Scenario& scenario,
                                           const std::string& policy);

// One call the simulator made into the routing core, in order, for tests that replay a
// run against a RoutingCore directly (RunSimulationWith's `tap`).
struct CoreCall {
  enum class Kind : uint8_t {
    kScrape,            // OnScrape(endpoint, scrape, t)
    kPick,              // Pick({request, dispatch_first}, t) -> ranked (empty: failed)
    kDispatched,        // OnDispatched(handle, endpoint, t)
    kFirstToken,        // OnFirstToken(handle, t)
    kTokens,            // OnTokens(handle, value, t)
    kFinished,          // OnFinished(handle, endpoint, value = code, t)
    kAttemptSucceeded,  // OnAttemptSucceeded(endpoint)
    kAttemptFailed,     // OnAttemptFailed({endpoint, {kind, flag = connect failed}, attempt,
                        //   n_ranked, max_attempts, started}, t) -> allowed = retry
    // P/D (issue 25).
    kPrefillDone,       // OnPrefillDone(endpoint = prefill, tokens, handle, flag = answered, t)
    kPrefillFailed,     // OnPrefillFailed({endpoint = the failed prefill, {kind, flag},
                        //   server_fault, request, decode, tried = exclude}, t) -> allowed =
                        //   moved, prefill and tokens its answer
  };
  Kind kind = Kind::kPick;
  uint32_t core = 0;  // the router replica whose core was called (router.replicas)
  double t = 0.0;
  uint32_t endpoint = routing::RoutingCore::kNoEndpoint;
  sched::RequestHandle handle = sched::kNoHandle;
  int64_t value = 0;
  bool flag = false;
  bool allowed = false;
  std::string failure_kind;
  routing::ScrapeResult scrape;
  // kPick and kPrefillFailed: the request as the core saw it, and what it answered.
  std::string model, prompt;
  int64_t max_tokens = -1, prompt_tokens = -1;
  std::vector<uint32_t> ranked;
  // P/D: kPick's decision, and the prefill endpoint and its charged tokens (kPick when it
  // disaggregates, kPrefillFailed when the leg moved, kPrefillDone); kPrefillFailed's
  // exclusions (the prefill endpoints tried before).
  routing::PdDecision pd = routing::PdDecision::kOff;
  uint32_t prefill = routing::RoutingCore::kNoEndpoint;
  double tokens = 0.0;
  std::vector<uint32_t> exclude;
  // kAttemptFailed: where the request stood; kPrefillFailed: whose fault, and the decode
  // endpoint the new prefill pairs with.
  uint32_t attempt = 0, n_ranked = 0, max_attempts = 0;
  bool started = false, server_fault = false;
  uint32_t decode = routing::RoutingCore::kNoEndpoint;
};
using CoreTap = std::function<void(const CoreCall&)>;

// Runs `scenario` on a core configured with `options` (SimulationCoreOptions, perhaps with
// a custom scheduling spec or CoreOptions::scheduler_factory); `label` names it in the
// report. A label with "+flow" or "+local-only" applies them as RunSimulation does.
// `tap`, when set, sees every call into the core (CoreCall).
SimulationResult RunSimulationWith(const config::Scenario& scenario,
                                   const routing::CoreOptions& options, const std::string& label,
                                   double oracle_hit_rate, const ProgressFn& progress = {},
                                   const CoreTap& tap = {});

// The workload's oracle prefix hit rate (simkit/workload/oracle.h): requests in generation
// order, each prompt queried then recorded together with its output (a later turn may
// reuse it). Independent of the policy.
double ComputeOracleHitRate(const config::Scenario& scenario);

}  // namespace kvroute::simulate
