#include "core/health/endpoint_health.h"

#include <array>
#include <limits>

#include "core/common/enum_names.h"

namespace kvroute::health {

std::string_view ConditionName(Condition c) {
  static constexpr std::array<std::string_view, kNumConditions> kNames = {"never_scraped", "up",
                                                                          "stale", "down"};
  return NameAt(kNames, c, "?");
}

std::string_view TreatmentName(Treatment t) {
  static constexpr std::array<std::string_view, kNumTreatments> kNames = {"normal", "saturated",
                                                                          "last_resort", "down"};
  return NameAt(kNames, t, "?");
}

std::string_view SignalName(Signal s) {
  static constexpr std::array<std::string_view, kNumSignals> kNames = {"kv_usage", "waiting",
                                                                       "running"};
  return NameAt(kNames, s, "?");
}

void EndpointHealth::OnScrape(const metrics::EngineMetrics& m, double sent_at_s) {
  using F = metrics::EngineMetrics;
  known_[0] = m.Has(F::kKvUsage);
  known_[1] = m.Has(F::kWaiting);
  known_[2] = m.Has(F::kRunning);
  if (known_[0]) kv_usage_ = m.kv_usage;
  if (known_[1]) waiting_ = m.waiting;
  if (known_[2]) running_ = m.running;
  // Capacity rarely changes; keep the last known value when a scrape omits it.
  if (m.Has(F::kNumGpuBlocks)) num_gpu_blocks_ = m.num_gpu_blocks;
  if (m.Has(F::kBlockSize)) block_size_ = m.block_size;
  scraped_at_s_ = sent_at_s;
  last_ok_ = true;
  down_ = false;
  last_ = m;
}

void EndpointHealth::OnScrapeFailed(double attempted_at_s, bool connect_failed) {
  last_ok_ = false;
  if (connect_failed) down_ = true;
}

void EndpointHealth::OnConnectFailed(double at_s) {
  // A scrape sent after the refusal clears it (OnScrape); one sent before but answered
  // after cannot be told apart here, which errs on the side of picking it again sooner.
  down_ = true;
}

Verdict EndpointHealth::Assess(double now_s, const HealthOptions& options) const {
  Verdict v;
  for (int i = 0; i < kNumSignals; ++i) v.known[i] = known_[i];
  if (down_) {
    v.condition = Condition::kDown;
    v.treatment = Treatment::kDown;
    return v;
  }
  if (scraped_at_s_ < 0) {
    v.condition = Condition::kNeverScraped;
  } else if (!last_ok_ || now_s - scraped_at_s_ > options.staleness_s) {
    v.condition = Condition::kStale;
  } else {
    v.condition = Condition::kUp;
  }
  const bool load_known = known_[0] && known_[1];
  if (v.condition == Condition::kUp && load_known) {
    v.treatment = Treatment::kNormal;
  } else {
    v.treatment = options.stale_policy == StalePolicy::kSaturated ? Treatment::kSaturated
                                                                   : Treatment::kLastResort;
  }
  return v;
}

double EndpointHealth::NextChange(const HealthOptions& options) const {
  if (down_ || scraped_at_s_ < 0 || !last_ok_) return std::numeric_limits<double>::infinity();
  return scraped_at_s_ + options.staleness_s;
}

}  // namespace kvroute::health
