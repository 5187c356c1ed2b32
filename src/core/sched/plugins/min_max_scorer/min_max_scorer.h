// The min-max normalised load scorers: queue-depth-scorer and queue-scorer (waiting),
// running-requests-scorer (running), least-request-scorer (the router's in-flight count).
// One class, the load field chosen by the type name (registry.cc).
#pragma once

#include <cstdint>
#include <span>

#include "core/sched/plugin.h"
#include "core/sched/plugin_factory.h"

namespace kvroute::sched {

// Which load field a MinMaxScorer reads.
enum class LoadField { kWaiting, kRunning, kInflight };

// (max - x) / (max - min) over the candidates; 1 for all when max == min. x is the
// candidate's load view (PickContext::loads), nothing from EndpointState::engine.
// Role kQueue for waiting, kLoad for running and in-flight.
class MinMaxScorer : public Scorer {
 public:
  explicit MinMaxScorer(LoadField f) : field_(f) {}
  ScorerRole role() const override {
    return field_ == LoadField::kWaiting ? ScorerRole::kQueue : ScorerRole::kLoad;
  }
  void Score(const PickContext& ctx, std::span<const uint32_t> candidates,
             std::span<double> out) override;

 private:
  LoadField field_;
};

// No parameters; `field` per type name.
PluginFactory MinMaxScorerFactory(LoadField field);

}  // namespace kvroute::sched
