// The retry budget as pure logic, in virtual time.
#include "core/routing/retry_budget.h"

#include <gtest/gtest.h>

namespace kvroute::routing {
namespace {

TEST(RetryBudget, MinimumRetriesThenAShareOfRequests) {
  RetryBudgetOptions o;
  o.ratio = 0.2;
  o.min_retries = 2;
  o.window_s = 10;
  RetryBudget b;
  // A quiet router: two retries whatever the traffic, not a third.
  EXPECT_TRUE(b.TryRetry(0.0, o));
  EXPECT_TRUE(b.TryRetry(0.1, o));
  EXPECT_FALSE(b.TryRetry(0.2, o));
  // 20 requests earn 4 more (2 + 0.2 * 20 = 6 in the window).
  for (int i = 0; i < 20; ++i) b.OnRequest(1.0, o);
  EXPECT_EQ(b.requests(1.0, o), 20u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(b.TryRetry(1.5, o)) << i;
  EXPECT_FALSE(b.TryRetry(1.5, o));
  EXPECT_EQ(b.retries(1.5, o), 6u);
}

TEST(RetryBudget, OldRequestsAndRetriesLeaveTheWindow) {
  RetryBudgetOptions o;
  o.ratio = 0.5;
  o.min_retries = 0;
  o.window_s = 10;  // ten 1 s buckets
  RetryBudget b;
  for (int i = 0; i < 10; ++i) b.OnRequest(0.5, o);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(b.TryRetry(0.5, o));
  EXPECT_FALSE(b.TryRetry(9.9, o));  // still in the window
  EXPECT_EQ(b.requests(10.5, o), 0u);  // the bucket of t=0.5 left at t=10
  EXPECT_EQ(b.retries(10.5, o), 0u);
  EXPECT_FALSE(b.TryRetry(10.5, o));   // no requests, no minimum: nothing to spend
  b.OnRequest(10.6, o);
  b.OnRequest(10.7, o);
  EXPECT_TRUE(b.TryRetry(10.8, o));
  EXPECT_FALSE(b.TryRetry(10.9, o));
}

}  // namespace
}  // namespace kvroute::routing
