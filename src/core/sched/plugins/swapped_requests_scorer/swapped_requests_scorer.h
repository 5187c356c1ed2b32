// swapped-requests-scorer (docs/POLICIES.md): prefers endpoints with fewer requests whose
// KV cache vLLM swapped out to CPU memory (vllm:num_requests_swapped, vLLM V0's engine):
// a swapping engine is out of GPU KV memory, and each swapped request waits for a swap-in
// before it runs again.
#pragma once

#include <cstdint>
#include <span>

#include "core/metrics/engine_metrics.h"
#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// 1 / (1 + swapped) per candidate, from EndpointState::engine. An endpoint whose scrape
// did not carry the gauge (a V1 engine), or whose value is stale or garbage, scores 0.5:
// unknown is neither the best nor excluded (the core hides a stale value; see
// consumed_fields). Role kOther; consumes EngineMetrics::kSwapped.
class SwappedRequestsScorer : public Scorer {
 public:
  uint32_t consumed_fields() const override { return metrics::EngineMetrics::kSwapped; }
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
};

// No parameters.
PluginFactory SwappedRequestsScorerFactory();

}  // namespace kvroute::sched
