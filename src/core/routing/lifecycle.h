// The request-lifecycle decisions a front end asks the core for when something went wrong,
// so that serve, the sidecar and simulate carry out one rule instead of writing it each:
//
//   RoutingCore::OnAttemptFailed(failure, now) -> retry on ranked[i], or end the request
//   RoutingCore::OnPrefillFailed(failure, now) -> move the prefill leg to endpoint X, or
//                                                 let the decode endpoint prefill locally
//   DecideSidecarPrefill(failure)              -> the sidecar's same-prefiller retry (it
//                                                 has no routing core: a pure rule)
//
// The front end translates its protocol into these structs (what reached the client, which
// failures its transport may retry), then executes the decision. Nothing here does I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/sched/types.h"

namespace kvroute::routing {

struct EndpointTable;

// Why an upstream attempt failed, for counters and passive health.
struct UpstreamFailure {
  // "connect_refused", "reset", "first_byte_timeout", ..., or "http_<status>" for a 5xx
  // answer.
  std::string_view kind;
  bool connect_failed = false;   // the endpoint did not accept the connection
};

// One attempt of a picked request failed on `endpoint_id` (the front end already knows the
// request did not simply get cancelled by its client: that is no failure of the endpoint).
struct AttemptFailure {
  uint32_t endpoint_id = 0xffffffffu;
  UpstreamFailure failure;
  uint32_t attempt = 0;       // the index in the pick's ranking that failed (0: the first)
  std::size_t n_ranked = 0;   // PickResult::n_ranked
  uint32_t max_attempts = 1;  // the front end's limit on attempts per request (>= 1)
  // The client already holds part of the answer (a relayed head, a first token): the
  // request cannot move.
  bool started = false;
  // The front end's transport says this kind of failure may be retried elsewhere (serve:
  // nothing relayed yet and a connect failure, reset, failed send, first-byte timeout or
  // protocol error, or a 5xx answer held back).
  bool retryable = true;
  bool client_gone = false;  // the client left: nothing to retry for
};

struct AttemptDecision {
  enum class Kind : uint8_t { kEnd, kRetry };
  Kind kind = Kind::kEnd;
  uint32_t next_attempt = 0;  // kRetry: send to ranked[next_attempt]
  bool retry() const { return kind == Kind::kRetry; }
};

// A disaggregated request's prefill leg failed before answering usefully. The front end
// has already ended the leg (OnPrefillDone) and passes what a new prefill pick needs.
struct PrefillFailure {
  uint32_t prefill_id = 0xffffffffu;
  UpstreamFailure failure;
  // The endpoint's fault (a transport failure, a 5xx, an oversized answer): counted against
  // it, and the leg may move to another prefill endpoint. False for a 4xx (the request
  // itself is at fault): the decode endpoint prefills locally, and nothing is counted.
  bool server_fault = true;
  const sched::SchedRequest* request = nullptr;  // the request, for PickPrefill
  uint32_t decode_id = 0xffffffffu;              // the pick's ranked[0]
  // Prefill endpoints tried so far; OnPrefillFailed appends `prefill_id` when it is the
  // endpoint's fault. Owned by the front end's request.
  std::vector<uint32_t>* tried = nullptr;
  bool client_gone = false;
};

struct PrefillDecision {
  enum class Kind : uint8_t { kLocal, kMove };
  Kind kind = Kind::kLocal;
  uint32_t prefill = 0xffffffffu;  // kMove: the new prefill endpoint
  double prefill_tokens = 0.0;     // kMove: its charged tokens (pass to OnPrefillDone)
  std::shared_ptr<const EndpointTable> table;  // kMove: the table `prefill` refers to
  bool move() const { return kind == Kind::kMove; }
};

// The sidecar's prefill leg (P/D behind epp) failed. It retries the same prefiller (epp
// named it; the sidecar has no pool to choose from) on a transport failure or a 502/503/504,
// at most `max_retries` times, unless the client left; otherwise the local engine prefills.
struct SidecarPrefillFailure {
  bool transport_failed = false;  // no answer at all
  int status = 0;                 // the answer's status when there was one
  int retries_so_far = 0;
  int max_retries = 0;
  bool client_gone = false;
};
enum class SidecarPrefillDecision : uint8_t { kLocal, kRetrySame };
SidecarPrefillDecision DecideSidecarPrefill(const SidecarPrefillFailure& f);

}  // namespace kvroute::routing
