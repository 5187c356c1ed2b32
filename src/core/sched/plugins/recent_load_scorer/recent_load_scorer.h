// recent-load-scorer (registry.h for parameters, docs/POLICIES.md).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// recent-load-scorer's parameters.
struct RecentLoadParams {
  double half_life_s = 10.0;
  double min_spread = 2.0;
};

// Traffic over the last several seconds, not only at this instant: an exponentially
// decayed count of the requests dispatched to each endpoint (halving every half_life_s).
// Score = 1 - (c - min) / (max - min + min_spread) over the candidates.
// Why: prefix affinity keeps a prompt group on the replica it first went to, and a group
// seen for the first time matches nowhere. Between bursts a replica that already serves
// five groups looks as idle as one serving one (vLLM's KV usage leaves out the cached
// blocks of finished requests, and nothing is in flight), so the random tie-break kept
// handing new groups to it; later several of its groups' long answers ran at once, filled
// its KV, and requests queued there for seconds (kvroute demo: TTFT p99 2.5 s, issue 12).
// The decayed count remembers which replica the recent traffic went to, so new groups go
// to the least-used one; it is small against a real prefix match.
// Role kOther (its own dispatch history, not a scraped load); reads nothing from
// EndpointState::engine.
class RecentLoadScorer : public Configured<Scorer, RecentLoadParams> {
 public:
  using Configured::Configured;
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;
  int64_t OnDispatched(const PendingRequest& req, const EndpointState& endpoint,
                       double now_s) override;
  void OnEndpointRemoved(uint32_t endpoint_id) override;
  void AdoptStateFrom(Plugin& previous) override;
  // Endpoint `id`'s decayed count at `now_s` (0 for one never dispatched to).
  double CountAt(uint32_t id, double now_s) const;

 private:
  struct Count {
    double value = 0.0;
    double at_s = 0.0;
  };
  std::vector<Count> counts_;  // by endpoint id
};

// Parameters halfLifeSeconds (10) and minSpread (2).
PluginFactory RecentLoadScorerFactory();

}  // namespace kvroute::sched
