// The discrete-event simulator behind `kvroute simulate`: N engine::Engine replicas and
// one sched::Scheduler driven in virtual time, with the same code the live router and
// simulator run (no sockets, no sleeps, no threads).
//
// What happens, in virtual time:
//   - a client sends each request at its arrival time (later if it is a follow-up turn
//     waiting for its previous turn plus think time, or if max_concurrency is reached);
//   - the scheduler picks a replica at once (Pick, then OnDispatched); the request
//     reaches the replica its group's network_delay_s later and is queued in its engine;
//   - each replica runs engine steps back to back while it has work; a step's tokens
//     reach the client (and the router: OnFirstToken, OnTokens, OnFinished) the same
//     network_delay_s after the step ends (symmetric: a replica d away adds 2d to TTFT
//     and to E2E beyond what its engine took);
//   - every scrape_interval_s the router scrapes every replica: EndpointState kv_usage,
//     waiting and running change only then (the scheduler sees stale figures between
//     scrapes, as in life), followed by OnMetricsUpdated.
// Deterministic: same scenario, policy and seed give the same report.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/report/summary.h"
#include "core/sched/scheduler.h"
#include "config/scenario_config.h"

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
// "+flow": that policy with flow control on, whatever scenario.flow.enabled says; or a
// local-only run, see BasePolicy). The report's `regions` count requests by the region
// of the replica that served them.
// `oracle_hit_rate` is copied into the report (pass ComputeOracleHitRate's value, or -1).
//
// Flow control (scenario.flow.enabled, or the "+flow" suffix on the policy or label): an
// arriving request is admitted by a flow::FlowQueue against the saturation detector over
// the router's view (endpoints as last scraped, adjusted by the scheduler's in-flight
// accounting as RoutingCore::Load does: a healthy replica with waiting >= 5 or KV usage
// >= 0.8 is saturated; all saturated is kSaturated, none healthy kEmpty). Queued requests
// are released after every completion, every scrape and at their expiry (Expire, then
// NextToDispatch while the view has room), each picked at that moment. Sheddable
// rejections and TTL expiries end as errors of kind shed (no_endpoint for the
// no-endpoint TTL); the report's flow_* and router_wait_* fields and, with tenants, its
// per-tenant rows count them. No prefix probe yet: release order is the queue's own.
SimulationResult RunSimulation(const config::Scenario& scenario, const std::string& policy,
                               double oracle_hit_rate, const ProgressFn& progress = {});

// `policy` without a trailing "+flow" (the name to build).
std::string PolicyWithoutFlow(const std::string& policy);

// Local-only runs: "<name>+local-only" (optionally followed by "+flow") runs <name> on
// the replicas of the router's region alone (LocalOnlyScenario); "local-only" alone is
// "kvroute+local-only". BasePolicy: the sched::PolicyNames() entry to build (both
// suffixes removed; "kvroute" for "local-only"). IsLocalOnly: whether it is such a run.
std::string BasePolicy(const std::string& policy);
bool IsLocalOnly(const std::string& policy);

// `scenario` with only its local fleet groups (region empty or scenario.router_region):
// the remote groups, and the faults on their replicas, removed; the remaining faults'
// replica ids renumbered; fleet.replicas the local total. Into `*out`; returns "" on
// success, else why not (no router region, no local replica) and `*out` is unspecified.
std::string LocalOnlyScenario(const config::Scenario& scenario, config::Scenario* out);

// The router's side of locality (issue 10) into `opts`: region = scenario.router_region;
// region_rtt_s = each remote region's round trip, twice its groups' network_delay_s (the
// largest when its groups differ); both empty without a router region.
void ApplyRouterRegion(const config::Scenario& scenario, sched::SchedulerOptions* opts);

// The scheduler options RunSimulation builds policies with for `scenario`: the scenario's
// seed, one ranked endpoint (the simulator never retries), the fleet's block size and KV
// blocks as defaults, the router's region and round trips (ApplyRouterRegion).
sched::SchedulerOptions SimulationSchedulerOptions(const config::Scenario& scenario);

// Runs `scenario` with a scheduler the caller built (a custom plugin profile, say, from
// sched::BuildScheduler with SimulationSchedulerOptions); `label` names it in the report.
// `scheduler` must be fresh (no requests yet) and is only used during the call. A label
// with "+flow" or "+local-only" applies them as RunSimulation does.
SimulationResult RunSimulationWith(const config::Scenario& scenario, sched::Scheduler& scheduler,
                                   const std::string& label, double oracle_hit_rate,
                                   const ProgressFn& progress = {});

// The workload's oracle prefix hit rate (workload/oracle.h): requests in generation
// order, each prompt queried then recorded together with its output (a later turn may
// reuse it). Independent of the policy.
double ComputeOracleHitRate(const config::Scenario& scenario);

}  // namespace kvroute::simulate
