#include "apps/epp/extproc/epp_stats.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <span>
#include <utility>

#include "core/metrics/prom_writer.h"

namespace kvroute::extproc {
namespace {

// Each family under every name in `names`, the samples alike.
template <typename Samples>
void AppendTwins(std::string& out, std::initializer_list<std::string_view> names, std::string_view help,
                 metrics::MetricType type, Samples&& samples) {
  for (std::string_view name : names) {
    metrics::AppendHeader(out, name, help, type);
    samples(name);
  }
}

// The pool gauges (llm_d_epp_average_*, _std_dev_*, _ready_endpoints, the per-endpoint
// queue sizes and their inference_pool_* twins) from `gauges`, labelled with `pool`.
void AppendPoolGauges(std::string& out, std::string_view pool,
                      const routing::RoutingCore::PoolGauges& gauges) {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
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
  AppendTwins(out, {"llm_d_epp_per_endpoint_queue_size", "inference_pool_per_pod_queue_size"},
              "Queued requests (in-flight estimate included) of each ready endpoint (NaN: unknown).",
              MetricType::kGauge, [&](std::string_view n) {
                const bool old = n.front() == 'i';
                for (const auto& q : gauges.queues) {
                  Label labels[] = {{"name", pool}, {old ? "model_server_pod" : "model_server_endpoint", q.address}};
                  AppendSample(out, n, labels, q.waiting);
                }
              });
}

}  // namespace

void EppStats::OnRequest(const RequestLabels& l) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  ++ModelLocked(l).requests;
}

void EppStats::OnError(const RequestLabels& l, int code) {
  std::lock_guard<std::mutex> lock(mu_);
  ++ModelLocked(l).errors[code];
}

void EppStats::OnUsage(const RequestLabels& l, int64_t prompt_tokens, int64_t completion_tokens) {
  if (prompt_tokens < 0 && completion_tokens < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  PerModel& m = ModelLocked(l);
  if (prompt_tokens > 0) m.prompt_tokens += static_cast<uint64_t>(prompt_tokens);
  if (completion_tokens > 0) m.completion_tokens += static_cast<uint64_t>(completion_tokens);
  ++m.usage_reports;
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

EppStats::PerModel& EppStats::ModelLocked(const RequestLabels& l) {
  KeyView k{l.model, l.target_model, l.fairness_id.empty() ? kDefaultFlow : l.fairness_id, l.priority};
  // The fairness id comes from a client header: bounded per model (the first
  // kMaxFairnessIds seen get their own series, the rest share "other").
  auto flows = flows_.find(k.model);
  if (flows == flows_.end()) flows = flows_.emplace(std::string(k.model), std::set<std::string, std::less<>>{}).first;
  if (!flows->second.contains(k.fairness)) {
    if (flows->second.size() < kMaxFairnessIds) {
      flows->second.emplace(k.fairness);
    } else {
      k.fairness = kOtherFlow;
    }
  }
  auto it = models_.find(k);
  if (it == models_.end()) {
    it = models_.emplace(Key{std::string(k.model), std::string(k.target), std::string(k.fairness), k.priority},
                         PerModel{}).first;
  }
  return it->second;
}

void EppStats::OnPickOutcome(bool ok) { (ok ? picks_ok_ : picks_failed_).fetch_add(1, std::memory_order_relaxed); }

void EppStats::OnPicked(const RequestLabels& l) {
  std::lock_guard<std::mutex> lock(mu_);
  ++ModelLocked(l).running;
}

void EppStats::OnDone(const RequestLabels& l, const Done& d) {
  std::lock_guard<std::mutex> lock(mu_);
  PerModel& m = ModelLocked(l);
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
  AppendRequestSeries(out);
  AppendPoolGauges(out, pool, gauges);
  AppendSchedulerSeries(out);
}

// The llm_d_epp_request_* series and their older twins (inference_objective_*), from the
// per-model counters, under mu_.
void EppStats::AppendRequestSeries(std::string& out) const {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  std::lock_guard<std::mutex> lock(mu_);
  const auto priority_s = [](const Key& k) { return std::to_string(k.priority); };
  // The llm_d_epp_request_* labels of one series.
  const auto for_each = [&](auto&& f) {
    for (const auto& [k, m] : models_) {
      const std::string prio = priority_s(k);
      Label labels[] = {{"model_name", k.model},
                        {"target_model_name", k.target},
                        {"fairness_id", k.fairness},
                        {"priority", prio}};
      f(std::span<const Label>(labels), m);
    }
  };
  // The older names keep their {model_name, target_model_name} labels: the series of
  // one pair (adjacent in models_) summed.
  const auto for_each_pair = [&](auto&& value, auto&& f) {
    for (auto it = models_.begin(); it != models_.end();) {
      auto next = it;
      auto sum = value(it->second);
      for (++next; next != models_.end() && next->first.model == it->first.model &&
                   next->first.target == it->first.target;
           ++next) {
        const auto v = value(next->second);
        for (const auto& [code, n] : v) sum[code] += n;
      }
      Label labels[] = {{"model_name", it->first.model}, {"target_model_name", it->first.target}};
      f(std::span<const Label>(labels), sum);
      it = next;
    }
  };
  using Counts = std::map<int, uint64_t>;  // by error code; requests and tokens use key 0
  const auto by_pair = [&](std::string_view name, auto value) {
    for_each_pair(value, [&](std::span<const Label> labels, const Counts& sum) {
      for (const auto& [code, n] : sum) {
        if (code == 0) {  // no HTTP status is 0
          AppendSample(out, name, labels, static_cast<double>(n));
          continue;
        }
        const std::string code_s = std::to_string(code);
        Label with_code[] = {labels[0], labels[1], {"error_code", code_s}};
        AppendSample(out, name, with_code, static_cast<double>(n));
      }
    });
  };
  AppendHeader(out, "llm_d_epp_request_total",
               "Requests the picker scheduled (or refused), by model, fairness id and priority.",
               MetricType::kCounter);
  for_each([&](std::span<const Label> labels, const PerModel& m) {
    AppendSample(out, "llm_d_epp_request_total", labels, static_cast<double>(m.requests));
  });
  AppendHeader(out, "inference_objective_request_total", "Requests the picker scheduled (or refused), by model.",
               MetricType::kCounter);
  by_pair("inference_objective_request_total", [](const PerModel& m) { return Counts{{0, m.requests}}; });
  AppendHeader(out, "llm_d_epp_request_error_total",
               "Requests answered with an immediate error response, by model, fairness id, priority and "
               "HTTP status.",
               MetricType::kCounter);
  for_each([&](std::span<const Label> labels, const PerModel& m) {
    for (const auto& [code, n] : m.errors) {
      const std::string code_s = std::to_string(code);
      Label with_code[] = {labels[0], labels[1], labels[2], labels[3], {"error_code", code_s}};
      AppendSample(out, "llm_d_epp_request_error_total", with_code, static_cast<double>(n));
    }
  });
  AppendHeader(out, "inference_objective_request_error_total",
               "Requests answered with an immediate error response, by model and HTTP status.",
               MetricType::kCounter);
  by_pair("inference_objective_request_error_total", [](const PerModel& m) { return Counts(m.errors); });
  AppendHeader(out, "inference_objective_input_tokens_total",
               "Prompt tokens reported in response usage, by model.", MetricType::kCounter);
  by_pair("inference_objective_input_tokens_total", [](const PerModel& m) { return Counts{{0, m.prompt_tokens}}; });
  AppendHeader(out, "inference_objective_output_tokens_total",
               "Completion tokens reported in response usage, by model.", MetricType::kCounter);
  by_pair("inference_objective_output_tokens_total",
          [](const PerModel& m) { return Counts{{0, m.completion_tokens}}; });
  auto histogram = [&](std::string_view name, std::string_view help, const auto& bounds, auto field) {
    AppendHeader(out, name, help, MetricType::kHistogram);
    for_each([&](std::span<const Label> labels, const PerModel& m) {
      const auto& h = field(m);
      metrics::AppendHistogramSeries(out, name, labels, bounds, h.counts, h.sum);
    });
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
  for_each([&](std::span<const Label> labels, const PerModel& m) {
    AppendSample(out, "llm_d_epp_request_running", labels, static_cast<double>(m.running));
  });
}

// The pick counters: llm_d_epp_scheduler_attempts_total and the pick duration histogram
// (with its inference_extension_* twin).
void EppStats::AppendSchedulerSeries(std::string& out) const {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
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
  AppendTwins(out, {"llm_d_epp_scheduler_e2e_duration_seconds", "inference_extension_scheduler_e2e_duration_seconds"},
              "Time to pick an endpoint for one request (subset and shedding checks included).",
              MetricType::kHistogram,
              [&](std::string_view n) { metrics::AppendHistogramSeries(out, n, {}, kBounds, counts, sum); });
}

}  // namespace kvroute::extproc
