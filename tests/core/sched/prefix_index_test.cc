#include "core/sched/prefix_index.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <string>
#include <vector>

namespace kvroute::sched {
namespace {

TEST(HashPromptBlocks, ChainsXxh64SeededByModelAndSalt) {
  std::vector<uint64_t> h;
  HashPromptBlocks("llama", "salt", "abcdefgh-", 4, 256, h);
  ASSERT_EQ(h.size(), 2u);  // "abcd", "efgh"; the partial "-" is dropped
  const std::string seed_text = "llamasalt";
  const uint64_t h0 = XXH64(seed_text.data(), seed_text.size(), 0);
  const uint64_t h1 = XXH3_64bits_withSeed("abcd", 4, h0);
  const uint64_t h2 = XXH3_64bits_withSeed("efgh", 4, h1);
  EXPECT_EQ(h[0], h1);
  EXPECT_EQ(h[1], h2);
}

TEST(HashPromptBlocks, StopsAtMaxBlocks) {
  std::vector<uint64_t> h{1, 2, 3};
  HashPromptBlocks("m", "", std::string(100, 'x'), 10, 4, h);
  EXPECT_EQ(h.size(), 4u);
  HashPromptBlocks("m", "", "short", 10, 4, h);
  EXPECT_TRUE(h.empty());
}

TEST(HashPromptBlocks, EqualHashesMeanEqualPrefixes) {
  std::vector<uint64_t> a, b;
  HashPromptBlocks("m", "", "AAAABBBB", 4, 256, a);
  HashPromptBlocks("m", "", "CCCCBBBB", 4, 256, b);
  EXPECT_NE(a[1], b[1]);  // same block text, different history
}

TEST(ApproxPrefixIndex, RecordReturnsTheLeadingBlocksHeldBefore) {
  ApproxPrefixIndex idx;
  std::vector<uint64_t> chain{11, 12, 13, 14};
  EXPECT_EQ(idx.Record(std::span(chain).first(2), 0, 100), 0u);
  EXPECT_EQ(idx.Record(chain, 0, 100), 2u);
  EXPECT_EQ(idx.Record(chain, 0, 100), 4u);
  EXPECT_EQ(idx.Record(chain, 1, 100), 0u);
  std::vector<uint64_t> holed{11, 99, 13, 14};  // 13 and 14 held, 99 not: leading run is 1
  EXPECT_EQ(idx.Record(holed, 0, 100), 1u);
}

TEST(ApproxPrefixIndex, MatchCountsLeadingBlocksPerEndpoint) {
  ApproxPrefixIndex idx;
  std::vector<uint64_t> chain{11, 12, 13, 14};
  idx.Record(std::span(chain).first(4), 0, 100);
  idx.Record(std::span(chain).first(2), 3, 100);
  std::vector<uint32_t> m;
  EXPECT_EQ(idx.Match(chain, m), 4u);
  ASSERT_GE(m.size(), 4u);
  EXPECT_EQ(m[0], 4u);
  EXPECT_EQ(m[1], 0u);
  EXPECT_EQ(m[3], 2u);
  EXPECT_EQ(idx.MatchOne(chain, 3), 2u);
  // A hole at block 0 means no match, even if later blocks are present.
  std::vector<uint64_t> other{99, 12, 13};
  EXPECT_EQ(idx.Match(other, m), 0u);
  EXPECT_EQ(m[0], 0u);
}

TEST(ApproxPrefixIndex, LruEvictsLeastRecentlyRecordedChainTailFirst) {
  ApproxPrefixIndex idx;
  std::vector<uint64_t> a{1, 2, 3};
  std::vector<uint64_t> b{7, 8};
  idx.Record(a, 0, 4);
  EXPECT_EQ(idx.Size(0), 3u);
  idx.Record(b, 0, 4);  // 5 entries > 4: the oldest goes, which is a's tail block 3
  EXPECT_EQ(idx.Size(0), 4u);
  EXPECT_TRUE(idx.Contains(1, 0));
  EXPECT_TRUE(idx.Contains(2, 0));
  EXPECT_FALSE(idx.Contains(3, 0));
  EXPECT_TRUE(idx.Contains(7, 0));
  EXPECT_EQ(idx.MatchOne(a, 0), 2u);
  // Touching a again makes it most recent; b's tail (8) is now the oldest.
  idx.Record(std::span(a).first(2), 0, 4);
  idx.Record(std::vector<uint64_t>{20}, 0, 4);
  EXPECT_FALSE(idx.Contains(8, 0));
  EXPECT_TRUE(idx.Contains(7, 0));
  EXPECT_TRUE(idx.Contains(1, 0));
  EXPECT_EQ(idx.Size(0), 4u);
}

TEST(ApproxPrefixIndex, CapacityIsPerEndpoint) {
  ApproxPrefixIndex idx;
  std::vector<uint64_t> a{1, 2, 3, 4, 5};
  idx.Record(a, 0, 2);
  idx.Record(a, 1, 10);
  EXPECT_EQ(idx.Size(0), 2u);
  EXPECT_EQ(idx.Size(1), 5u);
  EXPECT_EQ(idx.TotalEntries(), 7u);
  EXPECT_EQ(idx.MatchOne(a, 0), 2u);  // the head blocks survive
  idx.RemoveEndpoint(1);
  EXPECT_EQ(idx.Size(1), 0u);
  EXPECT_EQ(idx.TotalEntries(), 2u);
  EXPECT_TRUE(idx.Contains(1, 0));
  EXPECT_FALSE(idx.Contains(1, 1));
}

TEST(ApproxPrefixIndex, ExpireBeforeDropsOldEntries) {
  ApproxPrefixIndex idx;
  idx.Record(std::vector<uint64_t>{1, 2}, 0, 100, 1.0);
  idx.Record(std::vector<uint64_t>{3}, 0, 100, 5.0);
  idx.Record(std::vector<uint64_t>{1}, 1, 100, 2.0);
  idx.ExpireBefore(3.0);
  EXPECT_FALSE(idx.Contains(1, 0));
  EXPECT_FALSE(idx.Contains(2, 0));
  EXPECT_TRUE(idx.Contains(3, 0));
  EXPECT_FALSE(idx.Contains(1, 1));
  EXPECT_EQ(idx.TotalEntries(), 1u);
}

// Many inserts and evictions across endpoints, checked against a simple model.
TEST(ApproxPrefixIndex, AgreesWithModelUnderChurn) {
  ApproxPrefixIndex idx;
  constexpr size_t kCap = 50;
  std::vector<std::vector<uint64_t>> lru(4);  // front = least recent
  uint64_t x = 12345;
  for (int step = 0; step < 3000; ++step) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const uint32_t ep = static_cast<uint32_t>((x >> 33) % 4);
    std::vector<uint64_t> chain;
    const size_t len = 1 + (x >> 40) % 6;
    for (size_t i = 0; i < len; ++i) chain.push_back(((x >> 20) + i * 7) % 300 + 1);
    idx.Record(chain, ep, kCap);
    auto& l = lru[ep];
    for (size_t k = chain.size(); k-- > 0;) {
      std::erase(l, chain[k]);
      l.push_back(chain[k]);
    }
    while (l.size() > kCap) l.erase(l.begin());
  }
  for (uint32_t ep = 0; ep < 4; ++ep) {
    EXPECT_EQ(idx.Size(ep), lru[ep].size());
    for (uint64_t h = 1; h <= 300; ++h) {
      const bool in_model = std::find(lru[ep].begin(), lru[ep].end(), h) != lru[ep].end();
      EXPECT_EQ(idx.Contains(h, ep), in_model) << "ep " << ep << " hash " << h;
    }
  }
}

}  // namespace
}  // namespace kvroute::sched
