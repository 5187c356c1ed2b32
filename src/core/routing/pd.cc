#include "core/routing/pd.h"

#include <algorithm>
#include <cmath>

namespace kvroute::routing {

RoleParse ParseRole(std::string_view value) {
  if (value == "prefill") return {Role::kPrefill, true};
  if (value == "decode") return {Role::kDecode, true};
  if (value == "prefill-decode" || value == "both") return {Role::kBoth, true};
  return {Role::kUnset, false};
}

Role RoleOf(std::span<const std::pair<std::string, std::string>> labels) {
  Role role = Role::kUnset;
  for (const auto& [k, v] : labels) {
    if (k == kRoleLabel) role = ParseRole(v).role;
  }
  return role;
}

std::string_view RoleName(Role r) {
  switch (r) {
    case Role::kPrefill: return "prefill";
    case Role::kDecode: return "decode";
    case Role::kBoth: return "prefill-decode";
    case Role::kUnset: break;
  }
  return "";
}

std::string_view PdDecisionName(PdDecision d) {
  switch (d) {
    case PdDecision::kOff: return "off";
    case PdDecision::kShortPrompt: return "short_prompt";
    case PdDecision::kCached: return "cached";
    case PdDecision::kDisaggregate: return "disaggregate";
    case PdDecision::kNoPrefill: return "no_prefill";
  }
  return "off";
}

PdDecision Decide(const PdOptions& o, int64_t prompt_tokens, int64_t cached_tokens) {
  const int64_t prompt = std::max<int64_t>(prompt_tokens, 0);
  const int64_t cached = std::clamp<int64_t>(cached_tokens, 0, prompt);
  if (prompt < o.prompt_tokens || prompt == 0) return PdDecision::kShortPrompt;
  if (prompt - cached < o.non_cached_tokens) return PdDecision::kCached;
  return PdDecision::kDisaggregate;
}

int PickPrefill(std::span<const PrefillCandidate> c) {
  int best = -1;
  auto cost = [](const PrefillCandidate& p) {
    // Unknown work is never attractive: a non-finite figure costs the most.
    if (!std::isfinite(p.uncached_tokens) || !std::isfinite(p.queued_tokens)) return HUGE_VAL;
    return std::max(0.0, p.uncached_tokens) + std::max(0.0, p.queued_tokens);
  };
  auto queue = [](const PrefillCandidate& p) {
    return std::isfinite(p.waiting) && p.waiting >= 0 ? p.waiting : HUGE_VAL;
  };
  for (int i = 0; i < static_cast<int>(c.size()); ++i) {
    if (best < 0) {
      best = i;
      continue;
    }
    const PrefillCandidate& a = c[i];
    const PrefillCandidate& b = c[best];
    const double ca = cost(a), cb = cost(b);
    if (ca != cb) {
      if (ca < cb) best = i;
      continue;
    }
    const double qa = queue(a), qb = queue(b);
    if (qa != qb) {
      if (qa < qb) best = i;
      continue;
    }
    if (a.id < b.id) best = i;
  }
  return best;
}

}  // namespace kvroute::routing
