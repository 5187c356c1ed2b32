// RoutingCore: prefill/decode disaggregation. The decider's call for a pick, the prefill
// endpoint's choice (pd.h's rule over ready prefill-capable endpoints) and its queue term.
#include "core/routing/routing_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "core/routing/core_state.h"

namespace kvroute::routing {

void RoutingCore::PdLocked(const sched::SchedRequest& req, const sched::PickResult& r,
                           PickResult& out) {
  const uint32_t decode = out.ranked[0];
  const int64_t prompt = PromptTokensOf(req);
  // Cached on the decode endpoint, as the policy's prefix model (or the precise index
  // behind its prefix scorer) believes.
  const auto cached =
      static_cast<int64_t>(static_cast<double>(prompt) * CachedShareLocked(r, decode));
  PdDecision d = Decide(sched_->pd, prompt, cached);
  if (d == PdDecision::kDisaggregate && !ChoosePrefillLocked(req, decode, {}, out)) {
    d = PdDecision::kNoPrefill;
  }
  out.pd = d;
  Bump(counters_->pd_decisions[static_cast<std::size_t>(d)]);
}

bool RoutingCore::ChoosePrefillLocked(const sched::SchedRequest& req, uint32_t decode,
                                      std::span<const uint32_t> exclude, PickResult& out) {
  SchedState& s = *sched_;
  const int64_t prompt = PromptTokensOf(req);
  // Candidates: ready prefill-capable endpoints other than the decode one.
  thread_local std::vector<PrefillCandidate> cands;
  cands.clear();
  s.pd_key.clear();
  bool keyed = false;
  for (uint32_t id = 0; id < s.states.size(); ++id) {
    if (id == decode || s.vacant[id] || !PrefillCapable(s.roles[id])) continue;
    if (std::find(exclude.begin(), exclude.end(), id) != exclude.end()) continue;
    const health::Verdict& v = s.verdicts[id];
    if (v.condition != health::Condition::kUp || v.ejected ||
        v.treatment == health::Treatment::kDown) {
      continue;
    }
    if (!keyed && s.scheduler) {
      s.scheduler->PrefixKey(req, s.pd_key);
      keyed = true;
    }
    const std::size_t held = s.pd_key.empty() ? 0 : s.scheduler->HeldBlocks(s.pd_key, id);
    const double share =
        s.pd_key.empty() ? 0.0 : std::min(1.0, static_cast<double>(held) / s.pd_key.size());
    PrefillCandidate c;
    c.id = id;
    c.uncached_tokens = static_cast<double>(prompt) * (1.0 - share);
    c.queued_tokens = s.pd_queued[id];
    c.waiting = v.Known(health::Signal::kWaiting) ? s.states[id].waiting : -1.0;
    cands.push_back(c);
  }
  const int i = routing::PickPrefill(cands);
  if (i < 0) return false;
  const PrefillCandidate& c = cands[static_cast<std::size_t>(i)];
  out.prefill = c.id;
  out.prefill_tokens = c.uncached_tokens;
  s.pd_queued[c.id] += c.uncached_tokens;
  ++s.pd_pairs[{c.id, decode}];
  return true;
}

void RoutingCore::OnPrefillDone(uint32_t prefill_id, double tokens, sched::RequestHandle handle,
                                bool answered, double now_s) {
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  SchedState& s = *sched_;
  if (handle != sched::kNoHandle) {
    s.latency.OnPrefillAnswered(handle, prefill_id, answered, now_s);
    PublishLatencyLocked();
  }
  if (prefill_id >= s.pd_queued.size() || !std::isfinite(tokens)) return;
  s.pd_queued[prefill_id] = std::max(0.0, s.pd_queued[prefill_id] - tokens);
}

bool RoutingCore::PickPrefill(const sched::SchedRequest& request, uint32_t decode_id,
                              std::span<const uint32_t> exclude, PickResult& out) {
  std::unique_lock<RwSpinLock> lock(sched_mu_);
  SchedState& s = *sched_;
  out.prefill = kNoEndpoint;
  out.prefill_tokens = 0.0;
  if (!s.pd_active || !s.scheduler || decode_id >= s.states.size()) return false;
  out.table = s.table;
  return ChoosePrefillLocked(request, decode_id, exclude, out);
}

}  // namespace kvroute::routing
