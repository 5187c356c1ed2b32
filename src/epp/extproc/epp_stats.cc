#include "epp/extproc/epp_stats.h"

#include <algorithm>
#include <cmath>
#include <utility>

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

template <std::size_t N>
void EppStats::Histogram<N>::Observe(const std::array<double, N>& bounds, double v) {
  if (!(v >= 0) || !std::isfinite(v)) return;
  ++counts[static_cast<std::size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin())];
  sum += v;
}

EppStats::PerModel& EppStats::ModelLocked(std::string_view model) {
  auto it = models_.find(model);
  if (it == models_.end()) it = models_.emplace(std::string(model), PerModel{}).first;
  return it->second;
}

void EppStats::OnPickOutcome(bool ok) { (ok ? picks_ok_ : picks_failed_).fetch_add(1, std::memory_order_relaxed); }

void EppStats::OnPicked(std::string_view model) {
  std::lock_guard<std::mutex> lock(mu_);
  ++ModelLocked(model).running;
}

void EppStats::OnDone(std::string_view model, const Done& d) {
  std::lock_guard<std::mutex> lock(mu_);
  PerModel& m = ModelLocked(model);
  if (m.running > 0) --m.running;
  m.duration.Observe(kDurationBounds, d.duration_s);
  if (d.ttft_s >= 0) m.ttft.Observe(kTtftBounds, d.ttft_s);
  if (d.input_tokens >= 0) m.input.Observe(kTokenBounds, static_cast<double>(d.input_tokens));
  if (d.output_tokens >= 0) m.output.Observe(kTokenBounds, static_cast<double>(d.output_tokens));
  if (d.cached_tokens >= 0) m.cached.Observe(kTokenBounds, static_cast<double>(d.cached_tokens));
  if (d.end_after_first_s >= 0 && d.output_tokens >= 2) {
    m.ntpot.Observe(kTpotBounds, d.end_after_first_s / static_cast<double>(d.output_tokens - 1));
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
    auto histogram = [&](std::string_view name, std::string_view help, const auto& bounds, auto field) {
      AppendHeader(out, name, help, MetricType::kHistogram);
      for (const auto& [model, m] : models_) {
        Label labels[] = {{"model_name", model}, {"target_model_name", model}};
        const auto& h = field(m);
        metrics::AppendHistogramSeries(out, name, labels, bounds, h.counts, h.sum);
      }
    };
    histogram("llm_d_epp_request_duration_seconds",
              "Picked requests' time from their headers to the end of the response (or the stream's close).",
              kDurationBounds, [](const PerModel& m) -> const auto& { return m.duration; });
    histogram("llm_d_epp_request_ttft_seconds",
              "Picked requests' time from the pick to the first response body byte (response bodies sent).",
              kTtftBounds, [](const PerModel& m) -> const auto& { return m.ttft; });
    histogram("llm_d_epp_request_ntpot_seconds",
              "Picked requests' time per output token after the first byte (two tokens or more).",
              kTpotBounds, [](const PerModel& m) -> const auto& { return m.ntpot; });
    histogram("llm_d_epp_request_input_tokens", "Prompt tokens reported in response usage.", kTokenBounds,
              [](const PerModel& m) -> const auto& { return m.input; });
    histogram("llm_d_epp_request_output_tokens", "Completion tokens reported in response usage.", kTokenBounds,
              [](const PerModel& m) -> const auto& { return m.output; });
    histogram("llm_d_epp_request_cached_tokens",
              "Cached prompt tokens reported in response usage (prompt_tokens_details.cached_tokens).",
              kTokenBounds, [](const PerModel& m) -> const auto& { return m.cached; });
    AppendHeader(out, "llm_d_epp_request_running", "Picked requests not yet answered in full, by model.",
                 MetricType::kGauge);
    for (const auto& [model, m] : models_) {
      Label labels[] = {{"model_name", model}, {"target_model_name", model}};
      AppendSample(out, "llm_d_epp_request_running", labels, static_cast<double>(m.running));
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
  gauge({"llm_d_epp_flow_control_pool_saturation"},
        "Share of the ready endpoints the saturation detector calls saturated (1 when none is ready).",
        gauges.ready ? static_cast<double>(gauges.saturated) / static_cast<double>(gauges.ready) : 1.0);
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
  AppendHeader(out, "llm_d_epp_scheduler_attempts_total", "Picks, by status: success or failure (no usable endpoint).",
               MetricType::kCounter);
  for (const auto& [status, n] : {std::pair<std::string_view, uint64_t>{"success", picks_ok_.load()},
                                  {"failure", picks_failed_.load()}}) {
    const Label l{"status", status};
    AppendSample(out, "llm_d_epp_scheduler_attempts_total", {&l, 1}, static_cast<double>(n));
  }
  twins({"llm_d_epp_scheduler_e2e_duration_seconds", "inference_extension_scheduler_e2e_duration_seconds"},
        "Time to pick an endpoint for one request (subset and shedding checks included).",
        MetricType::kHistogram,
        [&](std::string_view n) { metrics::AppendHistogramSeries(out, n, {}, kBounds, counts, sum); });
}

}  // namespace kvroute::extproc
