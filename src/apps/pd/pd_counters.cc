#include "apps/pd/pd_counters.h"

#include "core/metrics/prom_writer.h"

namespace kvroute::pd {

void AppendPdMetrics(std::string& out, const PdCounters& c) {
  auto load = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  metrics::AppendHeader(out, "kvroute_pd_legs_total",
                        "Prefill/decode legs run for disaggregated requests, by leg and outcome: "
                        "ok, no_params (prefill answered without kv_transfer_params: decode "
                        "prefilled locally), error (failed before answering), cancelled (the "
                        "client left).",
                        metrics::MetricType::kCounter);
  for (int leg = 0; leg < 2; ++leg) {
    for (std::size_t i = 0; i < kPdOutcomes; ++i) {
      if (leg == 1 && i == static_cast<std::size_t>(PdOutcome::kNoParams)) continue;
      const metrics::Label labels[] = {{"leg", leg == 0 ? "prefill" : "decode"},
                                       {"outcome", kPdOutcomeNames[i]}};
      metrics::AppendSample(out, "kvroute_pd_legs_total", labels,
                            load(leg == 0 ? c.prefill[i] : c.decode[i]));
    }
  }
  std::array<metrics::LabeledValue, kPdFallbacks> by_reason;
  for (std::size_t i = 0; i < kPdFallbacks; ++i) {
    by_reason[i] = {kPdFallbackNames[i], load(c.fallbacks[i])};
  }
  metrics::AppendCounterFamily(out, "kvroute_pd_fallbacks_total",
                               "Disaggregated requests whose legs did not go as picked, by "
                               "reason: prefill_retry (a failed prefill leg was sent again), "
                               "local_prefill (no prefill answer to pass on: the decode endpoint "
                               "prefilled alone), decode_retry (the decode leg failed before its "
                               "first byte and was retried as an ordinary request).",
                               "reason", by_reason);
}

}  // namespace kvroute::pd
