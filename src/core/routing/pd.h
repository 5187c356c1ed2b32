// Prefill/decode disaggregation (issue 25): the rules the routing core applies when the
// pool has prefill endpoints. Pure logic: no clock, no lock, no I/O.
//
// Roles come from an endpoint's `llm-d.ai/role` label (config labels, the endpoints file,
// the pod label in Kubernetes): `prefill`, `decode`, `prefill-decode` (or its deprecated
// spelling `both`); unlabelled is decode-capable, as in llm-d (a decode filter accepts
// decode, prefill-decode and unlabelled endpoints; a prefill filter needs the label).
//
// When the pool has at least one `prefill` endpoint, a pick is a pair:
//   1. the decode endpoint, by the policy, among the decode-capable endpoints;
//   2. the decision (Decide): disaggregate when the prompt reaches `prompt_tokens` and its
//      tokens not already cached on that decode endpoint reach `non_cached_tokens`;
//   3. the prefill endpoint (PickPrefill), among the ready prefill-capable endpoints other
//      than the decode one: the least prefill work ahead of and including this request,
//      in tokens (its uncached prompt there plus the prefill the router has sent there and
//      not yet seen answered), so a prefix-warm endpoint wins until its queue costs more
//      than the prefix saves.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvroute::routing {

inline constexpr std::string_view kRoleLabel = "llm-d.ai/role";

enum class Role : uint8_t {
  kUnset,    // no label: decode-capable
  kPrefill,  // prefill only
  kDecode,   // decode only
  kBoth,     // prefill-decode (or both)
};

// The role a label value names; nullopt-like kUnset for an absent label. `ok` false when
// the value is not one of the names above (the caller reports it).
struct RoleParse {
  Role role = Role::kUnset;
  bool ok = true;
};
RoleParse ParseRole(std::string_view value);
// The role of an endpoint with `labels` (the last `llm-d.ai/role` wins; an unknown value
// counts as unset).
Role RoleOf(std::span<const std::pair<std::string, std::string>> labels);
std::string_view RoleName(Role r);  // "", "prefill", "decode", "prefill-decode"
inline bool DecodeCapable(Role r) { return r != Role::kPrefill; }
inline bool PrefillCapable(Role r) { return r == Role::kPrefill || r == Role::kBoth; }

// scheduling.pd. Defaults: below 256 uncached tokens a local prefill costs a few
// milliseconds of an H100 step (about 5 ms at 50k prefill tokens/s), less than the second
// leg's round trip and the KV transfer's setup, so it is not worth a second replica.
struct PdOptions {
  int64_t non_cached_tokens = 256;  // >= 0; 0: every prompt of prompt_tokens or more
  int64_t prompt_tokens = 256;      // >= 0
};

enum class PdDecision : uint8_t {
  kOff,           // the pool has no prefill endpoint: an ordinary pick
  kShortPrompt,   // the prompt is below prompt_tokens: decode alone
  kCached,        // its uncached tokens on the decode endpoint are below non_cached_tokens
  kDisaggregate,  // a prefill endpoint computes the prompt first
  kNoPrefill,     // it would disaggregate, but no prefill endpoint is ready: decode alone
};
inline constexpr std::size_t kNumPdDecisions = 5;
std::string_view PdDecisionName(PdDecision d);  // "off", "short_prompt", ...

// Step 2. `cached_tokens`: the prompt's tokens the router believes cached on the decode
// endpoint (clamped to 0..prompt_tokens). Never kOff or kNoPrefill.
PdDecision Decide(const PdOptions& o, int64_t prompt_tokens, int64_t cached_tokens);

// A prefill candidate as step 3 sees it.
struct PrefillCandidate {
  uint32_t id = 0;
  double uncached_tokens = 0.0;  // the prompt's tokens not cached there
  double queued_tokens = 0.0;    // prefill the router sent there, not yet answered
  double waiting = -1.0;         // the engine's scraped queue; < 0: unknown
};
// Step 3: the candidate with the least uncached_tokens + queued_tokens; ties: the shorter
// known engine queue (unknown counts as longer than any known), then the lower id.
// Returns the index into `c`, or -1 when `c` is empty.
int PickPrefill(std::span<const PrefillCandidate> c);

}  // namespace kvroute::routing
