#include "core/flow/flow_metrics.h"

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "core/metrics/prom_writer.h"

namespace kvroute::flow {

void AppendFlowMetrics(std::string& out, const flow::FlowStats& st) {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  std::vector<std::string> prios;
  for (const flow::BandStats& b : st.bands) prios.push_back(std::to_string(b.priority));
  auto per_band = [&](std::string_view name, std::string_view help, auto value,
                      MetricType type = MetricType::kGauge) {
    AppendHeader(out, name, help, type);
    for (std::size_t i = 0; i < st.bands.size(); ++i) {
      const Label l{"priority", prios[i]};
      AppendSample(out, name, {&l, 1}, static_cast<double>(value(st.bands[i])));
    }
  };
  for (std::string_view name : {"kvroute_flow_waiting_requests", "llm_d_epp_flow_control_queue_size"}) {
    per_band(name, "Requests waiting in the flow queue, by priority band.",
             [](const flow::BandStats& b) { return b.waiting_requests; });
  }
  per_band("kvroute_flow_waiting_bytes", "Request body bytes waiting in the flow queue, by priority band.",
           [](const flow::BandStats& b) { return b.waiting_bytes; });
  for (std::string_view name : {"kvroute_flow_wait_seconds", "llm_d_epp_flow_control_request_queue_duration_seconds"}) {
    AppendHeader(out, name,
                 "Time dispatched requests waited in the flow queue (0 when dispatched at arrival), "
                 "by priority band.",
                 MetricType::kHistogram);
    for (std::size_t i = 0; i < st.bands.size(); ++i) {
      const Label l{"priority", prios[i]};
      const flow::WaitHistogram& w = st.bands[i].wait;
      metrics::AppendHistogramSeries(out, name, {&l, 1}, flow::kWaitBucketBoundsS, w.counts, w.sum_s);
    }
  }
  // llm-d Router's per-band outcomes of the requests that entered the queue or went at once
  // (refusals at arrival are kvroute_flow_rejected_total, by reason, not by band).
  AppendHeader(out, "llm_d_epp_flow_control_requests_total",
               "Requests through flow control, by outcome (dispatched, expired, cancelled) and "
               "priority band.",
               MetricType::kCounter);
  for (std::size_t i = 0; i < st.bands.size(); ++i) {
    const flow::BandStats& b = st.bands[i];
    uint64_t expired_n = 0;
    for (uint64_t e : b.expired) expired_n += e;
    for (const auto& [outcome, n] : {std::pair<std::string_view, uint64_t>{"dispatched", b.dispatched + b.dispatched_at_once},
                                     {"expired", expired_n}, {"cancelled", b.cancelled}}) {
      const Label l[] = {{"outcome", outcome}, {"priority", prios[i]}};
      AppendSample(out, "llm_d_epp_flow_control_requests_total", l, static_cast<double>(n));
    }
  }
  per_band("kvroute_flow_late_total",
           "Waiting requests moved behind the on-time ones because they were predicted to miss "
           "their time-to-first-token objective, by priority band.",
           [](const flow::BandStats& b) { return b.went_late; }, MetricType::kCounter);
  per_band("kvroute_flow_late_dispatched_total",
           "Of those, the requests dispatched later all the same (the rest expired or were "
           "cancelled, or still wait), by priority band.",
           [](const flow::BandStats& b) { return b.dispatched_late; }, MetricType::kCounter);
  uint64_t at_once = 0, order = 0, affinity = 0, aged = 0, cancelled = 0;
  std::array<uint64_t, flow::kNumExpireReasons> expired{};
  for (const flow::BandStats& b : st.bands) {
    at_once += b.dispatched_at_once;
    affinity += b.dispatched_by_affinity;
    aged += b.dispatched_aged;
    order += b.dispatched - b.dispatched_by_affinity - b.dispatched_aged;
    cancelled += b.cancelled;
    for (std::size_t r = 0; r < expired.size(); ++r) expired[r] += b.expired[r];
  }
  AppendHeader(out, "kvroute_flow_dispatched_total",
               "Requests flow control let through: at arrival (immediate) or from the queue, "
               "first in order, by prefix affinity or aged past the affinity skips.",
               MetricType::kCounter);
  const std::pair<std::string_view, uint64_t> causes[] = {
      {"immediate", at_once}, {"order", order}, {"affinity", affinity}, {"aged", aged}};
  for (const auto& [cause, n] : causes) {
    const Label l{"cause", cause};
    AppendSample(out, "kvroute_flow_dispatched_total", {&l, 1}, static_cast<double>(n));
  }
  AppendHeader(out, "kvroute_flow_rejected_total",
               "Requests refused at arrival by flow control (429), by reason.", MetricType::kCounter);
  for (std::size_t r = 1; r < flow::kNumRejectReasons; ++r) {
    const Label l{"reason", flow::RejectReasonName(static_cast<flow::RejectReason>(r))};
    AppendSample(out, "kvroute_flow_rejected_total", {&l, 1}, static_cast<double>(st.rejected[r]));
  }
  AppendHeader(out, "kvroute_flow_expired_total",
               "Requests that waited past their TTL (429) or no-endpoint TTL (503), by reason.",
               MetricType::kCounter);
  for (std::size_t r = 0; r < expired.size(); ++r) {
    const Label l{"reason", flow::ExpireReasonName(static_cast<flow::ExpireReason>(r))};
    AppendSample(out, "kvroute_flow_expired_total", {&l, 1}, static_cast<double>(expired[r]));
  }
  metrics::AppendCounter(out, "kvroute_flow_cancelled_total",
                         "Requests whose client disconnected while they waited.", {},
                         static_cast<double>(cancelled));
}

}  // namespace kvroute::flow
