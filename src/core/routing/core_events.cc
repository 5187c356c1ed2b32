// RoutingCore: the KV-cache event calls, forwarded to its KvEventInput (kv_event_input.h)
// with the published table for naming endpoints in state lines.
#include "core/routing/routing_core.h"

#include "core/routing/core_state.h"
#include "core/routing/kv_event_input.h"

namespace kvroute::routing {

void RoutingCore::OnKvEvents(uint32_t id, const kvevents::KvEventBatch& batch, double now_s) {
  events_->Apply(id, batch, now_s, *table_.load(), log_);
}

void RoutingCore::OnKvEventsGap(uint32_t id, bool repaired, double now_s) {
  events_->Gap(id, repaired, now_s, *table_.load(), log_);
}

void RoutingCore::OnKvEventsRestart(uint32_t id, double now_s) {
  events_->Restart(id, now_s, *table_.load(), log_);
}

void RoutingCore::OnKvEventsDecodeError(uint32_t id, double now_s) {
  events_->DecodeError(id, now_s, *table_.load(), log_);
}

void RoutingCore::OnRouteReceipt(uint32_t endpoint_id, int64_t predicted, int64_t reported) {
  (void)endpoint_id;
  events_->OnRouteReceipt(predicted, reported, options_.load()->kv_events.block_tokens);
}

kvevents::EndpointEventStats RoutingCore::KvEventStats(uint32_t id, double now_s) const {
  return events_->Stats(id, now_s);
}

bool RoutingCore::kv_events_active() const { return events_->active(); }

}  // namespace kvroute::routing
