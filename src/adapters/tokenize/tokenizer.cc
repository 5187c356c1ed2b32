#include "adapters/tokenize/tokenizer.h"

#include <algorithm>
#include <cmath>

namespace kvroute::tokenize {

std::string_view TokenizeFailureName(TokenizeFailure f) {
  switch (f) {
    case TokenizeFailure::kInput: return "input";
    case TokenizeFailure::kConnect: return "connect";
    case TokenizeFailure::kTimeout: return "timeout";
    case TokenizeFailure::kStatus: return "status";
    case TokenizeFailure::kTooLarge: return "too_large";
    case TokenizeFailure::kBadAnswer: return "bad_answer";
    case TokenizeFailure::kTransport: return "transport";
  }
  return "unknown";
}

void TokenizerStats::Record(double seconds, std::optional<TokenizeFailure> failure) {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  calls_.fetch_add(1, kRelaxed);
  if (failure) {
    failures_.fetch_add(1, kRelaxed);
    failures_by_kind_[static_cast<std::size_t>(*failure)].fetch_add(1, kRelaxed);
  }
  if (!(seconds >= 0)) seconds = 0;  // NaN or negative: a clock that went wrong
  const auto it = std::lower_bound(kBuckets.begin(), kBuckets.end(), seconds);  // le
  buckets_[static_cast<std::size_t>(it - kBuckets.begin())].fetch_add(1, kRelaxed);
  latency_sum_ns_.fetch_add(static_cast<uint64_t>(std::llround(seconds * 1e9)), kRelaxed);
}

TokenizerStats::Snapshot TokenizerStats::Read() const {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  Snapshot s;
  s.calls = calls_.load(kRelaxed);
  s.failures = failures_.load(kRelaxed);
  for (std::size_t i = 0; i < s.failures_by_kind.size(); ++i) {
    s.failures_by_kind[i] = failures_by_kind_[i].load(kRelaxed);
  }
  for (std::size_t i = 0; i < s.buckets.size(); ++i) s.buckets[i] = buckets_[i].load(kRelaxed);
  s.latency_sum_s = static_cast<double>(latency_sum_ns_.load(kRelaxed)) / 1e9;
  return s;
}

}  // namespace kvroute::tokenize
