// The peers' admission as they ship it (issue 42, item 6), as rules over what the routing
// core knows of each endpoint (RoutingCore::PeerSignal), so `kvroute simulate` can compare
// kvroute's flow control with each peer's own and not with peers that never hold or refuse
// anything. FlowGate applies them when FlowOptions::admission names a peer; the sources and
// versions are in docs/POLICIES.md, "The peers' admission as shipped".
//
// llm-d Router (llm-d/llm-d-router at ebab687; the same at v0.10.0):
//   Its saturation detector (`utilization-detector`) scores each endpoint of the pool
//   max(waiting / 5, KV usage / 0.8) from its scraped metrics, 1 when they are missing or
//   older than 200 ms, and the pool by the mean of those scores.
//   * As shipped (flow control off: the legacy admission controller), a sheddable request
//     (priority < 0) is refused (429) while the pool's score is >= 1; every other request
//     goes at once. Nothing waits. (kLlmdShedOnly)
//   * With flow control on, every request is queued by priority band (strict between
//     bands, one global FCFS order inside, 60 s TTL, 5,000 requests and 1 GB per band);
//     the dispatch loop releases the head while the pool's score is < 1 and stops (head of
//     line) at >= 1. The score moves only when metrics do, so between scrapes a score
//     below 1 lets the whole queue go. Nothing is refused for being sheddable.
//     (kLlmdFlowControl)
// Dynamo (ai-dynamo/dynamo's KV router and frontend, docs v1.3-v1.7):
//   A worker is busy while the router's own count of its active prefill tokens (dispatched,
//   no first token yet) exceeds --router-queue-threshold x its max_num_batched_tokens. A
//   request is parked only while every worker is busy, in one FCFS queue (priorities are
//   not read), with no TTL, and released as prefills complete or requests finish. With
//   --active-decode-blocks-threshold set, a request is refused with 529 while every
//   worker's KV usage is above it. Both are off by default in the newest releases; the
//   `+admission` variant turns on the queue at threshold 2.0 (the lowest default it shipped
//   with before v1.4) and rejection at the docs' example 0.85. (kDynamoQueue)
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "core/flow/flow_queue.h"
#include "core/routing/routing_core.h"

namespace kvroute::flow {

// The admission a peer policy gets: `turned_on` is its `+admission` variant (the peer's own
// admission as that peer configures it). nullopt: the policy has no such thing (plain:
// admits everything at once, as without a gate; +admission: not a peer with admission).
// llm-d-sticky, llm-d-precise: kLlmdShedOnly plain, kLlmdFlowControl turned on;
// dynamo-kv: nothing plain, kDynamoQueue turned on.
std::optional<Admission> PeerAdmissionOf(std::string_view policy, bool turned_on);

// FlowOptions for a peer's admission: its queue as it configures it (TTL, fairness,
// ordering, bands) and the detector parameters above; kvroute's own extras (late
// binding, prediction, sheddable reserve) off. `max_batched_tokens`: the workers'
// max_num_batched_tokens (Dynamo reads it from each worker's runtime config).
FlowOptions PeerFlowOptions(Admission admission, int64_t max_batched_tokens = 8192);

// llm-d's pool saturation over `pool` at `now_s` (the mean score above); 1 for an empty
// pool, as llm-d's detector says.
double LlmdSaturation(const FlowOptions& o, std::span<const routing::RoutingCore::PeerSignal> pool,
                      double now_s);

// Dynamo: every worker busy by its active prefill tokens (an endpoint whose policy keeps no
// count is never busy); false for an empty pool.
bool DynamoAllBusy(const FlowOptions& o, std::span<const routing::RoutingCore::PeerSignal> pool);
// Dynamo's rejection: every worker's KV usage known and above reject_kv (off at 0); false
// for an empty pool.
bool DynamoRejects(const FlowOptions& o, std::span<const routing::RoutingCore::PeerSignal> pool);

// The pool as the peer's admission sees it: kEmpty with no endpoint, kSaturated when its
// detector says so (llm-d: score >= 1; Dynamo: every worker busy), else kAvailable.
PoolState PeerPoolState(const FlowOptions& o, std::span<const routing::RoutingCore::PeerSignal> pool,
                        double now_s);

}  // namespace kvroute::flow
