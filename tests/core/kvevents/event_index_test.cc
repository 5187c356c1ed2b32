#include "core/kvevents/event_index.h"

#include <gtest/gtest.h>

#include <numeric>

namespace kvroute::kvevents {
namespace {

std::vector<uint32_t> Tokens(size_t n, uint32_t first) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

KvEvent Stored(std::vector<uint64_t> hashes, std::optional<uint64_t> parent, std::vector<uint32_t> tokens,
               int32_t block_size, Medium m = Medium::kGpu, std::string lora = "") {
  KvEvent e;
  e.kind = EventKind::kBlockStored;
  e.block_hashes = std::move(hashes);
  e.parent_hash = parent;
  e.token_ids = std::move(tokens);
  e.block_size = block_size;
  e.medium = m;
  e.lora_name = std::move(lora);
  return e;
}

KvEvent Removed(std::vector<uint64_t> hashes, Medium m = Medium::kGpu) {
  KvEvent e;
  e.kind = EventKind::kBlockRemoved;
  e.block_hashes = std::move(hashes);
  e.medium = m;
  return e;
}

KvEventBatch Batch(std::vector<KvEvent> events) {
  KvEventBatch b;
  b.events = std::move(events);
  return b;
}

IndexOptions Opts(int32_t block_tokens = 4) {
  IndexOptions o;
  o.block_tokens = block_tokens;
  return o;
}

class EventIndexTest : public ::testing::Test {
 protected:
  uint32_t Run(uint32_t ep, const std::vector<uint32_t>& tokens, double now = 1.0,
               std::string_view lora = "") {
    std::vector<uint64_t> keys;
    index.RequestKeys(lora, tokens, &keys);
    return index.MatchOne(keys, ep, now);
  }
  EventIndex index{Opts()};
};

TEST_F(EventIndexTest, StatesFromExpectToLive) {
  EXPECT_EQ(index.State(0, 0), SourceState::kOff);
  EXPECT_FALSE(index.active());
  index.Expect(0, 0);
  EXPECT_TRUE(index.active());
  EXPECT_EQ(index.State(0, 0), SourceState::kUnknown);
  EXPECT_FALSE(index.Usable(0, 0));
  index.ApplyBatch(0, Batch({}), 0.5);
  EXPECT_EQ(index.State(0, 0.5), SourceState::kLive);
  EXPECT_TRUE(index.Usable(0, 0.5));
  std::vector<StateTransition> t;
  index.DrainTransitions(&t);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].from, SourceState::kOff);
  EXPECT_EQ(t[0].to, SourceState::kUnknown);
  EXPECT_EQ(t[1].to, SourceState::kLive);
  index.DrainTransitions(&t);
  EXPECT_EQ(t.size(), 2u);  // nothing new
}

TEST_F(EventIndexTest, KeysComeFromTokensNotEngineHashes) {
  index.Expect(0, 0);
  index.Expect(1, 0);
  const auto toks = Tokens(12, 100);
  // Two engines with different hash seeds: different hashes, same tokens.
  index.ApplyBatch(0, Batch({Stored({11, 12, 13}, std::nullopt, toks, 4)}), 0);
  index.ApplyBatch(1, Batch({Stored({91, 92}, std::nullopt, Tokens(8, 100), 4)}), 0);
  EXPECT_EQ(Run(0, toks), 3u);
  EXPECT_EQ(Run(1, toks), 2u);
  // A prompt that continues past the cached part, and one that differs in block 2.
  auto longer = Tokens(20, 100);
  EXPECT_EQ(Run(0, longer), 3u);
  auto differs = toks;
  differs[5] = 7;
  EXPECT_EQ(Run(0, differs), 1u);
  std::vector<uint64_t> keys;
  index.RequestKeys("", toks, &keys);
  std::vector<double> w;
  std::vector<uint32_t> run;
  index.Match(keys, 0, w, run);
  EXPECT_EQ(run[0], 3u);
  EXPECT_EQ(run[1], 2u);
  EXPECT_DOUBLE_EQ(w[0], 3.0);
  EXPECT_DOUBLE_EQ(w[1], 2.0);
  EXPECT_EQ(index.Stats(0, 0).blocks, 3u);
  EXPECT_EQ(index.TotalBlocks(), 5u);
}

TEST_F(EventIndexTest, ParentChainsRunsAndUnknownParentIsAnOrphan) {
  index.Expect(0, 0);
  const auto toks = Tokens(16, 1);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, Tokens(8, 1), 4)}), 0);
  index.ApplyBatch(0, Batch({Stored({3, 4}, 2, Tokens(8, 9), 4)}), 0);
  EXPECT_EQ(Run(0, toks), 4u);
  index.ApplyBatch(0, Batch({Stored({6}, 5, Tokens(4, 17), 4)}), 0);
  EXPECT_EQ(index.Stats(0, 0).orphans, 1u);
  EXPECT_EQ(index.Stats(0, 0).blocks, 4u);
}

TEST_F(EventIndexTest, EngineBlocksSpanningSeveralKeys) {
  index.Expect(0, 0);
  const auto toks = Tokens(16, 1);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, toks, 8)}), 0);
  EXPECT_EQ(Run(0, toks), 4u);
  index.ApplyBatch(0, Batch({Removed({2})}), 0);
  EXPECT_EQ(Run(0, toks), 2u);
  EXPECT_EQ(index.Stats(0, 0).block_size, 8);
}

TEST_F(EventIndexTest, RemovalEndsTheRunAndCopiesAreCounted) {
  index.Expect(0, 0);
  const auto toks = Tokens(12, 1);
  index.ApplyBatch(0, Batch({Stored({1, 2, 3}, std::nullopt, toks, 4)}), 0);
  index.ApplyBatch(0, Batch({Removed({2})}), 0);
  EXPECT_EQ(Run(0, toks), 1u);
  EXPECT_EQ(index.Stats(0, 0).blocks, 2u);
  // The same hash in two physical blocks: one removal leaves it held.
  index.ApplyBatch(0, Batch({Stored({1}, std::nullopt, Tokens(4, 1), 4)}), 0);
  index.ApplyBatch(0, Batch({Removed({1})}), 0);
  EXPECT_EQ(Run(0, toks), 1u);
  index.ApplyBatch(0, Batch({Removed({1})}), 0);
  EXPECT_EQ(Run(0, toks), 0u);
  // Removing what is not held changes nothing.
  index.ApplyBatch(0, Batch({Removed({1, 77})}), 0);
  EXPECT_EQ(index.Stats(0, 0).blocks, 1u);
}

TEST_F(EventIndexTest, TiersWeighBlocksAndOffloadedCopiesReuseKeys) {
  index.Expect(0, 0);
  const auto toks = Tokens(8, 1);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, toks, 4)}), 0);
  // Offloaded copies: no token ids, same engine hashes.
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, {}, 4, Medium::kCpu)}), 0);
  index.ApplyBatch(0, Batch({Removed({2})}), 0);  // evicted from GPU, still on CPU
  std::vector<uint64_t> keys;
  index.RequestKeys("", toks, &keys);
  double w = 0;
  EXPECT_EQ(index.MatchOne(keys, 0, 0, &w), 2u);
  EXPECT_DOUBLE_EQ(w, 1.0 + 0.8);
  index.ApplyBatch(0, Batch({Removed({2}, Medium::kCpu)}), 0);
  EXPECT_EQ(index.MatchOne(keys, 0, 0, &w), 1u);
  EXPECT_DOUBLE_EQ(w, 1.0);
  // A CPU copy of a block never seen cannot be keyed.
  index.ApplyBatch(0, Batch({Stored({42}, std::nullopt, {}, 4, Medium::kCpu)}), 0);
  EXPECT_EQ(index.Stats(0, 0).orphans, 1u);
}

TEST_F(EventIndexTest, AllBlocksClearedEmptiesTheEndpointOnly) {
  index.Expect(0, 0);
  index.Expect(1, 0);
  const auto toks = Tokens(8, 1);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, toks, 4)}), 0);
  index.ApplyBatch(1, Batch({Stored({1, 2}, std::nullopt, toks, 4)}), 0);
  KvEvent clear;
  clear.kind = EventKind::kAllBlocksCleared;
  index.ApplyBatch(0, Batch({clear}), 0);
  EXPECT_EQ(Run(0, toks), 0u);
  EXPECT_EQ(Run(1, toks), 2u);
  EXPECT_EQ(index.Stats(0, 0).cleared, 1u);
  EXPECT_EQ(index.State(0, 0), SourceState::kLive);
}

TEST_F(EventIndexTest, LoraNameRootsTheChain) {
  index.Expect(0, 0);
  const auto toks = Tokens(8, 1);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, toks, 4, Medium::kGpu, "sql-lora")}), 0);
  EXPECT_EQ(Run(0, toks), 0u);
  EXPECT_EQ(Run(0, toks, 1.0, "sql-lora"), 2u);
}

TEST_F(EventIndexTest, BlockSizeMismatchIsNotUsable) {
  index.Expect(0, 0);
  index.ApplyBatch(0, Batch({Stored({1}, std::nullopt, Tokens(6, 1), 6)}), 0);
  EXPECT_EQ(index.State(0, 0), SourceState::kMismatch);
  EXPECT_FALSE(index.Usable(0, 0));
  EXPECT_EQ(index.Stats(0, 0).mismatches, 1u);
  EXPECT_EQ(index.Stats(0, 0).block_size, 6);
  EXPECT_EQ(index.Stats(0, 0).blocks, 0u);
  // Tokens that do not cover the blocks are malformed.
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, Tokens(4, 1), 4)}), 0);
  EXPECT_EQ(index.Stats(0, 0).decode_errors, 1u);
  // A fitting block size makes it live again.
  index.ApplyBatch(0, Batch({Stored({1}, std::nullopt, Tokens(4, 1), 4)}), 0);
  EXPECT_EQ(index.State(0, 0), SourceState::kLive);
}

TEST_F(EventIndexTest, UnrepairedGapResyncsThenLive) {
  index.Expect(0, 0);
  const auto toks = Tokens(8, 1);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, toks, 4)}), 0);
  index.OnGap(0, /*repaired=*/true, 1);
  EXPECT_EQ(index.State(0, 1), SourceState::kLive);
  EXPECT_EQ(Run(0, toks), 2u);
  index.OnGap(0, /*repaired=*/false, 2);
  EXPECT_EQ(index.State(0, 2), SourceState::kResync);
  EXPECT_EQ(Run(0, toks), 0u);
  EXPECT_EQ(index.Stats(0, 2).gaps, 2u);
  EXPECT_EQ(index.Stats(0, 2).gaps_unrepaired, 1u);
  // Stores during the resync are learned, but the endpoint is not trusted until 2 + 10.
  index.ApplyBatch(0, Batch({Stored({1}, std::nullopt, Tokens(4, 1), 4)}), 3);
  EXPECT_EQ(index.State(0, 11.9), SourceState::kResync);
  EXPECT_EQ(index.State(0, 12.0), SourceState::kLive);
  std::vector<StateTransition> t;
  index.DrainTransitions(&t);
  t.clear();
  index.Tick(12.0);
  index.DrainTransitions(&t);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].from, SourceState::kResync);
  EXPECT_EQ(t[0].to, SourceState::kLive);
  EXPECT_EQ(Run(0, toks, 12.0), 1u);
}

TEST_F(EventIndexTest, DecodeErrorResyncsAndRestartClearsButStaysLive) {
  index.Expect(0, 0);
  const auto toks = Tokens(8, 1);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, toks, 4)}), 0);
  index.OnRestart(0, 1);
  EXPECT_EQ(index.State(0, 1), SourceState::kLive);
  EXPECT_EQ(Run(0, toks), 0u);
  EXPECT_EQ(index.Stats(0, 1).restarts, 1u);
  index.ApplyBatch(0, Batch({Stored({5, 6}, std::nullopt, toks, 4)}), 1);
  EXPECT_EQ(Run(0, toks), 2u);
  index.OnDecodeError(0, 2);
  EXPECT_EQ(index.State(0, 2), SourceState::kResync);
  EXPECT_EQ(Run(0, toks), 0u);
  EXPECT_EQ(index.Stats(0, 2).decode_errors, 1u);
}

TEST_F(EventIndexTest, SilentAfterDispatchedWorkIsStale) {
  index.Expect(0, 0);
  index.ApplyBatch(0, Batch({}), 0);
  index.OnWorkDispatched(0, 5);
  index.OnWorkDispatched(0, 9);  // the clock runs from the first
  EXPECT_EQ(index.State(0, 15.0), SourceState::kLive);
  EXPECT_EQ(index.State(0, 15.01), SourceState::kStale);
  index.Tick(16);
  std::vector<StateTransition> t;
  index.DrainTransitions(&t);
  EXPECT_EQ(t.back().to, SourceState::kStale);
  index.ApplyBatch(0, Batch({}), 17);
  EXPECT_EQ(index.State(0, 100), SourceState::kLive);
  t.clear();
  index.DrainTransitions(&t);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].from, SourceState::kStale);
  EXPECT_EQ(t[0].to, SourceState::kLive);
  // Never heard from: dispatching does not make it stale, it stays unknown.
  index.Expect(1, 0);
  index.OnWorkDispatched(1, 0);
  EXPECT_EQ(index.State(1, 100), SourceState::kUnknown);
}

TEST_F(EventIndexTest, SpeculativeEntriesLastTheirTtl) {
  index.Expect(0, 0);
  index.ApplyBatch(0, Batch({}), 0);
  const auto toks = Tokens(12, 1);
  std::vector<uint64_t> keys;
  index.RequestKeys("", toks, &keys);
  index.AddSpeculative(0, keys, 10.0);
  EXPECT_EQ(index.MatchOne(keys, 0, 11.9), 3u);
  EXPECT_EQ(index.MatchOne(keys, 0, 12.0), 0u);  // expired even before a Tick
  EXPECT_EQ(index.SpeculativeEntries(), 3u);
  // Re-added at 11: the first entries' expiry does not end the new ones.
  index.AddSpeculative(0, keys, 11.0);
  index.Tick(12.5);
  EXPECT_EQ(index.MatchOne(keys, 0, 12.5), 3u);
  index.Tick(13.0);
  EXPECT_EQ(index.SpeculativeEntries(), 0u);
  EXPECT_EQ(index.MatchOne(keys, 0, 12.5), 0u);
  // Events for the same blocks outlive the speculative entries.
  index.AddSpeculative(0, keys, 20.0);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, Tokens(8, 1), 4)}), 20.5);
  index.Tick(30);
  EXPECT_EQ(index.MatchOne(keys, 0, 30), 2u);
}

TEST_F(EventIndexTest, SpeculativeEntriesAreBounded) {
  IndexOptions o = Opts();
  o.max_speculative = 4;
  EventIndex small(o);
  small.Expect(0, 0);
  std::vector<uint64_t> keys;
  small.RequestKeys("", Tokens(24, 1), &keys);
  small.AddSpeculative(0, keys, 0);
  EXPECT_EQ(small.SpeculativeEntries(), 4u);
  EXPECT_EQ(small.MatchOne(keys, 0, 1), 0u);  // the oldest (leading) keys ended early
  EXPECT_EQ(small.MatchOne(std::span(keys).subspan(2), 0, 1), 4u);
}

TEST_F(EventIndexTest, PerEndpointBoundDropsEntriesAndResyncs) {
  IndexOptions o = Opts();
  o.max_blocks_per_endpoint = 4;
  EventIndex small(o);
  small.Expect(0, 0);
  small.ApplyBatch(0, Batch({Stored({1, 2, 3, 4}, std::nullopt, Tokens(16, 1), 4)}), 0);
  EXPECT_EQ(small.Stats(0, 0).blocks, 4u);
  small.ApplyBatch(0, Batch({Stored({5}, 4, Tokens(4, 17), 4)}), 0);
  EXPECT_EQ(small.Stats(0, 0).blocks, 0u);
  EXPECT_EQ(small.Stats(0, 0).overflows, 1u);
  EXPECT_EQ(small.State(0, 0), SourceState::kResync);
}

TEST_F(EventIndexTest, ForgetAndNewBlockSizeDropEntries) {
  index.Expect(0, 0);
  index.Expect(1, 0);
  const auto toks = Tokens(8, 1);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, toks, 4)}), 0);
  index.ApplyBatch(1, Batch({Stored({1, 2}, std::nullopt, toks, 4)}), 0);
  index.Forget(0);
  EXPECT_EQ(index.State(0, 0), SourceState::kOff);
  EXPECT_EQ(Run(0, toks), 0u);
  EXPECT_EQ(Run(1, toks), 2u);
  index.ApplyBatch(0, Batch({Stored({1, 2}, std::nullopt, toks, 4)}), 0);  // ignored: off
  EXPECT_EQ(Run(0, toks), 0u);
  index.SetOptions(Opts(2));
  EXPECT_EQ(index.State(1, 0), SourceState::kUnknown);
  EXPECT_EQ(Run(1, toks), 0u);
  EXPECT_EQ(index.TotalBlocks(), 0u);
}

TEST(EventIndexKeys, FullBlocksOnlyAndCapped) {
  std::vector<uint64_t> a, b;
  EventIndex::ChainKeys("", Tokens(10, 1), 4, 100, &a);
  EXPECT_EQ(a.size(), 2u);
  EventIndex::ChainKeys("", Tokens(8, 1), 4, 1, &b);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0], b[0]);
  EventIndex::ChainKeys("", Tokens(8, 2), 4, 100, &b);
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
}

}  // namespace
}  // namespace kvroute::kvevents
