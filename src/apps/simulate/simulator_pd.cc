// Simulation's P/D legs (simulator_internal.h): a disaggregated pick's prefill leg on its
// prefill replica, its answer or failure as the core hears them (moved to another prefill
// replica, or prefilled locally), and the decode leg's KV pull from the prefill replica.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "apps/simulate/simulator_internal.h"
#include "core/engine/engine.h"
#include "core/engine/kv_transfer.h"
#include "core/routing/routing_core.h"

namespace kvroute::simulate::detail {

void Simulation::SendPrefill(uint32_t s, double t) {
  Live& l = slots_[s];
  l.stage = Stage::kPrefillNetwork;
  l.prefill_rejected = false;
  Push(t + replicas_[static_cast<size_t>(l.prefill)].delay_s, Ev::kPrefillReach, s);
}

void Simulation::PrefillReach(uint32_t s, double t) {
  Live& l = slots_[s];
  if (l.stage != Stage::kPrefillNetwork) return;  // failed on the way
  const auto pi = static_cast<uint32_t>(l.prefill);
  Replica& r = replicas_[pi];
  if (r.down) {
    l.stage = Stage::kWaiting;
    l.refused = true;
    Push(t + r.delay_s, Ev::kPrefillFail, s);
    return;
  }
  engine::EngineRequest er;
  er.id = l.spec.id;
  er.prompt_tokens = l.tokens;  // a copy: the decode leg sends them again
  SetAdapter(l, r, &er);
  er.max_tokens = 1;
  er.arrival_s = t;
  er.kv_hold_s = sc_.pd.kv_lease_s;
  if (slot_of_.size() <= l.spec.id)
    slot_of_.resize(std::max<size_t>(l.spec.id + 1, slot_of_.size() * 2));
  slot_of_[l.spec.id] = s;
  if (auto err = r.engine.AddRequest(std::move(er))) {
    l.stage = Stage::kWaiting;
    l.prefill_rejected = true;  // a 400: the request's doing, not the replica's
    Push(t + r.delay_s, Ev::kPrefillFail, s);
    return;
  }
  l.stage = Stage::kPrefill;
  if (!r.busy) StartStep(pi, t);
}

void Simulation::PrefillOutput(uint32_t s, uint32_t ri, const engine::RequestOutput& o,
                               double visible) {
  Live& l = slots_[s];
  if (!o.finished) return;
  Replica& r = replicas_[ri];
  l.stage = Stage::kPrefillAnswer;
  l.prefill_cached = o.cached_tokens;
  // Finished by anything but its length cap, it holds nothing (null kv_transfer_params).
  l.held_blocks = o.reason == engine::FinishReason::kLength
                      ? static_cast<int>(r.engine.HeldBlocks(o.id).size())
                      : 0;
  if (l.held_blocks > 0) Push(o.finish_s + sc_.pd.kv_lease_s, Ev::kHoldExpiry, ri);
  Push(visible, Ev::kPrefillDone, s);
}

void Simulation::PrefillEnded(Live& l, bool answered) {
  if (!l.prefill_charged) return;
  l.prefill_charged = false;
  PrefillDoneCall(l, static_cast<uint32_t>(l.prefill), l.prefill_charge, l.handle, answered);
}

void Simulation::PrefillDoneCall(const Live& l, uint32_t prefill, double tokens,
                                 sched::RequestHandle handle, bool answered) {
  Core(l).OnPrefillDone(prefill, tokens, handle, answered, now_);
  Tap(l.core, CoreCall::Kind::kPrefillDone, now_, [&](CoreCall& c) {
    c.endpoint = prefill;
    c.prefill = prefill;
    c.tokens = tokens;
    c.handle = handle;
    c.flag = answered;
  });
}

void Simulation::PrefillDone(uint32_t s, double t) {
  Live& l = slots_[s];
  if (l.stage != Stage::kPrefillAnswer) return;
  PrefillEnded(l, /*answered=*/true);
  Core(l).OnAttemptSucceeded(static_cast<uint32_t>(l.prefill));
  Tap(l.core, CoreCall::Kind::kAttemptSucceeded, t, [&](CoreCall& c) {
    c.endpoint = static_cast<uint32_t>(l.prefill);
  });
  l.pull = l.held_blocks > 0;
  if (!l.pull) ++pd_totals_.local_prefills;
  SendAttempt(s, 0, t);
}

void Simulation::PrefillFail(uint32_t s, double t) {
  Live& l = slots_[s];
  const auto pi = static_cast<uint32_t>(l.prefill);
  PrefillEnded(l, /*answered=*/false);
  const bool refused = l.refused;
  l.refused = false;
  // A rejected leg (4xx: the request itself) is not the replica's fault.
  routing::PrefillFailure f;
  f.prefill_id = pi;
  f.failure = {refused ? "connect_refused" : "reset", refused};
  f.server_fault = !l.prefill_rejected;
  sched::SchedRequest req;
  if (f.server_fault) {
    Render(l.spec);
    FillSchedRequest(l, &req);
  }
  f.request = &req;
  f.decode_id = l.ranked[0];
  f.tried = &l.prefill_tried;
  const std::vector<uint32_t> tried_before = l.prefill_tried;
  const routing::PrefillDecision d = Core(l).OnPrefillFailed(f, t);
  Tap(l.core, CoreCall::Kind::kPrefillFailed, t, [&](CoreCall& c) {
    c.endpoint = pi;
    c.failure_kind = std::string(f.failure.kind);
    c.flag = refused;
    c.server_fault = f.server_fault;
    c.model = ModelOf(l);
    c.prompt = text_;
    c.max_tokens = req.max_tokens;
    c.prompt_tokens = req.prompt_tokens;
    c.decode = f.decode_id;
    c.exclude = tried_before;
    c.allowed = d.move();
    c.prefill = d.prefill;
    c.tokens = d.prefill_tokens;
  });
  if (d.move()) {
    l.prefill = static_cast<int32_t>(d.prefill);
    l.prefill_charge = d.prefill_tokens;
    l.prefill_charged = true;
    ++pd_totals_.prefill_retries;
    SendPrefill(s, t);
    return;
  }
  ++pd_totals_.local_prefills;
  l.pull = false;
  SendAttempt(s, 0, t);
}

void Simulation::PlanPull(Live& l, Replica& r, uint32_t ri, engine::EngineRequest* er, double t) {
  l.served_pd = true;
  ++pd_totals_.disaggregated;
  const auto pi = static_cast<uint32_t>(l.prefill);
  Replica& p = replicas_[pi];
  const int prompt = static_cast<int>(er->prompt_tokens.size());
  const int local = r.engine.PeekCachedTokens(er->prompt_tokens);
  const engine::KvPull pull = engine::PlanKvPull(
      engine::PullableTokens(prompt, l.held_blocks, r.config.block_size), local,
      sc_.pd.TransferModel(r.config));
  if (!pull.pulls()) {
    ++pd_totals_.recomputed;
    if (!p.down) p.engine.ReleaseHold(er->id);
    return;
  }
  if (p.down || p.engine.HeldBlocks(er->id).empty()) {
    ++pd_totals_.pull_failures;
    return;
  }
  er->kv_load_tokens = pull.load_tokens;
  er->kv_ready_s = t + pull.transfer_s;
  l.transfer_s = pull.transfer_s;
  ++pd_totals_.pulls;
  pulls_.push_back({pi, er->id, pull.transfer_s});
  Push(t + pull.transfer_s, Ev::kTransferDone, static_cast<uint32_t>(pulls_.size() - 1));
  Push(er->kv_ready_s, Ev::kKvReady, ri);
}

}  // namespace kvroute::simulate::detail
