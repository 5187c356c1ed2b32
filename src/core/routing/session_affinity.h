// Session affinity (issue 26; docs/POLICIES.md "Sessions") as a component of the routing
// core: the session table (sessions.h), whether sessions are on, the rule that puts a
// session's endpoint first in a pick's ranking while it is usable and rebinds the session
// otherwise, and the picks counted by outcome with their /metrics series. RoutingCore owns
// one: its Pick looks the session up before taking the scheduler's lock (LookUp), places it
// in the pick's commit (Place) and records the binding after (Bind); Configure sets its
// options; AppendMetrics writes its series.
//
// Threads: every method may be called from any thread. The table has its own sharded locks,
// never held with the scheduler's: LookUp, Bind and AppendMetrics run outside that lock.
// Place runs under the scheduler's lock held exclusively (it reads the core's view of the
// pool). The counters are atomics. Using a known session allocates nothing.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/routing/routing_core.h"
#include "core/routing/sched_view.h"
#include "core/routing/sessions.h"

namespace kvroute::routing {

class SessionAffinity {
 public:
  // A pick's session: its binding and token, read before the scheduler's lock;
  // `token_address` points into `token_buf` (never copy a lookup).
  struct Lookup {
    bool active = false;  // sessions are on and the request names one
    uint64_t key = 0;
    std::optional<SessionTable::Binding> bound;
    std::optional<std::string_view> token_address;
    std::array<char, 256> token_buf;
    SessionTable::Binding bind;  // what to record after the pick
  };

  SessionAffinity();
  ~SessionAffinity();
  SessionAffinity(const SessionAffinity&) = delete;
  SessionAffinity& operator=(const SessionAffinity&) = delete;

  // New options; bindings survive (an id keeps its endpoint id while its address survives).
  void Configure(const SessionOptions& options);

  // The request's binding (by its session id) and token, at `now_s`.
  void LookUp(const PickRequest& request, double now_s, Lookup& out);
  // A successful pick of a request with a session (`session.active`): the session's endpoint
  // (the token's, else the id's binding) first in out.ranked when it is still a candidate
  // and not saturated (PickRequest::session_id says the rule), unless a routing hint placed
  // the first `hinted` endpoints; sets out.session, counts it, and sets session.bind.
  void Place(const PickRequest& request, const sched::PickResult& r, std::size_t hinted,
             const SchedView& view, Lookup& session, PickResult& out);
  // Records the pick's binding of the request's session id.
  void Bind(const Lookup& session, double now_s);

  uint64_t picks(SessionOutcome outcome) const;
  std::size_t size() const;
  // Sweeps expired bindings, then kvroute_sessions, kvroute_session_picks_total and
  // kvroute_sessions_evicted_total.
  void AppendMetrics(std::string& out, double now_s);

 private:
  // Place's rule when no hint decided.
  void PlaceSession(const PickRequest& request, const sched::PickResult& r, const SchedView& view,
                    const Lookup& session, PickResult& out, SessionTable::Binding& bind) const;
  // PoolLoad's saturation rule for endpoint `id` from the scheduler's view (with the
  // in-flight estimate); an endpoint whose load is unknown or stale counts as saturated.
  static bool Saturated(const SchedView& view, uint32_t id);

  std::unique_ptr<SessionTable> table_;
  std::atomic<bool> enabled_{true};
  // Picks by what their session did (index = SessionOutcome; kNone not counted).
  std::array<std::atomic<uint64_t>, kNumSessionOutcomes> picks_{};
};

}  // namespace kvroute::routing
