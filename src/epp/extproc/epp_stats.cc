#include "epp/extproc/epp_stats.h"

#include <algorithm>

#include "core/metrics/prom_writer.h"

namespace kvroute::extproc {

void EppStats::OnRequest(std::string_view model) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end()) it = models_.emplace(std::string(model), PerModel{}).first;
  ++it->second.requests;
}

void EppStats::OnError(std::string_view model, int code) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end()) it = models_.emplace(std::string(model), PerModel{}).first;
  ++it->second.errors[code];
}

void EppStats::OnUsage(std::string_view model, int64_t prompt_tokens, int64_t completion_tokens) {
  if (prompt_tokens < 0 && completion_tokens < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end()) it = models_.emplace(std::string(model), PerModel{}).first;
  if (prompt_tokens > 0) it->second.prompt_tokens += static_cast<uint64_t>(prompt_tokens);
  if (completion_tokens > 0) it->second.completion_tokens += static_cast<uint64_t>(completion_tokens);
  ++it->second.usage_reports;
}

void EppStats::OnPickDuration(double seconds) {
  if (!(seconds >= 0)) return;
  const std::size_t i =
      static_cast<std::size_t>(std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  // A CAS loop: std::atomic<double>::fetch_add needs C++20 library support not every
  // toolchain here has.
  double old = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(old, old + seconds, std::memory_order_relaxed)) {
  }
}

uint64_t EppStats::picks_timed() const {
  uint64_t n = 0;
  for (const auto& b : buckets_) n += b.load(std::memory_order_relaxed);
  return n;
}

void EppStats::AppendMetrics(std::string& out, std::string_view pool,
                             const routing::RoutingCore::PoolLoad& load) const {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  {
    std::lock_guard<std::mutex> lock(mu_);
    AppendHeader(out, "inference_objective_request_total",
                 "Requests the picker scheduled (or refused), by model.", MetricType::kCounter);
    for (const auto& [model, m] : models_) {
      Label labels[] = {{"model_name", model}, {"target_model_name", model}};
      AppendSample(out, "inference_objective_request_total", labels, static_cast<double>(m.requests));
    }
    AppendHeader(out, "inference_objective_request_error_total",
                 "Requests answered with an immediate error response, by model and HTTP status.",
                 MetricType::kCounter);
    for (const auto& [model, m] : models_) {
      for (const auto& [code, n] : m.errors) {
        const std::string code_s = std::to_string(code);
        Label labels[] = {{"model_name", model}, {"target_model_name", model}, {"error_code", code_s}};
        AppendSample(out, "inference_objective_request_error_total", labels, static_cast<double>(n));
      }
    }
    AppendHeader(out, "inference_objective_input_tokens_total",
                 "Prompt tokens reported in response usage, by model.", MetricType::kCounter);
    for (const auto& [model, m] : models_) {
      Label labels[] = {{"model_name", model}, {"target_model_name", model}};
      AppendSample(out, "inference_objective_input_tokens_total", labels, static_cast<double>(m.prompt_tokens));
    }
    AppendHeader(out, "inference_objective_output_tokens_total",
                 "Completion tokens reported in response usage, by model.", MetricType::kCounter);
    for (const auto& [model, m] : models_) {
      Label labels[] = {{"model_name", model}, {"target_model_name", model}};
      AppendSample(out, "inference_objective_output_tokens_total", labels,
                   static_cast<double>(m.completion_tokens));
    }
  }
  Label name[] = {{"name", pool}};
  metrics::AppendGauge(out, "inference_pool_average_kv_cache_utilization",
                       "Mean KV-cache usage (0..1, in-flight estimate included) over ready endpoints.",
                       name, load.kv_known ? load.kv_usage_sum / static_cast<double>(load.kv_known) : 0.0);
  metrics::AppendGauge(out, "inference_pool_average_queue_size",
                       "Mean queued requests (in-flight estimate included) over ready endpoints.", name,
                       load.waiting_known ? load.waiting_sum / static_cast<double>(load.waiting_known) : 0.0);
  metrics::AppendGauge(out, "inference_pool_ready_pods",
                       "Endpoints with fresh metrics, not down or ejected.", name,
                       static_cast<double>(load.ready));
  AppendHeader(out, "inference_extension_scheduler_e2e_duration_seconds",
               "Time to pick an endpoint for one request (subset and shedding checks included).",
               MetricType::kHistogram);
  std::array<uint64_t, kBounds.size() + 1> counts;
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = buckets_[i].load(std::memory_order_relaxed);
  metrics::AppendHistogramSeries(out, "inference_extension_scheduler_e2e_duration_seconds", {},
                                 kBounds, counts, sum_.load(std::memory_order_relaxed));
}

}  // namespace kvroute::extproc
