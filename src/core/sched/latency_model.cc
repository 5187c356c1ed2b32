#include "core/sched/latency_model.h"

#include <algorithm>
#include <cmath>

namespace kvroute::sched {

template <size_t D>
void OnlineLinearFit<D>::Reset() {
  w_.fill(0.0);
  for (size_t i = 0; i < D; ++i) {
    p_[i].fill(0.0);
    p_[i][i] = o_.initial_variance;
  }
  samples_ = 0;
}

template <size_t D>
bool OnlineLinearFit<D>::Update(const Vec& x, double y) {
  if (!std::isfinite(y)) return false;
  for (double v : x) {
    if (!std::isfinite(v)) return false;
  }
  // k = P x / (lambda + x' P x); w += k (y - w'x); P = (P - k x' P) / lambda.
  Vec px{};
  for (size_t i = 0; i < D; ++i) {
    double s = 0.0;
    for (size_t j = 0; j < D; ++j) s += p_[i][j] * x[j];
    px[i] = s;
  }
  double denom = o_.forgetting;
  for (size_t i = 0; i < D; ++i) denom += x[i] * px[i];
  if (!(denom > 0.0) || !std::isfinite(denom)) return false;
  const double err = y - Predict(x);
  for (size_t i = 0; i < D; ++i) w_[i] += px[i] / denom * err;
  // P is symmetric, so x'P = (Px)'.
  double trace = 0.0;
  for (size_t i = 0; i < D; ++i) {
    for (size_t j = 0; j < D; ++j) {
      p_[i][j] = (p_[i][j] - px[i] * px[j] / denom) / o_.forgetting;
    }
    trace += p_[i][i];
  }
  if (trace > o_.max_trace) {
    const double scale = o_.max_trace / trace;
    for (auto& row : p_) {
      for (double& v : row) v *= scale;
    }
  }
  ++samples_;
  return true;
}

template class OnlineLinearFit<3>;
template class OnlineLinearFit<5>;
template class OnlineLinearFit<6>;

namespace {
bool Known(double v) { return std::isfinite(v) && v >= 0.0; }
}  // namespace

LatencyModel::PerEndpoint LatencyModel::Fresh(double forgetting) {
  TtftFit::Options t;
  t.forgetting = forgetting;
  TpotFit::Options p;
  p.forgetting = forgetting;
  QueuedTtftFit::Options q;
  q.forgetting = kQueuedForgetting;
  return PerEndpoint{TtftFit(t), QueuedTtftFit(q), TpotFit(p)};
}

LatencyModel::LatencyModel(const Options& o) : o_(o), fleet_(Fresh(o.forgetting)) {}

std::optional<TtftFit::Vec> LatencyModel::Encode(const TtftFeatures& f) {
  if (!Known(f.uncached_tokens) || !Known(f.queued_prefill_tokens) ||
      !Known(f.queued_requests) || !Known(f.waiting) || !Known(f.running) ||
      !Known(f.kv_usage)) {
    return std::nullopt;
  }
  // No waiting count: in this fit's regime the engine reported none.
  return TtftFit::Vec{1.0,
                      f.uncached_tokens / 1000.0,
                      f.queued_prefill_tokens / 1000.0,
                      f.queued_requests / 100.0,
                      f.running / 100.0,
                      f.kv_usage};
}

std::optional<QueuedTtftFit::Vec> LatencyModel::EncodeQueued(const TtftFeatures& f) {
  if (!Known(f.queued_requests) || !Known(f.uncached_tokens)) return std::nullopt;
  return QueuedTtftFit::Vec{1.0, f.queued_requests / 100.0, f.uncached_tokens / 1000.0};
}

std::optional<TpotFit::Vec> LatencyModel::Encode(const TpotFeatures& f) {
  if (!Known(f.batch) || !Known(f.context_tokens) || !Known(f.prefill_tokens_inflight) ||
      !Known(f.kv_usage)) {
    return std::nullopt;
  }
  return TpotFit::Vec{1.0, f.batch / 100.0, f.context_tokens / 1000.0,
                      f.prefill_tokens_inflight / 1000.0, f.kv_usage};
}

LatencyModel::PerEndpoint& LatencyModel::At(uint32_t endpoint) {
  if (endpoint >= endpoints_.size()) endpoints_.resize(endpoint + 1, Fresh(o_.forgetting));
  return endpoints_[endpoint];
}

bool LatencyModel::ObserveTtft(uint32_t endpoint, const TtftFeatures& f, double ttft_s) {
  const auto x = Encode(f);
  if (!x || !Known(ttft_s)) return false;
  if (Queued(f)) {
    const auto q = EncodeQueued(f);
    if (!q) return false;
    At(endpoint).ttft_queued.Update(*q, ttft_s);
    fleet_.ttft_queued.Update(*q, ttft_s);
  } else {
    At(endpoint).ttft.Update(*x, ttft_s);
    fleet_.ttft.Update(*x, ttft_s);
  }
  return true;
}

bool LatencyModel::ObserveTpot(uint32_t endpoint, const TpotFeatures& f, double tpot_s) {
  const auto x = Encode(f);
  if (!x || !Known(tpot_s)) return false;
  At(endpoint).tpot.Update(*x, tpot_s);
  fleet_.tpot.Update(*x, tpot_s);
  return true;
}

template <typename Fit>
std::optional<double> LatencyModel::Predict(const Fit* own, const Fit& fleet,
                                            const typename Fit::Vec& x) const {
  const Fit* use = own != nullptr && own->samples() >= o_.min_samples ? own
                   : fleet.samples() >= o_.min_samples                ? &fleet
                                                                      : nullptr;
  if (use == nullptr) return std::nullopt;
  const double y = use->Predict(x);
  if (!std::isfinite(y)) return std::nullopt;
  return std::max(0.0, y);
}

std::optional<double> LatencyModel::PredictTtft(uint32_t endpoint, const TtftFeatures& f) const {
  const auto x = Encode(f);
  if (!x) return std::nullopt;
  const PerEndpoint* own = endpoint < endpoints_.size() ? &endpoints_[endpoint] : nullptr;
  if (Queued(f)) {
    const auto q = EncodeQueued(f);
    if (!q) return std::nullopt;
    return Predict<QueuedTtftFit>(own ? &own->ttft_queued : nullptr, fleet_.ttft_queued, *q);
  }
  return Predict<TtftFit>(own ? &own->ttft : nullptr, fleet_.ttft, *x);
}

std::optional<double> LatencyModel::PredictTpot(uint32_t endpoint, const TpotFeatures& f) const {
  const auto x = Encode(f);
  if (!x) return std::nullopt;
  return Predict<TpotFit>(endpoint < endpoints_.size() ? &endpoints_[endpoint].tpot : nullptr,
                          fleet_.tpot, *x);
}

std::optional<double> LatencyModel::PredictFleetTpot(const TpotFeatures& f) const {
  const auto x = Encode(f);
  if (!x) return std::nullopt;
  return Predict<TpotFit>(nullptr, fleet_.tpot, *x);
}

uint64_t LatencyModel::TtftSamples(uint32_t endpoint) const {
  return endpoint < endpoints_.size()
             ? endpoints_[endpoint].ttft.samples() + endpoints_[endpoint].ttft_queued.samples()
             : 0;
}
uint64_t LatencyModel::TpotSamples(uint32_t endpoint) const {
  return endpoint < endpoints_.size() ? endpoints_[endpoint].tpot.samples() : 0;
}

void LatencyModel::ForgetEndpoint(uint32_t endpoint) {
  if (endpoint >= endpoints_.size()) return;
  endpoints_[endpoint].ttft.Reset();
  endpoints_[endpoint].ttft_queued.Reset();
  endpoints_[endpoint].tpot.Reset();
}

}  // namespace kvroute::sched
