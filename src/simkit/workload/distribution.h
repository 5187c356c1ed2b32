// Token-length distributions as inference-perf writes them: a plain integer, or
// {min, max, mean, std_dev} (a normal truncated to [min, max]); kvroute adds weighted
// mixtures of those for bimodal lengths ("mostly short answers, a few essays").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/common/rng.h"
#include "core/common/status.h"

namespace kvroute::workload {

struct LengthComponent {
  double weight = 1.0;  // relative; only used in mixtures
  int64_t min = 0;
  int64_t max = 0;
  double mean = 0.0;
  double std_dev = 0.0;  // 0: always round(mean) (clamped to [min, max])
};

struct LengthDist {
  std::vector<LengthComponent> components;  // one for a plain distribution

  // A distribution that always yields `value`.
  static LengthDist Fixed(int64_t value);
  // {min, max, mean, std_dev}.
  static LengthDist Normal(int64_t min, int64_t max, double mean, double std_dev);

  // Returns ok when the distribution is usable, else InvalidArgument saying what is wrong
  // ("min > max", "negative weight", ...). `min_allowed` is the smallest legal length.
  Status Validate(int64_t min_allowed) const;

  // Draws one length: picks a component by weight, then a normal draw rounded to the
  // nearest integer, redrawn (at most 16 times) while outside [min, max], then clamped.
  int64_t Sample(Rng& rng) const;

  // The mean of the untruncated components, weighted (for sizing, not exact).
  double NominalMean() const;
};

}  // namespace kvroute::workload
