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
                             const routing::RoutingCore::PoolGauges& gauges) const {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  // Each family under every name in `names`, the samples alike.
  auto twins = [&](std::initializer_list<std::string_view> names, std::string_view help, MetricType type,
                   auto&& samples) {
    for (std::string_view name : names) {
      AppendHeader(out, name, help, type);
      samples(name);
    }
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    twins({"llm_d_epp_request_total", "inference_objective_request_total"},
          "Requests the picker scheduled (or refused), by model.", MetricType::kCounter,
          [&](std::string_view name) {
            for (const auto& [model, m] : models_) {
              Label labels[] = {{"model_name", model}, {"target_model_name", model}};
              AppendSample(out, name, labels, static_cast<double>(m.requests));
            }
          });
    twins({"llm_d_epp_request_error_total", "inference_objective_request_error_total"},
          "Requests answered with an immediate error response, by model and HTTP status.",
          MetricType::kCounter, [&](std::string_view name) {
            for (const auto& [model, m] : models_) {
              for (const auto& [code, n] : m.errors) {
                const std::string code_s = std::to_string(code);
                Label labels[] = {{"model_name", model}, {"target_model_name", model}, {"error_code", code_s}};
                AppendSample(out, name, labels, static_cast<double>(n));
              }
            }
          });
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
  auto gauge = [&](std::initializer_list<std::string_view> names, std::string_view help, double v) {
    for (std::string_view n : names) metrics::AppendGauge(out, n, help, name, v);
  };
  gauge({"llm_d_epp_average_kv_cache_utilization", "inference_pool_average_kv_cache_utilization"},
        "Mean KV-cache usage (0..1, in-flight estimate included) over ready endpoints that report it.",
        gauges.kv_usage.Mean());
  gauge({"llm_d_epp_average_queue_size", "inference_pool_average_queue_size"},
        "Mean queued requests (in-flight estimate included) over ready endpoints that report it.",
        gauges.waiting.Mean());
  gauge({"llm_d_epp_average_running_requests"},
        "Mean running requests (as scraped) over ready endpoints that report it.", gauges.running.Mean());
  gauge({"llm_d_epp_std_dev_kv_cache_utilization"},
        "Standard deviation of KV-cache usage over ready endpoints that report it (the spread).",
        gauges.kv_usage.StdDev());
  gauge({"llm_d_epp_std_dev_queue_size"},
        "Standard deviation of queued requests over ready endpoints that report it.", gauges.waiting.StdDev());
  gauge({"llm_d_epp_ready_endpoints", "inference_pool_ready_pods"},
        "Endpoints with fresh metrics, not down or ejected.", static_cast<double>(gauges.ready));
  twins({"llm_d_epp_per_endpoint_queue_size", "inference_pool_per_pod_queue_size"},
        "Queued requests (in-flight estimate included) of each ready endpoint (NaN: unknown).",
        MetricType::kGauge, [&](std::string_view n) {
          const bool old = n.front() == 'i';
          for (const auto& q : gauges.queues) {
            Label labels[] = {{"name", pool}, {old ? "model_server_pod" : "model_server_endpoint", q.address}};
            AppendSample(out, n, labels, q.waiting);
          }
        });
  std::array<uint64_t, kBounds.size() + 1> counts;
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = buckets_[i].load(std::memory_order_relaxed);
  const double sum = sum_.load(std::memory_order_relaxed);
  twins({"llm_d_epp_scheduler_e2e_duration_seconds", "inference_extension_scheduler_e2e_duration_seconds"},
        "Time to pick an endpoint for one request (subset and shedding checks included).",
        MetricType::kHistogram,
        [&](std::string_view n) { metrics::AppendHistogramSeries(out, n, {}, kBounds, counts, sum); });
}

}  // namespace kvroute::extproc
