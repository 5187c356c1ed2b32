// A retry budget as pure logic: retries allowed as a share of recent requests, so a sick
// fleet is not amplified (every failing request retried would double the load exactly when
// the fleet can least take it). Counts requests and retries in a sliding window of
// `window_s` seconds (ten buckets); a retry is allowed while
//
//   retries in the window < min_retries + ratio * requests in the window
//
// `min_retries` lets a quiet router still retry its occasional failure. Retries after a
// connect failure never reached an engine and cost no generation work: the router does not
// charge them to the budget (RoutingCore::AllowRetry's `free`).
//
// Thread: a value type; the owner serialises access. No clock: every call takes the time.
#pragma once

#include <array>
#include <cstdint>

namespace kvroute::routing {

struct RetryBudgetOptions {
  double ratio = 0.2;       // retries per request in the window
  double min_retries = 10;  // allowed in the window whatever the traffic
  double window_s = 10.0;
};

class RetryBudget {
 public:
  void OnRequest(double now_s, const RetryBudgetOptions& options);
  // Returns true (and counts the retry) when the budget allows one at `now_s`.
  bool TryRetry(double now_s, const RetryBudgetOptions& options);
  // Requests and retries in the window ending at `now_s`.
  uint64_t requests(double now_s, const RetryBudgetOptions& options);
  uint64_t retries(double now_s, const RetryBudgetOptions& options);

 private:
  static constexpr int kBuckets = 10;
  struct Bucket {
    int64_t epoch = -1;  // floor(now / bucket width) this bucket counts
    uint64_t requests = 0;
    uint64_t retries = 0;
  };
  Bucket& At(double now_s, const RetryBudgetOptions& options);
  void Sum(double now_s, const RetryBudgetOptions& options, uint64_t& requests, uint64_t& retries);
  std::array<Bucket, kBuckets> buckets_{};
};

}  // namespace kvroute::routing
