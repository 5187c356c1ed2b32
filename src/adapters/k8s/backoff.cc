#include "adapters/k8s/backoff.h"

#include <algorithm>
#include <cmath>

namespace kvroute::k8s {

Backoff::Backoff(BackoffPolicy policy, uint64_t seed) : policy_(policy), seed_(seed) {}

void Backoff::OnSuccess(Time now) {
  up_ = true;
  up_since_ = now;
}

void Backoff::Reset() {
  failures_ = 0;
  up_ = false;
}

double Backoff::NextUnit() {
  uint64_t z = (seed_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

std::chrono::milliseconds Backoff::OnFailure(Time now) {
  if (up_ && now - up_since_ >= policy_.reset_after) failures_ = 0;
  up_ = false;
  ++failures_;
  const double initial = static_cast<double>(policy_.initial.count());
  const double max = static_cast<double>(policy_.max.count());
  // Capped before multiplying on, so a long outage cannot overflow.
  double base = initial;
  for (int i = 1; i < failures_ && base < max; ++i) base *= policy_.multiplier;
  base = std::min(base, max);
  double d = base * (1.0 + policy_.jitter * NextUnit());
  return std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, std::round(d))));
}

}  // namespace kvroute::k8s
