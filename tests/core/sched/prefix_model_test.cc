// The prefix model seam (prefix_model.h): the approximate model learns from routed chains
// only, and counts a match by its rules (GIE's and Dynamo's leading run, llm-d's walk).
#include "core/sched/prefix_model.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvroute::sched {
namespace {

TEST(ApproxPrefixModel, RoutedChainsAreBoundedByTheirCapacity) {
  ApproxPrefixModel m;
  const std::vector<uint64_t> a = {1, 2, 3, 4};
  EXPECT_EQ(m.OnRouted(a, 0, 4, 1.0), 0u);
  EXPECT_EQ(m.OnRouted(a, 0, 4, 2.0), 4u);
  // A chain beyond the capacity evicts the least recent blocks (a's tail first).
  const std::vector<uint64_t> b = {7, 8};
  EXPECT_EQ(m.OnRouted(b, 0, 4, 3.0), 0u);
  EXPECT_EQ(m.Size(0), 4u);
  EXPECT_EQ(m.MatchOne(b, 0), 2u);
  EXPECT_EQ(m.MatchOne(a, 0), 2u);
  m.RemoveEndpoint(0);
  EXPECT_EQ(m.TotalEntries(), 0u);
}

TEST(ApproxPrefixModel, TheLeadingRunCountsOnlyUnbrokenPrefixes) {
  ApproxPrefixModel m;
  const std::vector<uint64_t> one = {1};
  const std::vector<uint64_t> chain = {1, 2, 3};
  m.OnRouted(one, 0, 100, 1.0);
  m.OnRouted(std::vector<uint64_t>{1, 2, 9}, 1, 100, 1.0);
  std::vector<uint32_t> by;
  EXPECT_EQ(m.Match(chain, by), 2u);  // the longest leading match
  ASSERT_GE(by.size(), 2u);
  EXPECT_EQ(by[0], 1u);
  EXPECT_EQ(by[1], 2u);
}

// llm-d's producer: the walk stops at the first block nobody holds, and an endpoint counts
// every walked block it holds; its LRU fills in chain order, so the head goes first.
TEST(ApproxPrefixModel, TheWalkRuleCountsHeldBlocksAlongTheWalk) {
  ApproxPrefixModel m({ApproxRules::Count::kWalk, ApproxPrefixIndex::RecordOrder::kInOrder});
  const std::vector<uint64_t> chain = {1, 2, 3, 4};
  m.OnRouted(std::vector<uint64_t>{2, 3}, 0, 100, 1.0);  // not the head
  m.OnRouted(std::vector<uint64_t>{1, 2}, 1, 100, 1.0);
  std::vector<uint32_t> by;
  EXPECT_EQ(m.Match(chain, by), 3u);  // 4 is held by nobody
  ASSERT_GE(by.size(), 2u);
  EXPECT_EQ(by[0], 2u);  // 2 and 3, though not a leading run
  EXPECT_EQ(by[1], 2u);
  EXPECT_EQ(m.MatchOne(chain, 0), 0u);  // the probe is a leading run whatever the rule
  EXPECT_EQ(m.MatchOne(chain, 1), 2u);

  // In chain order: over capacity, the chain's head is evicted first.
  m.OnRouted(std::vector<uint64_t>{5, 6, 7}, 1, 3, 2.0);
  EXPECT_EQ(m.Size(1), 3u);
  EXPECT_EQ(m.MatchOne(std::vector<uint64_t>{5, 6, 7}, 1), 3u);
  ApproxPrefixModel tail_first;
  tail_first.OnRouted(std::vector<uint64_t>{5, 6, 7}, 0, 2, 1.0);
  EXPECT_EQ(tail_first.MatchOne(std::vector<uint64_t>{5, 6, 7}, 0), 2u);
  ApproxPrefixModel head_first({ApproxRules::Count::kWalk,
                                ApproxPrefixIndex::RecordOrder::kInOrder});
  head_first.OnRouted(std::vector<uint64_t>{5, 6, 7}, 0, 2, 1.0);
  EXPECT_EQ(head_first.MatchOne(std::vector<uint64_t>{5, 6, 7}, 0), 0u);
}

}  // namespace
}  // namespace kvroute::sched
