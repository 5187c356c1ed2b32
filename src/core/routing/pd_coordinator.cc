#include "core/routing/pd_coordinator.h"

#include <algorithm>
#include <cmath>

#include "core/metrics/prom_writer.h"
#include "core/routing/core_counters.h"

namespace kvroute::routing {

using core_detail::Bump;
using core_detail::GetU;
using core_detail::PromptTokensOf;
using metrics::AppendHeader;
using metrics::AppendSample;
using metrics::Label;
using metrics::MetricType;

void PdCoordinator::Configure(const PdOptions& options, const EndpointTable& table,
                              const EndpointTable& old_table) {
  const std::size_t n = table.by_id.size();
  roles_.assign(n, Role::kUnset);
  queued_.resize(n, 0.0);
  active_ = false;
  options_ = options;
  for (uint32_t id = 0; id < n; ++id) {
    const Endpoint* ep = table.Find(id);
    if (!ep) continue;
    const Endpoint* prev = old_table.Find(id);
    if (!prev || prev->spec.address != ep->spec.address) queued_[id] = 0.0;
    roles_[id] = RoleOf(ep->spec.labels);
    active_ = active_ || roles_[id] == Role::kPrefill;
  }
}

PdDecision PdCoordinator::DecidePick(const sched::SchedRequest& req, double cached_share,
                                     uint32_t decode, const SchedView& view, Prefill& prefill) {
  const int64_t prompt = PromptTokensOf(req);
  // Cached on the decode endpoint, as the policy's prefix model (or the precise index
  // behind its prefix scorer) believes.
  const auto cached = static_cast<int64_t>(static_cast<double>(prompt) * cached_share);
  PdDecision d = Decide(options_, prompt, cached);
  if (d == PdDecision::kDisaggregate && !ChoosePrefill(req, decode, {}, view, prefill)) {
    d = PdDecision::kNoPrefill;
  }
  Bump(decisions_[static_cast<std::size_t>(d)]);
  return d;
}

bool PdCoordinator::ChoosePrefill(const sched::SchedRequest& req, uint32_t decode,
                                  std::span<const uint32_t> exclude, const SchedView& view,
                                  Prefill& out) {
  const int64_t prompt = PromptTokensOf(req);
  // Candidates: ready prefill-capable endpoints other than the decode one.
  thread_local std::vector<PrefillCandidate> cands;
  cands.clear();
  key_.clear();
  bool keyed = false;
  for (uint32_t id = 0; id < view.states.size(); ++id) {
    if (id == decode || view.vacant[id] || !PrefillCapable(roles_[id])) continue;
    if (std::find(exclude.begin(), exclude.end(), id) != exclude.end()) continue;
    const health::Verdict& v = view.verdicts[id];
    if (v.condition != health::Condition::kUp || v.ejected ||
        v.treatment == health::Treatment::kDown) {
      continue;
    }
    if (!keyed && view.scheduler) {
      view.scheduler->PrefixKey(req, key_);
      keyed = true;
    }
    const std::size_t held = key_.empty() ? 0 : view.scheduler->HeldBlocks(key_, id);
    const double share =
        key_.empty() ? 0.0 : std::min(1.0, static_cast<double>(held) / key_.size());
    PrefillCandidate c;
    c.id = id;
    c.uncached_tokens = static_cast<double>(prompt) * (1.0 - share);
    c.queued_tokens = queued_[id];
    c.waiting = v.Known(health::Signal::kWaiting) ? view.states[id].waiting : -1.0;
    cands.push_back(c);
  }
  const int i = PickPrefill(cands);
  if (i < 0) return false;
  const PrefillCandidate& c = cands[static_cast<std::size_t>(i)];
  out.id = c.id;
  out.tokens = c.uncached_tokens;
  queued_[c.id] += c.uncached_tokens;
  ++pairs_[{c.id, decode}];
  return true;
}

void PdCoordinator::OnPrefillDone(uint32_t prefill_id, double tokens) {
  if (prefill_id >= queued_.size() || !std::isfinite(tokens)) return;
  queued_[prefill_id] = std::max(0.0, queued_[prefill_id] - tokens);
}

void PdCoordinator::AppendDecisionMetrics(std::string& out) const {
  AppendHeader(out, "kvroute_pd_decisions_total",
               "Picks in a pool with prefill endpoints, by decision: disaggregate (a prefill "
               "endpoint computes the prompt, the picked one decodes), short_prompt and "
               "cached (below scheduling.pd's prompt_tokens or non_cached_tokens: decode "
               "alone), no_prefill (would disaggregate, no prefill endpoint ready).",
               MetricType::kCounter);
  for (std::size_t i = 1; i < kNumPdDecisions; ++i) {
    Label labels[] = {{"decision", PdDecisionName(static_cast<PdDecision>(i))}};
    AppendSample(out, "kvroute_pd_decisions_total", labels, GetU(decisions_[i]));
  }
}

void PdCoordinator::AppendPairMetrics(std::string& out, const SchedView& view) const {
  auto name = [&](uint32_t id) -> std::string_view {
    const Endpoint* ep = view.table ? view.table->Find(id) : nullptr;
    return ep ? std::string_view(ep->spec.name) : std::string_view();
  };
  AppendHeader(out, "kvroute_pd_pairs_total",
               "Disaggregated requests (prefill legs sent, retries included) by the pair "
               "of endpoints: prefill and decode.",
               MetricType::kCounter);
  for (const auto& [pair, n] : pairs_) {
    const std::string_view p = name(pair.first), d = name(pair.second);
    if (p.empty() || d.empty()) continue;
    Label labels[] = {{"prefill", p}, {"decode", d}};
    AppendSample(out, "kvroute_pd_pairs_total", labels, static_cast<double>(n));
  }
  AppendHeader(out, "kvroute_pd_prefill_queued_tokens",
               "Prompt tokens the router sent to a prefill-capable endpoint as prefill "
               "legs and has not seen answered (the prefill pick's queue term).",
               MetricType::kGauge);
  for (uint32_t id = 0; id < roles_.size() && id < queued_.size(); ++id) {
    if (view.vacant[id] || !PrefillCapable(roles_[id]) || !active_) continue;
    const std::string_view n = name(id);
    if (n.empty()) continue;
    Label labels[] = {{"endpoint", n}};
    AppendSample(out, "kvroute_pd_prefill_queued_tokens", labels, queued_[id]);
  }
}

}  // namespace kvroute::routing
