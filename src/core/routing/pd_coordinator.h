// Prefill/decode disaggregation (issue 25) as a component of the routing core: the roles of
// the configured endpoints, the decider's call for each pick in a pool with prefill
// endpoints, the prefill endpoint's choice (the rules are pd.h's), the prefill work sent to
// each endpoint and not yet answered (the choice's queue term), the pairs chosen, and their
// /metrics series. RoutingCore owns one and calls it from Configure, its pick's commit,
// PickPrefill, OnPrefillDone, the health refresh (with prefill endpoints in the pool a
// prefill-only endpoint is no pick's candidate) and AppendMetrics.
//
// Threads: no lock of its own. Its state is guarded by the core's scheduler lock: the caller
// holds it exclusively for every call that changes it (Configure, DecidePick,
// ChoosePrefill, OnPrefillDone) and at least shared for the reads (active,
// ExcludedFromPicks, AppendPairMetrics). The decision counters are atomics:
// AppendDecisionMetrics takes no lock.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/routing/endpoint_table.h"
#include "core/routing/pd.h"
#include "core/routing/sched_view.h"
#include "core/sched/types.h"

namespace kvroute::routing {

class PdCoordinator {
 public:
  // A prefill leg's endpoint and the prompt tokens charged to it (its uncached prompt).
  struct Prefill {
    uint32_t id = 0xffffffffu;
    double tokens = 0.0;
  };

  // Follows a new endpoint table: roles from the labels, whether any endpoint is a prefill
  // one, and the decider's options. An id whose address changed starts with nothing queued.
  void Configure(const PdOptions& options, const EndpointTable& table, const EndpointTable& old_table);

  // The pool has a prefill endpoint: picks are pairs.
  bool active() const { return active_; }
  // A prefill-only endpoint in a pool with prefill endpoints: never a pick's candidate (the
  // decode endpoint is picked; DecidePick chooses the prefill one).
  bool ExcludedFromPicks(uint32_t id) const { return active_ && roles_[id] == Role::kPrefill; }

  // A pick's decision for a request decoding on `decode`, of whose prompt the policy's prefix
  // model believes `cached_share` (0..1) cached there; with kDisaggregate, `prefill` is the
  // leg's endpoint, charged its tokens. Counted by decision.
  PdDecision DecidePick(const sched::SchedRequest& req, double cached_share, uint32_t decode,
                        const SchedView& view, Prefill& prefill);
  // The prefill endpoint for a request decoding on `decode` (not one of `exclude`): pd.h's
  // rule over the ready prefill-capable endpoints, charged its uncached tokens and counted
  // under the pair; false when none is ready.
  bool ChoosePrefill(const sched::SchedRequest& req, uint32_t decode, std::span<const uint32_t> exclude,
                     const SchedView& view, Prefill& out);
  // A prefill leg's `tokens` on `prefill_id` no longer count as queued there.
  void OnPrefillDone(uint32_t prefill_id, double tokens);

  // kvroute_pd_decisions_total (atomics only).
  void AppendDecisionMetrics(std::string& out) const;
  // kvroute_pd_pairs_total and kvroute_pd_prefill_queued_tokens, endpoints named from
  // `view.table` (caller holds the scheduler lock, either side).
  void AppendPairMetrics(std::string& out, const SchedView& view) const;

 private:
  std::vector<Role> roles_;  // by id
  bool active_ = false;
  PdOptions options_;
  std::vector<double> queued_;  // by id: prefill tokens sent there, not yet answered
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> pairs_;  // (prefill, decode) -> legs
  std::vector<uint64_t> key_;  // ChoosePrefill's prefix chain, reused
  std::array<std::atomic<uint64_t>, kNumPdDecisions> decisions_{};
};

}  // namespace kvroute::routing
