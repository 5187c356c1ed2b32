#include "simkit/workload/distribution.h"

#include <algorithm>
#include <cmath>

namespace kvroute::workload {

LengthDist LengthDist::Fixed(int64_t value) {
  LengthDist d;
  d.components.push_back({1.0, value, value, static_cast<double>(value), 0.0});
  return d;
}

LengthDist LengthDist::Normal(int64_t min, int64_t max, double mean, double std_dev) {
  LengthDist d;
  d.components.push_back({1.0, min, max, mean, std_dev});
  return d;
}

Status LengthDist::Validate(int64_t min_allowed) const {
  if (components.empty()) return Status::InvalidArgument("empty distribution");
  double total = 0.0;
  for (const LengthComponent& c : components) {
    if (!(c.weight >= 0.0)) return Status::InvalidArgument("weight must be >= 0");
    if (c.min > c.max) return Status::InvalidArgument("min must be <= max");
    if (c.min < min_allowed) {
      return Status::InvalidArgument("lengths must be >= " + std::to_string(min_allowed));
    }
    if (!(c.std_dev >= 0.0)) return Status::InvalidArgument("std_dev must be >= 0");
    if (!std::isfinite(c.mean)) return Status::InvalidArgument("mean must be finite");
    total += c.weight;
  }
  if (!(total > 0.0)) return Status::InvalidArgument("mixture weights must not all be 0");
  return Status::Ok();
}

int64_t LengthDist::Sample(Rng& rng) const {
  const LengthComponent* c = &components.front();
  if (components.size() > 1) {
    double total = 0.0;
    for (const LengthComponent& x : components) total += x.weight;
    double u = rng.Uniform() * total;
    for (const LengthComponent& x : components) {
      c = &x;
      if (u < x.weight) break;
      u -= x.weight;
    }
  }
  if (c->min == c->max) return c->min;
  if (c->std_dev == 0.0)
    return std::clamp(std::llround(c->mean), static_cast<long long>(c->min),
                      static_cast<long long>(c->max));
  long long v = 0;
  for (int attempt = 0; attempt < 16; ++attempt) {
    v = std::llround(c->mean + c->std_dev * rng.Normal());
    if (v >= c->min && v <= c->max) return v;
  }
  return std::clamp(v, static_cast<long long>(c->min), static_cast<long long>(c->max));
}

double LengthDist::NominalMean() const {
  double total = 0.0, sum = 0.0;
  for (const LengthComponent& c : components) {
    total += c.weight;
    sum += c.weight * (c.min == c.max ? static_cast<double>(c.min) : c.mean);
  }
  return total > 0.0 ? sum / total : 0.0;
}

}  // namespace kvroute::workload
