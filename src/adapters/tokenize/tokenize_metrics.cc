#include "adapters/tokenize/tokenize_metrics.h"

#include "core/metrics/prom_writer.h"

namespace kvroute::tokenize {

void AddSnapshot(TokenizerStats::Snapshot& sum, const TokenizerStats::Snapshot& s) {
  sum.calls += s.calls;
  sum.failures += s.failures;
  for (std::size_t i = 0; i < s.failures_by_kind.size(); ++i) sum.failures_by_kind[i] += s.failures_by_kind[i];
  for (std::size_t i = 0; i < s.buckets.size(); ++i) sum.buckets[i] += s.buckets[i];
  sum.latency_sum_s += s.latency_sum_s;
}

void AppendTokenizerMetrics(std::string& out, const TokenizerStats::Snapshot& sum) {
  metrics::AppendCounter(out, "kvroute_tokenize_requests_total",
                         "Prompts tokenized for precise prefix routing (POST /tokenize).", {},
                         static_cast<double>(sum.calls));
  metrics::AppendHeader(out, "kvroute_tokenize_failures_total",
                        "Tokenize calls that failed, by kind (the request was then routed by "
                        "the approximate model).", metrics::MetricType::kCounter);
  for (std::size_t i = 0; i < kNumTokenizeFailures; ++i) {
    const metrics::Label kind{"kind", TokenizeFailureName(static_cast<TokenizeFailure>(i))};
    metrics::AppendSample(out, "kvroute_tokenize_failures_total", {&kind, 1},
                          static_cast<double>(sum.failures_by_kind[i]));
  }
  metrics::AppendHeader(out, "kvroute_tokenize_duration_seconds", "Time to tokenize one prompt.",
                        metrics::MetricType::kHistogram);
  metrics::AppendHistogramSeries(out, "kvroute_tokenize_duration_seconds", {},
                                 TokenizerStats::kBuckets, sum.buckets, sum.latency_sum_s);
}

}  // namespace kvroute::tokenize
