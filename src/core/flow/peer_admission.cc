#include "core/flow/peer_admission.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvroute::flow {

std::optional<Admission> PeerAdmissionOf(std::string_view policy, bool turned_on) {
  if (policy == "llm-d-sticky" || policy == "llm-d-precise") {
    return turned_on ? Admission::kLlmdFlowControl : Admission::kLlmdShedOnly;
  }
  if (policy == "dynamo-kv" && turned_on) return Admission::kDynamoQueue;
  return std::nullopt;
}

FlowOptions PeerFlowOptions(Admission admission, int64_t max_batched_tokens) {
  FlowOptions o;
  o.admission = admission;
  o.slo_aware = false;
  o.affinity_window = 1;  // no late binding: the order alone
  o.sheddable_reserve = 0;
  o.fairness = Fairness::kGlobal;
  o.ordering = Ordering::kFcfs;
  o.dynamo_max_batched_tokens = std::max<int64_t>(1, max_batched_tokens);
  switch (admission) {
    case Admission::kKvroute:
      return FlowOptions{};
    case Admission::kLlmdShedOnly:
      break;  // sheddable below 0, as the queue's default
    case Admission::kLlmdFlowControl:
      o.default_ttl_s = 60.0;
      o.no_endpoint_ttl_s = 60.0;  // llm-d: equal to the default TTL unless configured
      o.shed_below_priority = std::numeric_limits<int64_t>::min();  // every band may wait
      break;
    case Admission::kDynamoQueue:
      // No TTL in Dynamo's queue: a request waits until released (or its client leaves).
      o.default_ttl_s = 1e9;
      o.no_endpoint_ttl_s = 1e9;
      o.shed_below_priority = std::numeric_limits<int64_t>::min();
      break;
  }
  return o;
}

double LlmdSaturation(const FlowOptions& o, std::span<const routing::RoutingCore::PeerSignal> pool,
                      double now_s) {
  if (pool.empty()) return 1.0;
  double total = 0.0;
  for (const routing::RoutingCore::PeerSignal& p : pool) {
    const bool fresh = p.scraped_at_s >= 0 && now_s - p.scraped_at_s <= o.llmd_stale_s;
    if (!fresh || !p.kv_known || !p.waiting_known || !std::isfinite(p.kv_usage) ||
        !std::isfinite(p.waiting)) {
      total += 1.0;  // fail closed
      continue;
    }
    total += std::max(p.waiting / o.llmd_queue_depth, p.kv_usage / o.llmd_kv_threshold);
  }
  return total / static_cast<double>(pool.size());
}

bool DynamoAllBusy(const FlowOptions& o, std::span<const routing::RoutingCore::PeerSignal> pool) {
  if (pool.empty()) return false;
  const double limit =
      o.dynamo_queue_threshold * static_cast<double>(o.dynamo_max_batched_tokens);
  return std::all_of(pool.begin(), pool.end(), [&](const routing::RoutingCore::PeerSignal& p) {
    return p.active_prefill_tokens >= 0 && static_cast<double>(p.active_prefill_tokens) > limit;
  });
}

bool DynamoRejects(const FlowOptions& o, std::span<const routing::RoutingCore::PeerSignal> pool) {
  if (pool.empty() || !(o.dynamo_reject_kv > 0)) return false;
  return std::all_of(pool.begin(), pool.end(), [&](const routing::RoutingCore::PeerSignal& p) {
    return p.kv_known && std::isfinite(p.kv_usage) && p.kv_usage > o.dynamo_reject_kv;
  });
}

PoolState PeerPoolState(const FlowOptions& o, std::span<const routing::RoutingCore::PeerSignal> pool,
                        double now_s) {
  if (pool.empty()) return PoolState::kEmpty;
  switch (o.admission) {
    case Admission::kLlmdShedOnly:
    case Admission::kLlmdFlowControl:
      return LlmdSaturation(o, pool, now_s) >= 1.0 ? PoolState::kSaturated
                                                   : PoolState::kAvailable;
    case Admission::kDynamoQueue:
      return DynamoAllBusy(o, pool) ? PoolState::kSaturated : PoolState::kAvailable;
    case Admission::kKvroute:
      break;
  }
  return PoolState::kAvailable;
}

}  // namespace kvroute::flow
