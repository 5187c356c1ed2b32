// Reconnect delays for the watch: exponential backoff with jitter, as pure logic (time
// and randomness are passed in), so a test can run a whole outage in virtual time.
//
//   delay(n) = min(max, initial * multiplier^(n-1)) * (1 + jitter * u),  u uniform in [-1, 1)
//
// for the n-th consecutive failure. A connection that stayed up for at least
// `reset_after` resets n, so a watch the server ends every few minutes (as it does
// after its timeout) reconnects at once instead of climbing towards `max`.
//
// Thread: a value owned by one connection loop.
#pragma once

#include <chrono>
#include <cstdint>

namespace kvroute::k8s {

struct BackoffPolicy {
  std::chrono::milliseconds initial{500};
  std::chrono::milliseconds max{30000};
  double multiplier = 2.0;
  double jitter = 0.2;  // fraction of the delay, in [0, 1)
  std::chrono::milliseconds reset_after{10000};
};

class Backoff {
 public:
  using Time = std::chrono::steady_clock::time_point;

  explicit Backoff(BackoffPolicy policy = {}, uint64_t seed = 1);

  // A connection (or request) succeeded at `now`: the next failure after it has stayed up
  // `reset_after` starts again from `initial`.
  void OnSuccess(Time now);
  // An attempt failed at `now`; returns how long to wait before the next one.
  std::chrono::milliseconds OnFailure(Time now);
  // Forget every failure.
  void Reset();

  int consecutive_failures() const { return failures_; }
  const BackoffPolicy& policy() const { return policy_; }

 private:
  double NextUnit();  // uniform in [-1, 1), from seed_ (splitmix64)

  BackoffPolicy policy_;
  uint64_t seed_;
  int failures_ = 0;
  bool up_ = false;
  Time up_since_{};
};

}  // namespace kvroute::k8s
