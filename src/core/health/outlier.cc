#include "core/health/outlier.h"

#include <algorithm>
#include <cmath>

namespace kvroute::health {

std::size_t MaxEjected(std::size_t pool_size, const OutlierOptions& options) {
  if (pool_size < 2 || options.consecutive_failures <= 0) return 0;
  const double pct = std::clamp(options.max_ejection_percent, 0.0, 100.0);
  auto n = static_cast<std::size_t>(std::floor(static_cast<double>(pool_size) * pct / 100.0));
  // Never every endpoint, and at least one (Envoy's rule too): a pool of 2 at 10% can
  // still eject its broken half.
  return std::clamp<std::size_t>(n, 1, pool_size - 1);
}

double Ejection::Eject(double now_s, const OutlierOptions& options) {
  const double base = std::max(options.base_ejection_s, 1e-3);
  if (count_ > 0 && now_s > until_s_) {
    const double calm = (now_s - until_s_) / base;
    level_ = std::max(0, level_ - static_cast<int>(std::min(calm, 64.0)));
  }
  const double duration = std::min(std::max(options.max_ejection_s, base),
                                   base * std::ldexp(1.0, std::min(level_, 30)));
  until_s_ = now_s + duration;
  level_ = std::min(level_ + 1, 30);
  ++count_;
  return until_s_;
}

}  // namespace kvroute::health
