#include "adapters/k8s/backoff.h"

#include <gtest/gtest.h>

namespace kvroute::k8s {
namespace {

using std::chrono::milliseconds;
using Time = Backoff::Time;

TEST(Backoff, DoublesUpToTheCapWithoutJitter) {
  BackoffPolicy p;
  p.initial = milliseconds(100);
  p.max = milliseconds(1000);
  p.jitter = 0;
  Backoff b(p);
  Time t{};
  std::vector<int64_t> got;
  for (int i = 0; i < 7; ++i) got.push_back(b.OnFailure(t).count());
  EXPECT_EQ(got, (std::vector<int64_t>{100, 200, 400, 800, 1000, 1000, 1000}));
  EXPECT_EQ(b.consecutive_failures(), 7);
  for (int i = 0; i < 10000; ++i) b.OnFailure(t);  // no overflow in a long outage
  EXPECT_EQ(b.OnFailure(t).count(), 1000);
}

TEST(Backoff, JitterStaysInBoundsAndSpreads) {
  BackoffPolicy p;
  p.initial = milliseconds(1000);
  p.max = milliseconds(1000);
  p.jitter = 0.25;
  Backoff b(p, 42);
  int64_t lo = 1 << 30, hi = 0;
  for (int i = 0; i < 2000; ++i) {
    int64_t d = b.OnFailure(Time{}).count();
    EXPECT_GE(d, 750);
    EXPECT_LE(d, 1250);
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  EXPECT_LT(lo, 780);
  EXPECT_GT(hi, 1220);
  // Same seed, same delays: reproducible in tests; different seeds desynchronise replicas.
  Backoff a1(p, 7), a2(p, 7), a3(p, 8);
  int64_t x1 = a1.OnFailure(Time{}).count(), x2 = a2.OnFailure(Time{}).count(),
          x3 = a3.OnFailure(Time{}).count();
  EXPECT_EQ(x1, x2);
  EXPECT_NE(x1, x3);
}

TEST(Backoff, AStableConnectionResetsInVirtualTime) {
  BackoffPolicy p;
  p.initial = milliseconds(500);
  p.max = milliseconds(30000);
  p.jitter = 0;
  p.reset_after = milliseconds(10000);
  Backoff b(p);
  Time t{};
  EXPECT_EQ(b.OnFailure(t).count(), 500);    // API server down at start
  t += milliseconds(500);
  EXPECT_EQ(b.OnFailure(t).count(), 1000);
  t += milliseconds(1000);
  EXPECT_EQ(b.OnFailure(t).count(), 2000);
  t += milliseconds(2000);
  b.OnSuccess(t);                            // up; the watch drops after 3 s: still climbing
  t += milliseconds(3000);
  EXPECT_EQ(b.OnFailure(t).count(), 4000);
  t += milliseconds(4000);
  b.OnSuccess(t);                            // up for 5 minutes: the server's watch timeout
  t += std::chrono::minutes(5);
  EXPECT_EQ(b.OnFailure(t).count(), 500);    // back to the start
  EXPECT_EQ(b.consecutive_failures(), 1);
  b.Reset();
  EXPECT_EQ(b.consecutive_failures(), 0);
  EXPECT_EQ(b.OnFailure(t).count(), 500);
}

}  // namespace
}  // namespace kvroute::k8s
