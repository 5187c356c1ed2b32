// Arrival processes: when requests are sent. Open loop (times do not depend on how fast
// the fleet answers); `max_concurrency` is a cap the driver enforces by holding requests
// back, not part of the times generated here.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/common/rng.h"
#include "core/common/status.h"

namespace kvroute::workload {

enum class ArrivalKind {
  kPoisson,   // exponential gaps
  kGamma,     // Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) gaps
  kConstant,  // gaps of exactly 1 / rate
};

// One stage of a rate sweep: `rate` requests/s for `duration_s` seconds.
struct RateStage {
  double rate = 1.0;
  double duration_s = std::numeric_limits<double>::infinity();
};

struct ArrivalSpec {
  ArrivalKind kind = ArrivalKind::kPoisson;
  double burstiness = 1.0;        // kGamma's shape; 1 equals Poisson
  std::vector<RateStage> stages;  // run in order; the last may be open-ended (infinite)
  int64_t num_requests = 0;       // stop after this many (0: no count limit)
  double duration_s = 0.0;        // stop at this time (0: no time limit)
  int64_t max_concurrency = 0;    // 0: unlimited; enforced by the driver

  // Ok when usable, else InvalidArgument naming the problem. Some limit must make the
  // process finite: a count, a duration, or stages that all have finite durations.
  Status Validate() const;
};

// Generates arrival times (seconds from 0, non-decreasing). Deterministic given the seed.
class ArrivalProcess {
 public:
  ArrivalProcess(const ArrivalSpec& spec, uint64_t seed);

  // The next arrival time, or nullopt once the count, duration or stages are used up.
  std::optional<double> Next();

  int64_t generated() const { return generated_; }

 private:
  double Gap(double rate);

  ArrivalSpec spec_;
  Rng rng_;
  size_t stage_ = 0;
  double stage_start_ = 0.0;
  double last_ = 0.0;
  int64_t generated_ = 0;
  bool done_ = false;
};

}  // namespace kvroute::workload
