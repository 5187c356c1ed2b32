// The lifecycle decisions (lifecycle.h) as RoutingCore methods: they combine the core's
// health, retry budget and P/D rules in the one order every front end used to write out.
#include "core/routing/lifecycle.h"

#include <algorithm>
#include <utility>

#include "core/routing/routing_core.h"

namespace kvroute::routing {

AttemptDecision RoutingCore::OnAttemptFailed(const AttemptFailure& f, double now_s) {
  OnUpstreamFailure(f.endpoint_id, f.failure, now_s);
  AttemptDecision d;
  // The cheap conditions first: the retry budget counts every retry it allows or denies,
  // so it is asked only for a request that could move.
  const std::size_t limit = std::min<std::size_t>(f.n_ranked, f.max_attempts);
  if (f.started || !f.retryable || f.client_gone || f.attempt + 1 >= limit) return d;
  // A connect failure never reached an engine: its retry is free of the budget.
  if (!AllowRetry(now_s, f.failure.connect_failed)) return d;
  d.kind = AttemptDecision::Kind::kRetry;
  d.next_attempt = f.attempt + 1;
  return d;
}

PrefillDecision RoutingCore::OnPrefillFailed(const PrefillFailure& f, double now_s) {
  PrefillDecision d;
  if (!f.server_fault) return d;
  OnUpstreamFailure(f.prefill_id, f.failure, now_s);
  if (f.tried != nullptr) f.tried->push_back(f.prefill_id);
  if (f.client_gone || f.request == nullptr) return d;
  PickResult alt;
  const std::span<const uint32_t> exclude =
      f.tried != nullptr ? std::span<const uint32_t>(*f.tried) : std::span<const uint32_t>();
  if (!PickPrefill(*f.request, f.decode_id, exclude, alt)) return d;
  if (!AllowRetry(now_s, f.failure.connect_failed)) {
    OnPrefillDone(alt.prefill, alt.prefill_tokens);  // picked, but not sent after all
    return d;
  }
  d.kind = PrefillDecision::Kind::kMove;
  d.prefill = alt.prefill;
  d.prefill_tokens = alt.prefill_tokens;
  d.table = std::move(alt.table);
  return d;
}

SidecarPrefillDecision DecideSidecarPrefill(const SidecarPrefillFailure& f) {
  const bool transient =
      f.transport_failed || f.status == 502 || f.status == 503 || f.status == 504;
  if (transient && f.retries_so_far < f.max_retries && !f.client_gone) {
    return SidecarPrefillDecision::kRetrySame;
  }
  return SidecarPrefillDecision::kLocal;
}

}  // namespace kvroute::routing
