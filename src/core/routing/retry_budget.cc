#include "core/routing/retry_budget.h"

#include <algorithm>
#include <cmath>

namespace kvroute::routing {

namespace {

int64_t EpochOf(double now_s, const RetryBudgetOptions& options, int buckets) {
  const double width = std::max(options.window_s, 1e-3) / buckets;
  return static_cast<int64_t>(std::floor(now_s / width));
}

}  // namespace

RetryBudget::Bucket& RetryBudget::At(double now_s, const RetryBudgetOptions& options) {
  const int64_t e = EpochOf(now_s, options, kBuckets);
  Bucket& b = buckets_[static_cast<std::size_t>(((e % kBuckets) + kBuckets) % kBuckets)];
  if (b.epoch != e) b = Bucket{e, 0, 0};
  return b;
}

void RetryBudget::Sum(double now_s, const RetryBudgetOptions& options, uint64_t& requests,
                      uint64_t& retries) {
  const int64_t e = EpochOf(now_s, options, kBuckets);
  requests = retries = 0;
  for (const Bucket& b : buckets_) {
    if (b.epoch > e - kBuckets && b.epoch <= e) {
      requests += b.requests;
      retries += b.retries;
    }
  }
}

void RetryBudget::OnRequest(double now_s, const RetryBudgetOptions& options) {
  ++At(now_s, options).requests;
}

bool RetryBudget::TryRetry(double now_s, const RetryBudgetOptions& options) {
  uint64_t req = 0, ret = 0;
  Sum(now_s, options, req, ret);
  const double allowed = std::max(0.0, options.min_retries) +
                         std::max(0.0, options.ratio) * static_cast<double>(req);
  if (static_cast<double>(ret) + 1.0 > allowed) return false;
  ++At(now_s, options).retries;
  return true;
}

uint64_t RetryBudget::requests(double now_s, const RetryBudgetOptions& options) {
  uint64_t req = 0, ret = 0;
  Sum(now_s, options, req, ret);
  return req;
}

uint64_t RetryBudget::retries(double now_s, const RetryBudgetOptions& options) {
  uint64_t req = 0, ret = 0;
  Sum(now_s, options, req, ret);
  return ret;
}

}  // namespace kvroute::routing
