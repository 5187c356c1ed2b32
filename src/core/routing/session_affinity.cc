#include "core/routing/session_affinity.h"

#include <algorithm>
#include <span>

#include "core/metrics/prom_writer.h"
#include "core/routing/core_counters.h"

namespace kvroute::routing {

using core_detail::Bump;
using core_detail::GetU;
using metrics::AppendCounter;
using metrics::AppendGauge;
using metrics::AppendHeader;
using metrics::AppendSample;
using metrics::Label;
using metrics::MetricType;

std::string_view SessionOutcomeName(SessionOutcome o) {
  switch (o) {
    case SessionOutcome::kNone: return "none";
    case SessionOutcome::kBound: return "bound";
    case SessionOutcome::kNew: return "new";
    case SessionOutcome::kMovedGone: return "moved_gone";
    case SessionOutcome::kMovedSaturated: return "moved_saturated";
    case SessionOutcome::kToken: return "token";
  }
  return "none";
}

SessionAffinity::SessionAffinity() : table_(std::make_unique<SessionTable>()) {}
SessionAffinity::~SessionAffinity() = default;

void SessionAffinity::Configure(const SessionOptions& options) {
  table_->SetOptions(options);
  enabled_.store(options.enabled, std::memory_order_relaxed);
}

void SessionAffinity::LookUp(const PickRequest& request, double now_s, Lookup& out) {
  out.active = enabled_.load(std::memory_order_relaxed) &&
               (!request.session_id.empty() || !request.session_token.empty());
  if (!out.active) return;
  if (!request.session_id.empty()) {
    out.key = SessionKey(request.session_id);
    out.bound = table_->Find(out.key, now_s);
  }
  if (!request.session_token.empty()) {
    out.token_address = DecodeSessionToken(request.session_token, out.token_buf);
  }
}

void SessionAffinity::Place(const PickRequest& request, const sched::PickResult& r, std::size_t hinted,
                            const SchedView& view, Lookup& session, PickResult& out) {
  if (hinted == 0) {
    PlaceSession(request, r, view, session, out, session.bind);
    if (out.session != SessionOutcome::kNone) {
      Bump(picks_[static_cast<std::size_t>(out.session)]);
    }
  } else {
    // A routing hint decided: the session follows it.
    session.bind.endpoint = out.ranked[0];
    session.bind.address_key = SessionKey(out.endpoint(0).spec.address);
  }
}

void SessionAffinity::Bind(const Lookup& session, double now_s) {
  table_->Bind(session.key, session.bind, now_s);
}

bool SessionAffinity::Saturated(const SchedView& view, uint32_t id) {
  const health::Verdict& v = view.verdicts[id];
  if (v.treatment != health::Treatment::kNormal) return true;
  const sched::EndpointState& st = view.states[id];
  const double capacity = st.num_gpu_blocks > 0
                              ? static_cast<double>(st.num_gpu_blocks)
                              : static_cast<double>(sched::SchedulerOptions{}.default_num_gpu_blocks);
  const sched::EndpointLoad adj = view.scheduler->inflight().Load(st, capacity, true);
  return (v.Known(health::Signal::kKvUsage) && adj.kv_usage >= 0.8) ||
         (v.Known(health::Signal::kWaiting) && adj.waiting >= 5.0);
}

void SessionAffinity::PlaceSession(const PickRequest& request, const sched::PickResult& r,
                                   const SchedView& view, const Lookup& session, PickResult& out,
                                   SessionTable::Binding& bind) const {
  auto contains = [](std::span<const uint32_t> ids, uint32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  // 0: usable; 1: no longer a candidate; 2: saturated (and the policy's pick is not).
  auto assess = [&](uint32_t id) {
    if (id >= view.states.size() || view.vacant[id] || !view.states[id].healthy) return 1;
    if (!request.only.empty() && !contains(request.only, id)) return 1;
    if (id != out.ranked[0] && Saturated(view, id) && !Saturated(view, out.ranked[0])) return 2;
    // Filtered out by the policy for another reason than load (its candidates are the
    // ids that passed its filters).
    if (!r.candidates.empty() && !contains(r.candidates, id)) return Saturated(view, id) ? 2 : 1;
    return 0;
  };
  auto first = [&](uint32_t id) {
    std::size_t k = 0;
    while (k < out.n_ranked && out.ranked[k] != id) ++k;
    if (k == out.n_ranked) {
      if (out.n_ranked < view.max_ranked) ++out.n_ranked;
      k = out.n_ranked - 1;
    }
    for (; k > 0; --k) out.ranked[k] = out.ranked[k - 1];
    out.ranked[0] = id;
  };
  bool placed = false;
  if (session.token_address) {
    for (uint32_t id = 0; id < view.states.size() && !placed; ++id) {
      const Endpoint* ep = view.table->Find(id);
      if (ep == nullptr || ep->spec.address != *session.token_address) continue;
      if (assess(id) == 0) {
        first(id);
        out.session = SessionOutcome::kToken;
        placed = true;
      }
      break;
    }
  }
  if (!placed && session.bound) {
    const Endpoint* ep = view.table->Find(session.bound->endpoint);
    // An id a reload gave to another address is another endpoint: the session's is gone.
    const int a = ep && SessionKey(ep->spec.address) == session.bound->address_key
                      ? assess(session.bound->endpoint)
                      : 1;
    if (a == 0) {
      first(session.bound->endpoint);
      out.session = SessionOutcome::kBound;
    } else {
      out.session = a == 2 ? SessionOutcome::kMovedSaturated : SessionOutcome::kMovedGone;
    }
  } else if (!placed && !request.session_id.empty()) {
    out.session = SessionOutcome::kNew;
  }
  bind.endpoint = out.ranked[0];
  bind.address_key = SessionKey(view.table->by_id[out.ranked[0]]->spec.address);
}

uint64_t SessionAffinity::picks(SessionOutcome outcome) const {
  return picks_[static_cast<std::size_t>(outcome)].load(std::memory_order_relaxed);
}

std::size_t SessionAffinity::size() const { return table_->size(); }

void SessionAffinity::AppendMetrics(std::string& out, double now_s) {
  table_->Sweep(now_s);
  AppendGauge(out, "kvroute_sessions",
              "Session ids bound to an endpoint (x-session-id), idle less than the TTL.", {},
              static_cast<double>(table_->size()));
  AppendHeader(out, "kvroute_session_picks_total",
               "Picks of requests with a session id or token, by outcome (bound: stayed on "
               "the session's endpoint; new: first binding; moved_gone, moved_saturated: "
               "rebound to the policy's pick; token: routed by the session token).",
               MetricType::kCounter);
  for (std::size_t i = 1; i < kNumSessionOutcomes; ++i) {
    Label labels[] = {{"outcome", SessionOutcomeName(static_cast<SessionOutcome>(i))}};
    AppendSample(out, "kvroute_session_picks_total", labels, GetU(picks_[i]));
  }
  AppendCounter(out, "kvroute_sessions_evicted_total",
                "Session bindings dropped to stay within sessions.max_sessions (idle longest "
                "first).",
                {}, static_cast<double>(table_->evicted()));
}

}  // namespace kvroute::routing
