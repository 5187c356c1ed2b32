// RoutingCore: prefill/decode disaggregation, forwarded to its PdCoordinator
// (pd_coordinator.h) with the core's view of the pool, under the scheduler's lock.
#include "core/routing/routing_core.h"

#include <mutex>

#include "core/routing/core_state.h"
#include "core/routing/latency_feed.h"
#include "core/routing/pd_coordinator.h"

namespace kvroute::routing {

void RoutingCore::PdLocked(const sched::SchedRequest& req, const sched::PickResult& r,
                           PickResult& out) {
  const uint32_t decode = out.ranked[0];
  PdCoordinator::Prefill prefill;
  out.pd = pd_->DecidePick(req, CachedShareLocked(r, decode), decode, sched_->view(), prefill);
  if (out.pd == PdDecision::kDisaggregate) {
    out.prefill = prefill.id;
    out.prefill_tokens = prefill.tokens;
  }
}

void RoutingCore::OnPrefillDone(uint32_t prefill_id, double tokens, sched::RequestHandle handle,
                                bool answered, double now_s) {
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  if (handle != sched::kNoHandle) latency_->OnPrefillAnswered(handle, prefill_id, answered, now_s);
  pd_->OnPrefillDone(prefill_id, tokens);
}

bool RoutingCore::PickPrefill(const sched::SchedRequest& request, uint32_t decode_id,
                              std::span<const uint32_t> exclude, PickResult& out) {
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  SchedState& s = *sched_;
  out.prefill = kNoEndpoint;
  out.prefill_tokens = 0.0;
  if (!pd_->active() || !s.scheduler || decode_id >= s.states.size()) return false;
  out.table = s.table;
  PdCoordinator::Prefill prefill;
  if (!pd_->ChoosePrefill(request, decode_id, exclude, s.view(), prefill)) return false;
  out.prefill = prefill.id;
  out.prefill_tokens = prefill.tokens;
  return true;
}

}  // namespace kvroute::routing
