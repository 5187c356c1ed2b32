// Simulation's scenario faults (simulator_internal.h): a crash or restart takes a replica
// down and fails the requests at or heading to it (a restart replaces its engine); a slow
// fault stretches its steps.
#include <algorithm>
#include <cstdint>

#include "apps/simulate/simulator_internal.h"
#include "core/common/rng.h"
#include "core/engine/engine.h"

namespace kvroute::simulate::detail {

void Simulation::DropRequestsOn(uint32_t ri, double t, bool abort_engine) {
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    Live& l = slots_[s];
    if (l.prefill == static_cast<int32_t>(ri) &&
        (l.stage == Stage::kPrefillNetwork || l.stage == Stage::kPrefill)) {
      if (l.stage == Stage::kPrefill && abort_engine) replicas_[ri].engine.Abort(l.spec.id);
      l.stage = Stage::kWaiting;
      Push(t + replicas_[ri].delay_s, Ev::kPrefillFail, s);
      continue;
    }
    if (l.replica != static_cast<int32_t>(ri)) continue;
    if (l.stage != Stage::kNetwork && l.stage != Stage::kEngine) continue;
    if (l.stage == Stage::kEngine && abort_engine) replicas_[ri].engine.Abort(l.spec.id);
    l.stage = Stage::kWaiting;
    Push(t + replicas_[ri].delay_s, Ev::kFail, s);
  }
}

void Simulation::FaultStart(const config::ScenarioFault& f, double t) {
  const auto ri = static_cast<uint32_t>(f.replica);
  Replica& r = replicas_[ri];
  switch (f.spec.kind) {
    case fault::FaultKind::kCrash:
      ++r.down;
      DropRequestsOn(ri, t, /*abort_engine=*/true);
      break;
    case fault::FaultKind::kRestart: {
      if (f.spec.duration_s) ++r.down;
      DropRequestsOn(ri, t, /*abort_engine=*/false);
      const engine::EngineStats st = r.engine.Stats();
      r.past_queries += st.prefix_queries_tokens;
      r.past_hits += st.prefix_hits_tokens;
      r.past_preemptions += st.preemptions;
      r.past_released += st.kv_holds_released;
      r.past_expired += st.kv_holds_expired;
      r.past_lora_loads += st.lora_loads;
      r.past_lora_evictions += st.lora_evictions;
      // A step in flight still ends (its outputs are ignored: nothing is on it now).
      // The new engine hashes with another seed (vLLM without PYTHONHASHSEED) and its
      // publisher numbers batches from 0 again.
      ++r.restarts;
      if (kv_events_) {
        r.config.hash_seed = MixKey(sc_.seed * 0x9e3779b97f4a7c15ULL + ri,
                                    static_cast<uint64_t>(r.restarts));
        publishers_[ri].Restart();
      }
      r.engine = engine::Engine(r.config);
      r.stale_step = r.busy;
      break;
    }
    case fault::FaultKind::kSlow:
      r.slow = f.spec.factor;
      break;
    default:
      break;  // the scenario loader admits only the kinds above
  }
}

void Simulation::FaultEnd(const config::ScenarioFault& f) {
  Replica& r = replicas_[static_cast<size_t>(f.replica)];
  if (f.spec.kind == fault::FaultKind::kSlow) r.slow = 1.0;
  if (f.spec.kind == fault::FaultKind::kCrash || f.spec.kind == fault::FaultKind::kRestart) {
    r.down = std::max(0, r.down - 1);
  }
}

}  // namespace kvroute::simulate::detail
