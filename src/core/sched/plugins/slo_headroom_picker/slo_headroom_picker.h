// slo-headroom-picker (issue 24; registry.h for parameters, docs/POLICIES.md "Picking by
// predicted latency").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// slo-headroom-picker's parameters.
struct SloHeadroomParams {
  // Another endpoint is taken over the blend's choice only when its prediction is at
  // most this fraction of the objective (room for the model's error).
  double fit_fraction = 0.25;
  // Judge the TPOT objective too (off: TTFT only; the TPOT model is not good enough).
  bool use_tpot = false;
  // An endpoint with room must hold at least the blend choice's cached share of the
  // prompt minus this (0..1): by default, no colder replica (a move to one makes the
  // fleet prefill the prompt again; measured, docs/BENCHMARKS.md).
  double max_cached_loss = 0.0;
};

// Picks by predicted latency against the request's objectives (issue 24; docs/POLICIES.md
// "Picking by predicted latency"). The latency model (SchedRequest::latency) predicts, for
// each candidate, TTFT from the prompt tokens not cached there (by the profile's prefix
// scorer) and the queue ahead of it, and optionally TPOT. The picker keeps the weighted
// blend's choice unless that endpoint is predicted to miss the objective and another is
// predicted to meet it with room (at most fit_fraction of it, and holding as much of the
// prompt within max_cached_loss); then the endpoints with room come first, each group by
// the blend. With no model, no objective, or no prediction
// for the blend's choice, it ranks as max-score-picker does: a cold start picks exactly as
// the blend, and an endpoint without a prediction is never chosen for it.
// Consumes kWaiting, kRunning and kKvUsage of EndpointState::engine: the features of its
// predictions (LatencyTrainer::DispatchOf), read only when the request has a model and an
// objective.
//
// Why so conservative (measured in docs/BENCHMARKS.md, issue 24): moving a request off
// its prefix holder costs the fleet the prefill of its cached tokens, and the model errs
// most (MAPE 70% in bursts) where the move would matter; ranking every predicted fit
// first and every miss by its predicted violation, as first built, lost up to 12% goodput
// against the blend; moves to colder replicas won 8% on one burst and lost 31% on
// another; and TPOT predictions (MAPE 50-100% in overload) moved requests off prefix-warm
// replicas for nothing.
class SloHeadroomPicker : public Configured<Picker, SloHeadroomParams> {
 public:
  using Configured::Configured;
  uint32_t consumed_fields() const override;
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override;
};

// Parameters fitFraction (0.25), useTpot (0) and maxCachedLoss (0).
PluginFactory SloHeadroomPickerFactory();

}  // namespace kvroute::sched
