#include "core/routing/region_rtt.h"

#include <cmath>

namespace kvroute::routing {

std::optional<double> RegionRttEstimator::Observe(std::string_view region, double rtt_s,
                                                  double now_s) {
  if (region.empty() || !std::isfinite(rtt_s) || rtt_s < 0) return std::nullopt;
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    it = regions_.emplace(std::string(region), Region{rtt_s, now_s, false}).first;
  } else {
    it->second.estimate += options_.alpha * (rtt_s - it->second.estimate);
  }
  Region& r = it->second;
  if (r.pushed && now_s - r.pushed_at_s < options_.push_interval_s) return std::nullopt;
  r.pushed = true;
  r.pushed_at_s = now_s;
  return r.estimate;
}

std::optional<double> RegionRttEstimator::Estimate(std::string_view region) const {
  auto it = regions_.find(region);
  if (it == regions_.end()) return std::nullopt;
  return it->second.estimate;
}

std::vector<std::pair<std::string, double>> RegionRttEstimator::Estimates() const {
  std::vector<std::pair<std::string, double>> out;
  out.reserve(regions_.size());
  for (const auto& [name, r] : regions_) out.emplace_back(name, r.estimate);
  return out;
}

}  // namespace kvroute::routing
