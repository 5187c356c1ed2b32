// What the two front ends that run prefill/decode legs (serve, and the decode pod's
// sidecar) count about them, and its exposition (issue 25): the same series from both, so
// one dashboard reads either.
//   kvroute_pd_legs_total{leg="prefill"|"decode", outcome}
//   kvroute_pd_fallbacks_total{reason}
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvroute::pd {

// How a leg ended: ok; no_params (prefill answered without kv_transfer_params, so the
// decode endpoint prefilled locally; prefill leg only); error (failed before answering);
// cancelled (the client left).
enum class PdOutcome : uint8_t { kOk, kNoParams, kError, kCancelled };
inline constexpr std::size_t kPdOutcomes = 4;
inline constexpr std::string_view kPdOutcomeNames[kPdOutcomes] = {"ok", "no_params", "error", "cancelled"};

// Why a disaggregated request's legs did not go as picked: prefill_retry (a failed
// prefill leg was sent again: to another prefill endpoint in serve, to the same one in the
// sidecar), local_prefill (no prefill answer to pass on: the decode endpoint prefilled
// alone), decode_retry (the decode leg failed before its first byte and went again as an
// ordinary request).
enum class PdFallback : uint8_t { kPrefillRetry, kLocalPrefill, kDecodeRetry };
inline constexpr std::size_t kPdFallbacks = 3;
inline constexpr std::string_view kPdFallbackNames[kPdFallbacks] = {"prefill_retry", "local_prefill",
                                                                    "decode_retry"};

// Relaxed atomics: counted from any worker thread, read by /metrics.
struct PdCounters {
  std::atomic<uint64_t> prefill[kPdOutcomes]{};
  std::atomic<uint64_t> decode[kPdOutcomes]{};
  std::atomic<uint64_t> fallbacks[kPdFallbacks]{};

  void Count(PdOutcome o, bool decode_leg) {
    (decode_leg ? decode : prefill)[static_cast<std::size_t>(o)].fetch_add(1, std::memory_order_relaxed);
  }
  void Count(PdFallback f) { fallbacks[static_cast<std::size_t>(f)].fetch_add(1, std::memory_order_relaxed); }
};

// Appends both families (HELP, TYPE and every sample, zeros included).
void AppendPdMetrics(std::string& out, const PdCounters& c);

}  // namespace kvroute::pd
