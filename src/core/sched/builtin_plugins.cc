#include "core/sched/builtin_plugins.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/kvevents/event_index.h"
#include "core/sched/latency_trainer.h"
#include "core/sched/lora.h"

namespace kvroute::sched {

// ---- prefix-cache-scorer ----

void PrefixCacheScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                              std::span<double> out) {
  // Hash once per request; OnDispatched records the same chain.
  std::vector<uint64_t>& hashes = ctx.pending->hashes[index()];
  HashPromptBlocks(ctx.request->model, ctx.request->cache_salt, ctx.request->prompt,
                   p_.block_chars, p_.max_blocks, hashes);
  std::fill(out.begin(), out.end(), 0.0);
  if (!hashes.empty()) ApproxScores(ctx, candidates, hashes, out);
  const SchedRequest& r = *ctx.request;
  if (!p_.precise || r.events == nullptr || r.event_keys.empty()) return;
  std::vector<double>& weighted = ctx.scratch->f64;
  std::vector<uint32_t>& run = ctx.scratch->u32_b;
  r.events->Match(r.event_keys, ctx.now_s, weighted, run);
  const double keys = static_cast<double>(r.event_keys.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const uint32_t id = ctx.endpoints[candidates[i]].id;
    if (r.events->Usable(id, ctx.now_s)) out[i] = id < weighted.size() ? weighted[id] / keys : 0.0;
  }
}

void PrefixCacheScorer::ApproxScores(const PickContext& ctx, std::span<const uint32_t> candidates,
                                     std::span<const uint64_t> hashes, std::span<double> out) const {
  uint32_t max_id = 0;
  for (uint32_t pos : candidates) max_id = std::max(max_id, ctx.endpoints[pos].id);
  std::vector<uint32_t>& match = ctx.scratch->u32_a;
  if (match.size() <= max_id) match.resize(max_id + 1);
  model_->Match(hashes, match);
  const double total = static_cast<double>(hashes.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    out[i] = match[ctx.endpoints[candidates[i]].id] / total;
  }
}

void PrefixCacheScorer::AdoptStateFrom(Plugin& previous) {
  // Same type() as this one (the scheduler matched them), so the same class.
  auto& prev = static_cast<PrefixCacheScorer&>(previous);
  if (prev.p_.block_chars != p_.block_chars || prev.p_.max_blocks != p_.max_blocks) return;
  model_ = std::move(prev.model_);
  prev.model_ = MakeApproxPrefixModel();
}

size_t PrefixCacheScorer::CapacityFor(const EndpointState& e) const {
  if (p_.lru_capacity > 0) return p_.lru_capacity;
  if (e.num_gpu_blocks > 0 && e.block_size > 0) {
    // The endpoint holds num_gpu_blocks * block_size tokens; one of our blocks is about
    // block_chars / 4 tokens.
    const double tokens_per_block = std::max(1.0, p_.block_chars / 4.0);
    return static_cast<size_t>(static_cast<double>(e.num_gpu_blocks) *
                               static_cast<double>(e.block_size) / tokens_per_block);
  }
  return kDefaultCapacity;
}

int64_t PrefixCacheScorer::OnDispatched(const PendingRequest& req, const EndpointState& endpoint,
                                        double now_s) {
  const std::vector<uint64_t>& hashes = req.hashes[index()];
  if (hashes.empty()) return 0;
  const size_t held = model_->OnRouted(hashes, endpoint.id, CapacityFor(endpoint), now_s);
  return static_cast<int64_t>(held * p_.block_chars);
}

// ---- load scorers ----

void KvUtilizationScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                                std::span<double> out) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    out[i] = std::clamp(1.0 - ctx.loads[candidates[i]].kv_usage, 0.0, 1.0);
  }
}

namespace {
double Field(const EndpointLoad& l, LoadField f) {
  switch (f) {
    case LoadField::kWaiting:
      return l.waiting;
    case LoadField::kRunning:
      return l.running;
    case LoadField::kInflight:
      return l.inflight;
  }
  return 0.0;
}
}  // namespace

void MinMaxScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                         std::span<double> out) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  for (uint32_t pos : candidates) {
    const double v = Field(ctx.loads[pos], field_);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const double range = hi - lo;
  for (size_t i = 0; i < candidates.size(); ++i) {
    out[i] = range > 0 ? (hi - Field(ctx.loads[candidates[i]], field_)) / range : 1.0;
  }
}

double SoftLoadScorer::LoadOf(const EndpointLoad& l) {
  return std::max(static_cast<double>(l.inflight), l.waiting + l.running);
}

void SoftLoadScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                           std::span<double> out) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  double sum = 0.0;
  for (uint32_t pos : candidates) {
    const double v = LoadOf(ctx.loads[pos]);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  const double mean = candidates.empty() ? 0.0 : sum / static_cast<double>(candidates.size());
  const double denom = hi - lo + p_.min_spread + p_.relative_spread * mean;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double d = LoadOf(ctx.loads[candidates[i]]) - lo;
    // denom is 0 only when every load is equal and both spreads are 0: all score 1.
    out[i] = denom > 0 ? 1.0 - d / denom : 1.0;
  }
}

double RecentLoadScorer::CountAt(uint32_t id, double now_s) const {
  if (id >= counts_.size()) return 0.0;
  const Count& c = counts_[id];
  const double age = std::max(0.0, now_s - c.at_s);
  return p_.half_life_s > 0 ? c.value * std::exp2(-age / p_.half_life_s) : 0.0;
}

void RecentLoadScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                             std::span<double> out) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  for (uint32_t pos : candidates) {
    const double v = CountAt(ctx.endpoints[pos].id, ctx.now_s);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const double denom = hi - lo + p_.min_spread;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double d = CountAt(ctx.endpoints[candidates[i]].id, ctx.now_s) - lo;
    out[i] = denom > 0 ? 1.0 - d / denom : 1.0;
  }
}

int64_t RecentLoadScorer::OnDispatched(const PendingRequest&, const EndpointState& endpoint,
                                       double now_s) {
  if (endpoint.id >= counts_.size()) counts_.resize(endpoint.id + 1);
  counts_[endpoint.id] = {CountAt(endpoint.id, now_s) + 1.0, now_s};
  return -1;
}

void RecentLoadScorer::OnEndpointRemoved(uint32_t endpoint_id) {
  if (endpoint_id < counts_.size()) counts_[endpoint_id] = {};
}

void RecentLoadScorer::AdoptStateFrom(Plugin& previous) {
  // Same type() as this one (the scheduler matched them), so the same class.
  counts_ = std::move(static_cast<RecentLoadScorer&>(previous).counts_);
}

// ---- lora-affinity-scorer ----

void LoraAffinityScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                               std::span<double> out) {
  std::fill(out.begin(), out.end(), 0.0);
  const uint64_t adapter =
      AdapterRequestKey(ctx.request->model, ctx.endpoints, ctx.now_s, p_.stale_after_s);
  if (adapter == 0) return;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const EndpointState& e = ctx.endpoints[candidates[i]];
    if (LoraKnown(e, ctx.now_s, p_.stale_after_s)) out[i] = LoraAffinity(e.engine, adapter);
  }
}

void LoraAffinityFilter::Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) {
  const uint64_t adapter =
      AdapterRequestKey(ctx.request->model, ctx.endpoints, ctx.now_s, p_.stale_after_s);
  if (adapter == 0) return;
  auto batchable = [&](uint32_t pos) {
    const EndpointState& e = ctx.endpoints[pos];
    return LoraKnown(e, ctx.now_s, p_.stale_after_s) && LoraAffinity(e.engine, adapter) > 0.0;
  };
  if (std::none_of(candidates.begin(), candidates.end(), batchable)) return;
  std::erase_if(candidates, [&](uint32_t pos) { return !batchable(pos); });
}

void LoadAwareScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                            std::span<double> out) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double q = ctx.loads[candidates[i]].waiting;
    out[i] = q >= threshold_ ? 0.0 : std::clamp(0.5 * (1.0 - q / threshold_), 0.0, 1.0);
  }
}

// ---- saturation-filter ----

bool SaturationFilter::Saturated(const PickContext& ctx, uint32_t pos) const {
  const EndpointState& e = ctx.endpoints[pos];
  if (!e.MetricsFresh(ctx.now_s, p_.stale_after_s)) return true;
  const EndpointLoad& l = ctx.loads[pos];
  return l.kv_usage > p_.kv_threshold || l.waiting > p_.queue_threshold;
}

void SaturationFilter::Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) {
  bool any_ok = false;
  for (uint32_t pos : candidates) {
    if (!Saturated(ctx, pos)) {
      any_ok = true;
      break;
    }
  }
  // Dropping every endpoint would turn overload into errors; better to queue somewhere.
  if (!any_ok) return;
  std::erase_if(candidates, [&](uint32_t pos) { return Saturated(ctx, pos); });
}

// ---- timing ----

void PluginTiming::Observe(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  const auto i = static_cast<std::size_t>(
      std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin());
  counts[i].fetch_add(1, std::memory_order_relaxed);
  double old = sum.load(std::memory_order_relaxed);
  while (!sum.compare_exchange_weak(old, old + seconds, std::memory_order_relaxed)) {
  }
}

uint64_t PluginTiming::total() const {
  uint64_t n = 0;
  for (const auto& c : counts) n += c.load(std::memory_order_relaxed);
  return n;
}

// ---- pickers ----

void RankByMaxScore(std::span<const double> totals, size_t max_ranked, Rng& rng,
                    std::vector<uint32_t>& scratch, std::vector<uint64_t>& tiebreak,
                    std::vector<uint32_t>& ranked) {
  const size_t n = totals.size();
  const size_t k = (max_ranked == 0 || max_ranked > n) ? n : max_ranked;
  scratch.resize(n);
  tiebreak.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    scratch[i] = i;
    tiebreak[i] = rng.Next();
  }
  // A random key per candidate breaks ties uniformly (equal keys are astronomically rare
  // and then fall back to index order).
  auto better = [&](uint32_t a, uint32_t b) {
    if (totals[a] != totals[b]) return totals[a] > totals[b];
    if (tiebreak[a] != tiebreak[b]) return tiebreak[a] < tiebreak[b];
    return a < b;
  };
  if (k == 1) {
    ranked.assign(1, *std::min_element(scratch.begin(), scratch.end(), better));
    return;
  }
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(), better);
  ranked.assign(scratch.begin(), scratch.begin() + k);
}

void MaxScorePicker::Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
                          std::span<const double> totals, size_t max_ranked,
                          std::vector<uint32_t>& ranked) {
  RankByMaxScore(totals, max_ranked, *ctx.rng, ctx.scratch->u32_b, ctx.scratch->u64, ranked);
}

void SloHeadroomPicker::Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
                             std::span<const double> totals, size_t max_ranked,
                             std::vector<uint32_t>& ranked) {
  PickScratch& sc = *ctx.scratch;
  auto blend = [&] { RankByMaxScore(totals, max_ranked, *ctx.rng, sc.u32_b, sc.u64, ranked); };
  const SchedRequest& req = *ctx.request;
  const LatencyTrainer* model = req.latency;
  const bool ttft_slo = req.slo_ttft_s > 0;
  const bool tpot_slo = req.slo_tpot_s > 0 && p_.use_tpot;
  const size_t n = candidates.size();
  if (model == nullptr || (!ttft_slo && !tpot_slo) || n < 2) return blend();
  // Predicted latency over objective of candidate c: NaN when unknown.
  // The share of the prompt the profile's prefix scorer finds cached on candidate c.
  auto cached_at = [&](size_t c) {
    return ctx.prefix_row >= 0 ? sc.scores[static_cast<size_t>(ctx.prefix_row) * n + c] : 0.0;
  };
  auto ratio_of = [&](size_t c) {
    const LatencyTrainer::Dispatch d =
        LatencyTrainer::DispatchOf(req, ctx.endpoints[candidates[c]], cached_at(c));
    std::optional<double> ttft, tpot;
    if (ttft_slo) ttft = model->PredictTtft(d);
    if (tpot_slo) tpot = model->PredictTpot(d);
    if ((ttft_slo && !ttft) || (tpot_slo && !tpot)) return std::nan("");
    return std::max(ttft_slo ? *ttft / req.slo_ttft_s : 0.0,
                    tpot_slo ? *tpot / req.slo_tpot_s : 0.0);
  };
  // The blend's choice (the first of the best totals; ties are broken at random below
  // only when nothing moves). Predicted first and alone: when it fits (the common case)
  // nothing else is predicted, so a pick costs one prediction, not one per candidate.
  size_t best = 0;
  for (size_t c = 1; c < n; ++c) {
    if (totals[c] > totals[best]) best = c;
  }
  const double best_ratio = ratio_of(best);
  if (!(best_ratio > 1.0)) return blend();  // predicted to fit, or unknown: keep it
  std::vector<double>& ratio = sc.f64;
  ratio.resize(n);
  for (size_t c = 0; c < n; ++c) ratio[c] = c == best ? best_ratio : ratio_of(c);
  // Room: predicted within fit_fraction of the objective, and holding about as much of the
  // prompt as the blend's choice (moving to a colder replica makes the fleet prefill again).
  const double floor_cached = cached_at(best) - p_.max_cached_loss;
  for (size_t c = 0; c < n; ++c) {
    if (ratio[c] <= p_.fit_fraction && cached_at(c) < floor_cached) ratio[c] = std::nan("");
  }
  bool any_room = false;
  for (size_t c = 0; c < n; ++c) any_room = any_room || ratio[c] <= p_.fit_fraction;
  if (!any_room) return blend();  // nowhere clearly better: the blend's choice
  // Candidates with room first, then the rest, each by the blend. Keys shift the room
  // tier above every total (totals are finite and >= 0).
  double top = 0.0;
  for (double t : totals) top = std::max(top, std::isfinite(t) ? t : 0.0);
  std::vector<double>& key = ratio;  // reused in place
  for (size_t c = 0; c < n; ++c) {
    const double t = std::isfinite(totals[c]) ? std::max(totals[c], 0.0) : 0.0;
    key[c] = (ratio[c] <= p_.fit_fraction ? top + 1.0 : 0.0) + t;
  }
  RankByMaxScore(key, max_ranked, *ctx.rng, sc.u32_b, sc.u64, ranked);
}

void WeightedRandomPicker::Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
                                std::span<const double> totals, size_t max_ranked,
                                std::vector<uint32_t>& ranked) {
  const size_t n = totals.size();
  const size_t k = (max_ranked == 0 || max_ranked > n) ? n : max_ranked;
  std::vector<double>& w_ = ctx.scratch->f64;
  std::vector<uint32_t>& idx_ = ctx.scratch->u32_b;
  w_.assign(totals.begin(), totals.end());
  idx_.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    idx_[i] = i;
    if (!(w_[i] > 0)) w_[i] = 0;  // negative and NaN weigh nothing
  }
  ranked.clear();
  size_t remaining = n;
  while (ranked.size() < k) {
    double sum = 0;
    for (size_t j = 0; j < remaining; ++j) sum += w_[j];
    size_t chosen;
    if (sum > 0) {
      double r = ctx.rng->Uniform() * sum;
      chosen = remaining - 1;
      for (size_t j = 0; j < remaining; ++j) {
        if (w_[j] <= 0) continue;
        if (r < w_[j]) {
          chosen = j;
          break;
        }
        r -= w_[j];
      }
      // Rounding may leave r just past the last positive weight: take that one.
      while (w_[chosen] <= 0 && chosen > 0) --chosen;
    } else {
      chosen = ctx.rng->Below(remaining);
    }
    ranked.push_back(idx_[chosen]);
    --remaining;
    std::swap(idx_[chosen], idx_[remaining]);
    std::swap(w_[chosen], w_[remaining]);
  }
}

void RandomPicker::Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
                        std::span<const double> totals, size_t max_ranked,
                        std::vector<uint32_t>& ranked) {
  const size_t n = candidates.size();
  const size_t k = (max_ranked == 0 || max_ranked > n) ? n : max_ranked;
  std::vector<uint32_t>& idx_ = ctx.scratch->u32_b;
  idx_.resize(n);
  for (uint32_t i = 0; i < n; ++i) idx_[i] = i;
  for (size_t i = 0; i < k; ++i) {
    const size_t j = i + ctx.rng->Below(n - i);
    std::swap(idx_[i], idx_[j]);
  }
  ranked.assign(idx_.begin(), idx_.begin() + k);
}

void RoundRobinPicker::Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
                            std::span<const double> totals, size_t max_ranked,
                            std::vector<uint32_t>& ranked) {
  const size_t n = candidates.size();
  const size_t k = (max_ranked == 0 || max_ranked > n) ? n : max_ranked;
  const size_t start = static_cast<size_t>(next_.fetch_add(1, std::memory_order_relaxed) % n);
  ranked.clear();
  for (size_t i = 0; i < k; ++i) ranked.push_back(static_cast<uint32_t>((start + i) % n));
}

}  // namespace kvroute::sched
