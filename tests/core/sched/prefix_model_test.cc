// The prefix model seam (prefix_model.h): today's approximate model learns from routed
// chains and from reported cache changes alike, and the policies answer through it.
#include "core/sched/prefix_model.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/sched/registry.h"

namespace kvroute::sched {
namespace {

TEST(ApproxPrefixModel, ReportedStoresRemovalsAndClears) {
  ApproxPrefixModel m;
  const std::vector<uint64_t> chain = {11, 12, 13, 14, 15};
  m.Apply(2, {CacheUpdate::Kind::kStored, chain}, 1.0);
  EXPECT_EQ(m.MatchOne(chain, 2), 5u);
  EXPECT_EQ(m.MatchOne(chain, 1), 0u);
  EXPECT_EQ(m.Size(2), 5u);
  // A removed middle block ends the held prefix there.
  const std::vector<uint64_t> middle = {13};
  m.Apply(2, {CacheUpdate::Kind::kRemoved, middle}, 2.0);
  EXPECT_EQ(m.MatchOne(chain, 2), 2u);
  EXPECT_EQ(m.Size(2), 4u);
  // Removing what it does not hold changes nothing.
  m.Apply(1, {CacheUpdate::Kind::kRemoved, middle}, 2.0);
  EXPECT_EQ(m.TotalEntries(), 4u);
  m.Apply(2, {CacheUpdate::Kind::kCleared, {}}, 3.0);
  EXPECT_EQ(m.Size(2), 0u);
  EXPECT_EQ(m.TotalEntries(), 0u);
}

TEST(ApproxPrefixModel, RoutedChainsAreBoundedByTheirCapacityAndStoresByTheLastOne) {
  ApproxPrefixModel m;
  const std::vector<uint64_t> a = {1, 2, 3, 4};
  EXPECT_EQ(m.OnRouted(a, 0, 4, 1.0), 0u);
  EXPECT_EQ(m.OnRouted(a, 0, 4, 2.0), 4u);
  // A store beyond the routed capacity evicts the least recent blocks (a's tail first).
  const std::vector<uint64_t> b = {7, 8};
  m.Apply(0, {CacheUpdate::Kind::kStored, b}, 3.0);
  EXPECT_EQ(m.Size(0), 4u);
  EXPECT_EQ(m.MatchOne(b, 0), 2u);
  EXPECT_EQ(m.MatchOne(a, 0), 2u);
}

// Both policies that hold the approximate model take reported changes keyed by their own
// chains (PrefixKey); sglang-cache-aware keeps its tree of routed text and ignores them.
TEST(PrefixModelSeam, PoliciesApplyCacheUpdatesToTheirModel) {
  const std::string prompt = std::string(4096, 'x') + "tail";
  SchedRequest req;
  req.model = "m";
  req.prompt = prompt;  // a view: the string outlives every use
  for (const char* policy : {"kvroute", "gie-default", "dynamo-cost"}) {
    SCOPED_TRACE(policy);
    BuildResult b = BuildPolicy(policy);
    ASSERT_TRUE(b.ok());
    std::vector<uint64_t> chain;
    b.scheduler->PrefixKey(req, chain);
    ASSERT_FALSE(chain.empty());
    b.scheduler->OnCacheUpdate(3, {CacheUpdate::Kind::kStored, chain}, 1.0);
    EXPECT_EQ(b.scheduler->HeldBlocks(chain, 3), chain.size());
    EXPECT_EQ(b.scheduler->PrefixEntries(3), static_cast<int64_t>(chain.size()));
    b.scheduler->OnCacheUpdate(3, {CacheUpdate::Kind::kCleared, {}}, 2.0);
    EXPECT_EQ(b.scheduler->HeldBlocks(chain, 3), 0u);
  }
  BuildResult s = BuildPolicy("sglang-cache-aware");
  std::vector<uint64_t> chain = {1, 2, 3};
  s.scheduler->OnCacheUpdate(0, {CacheUpdate::Kind::kStored, chain}, 1.0);
  EXPECT_EQ(s.scheduler->HeldBlocks(chain, 0), 0u);
}

}  // namespace
}  // namespace kvroute::sched
