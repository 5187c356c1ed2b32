// The measured round-trip smoother, in virtual time.
#include "core/routing/region_rtt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvroute::routing {
namespace {

TEST(RegionRttEstimator, FirstSampleIsTheEstimateAndPushesAtOnce) {
  RegionRttEstimator est;
  EXPECT_FALSE(est.Estimate("eu-west"));
  auto push = est.Observe("eu-west", 0.080, 10.0);
  ASSERT_TRUE(push);
  EXPECT_DOUBLE_EQ(*push, 0.080);
  EXPECT_DOUBLE_EQ(*est.Estimate("eu-west"), 0.080);
}

// alpha 0.2 over every sample of the region, whichever endpoint sent it; pushes at most
// once per push_interval_s, carrying the estimate as of that sample.
TEST(RegionRttEstimator, SmoothsPerRegionAndRateLimitsPushes) {
  RegionRttEstimator est;  // alpha 0.2, 1 s
  ASSERT_TRUE(est.Observe("eu-west", 0.100, 0.0));
  EXPECT_FALSE(est.Observe("eu-west", 0.050, 0.05));  // 0.1 + 0.2 x (0.05 - 0.1) = 0.09
  EXPECT_NEAR(*est.Estimate("eu-west"), 0.090, 1e-12);
  EXPECT_FALSE(est.Observe("eu-west", 0.090, 0.5));   // unchanged
  EXPECT_NEAR(*est.Estimate("eu-west"), 0.090, 1e-12);
  auto push = est.Observe("eu-west", 0.140, 1.0);     // 0.09 + 0.2 x 0.05 = 0.1
  ASSERT_TRUE(push);
  EXPECT_NEAR(*push, 0.100, 1e-12);
  EXPECT_FALSE(est.Observe("eu-west", 0.100, 1.99));
  EXPECT_TRUE(est.Observe("eu-west", 0.100, 2.0));
  // Another region has its own average and its own push clock.
  auto other = est.Observe("ap-south", 0.150, 1.5);
  ASSERT_TRUE(other);
  EXPECT_DOUBLE_EQ(*other, 0.150);
  EXPECT_NEAR(*est.Estimate("eu-west"), 0.100, 1e-12);
  ASSERT_EQ(est.Estimates().size(), 2u);
  EXPECT_EQ(est.Estimates()[0].first, "ap-south");
}

// A burst of slow samples moves the estimate a fifth of the way each, not all the way.
TEST(RegionRttEstimator, OneOutlierMovesItByAlpha) {
  RegionRttEstimator est(RegionRttEstimator::Options{0.2, 0.0});
  est.Observe("r", 0.010, 0.0);
  auto p = est.Observe("r", 1.010, 0.1);
  ASSERT_TRUE(p);
  EXPECT_NEAR(*p, 0.210, 1e-12);
}

TEST(RegionRttEstimator, IgnoresNoRegionAndBadSamples) {
  RegionRttEstimator est;
  EXPECT_FALSE(est.Observe("", 0.05, 0.0));
  EXPECT_FALSE(est.Observe("r", -0.01, 0.0));
  EXPECT_FALSE(est.Observe("r", std::numeric_limits<double>::quiet_NaN(), 0.0));
  EXPECT_FALSE(est.Observe("r", std::numeric_limits<double>::infinity(), 0.0));
  EXPECT_FALSE(est.Estimate("r"));
  EXPECT_TRUE(est.Estimates().empty());
  ASSERT_TRUE(est.Observe("r", 0.02, 0.0));
  est.Clear();
  EXPECT_FALSE(est.Estimate("r"));
  EXPECT_TRUE(est.Observe("r", 0.03, 0.1));  // afresh: pushes at once
}

}  // namespace
}  // namespace kvroute::routing
