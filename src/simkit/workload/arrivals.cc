#include "simkit/workload/arrivals.h"

#include <cmath>

namespace kvroute::workload {

Status ArrivalSpec::Validate() const {
  if (stages.empty()) return Status::InvalidArgument("needs a rate or stages");
  bool finite_stages = true;
  for (const RateStage& s : stages) {
    if (!(s.rate > 0.0) || !std::isfinite(s.rate)) {
      return Status::InvalidArgument("rate must be > 0");
    }
    if (!(s.duration_s > 0.0)) return Status::InvalidArgument("stage duration_s must be > 0");
    if (!std::isfinite(s.duration_s)) finite_stages = false;
  }
  if (kind == ArrivalKind::kGamma && !(burstiness > 0.0)) {
    return Status::InvalidArgument("burstiness must be > 0");
  }
  if (num_requests < 0) return Status::InvalidArgument("num_requests must be >= 0");
  if (duration_s < 0.0) return Status::InvalidArgument("duration_s must be >= 0");
  if (max_concurrency < 0) return Status::InvalidArgument("max_concurrency must be >= 0");
  if (num_requests == 0 && duration_s == 0.0 && !finite_stages) {
    return Status::InvalidArgument("needs num_requests, duration_s or finite stage durations");
  }
  return Status::Ok();
}

ArrivalProcess::ArrivalProcess(const ArrivalSpec& spec, uint64_t seed)
    : spec_(spec), rng_(MixKey(seed, 0xa77ULL)) {}

double ArrivalProcess::Gap(double rate) {
  switch (spec_.kind) {
    case ArrivalKind::kConstant:
      return 1.0 / rate;
    case ArrivalKind::kGamma:
      if (spec_.burstiness != 1.0) {
        return rng_.Gamma(spec_.burstiness, 1.0 / (rate * spec_.burstiness));
      }
      [[fallthrough]];
    case ArrivalKind::kPoisson:
      break;
  }
  return rng_.Exponential(rate);
}

std::optional<double> ArrivalProcess::Next() {
  if (done_) return std::nullopt;
  if (spec_.num_requests > 0 && generated_ >= spec_.num_requests) {
    done_ = true;
    return std::nullopt;
  }
  // The first constant-rate arrival is at 0; random processes draw a gap first, so the
  // sum of n gaps has the right distribution.
  const bool first_constant = generated_ == 0 && spec_.kind == ArrivalKind::kConstant;
  double t = last_;
  for (;;) {
    if (stage_ >= spec_.stages.size()) {
      done_ = true;
      return std::nullopt;
    }
    const RateStage& s = spec_.stages[stage_];
    const double stage_end = stage_start_ + s.duration_s;
    const double candidate = first_constant ? t : t + Gap(s.rate);
    if (candidate < stage_end) {
      t = candidate;
      break;
    }
    // The draw crossed into the next stage: restart from that stage's start at its
    // rate (exact for Poisson by memorylessness; a fine approximation otherwise).
    t = stage_end;
    stage_start_ = stage_end;
    ++stage_;
    if (spec_.kind == ArrivalKind::kConstant && stage_ < spec_.stages.size()) {
      t = stage_end;  // the next stage's first arrival is at its start
      if (spec_.duration_s > 0.0 && t >= spec_.duration_s) break;
      last_ = t;
      ++generated_;
      return t;
    }
  }
  if (spec_.duration_s > 0.0 && t >= spec_.duration_s) {
    done_ = true;
    return std::nullopt;
  }
  last_ = t;
  ++generated_;
  return t;
}

}  // namespace kvroute::workload
