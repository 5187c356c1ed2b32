// Simulation's requests at the router (simulator_internal.h): generated arrivals, follow-up
// turns waiting for their previous turn, the concurrency limit, admission by the flow
// gate, the core's pick and the prompt rendered for it, and completion (the record, the
// slot freed, waiting turns released).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "apps/simulate/simulator_internal.h"
#include "core/common/slot_pool.h"
#include "core/engine/tokenizer.h"
#include "core/flow/flow_gate.h"
#include "core/flow/flow_queue.h"
#include "core/routing/routing_core.h"
#include "simkit/report/summary.h"
#include "simkit/workload/workload.h"

namespace kvroute::simulate::detail {

void Simulation::FetchNext() {
  if (gen_.Next(&next_)) {
    Push(next_.arrival_s, Ev::kArrival, 0);
  } else {
    generator_done_ = true;
  }
}

uint32_t Simulation::AllocSlot() {
  const uint32_t s = TakeSlot(slots_, free_slots_).index;
  Live& l = slots_[s];
  l.first_token_s = -1.0;
  l.max_gap_s = 0.0;
  l.handle = sched::kNoHandle;
  l.replica = -1;
  l.n_ranked = 0;
  l.refused = false;
  l.flow_queued = false;
  l.queued_s = 0.0;
  l.output_tokens = l.cached_tokens = 0;
  l.retries = 0;
  l.prefill = -1;
  l.prefill_charge = 0.0;
  l.prefill_charged = false;
  l.prefill_rejected = false;
  l.prefill_tried.clear();
  l.pull = false;
  l.held_blocks = 0;
  l.served_pd = false;
  l.prefill_cached = -1;
  l.transfer_s = -1.0;
  l.stage = Stage::kWaiting;
  l.error = report::ErrorKind::kNone;
  ++live_;
  return s;
}

void Simulation::Arrival(double t) {
  const uint32_t s = AllocSlot();
  Live& l = slots_[s];
  std::swap(l.spec, next_);  // keeps both segment buffers' capacity in circulation
  const uint64_t id = l.spec.id;
  if (finish_s_.size() <= id)
    finish_s_.resize(std::max<size_t>(id + 1, finish_s_.size() * 2), -1.0);
  FetchNext();
  if (l.spec.after_request >= 0) {
    const double done = finish_s_[static_cast<size_t>(l.spec.after_request)];
    if (done < 0) {
      blocked_on_[static_cast<uint64_t>(l.spec.after_request)] = s;
      return;
    }
    const double ready = done + l.spec.think_time_s;
    if (ready > t) {
      Push(ready, Ev::kSend, s);
      return;
    }
  }
  TrySend(s, t);
}

void Simulation::TrySend(uint32_t s, double t) {
  if (sc_.arrivals.max_concurrency > 0 && in_flight_ >= sc_.arrivals.max_concurrency) {
    held_.push_back(s);
    return;
  }
  Send(s, t);
}

class Simulation::Waiter final : public flow::FlowWaiter {
 public:
  Waiter(Simulation* sim, uint32_t slot) : sim_(sim), slot_(slot) {}
  void Dispatch(double now_s, double waited_s) override {
    sim_->slots_[slot_].flow_queued = false;
    sim_->slots_[slot_].queued_s = waited_s;
    sim_->router_waits_.push_back(waited_s);
    sim_->Dispatch(slot_, now_s);
  }
  void Expire(flow::ExpireReason reason) override {
    Live& l = sim_->slots_[slot_];
    l.flow_queued = false;
    ++sim_->flow_expired_;
    l.error = reason == flow::ExpireReason::kNoEndpointTtl ? report::ErrorKind::kNoEndpoint
                                                           : report::ErrorKind::kShed;
    l.stage = Stage::kDone;
    sim_->Push(sim_->now_, Ev::kFinished, slot_);
  }

 private:
  Simulation* sim_;
  uint32_t slot_;
};

void Simulation::Send(uint32_t s, double t) {
  Live& l = slots_[s];
  ++in_flight_;
  ++sent_;
  l.send_s = t;
  l.tenant = TenantOf(l.spec.id);
  // Router replicas take requests round-robin in send order.
  l.core = static_cast<uint32_t>(next_core_);
  if (++next_core_ == cores_.size()) next_core_ = 0;
  if (!gate_) {
    Dispatch(s, t);
    return;
  }
  // Admission is the front end's call into the gate, as in serve: dispatch now, wait,
  // or refuse.
  flow::FlowRequest fr;
  fr.priority = sc_.tenants.empty() ? 0 : sc_.tenants[static_cast<size_t>(l.tenant)].priority;
  fr.flow_id = static_cast<uint64_t>(l.tenant);
  fr.bytes = static_cast<uint64_t>(l.spec.prompt_tokens) * engine::kBytesPerToken;
  Render(l.spec);
  sched::SchedRequest req;
  req.model = ModelOf(l);
  req.prompt = text_;
  const flow::AdmitResult admitted =
      gate_->Admit(fr, std::make_shared<Waiter>(this, s), req);
  switch (admitted.outcome) {
    case flow::AdmitOutcome::kDispatchNow:
      router_waits_.push_back(0.0);
      Dispatch(s, t);
      break;
    case flow::AdmitOutcome::kQueued:
      ++flow_queued_;
      l.flow_queued = true;
      ArmFlowTimer();
      break;
    case flow::AdmitOutcome::kRejected:
      ++flow_shed_;
      l.error = report::ErrorKind::kShed;  // 429 in serve
      l.stage = Stage::kDone;
      Push(t, Ev::kFinished, s);
      break;
  }
}

int32_t Simulation::TenantOf(uint64_t id) const {
  if (tenant_cdf_.size() <= 1) return 0;
  uint64_t z = id + sc_.seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
  for (size_t i = 0; i + 1 < tenant_cdf_.size(); ++i) {
    if (u < tenant_cdf_[i]) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(tenant_cdf_.size() - 1);
}

void Simulation::Pump(uint32_t freed) {
  if (!gate_ || !gate_->waiting()) return;
  gate_->Pump(freed);
  ArmFlowTimer();
}

void Simulation::ArmFlowTimer() {
  const double at = gate_->next_expiry();
  if (at < flow_timer_at_) {
    flow_timer_at_ = at;
    Push(at, Ev::kFlowExpiry, 0);
  }
}

void Simulation::Dispatch(uint32_t s, double t) {
  Live& l = slots_[s];
  Render(l.spec);
  l.prompt_tokens = static_cast<int64_t>(engine::CountTokens(text_));
  routing::PickRequest pr;
  FillSchedRequest(l, &pr.request);
  pr.dispatch_first = true;
  l.tokens_ready = false;
  if (kv_events_) {
    // The engine's token ids, exactly those the replica will get (for precise picks).
    l.tokens.clear();
    engine::TokenizeInto(text_, &l.tokens);
    l.tokens_ready = true;
    pr.request.token_ids = l.tokens;
  }
  const routing::PickResult pick = Core(l).Pick(pr, t);
  l.predicted_cached = pick.ok() && pick.dispatched ? pick.predicted_cached_tokens : -1;
  l.admitted_cached = -1;
  if (pick.ok() && pick.dispatched) ++kv_totals_.picks;
  Tap(l.core, CoreCall::Kind::kPick, t, [&](CoreCall& c) {
    c.model = ModelOf(l);
    c.prompt = text_;
    c.max_tokens = pr.request.max_tokens;
    c.prompt_tokens = pr.request.prompt_tokens;
    c.handle = pick.handle;
    c.ranked.assign(pick.ranked.begin(), pick.ranked.begin() + pick.n_ranked);
    if (!pick.ok()) c.ranked.clear();
    c.pd = pick.pd;
    if (pick.disaggregated()) {
      c.prefill = pick.prefill;
      c.tokens = pick.prefill_tokens;
    }
  });
  if (!pick.ok() || pick.n_ranked == 0) {
    l.error = report::ErrorKind::kNoEndpoint;
    l.handle = pick.handle;  // kNoHandle unless the core gave one
    l.replica = -1;
    l.stage = Stage::kDone;
    Push(t, Ev::kFinished, s);
    return;
  }
  l.handle = pick.handle;
  l.n_ranked = static_cast<uint32_t>(pick.n_ranked);
  std::copy(pick.ranked.begin(), pick.ranked.begin() + pick.n_ranked, l.ranked.begin());
  ++pd_decisions_[static_cast<size_t>(pick.pd)];
  if (pick.disaggregated()) {
    // Both legs send the same prompt ids: tokenize once.
    if (!l.tokens_ready) {
      l.tokens.clear();
      engine::TokenizeInto(text_, &l.tokens);
      l.tokens_ready = true;
    }
    l.prefill = static_cast<int32_t>(pick.prefill);
    l.prefill_charge = pick.prefill_tokens;
    l.prefill_charged = true;
    SendPrefill(s, t);
    return;
  }
  SendAttempt(s, 0, t);
}

void Simulation::FillSchedRequest(Live& l, sched::SchedRequest* req) {
  req->model = ModelOf(l);
  req->prompt = text_;
  req->max_tokens = l.spec.max_tokens;
  req->prompt_tokens = l.prompt_tokens;
  req->queued_s = l.queued_s;
}

void Simulation::Render(const workload::RequestSpec& spec) {
  if (spec.endpoint != api::Endpoint::kCompletions) {
    workload::RenderPrompt(spec, EngineOutputText, &text_);
    return;
  }
  text_.clear();
  for (const workload::Segment& seg : spec.segments) {
    if (seg.is_output) {
      EngineOutputText(seg.key, seg.tokens, &text_);
    } else if (seg.tokens < kCacheMinTokens) {
      workload::AppendSegmentText(seg.key, seg.tokens, &text_);
    } else {
      auto it = text_cache_.find(seg.key);
      if (it == text_cache_.end() || it->second.size() != static_cast<size_t>(seg.tokens) * 4) {
        if (text_cache_bytes_ > kCacheMaxBytes) {
          text_cache_.clear();
          text_cache_bytes_ = 0;
        }
        std::string text;
        workload::AppendSegmentText(seg.key, seg.tokens, &text);
        text_cache_bytes_ += text.size();
        it = text_cache_.insert_or_assign(seg.key, std::move(text)).first;
      }
      text_.append(it->second);
    }
  }
}

void Simulation::Complete(uint32_t s, double t) {
  Live& l = slots_[s];
  report::RequestRecord rec;
  rec.id = l.spec.id;
  rec.send_s = l.send_s;
  rec.error = l.error;
  rec.endpoint = l.replica;
  rec.prompt_tokens = l.prompt_tokens;
  rec.output_tokens = l.output_tokens;
  rec.cached_tokens = l.cached_tokens;
  rec.max_itl_s = l.max_gap_s;
  rec.retries = l.retries;
  if (l.served_pd) {
    rec.prefill_endpoint = l.prefill;
    rec.kv_transfer_s = l.transfer_s;
    // As serve's usage: the prefill leg's cached tokens, not the tokens decode loaded.
    if (l.prefill_cached >= 0) rec.cached_tokens = l.prefill_cached;
  }
  if (l.first_token_s >= 0) rec.ttft_s = l.first_token_s - l.send_s;
  if (l.error == report::ErrorKind::kNone) rec.e2e_s = t - l.send_s;
  records_.push_back(rec);
  record_tenants_.push_back(l.tenant);
  if (l.predicted_cached >= 0 && l.admitted_cached >= 0) {
    const int64_t err = std::abs(l.predicted_cached - l.admitted_cached);
    ++kv_totals_.receipts;
    kv_totals_.abs_error_sum += static_cast<double>(err);
    const size_t ri = static_cast<size_t>(l.ranked[0]);
    if (err > replicas_[ri].config.block_size) ++kv_totals_.off_by_block;
  }
  finish_s_[l.spec.id] = t;
  --in_flight_;
  ++finished_;
  --live_;
  free_slots_.push_back(s);
  // A follow-up turn waiting for this one.
  if (!blocked_on_.empty()) {
    auto it = blocked_on_.find(l.spec.id);
    if (it != blocked_on_.end()) {
      const uint32_t next = it->second;
      blocked_on_.erase(it);
      const double ready =
          std::max(t + slots_[next].spec.think_time_s, slots_[next].spec.arrival_s);
      Push(ready, Ev::kSend, next);
    }
  }
  while (!held_.empty() &&
         (sc_.arrivals.max_concurrency <= 0 || in_flight_ < sc_.arrivals.max_concurrency)) {
    const uint32_t next = held_.front();
    held_.pop_front();
    Send(next, t);
  }
}

}  // namespace kvroute::simulate::detail
