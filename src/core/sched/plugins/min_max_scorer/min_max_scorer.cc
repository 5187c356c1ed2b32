#include "core/sched/plugins/min_max_scorer/min_max_scorer.h"

#include <algorithm>
#include <limits>

namespace kvroute::sched {

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

PluginFactory MinMaxScorerFactory(LoadField field) {
  return {PluginKind::kScorer, {}, [field](const PluginParams&) {
            return std::unique_ptr<Plugin>(new MinMaxScorer(field));
          }};
}

}  // namespace kvroute::sched
