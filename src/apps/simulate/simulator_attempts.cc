// Simulation's attempts on replicas (simulator_internal.h): an attempt sent to its ranked
// endpoint, reaching its replica (refused when down) and queued in its engine, the engine's
// steps and their tokens back to the router and the core, the first token and the end of
// the stream as the core hears them, and a failed attempt retried or given up.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "apps/simulate/simulator_internal.h"
#include "core/engine/engine.h"
#include "core/engine/tokenizer.h"
#include "core/routing/routing_core.h"
#include "simkit/report/summary.h"

namespace kvroute::simulate::detail {

void Simulation::SendAttempt(uint32_t s, uint32_t attempt, double t) {
  Live& l = slots_[s];
  const uint32_t ep = l.ranked[attempt];
  l.replica = static_cast<int32_t>(ep);
  if (attempt > 0) {
    Core(l).OnDispatched(l.handle, ep, t);
    Tap(l.core, CoreCall::Kind::kDispatched, t, [&](CoreCall& c) {
      c.handle = l.handle;
      c.endpoint = ep;
    });
  }
  l.stage = Stage::kNetwork;
  if (!l.tokens_ready) {
    l.tokens.clear();
    engine::TokenizeInto(text_, &l.tokens);
  }
  l.tokens_ready = false;  // moved into the engine request when it arrives
  Push(t + replicas_[ep].delay_s, Ev::kReach, s);
}

void Simulation::SetAdapter(const Live& l, Replica& r, engine::EngineRequest* er) {
  if (l.spec.adapter < 0) return;
  const auto k = static_cast<size_t>(l.spec.adapter);
  er->lora_name = adapter_names_[k];
  if (r.adapters_seen.size() <= k) r.adapters_seen.resize(adapter_names_.size());
  r.adapters_seen[k] = true;
}

void Simulation::Reach(uint32_t s, double t) {
  Live& l = slots_[s];
  if (l.stage != Stage::kNetwork) return;  // failed on the way (the replica crashed)
  Replica& r = replicas_[static_cast<size_t>(l.replica)];
  if (r.down) {
    // Connection refused: the router hears it a network delay later.
    l.stage = Stage::kWaiting;
    l.refused = true;
    Push(t + r.delay_s, Ev::kFail, s);
    return;
  }
  l.stage = Stage::kEngine;
  engine::EngineRequest er;
  er.id = l.spec.id;
  er.prompt_tokens = std::move(l.tokens);
  SetAdapter(l, r, &er);
  er.max_tokens = static_cast<int>(l.spec.max_tokens);
  er.arrival_s = t;
  if (l.pull) {
    l.pull = false;
    PlanPull(l, r, static_cast<uint32_t>(l.replica), &er, t);
  }
  if (slot_of_.size() <= l.spec.id)
    slot_of_.resize(std::max<size_t>(l.spec.id + 1, slot_of_.size() * 2));
  slot_of_[l.spec.id] = s;
  if (auto err = r.engine.AddRequest(std::move(er))) {
    l.stage = Stage::kDone;
    l.error = report::ErrorKind::kRejected;  // a 400 from the replica
    Push(t + r.delay_s, Ev::kFinished, s);
    return;
  }
  if (!r.busy) StartStep(static_cast<uint32_t>(l.replica), t);
}

void Simulation::StartStep(uint32_t ri, double t) {
  Replica& r = replicas_[ri];
  r.engine.Step(t, &r.step);
  if (r.step.duration_s <= 0.0) {
    // Nothing schedulable: decode legs waiting for their KV pull (kKvReady wakes the
    // replica); otherwise it should not happen with work queued. Wait for the next
    // event rather than spin.
    r.busy = false;
    return;
  }
  ++steps_;
  r.busy = true;
  r.busy_s += r.step.duration_s * r.slow;
  Push(t + r.step.duration_s * r.slow, Ev::kStepDone, ri);
}

void Simulation::StepDone(uint32_t ri, double t) {
  Replica& r = replicas_[ri];
  const double visible = t + r.delay_s;
  if (r.stale_step) {
    r.stale_step = false;
    r.step.outputs.clear();
  }
  if (kv_events_) PublishKvEvents(ri, t);
  for (const engine::RequestOutput& o : r.step.outputs) {
    const uint32_t s = slot_of_[o.id];
    Live& l = slots_[s];
    if (l.stage == Stage::kPrefill && l.prefill == static_cast<int32_t>(ri)) {
      PrefillOutput(s, ri, o, visible);
      continue;
    }
    // Dropped by a crash or restart during the step (and perhaps sent elsewhere since).
    if (l.stage != Stage::kEngine || l.replica != static_cast<int32_t>(ri)) continue;
    if (o.new_tokens > 0) {
      if (o.first_token) {
        l.first_token_s = visible;
        Push(visible, Ev::kFirstToken, s);
      } else {
        const double gap = visible - l.last_token_s;
        gaps_.Add(gap);
        if (pd_report_) pd_gaps_[l.served_pd ? 1 : 0].Add(gap);
        l.max_gap_s = std::max(l.max_gap_s, gap);
      }
      l.last_token_s = visible;
    }
    l.output_tokens = o.completion_tokens;
    l.cached_tokens = o.cached_tokens;
    // A decode leg's cached tokens include the ones it pulled: no route receipt for it.
    if (l.admitted_cached < 0 && l.retries == 0 && l.transfer_s < 0) {
      l.admitted_cached = o.cached_tokens;
    }
    // The router sees the tokens on the stream network_delay_s from now; telling the
    // scheduler here (stamped with that time) saves one event per token and step.
    if (o.new_tokens > 0 && l.handle != sched::kNoHandle) {
      Core(l).OnTokens(l.handle, o.completion_tokens, visible);
      Tap(l.core, CoreCall::Kind::kTokens, visible, [&](CoreCall& c) {
        c.handle = l.handle;
        c.value = o.completion_tokens;
      });
    }
    if (o.finished) {
      if (o.reason == engine::FinishReason::kAbort) l.error = report::ErrorKind::kAborted;
      l.stage = Stage::kDone;
      Push(visible, Ev::kFinished, s);
    }
  }
  r.busy = false;
  if (r.engine.HasWork()) StartStep(ri, t);
}

void Simulation::FirstToken(uint32_t s, double t) {
  Live& l = slots_[s];
  if (l.replica >= 0) {
    Core(l).OnAttemptSucceeded(static_cast<uint32_t>(l.replica));
    Tap(l.core, CoreCall::Kind::kAttemptSucceeded, t, [&](CoreCall& c) {
      c.endpoint = static_cast<uint32_t>(l.replica);
    });
  }
  Core(l).OnFirstToken(l.handle, t);
  if (l.handle != sched::kNoHandle) {
    Tap(l.core, CoreCall::Kind::kFirstToken, t, [&](CoreCall& c) {
      c.handle = l.handle;
    });
  }
  // Dynamo's queue releases as prefills complete.
  if (gate_ && gate_->releases_on_first_token()) Pump();
}

uint32_t Simulation::Finish(uint32_t s, double t) {
  Live& l = slots_[s];
  const uint32_t ep = l.replica >= 0 ? static_cast<uint32_t>(l.replica) : kNoEndpoint;
  int code = 200;
  switch (l.error) {
    case report::ErrorKind::kNone: code = 200; break;
    case report::ErrorKind::kRejected: code = 400; break;
    case report::ErrorKind::kNoEndpoint: code = 503; break;
    case report::ErrorKind::kShed: code = 429; break;
    case report::ErrorKind::kUpstream: code = l.first_token_s >= 0 ? 200 : 502; break;
    case report::ErrorKind::kTimeout: code = 504; break;
    case report::ErrorKind::kAborted: code = 499; break;
  }
  if (l.error == report::ErrorKind::kRejected && ep != kNoEndpoint) {
    Core(l).OnAttemptSucceeded(ep);  // a 4xx is the client's doing
    Tap(l.core, CoreCall::Kind::kAttemptSucceeded, t, [&](CoreCall& c) {
      c.endpoint = ep;
    });
  }
  Core(l).OnFinished(l.handle, ep, code, t);
  Tap(l.core, CoreCall::Kind::kFinished, t, [&](CoreCall& c) {
    c.handle = l.handle;
    c.endpoint = ep;
    c.value = code;
  });
  const bool freed = l.handle != sched::kNoHandle && ep != kNoEndpoint;
  l.handle = sched::kNoHandle;
  return freed ? ep : kNoEndpoint;
}

void Simulation::Retry(uint32_t s, double t) {
  Live& l = slots_[s];
  const auto ep = static_cast<uint32_t>(l.replica);
  const bool refused = l.refused;
  l.refused = false;
  routing::AttemptFailure f;
  f.endpoint_id = ep;
  f.failure = {refused ? "connect_refused" : "reset", refused};
  f.attempt = static_cast<uint32_t>(l.retries);
  f.n_ranked = l.n_ranked;
  f.max_attempts = static_cast<uint32_t>(max_attempts_);
  f.started = l.first_token_s >= 0;
  const routing::AttemptDecision d = Core(l).OnAttemptFailed(f, t);
  Tap(l.core, CoreCall::Kind::kAttemptFailed, t, [&](CoreCall& c) {
    c.endpoint = ep;
    c.failure_kind = std::string(f.failure.kind);
    c.flag = refused;
    c.attempt = f.attempt;
    c.n_ranked = static_cast<uint32_t>(f.n_ranked);
    c.max_attempts = f.max_attempts;
    c.started = f.started;
    c.allowed = d.retry();
  });
  const uint32_t attempt = f.attempt;
  const bool retry = d.retry();
  if (!retry) {
    l.error = report::ErrorKind::kUpstream;
    l.stage = Stage::kDone;
    Push(t, Ev::kFinished, s);
    return;
  }
  ++l.retries;
  // A decode leg that failed is retried as an ordinary request (and counts as one).
  l.pull = false;
  l.served_pd = false;
  l.transfer_s = -1.0;
  Render(l.spec);
  SendAttempt(s, attempt + 1, t);
}

}  // namespace kvroute::simulate::detail
