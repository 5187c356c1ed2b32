#include "core/sched/latency_trainer.h"

#include <algorithm>
#include <cmath>

namespace kvroute::sched {

namespace {
bool Finite(double v) { return std::isfinite(v); }
}  // namespace

LatencyTrainer::Dispatch LatencyTrainer::DispatchOf(const SchedRequest& req,
                                                    const EndpointState& e,
                                                    double cached_fraction) {
  Dispatch d;
  d.endpoint = e.id;
  d.prompt_tokens = req.token_ids.empty() ? static_cast<double>(req.EstimatedPromptTokens())
                                          : static_cast<double>(req.token_ids.size());
  const double cached = Finite(cached_fraction) ? std::clamp(cached_fraction, 0.0, 1.0) : 0.0;
  d.uncached_tokens = d.prompt_tokens * (1.0 - cached);
  const double nan = std::nan("");
  const bool scraped = e.scrape_ok && e.scraped_at_s >= 0;
  using F = metrics::EngineMetrics;
  d.waiting = scraped && e.engine.Has(F::kWaiting) ? e.engine.waiting : nan;
  d.running = scraped && e.engine.Has(F::kRunning) ? e.engine.running : nan;
  d.kv_usage = scraped && e.engine.Has(F::kKvUsage) ? e.engine.kv_usage : nan;
  d.capacity_tokens = scraped && e.num_gpu_blocks > 0 && e.block_size > 0
                          ? static_cast<double>(e.num_gpu_blocks * e.block_size)
                          : 0.0;
  d.streaming = req.streaming;
  d.slo_ttft_s = req.slo_ttft_s;
  d.slo_tpot_s = req.slo_tpot_s;
  d.queued_s = std::isfinite(req.queued_s) && req.queued_s > 0 ? req.queued_s : 0.0;
  return d;
}

TtftFeatures LatencyTrainer::TtftFeaturesOf(const Dispatch& d) const {
  TtftFeatures f;
  f.uncached_tokens = d.uncached_tokens;
  f.queued_prefill_tokens = QueuedPrefill(d.endpoint);
  f.queued_requests = QueuedRequests(d.endpoint);
  f.waiting = d.waiting;
  f.running = d.running;
  f.kv_usage = d.kv_usage;
  return f;
}

TpotFeatures LatencyTrainer::TpotFeaturesOf(const Dispatch& d) const {
  TpotFeatures f;
  f.batch = d.running + 1.0;
  // Tokens resident in the batch it joins: what the KV cache holds now, plus its prompt.
  // Unknown (NaN) when the endpoint does not report its cache size.
  f.context_tokens = d.capacity_tokens > 0 ? d.kv_usage * d.capacity_tokens + d.prompt_tokens
                                           : std::nan("");
  f.prefill_tokens_inflight = QueuedPrefill(d.endpoint) + d.uncached_tokens;
  f.kv_usage = d.kv_usage;
  return f;
}

LatencyTrainer::Record* LatencyTrainer::Find(RequestHandle handle) {
  const uint32_t slot = static_cast<uint32_t>(handle & 0xffffffffu);
  if (handle == kNoHandle || slot >= records_.size() || records_[slot].handle != handle) {
    return nullptr;
  }
  return &records_[slot];
}

LatencyTrainer::Queue& LatencyTrainer::QueueOf(uint32_t endpoint) {
  if (endpoint >= queue_.size()) queue_.resize(endpoint + 1);
  return queue_[endpoint];
}

void LatencyTrainer::Dequeue(Record& r) {
  if (!r.in_queue) return;
  r.in_queue = false;
  Queue& q = QueueOf(r.endpoint);
  if (q.requests > 0) --q.requests;
  q.prefill_tokens = std::max(0.0, q.prefill_tokens - r.uncached);
}

void LatencyTrainer::Score(Errors& e, double predicted, double observed) {
  if (predicted < 0 || !(observed > 0)) return;
  ++e.n;
  e.abs_s += std::abs(predicted - observed);
  e.abs_rel += std::abs(predicted - observed) / observed;
}

void LatencyTrainer::OnDispatched(RequestHandle handle, const Dispatch& d, double now_s) {
  if (handle == kNoHandle) return;
  const uint32_t slot = static_cast<uint32_t>(handle & 0xffffffffu);
  if (slot >= records_.size()) records_.resize(slot + 1);
  Record& r = records_[slot];
  // A retry elsewhere: off the first endpoint's queue, objectives kept.
  const bool retry = r.handle == handle;
  if (retry) Dequeue(r);
  const double slo_ttft = d.slo_ttft_s > 0 ? d.slo_ttft_s : retry ? r.slo_ttft_s : 0.0;
  const double slo_tpot = d.slo_tpot_s > 0 ? d.slo_tpot_s : retry ? r.slo_tpot_s : 0.0;
  const bool r_streaming = r.streaming;  // a retry is the same request
  const double queued = retry ? r.queued_s : d.queued_s;
  Arm(r, handle, d, now_s);
  r.slo_ttft_s = slo_ttft;
  r.slo_tpot_s = slo_tpot;
  r.queued_s = queued;
  r.streaming = retry ? r_streaming : d.streaming;
}

void LatencyTrainer::Arm(Record& r, RequestHandle handle, const Dispatch& d, double now_s) {
  r = Record{};
  r.handle = handle;
  r.endpoint = d.endpoint;
  r.dispatch_s = now_s;
  r.streaming = d.streaming;
  r.ttft = TtftFeaturesOf(d);
  r.tpot = TpotFeaturesOf(d);
  r.known = LatencyModel::Encode(r.ttft).has_value();
  r.learn_ttft = !d.remote_prefill;
  if (const auto p = PredictTtft(d); p && r.learn_ttft) r.predicted_ttft = *p;
  if (const auto p = model_.PredictTpot(d.endpoint, r.tpot)) r.predicted_tpot = *p;
  r.in_queue = true;
  if (Finite(d.uncached_tokens) && d.uncached_tokens >= 0) r.uncached = d.uncached_tokens;
  Queue& q = QueueOf(d.endpoint);
  ++q.requests;
  q.prefill_tokens += r.uncached;
}

void LatencyTrainer::OnFirstToken(RequestHandle handle, double now_s) {
  Record* r = Find(handle);
  if (r == nullptr || r->first_token_s >= 0) return;
  r->first_token_s = now_s;
  Dequeue(*r);
  if (!r->streaming) return;  // the whole answer, not its first token
  const double ttft = now_s - r->dispatch_s;
  if (r->slo_ttft_s > 0) {
    // The client's TTFT: the wait in the router's queue too.
    ++ttft_slo_.observed;
    if (ttft + r->queued_s > r->slo_ttft_s) ++ttft_slo_.violated;
  }
  if (!r->known || !r->learn_ttft) return;
  if (model_.ObserveTtft(r->endpoint, r->ttft, ttft)) {
    ++ttft_samples_;
    Score(ttft_errors_, r->predicted_ttft, ttft);
  }
}

void LatencyTrainer::OnTokens(RequestHandle handle, int64_t generated_tokens, double now_s) {
  Record* r = Find(handle);
  if (r == nullptr) return;
  r->generated = std::max(r->generated, generated_tokens);
}

void LatencyTrainer::OnFinished(RequestHandle handle, int64_t generated_tokens, double now_s) {
  Record* r = Find(handle);
  if (r == nullptr) return;
  Dequeue(*r);
  const int64_t n = generated_tokens >= 0 ? generated_tokens : r->generated;
  if (r->streaming && r->first_token_s >= 0 && n >= 2) {
    const double tpot = (now_s - r->first_token_s) / static_cast<double>(n - 1);
    if (r->slo_tpot_s > 0) {
      ++tpot_slo_.observed;
      if (tpot > r->slo_tpot_s) ++tpot_slo_.violated;
    }
    if (std::isfinite(tpot) && tpot >= 0) {
      if (r->endpoint >= recent_tpot_.size()) recent_tpot_.resize(r->endpoint + 1);
      Recent& rt = recent_tpot_[r->endpoint];
      rt.ewma = rt.n == 0 ? tpot : rt.ewma + (tpot - rt.ewma) / 4.0;
      rt.last_s = now_s;
      ++rt.n;
    }
    // Slowness: against what the fleet's fit expected before this sample joins it.
    if (const auto fleet = model_.PredictFleetTpot(r->tpot); fleet && *fleet > 0) {
      ObserveSlowness(r->endpoint, tpot / *fleet);
    }
    if (model_.ObserveTpot(r->endpoint, r->tpot, tpot)) {
      ++tpot_samples_;
      Score(tpot_errors_, r->predicted_tpot, tpot);
    }
  }
  r->handle = kNoHandle;
}

void LatencyTrainer::ObserveSlowness(uint32_t endpoint, double ratio) {
  if (!std::isfinite(ratio) || ratio <= 0) return;
  if (endpoint >= slowness_.size()) slowness_.resize(endpoint + 1);
  Slow& sl = slowness_[endpoint];
  sl.ewma = sl.n == 0 ? ratio : sl.ewma + (ratio - sl.ewma) / 8.0;
  ++sl.n;
  // The reference: the 25th percentile of the endpoints that have enough samples.
  slow_scratch_.clear();
  for (const Slow& x : slowness_) {
    if (x.n >= kMinSlownessSamples) slow_scratch_.push_back(x.ewma);
  }
  if (slow_scratch_.empty()) {
    slow_ref_ = 0.0;
    return;
  }
  const size_t k = (slow_scratch_.size() - 1) / 4;
  std::nth_element(slow_scratch_.begin(), slow_scratch_.begin() + static_cast<std::ptrdiff_t>(k),
                   slow_scratch_.end());
  slow_ref_ = slow_scratch_[k];
}

void LatencyTrainer::ForgetEndpoint(uint32_t endpoint) {
  model_.ForgetEndpoint(endpoint);
  if (endpoint < slowness_.size()) slowness_[endpoint] = Slow{};
  if (endpoint < recent_tpot_.size()) recent_tpot_[endpoint] = Recent{};
  if (endpoint < queue_.size()) queue_[endpoint] = Queue{};
  for (auto* v : {&records_, &legs_}) {
    for (Record& r : *v) {
      if (r.handle != kNoHandle && r.endpoint == endpoint) {
        r.in_queue = false;
        r.known = false;  // its dispatch-time features describe the endpoint before
      }
    }
  }
}

void LatencyTrainer::OnPrefillSent(RequestHandle handle, const Dispatch& d, double now_s) {
  if (handle == kNoHandle) return;
  const uint32_t slot = static_cast<uint32_t>(handle & 0xffffffffu);
  if (slot >= legs_.size()) legs_.resize(slot + 1);
  Record& r = legs_[slot];
  if (r.handle != kNoHandle) Dequeue(r);  // an older leg never reported: off its queue
  Dispatch leg = d;
  leg.streaming = true;  // its one token is its whole answer: the answer time is its TTFT
  leg.remote_prefill = false;
  Arm(r, handle, leg, now_s);
}

void LatencyTrainer::OnPrefillAnswered(RequestHandle handle, uint32_t endpoint, bool ok, double now_s) {
  const uint32_t slot = static_cast<uint32_t>(handle & 0xffffffffu);
  if (handle == kNoHandle || slot >= legs_.size()) return;
  Record& r = legs_[slot];
  if (r.handle != handle || r.endpoint != endpoint) return;
  Dequeue(r);
  if (ok && r.known && model_.ObserveTtft(r.endpoint, r.ttft, now_s - r.dispatch_s)) {
    ++ttft_samples_;
    Score(ttft_errors_, r.predicted_ttft, now_s - r.dispatch_s);
  }
  r.handle = kNoHandle;
}

}  // namespace kvroute::sched
