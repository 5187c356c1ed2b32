#include "core/routing/latency_feed.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <type_traits>

#include "core/metrics/prom_writer.h"

namespace kvroute::routing {

using core_detail::Get;
using core_detail::GetU;
using core_detail::PromptTokensOf;
using metrics::AppendHeader;
using metrics::AppendSample;
using metrics::Label;
using metrics::MetricType;

void LatencyFeed::SetObjectives(double ttft_s, double tpot_s) {
  default_ttft_s_ = ttft_s;
  default_tpot_s_ = tpot_s;
}

void LatencyFeed::Prepare(sched::SchedRequest& req) const {
  if (req.slo_ttft_s <= 0) req.slo_ttft_s = default_ttft_s_;
  if (req.slo_tpot_s <= 0) req.slo_tpot_s = default_tpot_s_;
  req.latency = &trainer_;
}

LatencyFeed::Predicted LatencyFeed::OnPickDispatched(const sched::SchedRequest& req,
                                                     sched::RequestHandle handle,
                                                     std::span<const sched::EndpointState> states,
                                                     uint32_t decode, double cached_share,
                                                     const PrefillLeg* leg, double now_s) {
  using Dispatch = sched::LatencyTrainer::Dispatch;
  Dispatch d;
  if (decode < states.size()) {
    d = sched::LatencyTrainer::DispatchOf(req, states[decode], cached_share);
  } else {
    d.endpoint = decode;  // not in the table: nothing known
    d.uncached_tokens = std::nan("");
  }
  std::optional<double> ttft;
  if (leg != nullptr) {
    // Both legs: the prefill endpoint computes what it lacks of the prompt, then the
    // decode endpoint, holding it all once pulled, samples the first token.
    d = sched::LatencyTrainer::DispatchOf(req, states[decode], 1.0);
    d.remote_prefill = true;
    const double prompt = static_cast<double>(PromptTokensOf(req));
    const double share = prompt > 0 ? std::clamp(1.0 - leg->tokens / prompt, 0.0, 1.0) : 0.0;
    const Dispatch prefill_leg = sched::LatencyTrainer::DispatchOf(req, states[leg->endpoint], share);
    const auto prefill = trainer_.PredictTtft(prefill_leg);
    const auto decoded = trainer_.PredictTtft(d);
    if (prefill && decoded) ttft = *prefill + *decoded;
    trainer_.OnPrefillSent(handle, prefill_leg, now_s);
  } else {
    ttft = trainer_.PredictTtft(d);
  }
  Predicted p;
  if (ttft) {
    p.ttft_s = *ttft;
    predicted_ttft_.Observe(*ttft);
  }
  if (const auto tpot = trainer_.PredictTpot(d)) {
    p.tpot_s = *tpot;
    predicted_tpot_.Observe(*tpot);
  }
  trainer_.OnDispatched(handle, d, now_s);
  return p;
}

void LatencyFeed::OnRedispatched(sched::RequestHandle handle, uint32_t endpoint, double now_s) {
  sched::LatencyTrainer::Dispatch d;
  d.endpoint = endpoint;
  d.uncached_tokens = std::nan("");
  trainer_.OnDispatched(handle, d, now_s);
}

void LatencyFeed::OnFirstToken(sched::RequestHandle handle, double now_s) {
  trainer_.OnFirstToken(handle, now_s);
  Publish();
}

void LatencyFeed::OnTokens(sched::RequestHandle handle, int64_t generated_tokens, double now_s) {
  trainer_.OnTokens(handle, generated_tokens, now_s);
}

void LatencyFeed::OnFinished(sched::RequestHandle handle, int64_t generated_tokens, double now_s) {
  trainer_.OnFinished(handle, generated_tokens, now_s);
  Publish();
}

void LatencyFeed::OnPrefillAnswered(sched::RequestHandle handle, uint32_t endpoint, bool answered,
                                    double now_s) {
  trainer_.OnPrefillAnswered(handle, endpoint, answered, now_s);
  Publish();
}

void LatencyFeed::Publish() {
  const sched::LatencyTrainer& t = trainer_;
  const sched::LatencyTrainer::Errors* errors[] = {&t.ttft_errors(), &t.tpot_errors()};
  const uint64_t samples[] = {t.ttft_samples(), t.tpot_samples()};
  for (size_t k = 0; k < 2; ++k) {
    samples_[k].store(samples[k], std::memory_order_relaxed);
    scored_[k].store(errors[k]->n, std::memory_order_relaxed);
    abs_s_[k].store(errors[k]->abs_s, std::memory_order_relaxed);
    abs_rel_[k].store(errors[k]->abs_rel, std::memory_order_relaxed);
  }
  const sched::LatencyTrainer::SloCounts* slo[] = {&t.ttft_slo(), &t.tpot_slo()};
  for (size_t k = 0; k < 2; ++k) {
    slo_requests_[k].store(slo[k]->observed, std::memory_order_relaxed);
    slo_violations_[k].store(slo[k]->violated, std::memory_order_relaxed);
  }
}

LatencyStats LatencyFeed::stats() const {
  LatencyStats st;
  sched::LatencyTrainer::Errors* errors[] = {&st.ttft_errors, &st.tpot_errors};
  uint64_t* samples[] = {&st.ttft_samples, &st.tpot_samples};
  for (size_t k = 0; k < 2; ++k) {
    *samples[k] = samples_[k].load(std::memory_order_relaxed);
    errors[k]->n = scored_[k].load(std::memory_order_relaxed);
    errors[k]->abs_s = abs_s_[k].load(std::memory_order_relaxed);
    errors[k]->abs_rel = abs_rel_[k].load(std::memory_order_relaxed);
  }
  st.ttft_slo.observed = slo_requests_[0].load(std::memory_order_relaxed);
  st.ttft_slo.violated = slo_violations_[0].load(std::memory_order_relaxed);
  st.tpot_slo.observed = slo_requests_[1].load(std::memory_order_relaxed);
  st.tpot_slo.violated = slo_violations_[1].load(std::memory_order_relaxed);
  return st;
}

// What the model learned from and how far its predictions were from what came back; mean
// absolute error = rate(abs_error) / rate(scored).
void LatencyFeed::AppendMetrics(std::string& out) const {
  const LatencyStats lat = stats();
  const struct {
    const char* kind;
    uint64_t samples;
    const sched::LatencyTrainer::Errors* e;
  } kinds[] = {{"ttft", lat.ttft_samples, &lat.ttft_errors},
               {"tpot", lat.tpot_samples, &lat.tpot_errors}};
  auto family = [&](const char* name, const char* help, auto value) {
    AppendHeader(out, name, help, MetricType::kCounter);
    for (const auto& k : kinds) {
      Label labels[] = {{"kind", k.kind}};
      AppendSample(out, name, labels, value(k));
    }
  };
  family("kvroute_latency_model_samples_total",
         "Observed TTFT (dispatch to first token) and TPOT samples the latency model learned from.",
         [](const auto& k) { return static_cast<double>(k.samples); });
  family("kvroute_latency_predictions_scored_total",
         "Dispatched requests whose predicted TTFT or TPOT was compared with the observed one.",
         [](const auto& k) { return static_cast<double>(k.e->n); });
  family("kvroute_latency_prediction_abs_error_seconds_total",
         "Sum of |predicted - observed| over the scored predictions, in seconds.",
         [](const auto& k) { return k.e->abs_s; });
  family("kvroute_latency_prediction_abs_relative_error_total",
         "Sum of |predicted - observed| / observed over the scored predictions.",
         [](const auto& k) { return k.e->abs_rel; });
  const sched::LatencyTrainer::SloCounts* slo[] = {&lat.ttft_slo, &lat.tpot_slo};
  AppendHeader(out, "kvroute_slo_requests_total",
               "Requests with a TTFT or TPOT objective (headers or scheduling.slo) whose "
               "observed value was measured.", MetricType::kCounter);
  for (size_t k = 0; k < 2; ++k) {
    Label labels[] = {{"type", kinds[k].kind}};
    AppendSample(out, "kvroute_slo_requests_total", labels, static_cast<double>(slo[k]->observed));
  }
  AppendHeader(out, "kvroute_slo_violations_total",
               "Of those, requests whose observed TTFT or TPOT exceeded the objective.",
               MetricType::kCounter);
  for (size_t k = 0; k < 2; ++k) {
    Label labels[] = {{"type", kinds[k].kind}};
    AppendSample(out, "kvroute_slo_violations_total", labels, static_cast<double>(slo[k]->violated));
  }
  // The same under llm-d Router v1.0's names (REFERENCE section 17), for its dashboards:
  // the predictions made at dispatch, and the violations.
  auto predicted = [&](const char* name, const char* help, const auto& h) {
    AppendHeader(out, name, help, MetricType::kHistogram);
    std::array<uint64_t, std::tuple_size_v<std::decay_t<decltype(h.counts)>>> counts;
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = GetU(h.counts[i]);
    metrics::AppendHistogramSeries(out, name, {}, h.bounds, counts, Get(h.sum));
  };
  predicted("llm_d_epp_request_predicted_ttft_seconds",
            "TTFT the latency model predicted for each dispatched request (one with samples).",
            predicted_ttft_);
  predicted("llm_d_epp_request_predicted_tpot_seconds",
            "TPOT the latency model predicted for each dispatched request (one with samples).",
            predicted_tpot_);
  AppendHeader(out, "llm_d_epp_request_slo_violation_total",
               "Requests whose observed TTFT or TPOT exceeded their objective "
               "(kvroute_slo_violations_total).", MetricType::kCounter);
  for (size_t k = 0; k < 2; ++k) {
    Label labels[] = {{"type", kinds[k].kind}};
    AppendSample(out, "llm_d_epp_request_slo_violation_total", labels,
                 static_cast<double>(slo[k]->violated));
  }
}

}  // namespace kvroute::routing
