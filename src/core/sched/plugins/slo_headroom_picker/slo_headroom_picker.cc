#include "core/sched/plugins/slo_headroom_picker/slo_headroom_picker.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/sched/latency_trainer.h"

namespace kvroute::sched {

uint32_t SloHeadroomPicker::consumed_fields() const {
  // What LatencyTrainer::DispatchOf reads of a candidate's engine.
  using F = metrics::EngineMetrics;
  return F::kWaiting | F::kRunning | F::kKvUsage;
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

PluginFactory SloHeadroomPickerFactory() {
  using P = SloHeadroomPicker::Params;
  return ParamsFactory<SloHeadroomPicker>(
      PluginKind::kPicker, {{{"fitFraction", 1e-3, 1, false}, &P::fit_fraction},
                            {{"useTpot", 0, 1, true}, &P::use_tpot},
                            {{"maxCachedLoss", 0, 1, false}, &P::max_cached_loss}});
}

}  // namespace kvroute::sched
