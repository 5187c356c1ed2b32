// llm-d-sticky and llm-d-precise: llm-d Router's "sticky until saturated" as
// ../shared/REFERENCE.md section 22 states it. Each documented rule is pinned here: the
// affinity filter's 0.80 threshold and its 286,704-token release, the token-load formula,
// the in-flight accounting (added at dispatch, released at the first token), the
// producer's 64-token blocks with the partial block, and the LRU's size and fill order.
// Prompts are written in 256-character blocks (64 tokens at 4 bytes a token).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "core/kvevents/event_index.h"
#include "core/sched/llmd_sticky.h"
#include "sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;
using testing::MustBuildPolicy;
using testing::Req;

constexpr size_t kBlock = 256;  // characters of one 64-token block

// `n` blocks, block i filled with character base + i (so chains diverge where bases do).
std::string Blocks(char base, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += std::string(kBlock, static_cast<char>(base + i));
  return s;
}

struct Fixture {
  explicit Fixture(bool precise = false, size_t endpoints = 3, int64_t gpu_blocks = 1 << 20)
      : s(Config(precise), SchedulerOptions{}), eps(MakeEndpoints(endpoints)) {
    for (EndpointState& e : eps) e.num_gpu_blocks = gpu_blocks;
  }
  static LlmdStickyScheduler::Config Config(bool precise) {
    LlmdStickyScheduler::Config c;
    c.precise = precise;
    return c;
  }
  // Picks, dispatches to `endpoint`, and (unless `hold`) lets it reach its first token and
  // finish, so it leaves only its blocks behind.
  RequestHandle Send(const std::string& prompt, uint32_t endpoint, double t, bool hold = false) {
    PickResult p = s.Pick(Req(prompt), eps, t);
    EXPECT_TRUE(p.ok());
    s.OnDispatched(p.handle, endpoint, t);
    if (!hold) {
      s.OnFirstToken(p.handle, t);
      s.OnFinished(p.handle, t);
    }
    return p.handle;
  }
  std::vector<uint32_t> Candidates(const PickResult& r) {
    return std::vector<uint32_t>(r.candidates.begin(), r.candidates.end());
  }

  LlmdStickyScheduler s;
  std::vector<EndpointState> eps;
};

TEST(LlmdSticky, BuiltByNameInTheDefaultSet) {
  EXPECT_EQ(MustBuildPolicy("llm-d-sticky")->policy(), "llm-d-sticky");
  EXPECT_EQ(MustBuildPolicy("llm-d-precise")->policy(), "llm-d-precise");
  EXPECT_FALSE(PolicyNeedsEvents("llm-d-sticky"));
  EXPECT_TRUE(PolicyNeedsEvents("llm-d-precise"));
  const LlmdStickyScheduler::Config c;
  EXPECT_EQ(c.block_tokens, 64);
  EXPECT_EQ(c.max_blocks, 2048u);  // 131,072 tokens
  EXPECT_DOUBLE_EQ(c.affinity_threshold, 0.80);
  EXPECT_DOUBLE_EQ(c.release_tokens, 286704.0);
  EXPECT_DOUBLE_EQ(c.load_scale_tokens, 4194304.0);
  EXPECT_EQ(c.default_lru_entries, 31250u);
}

TEST(LlmdSticky, AffinityFilterKeepsEndpointsAtOrAbove80Percent) {
  Fixture f;
  f.Send(Blocks('a', 10), 1, 0.0);
  // 8 of 10 blocks held by endpoint 1: a = 0.8, it alone stays.
  PickResult r = f.s.Pick(Req(Blocks('a', 8) + Blocks('x', 2)), f.eps, 1.0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({1}));
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.8);
  EXPECT_EQ(r.ranked[0], 1u);
  f.s.OnFinished(r.handle, 1.0);
  // 7 of 10: a = 0.7 < 0.8 everywhere: S is empty, every endpoint stays.
  r = f.s.Pick(Req(Blocks('a', 7) + Blocks('x', 3)), f.eps, 2.0);
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({0, 1, 2}));
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 0.7);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.0);
  f.s.OnFinished(r.handle, 2.0);
}

TEST(LlmdSticky, MatchWalksUntilNoEndpointHoldsTheBlock) {
  Fixture f;
  // Endpoint 0 holds blocks 0-3 of chain 'a', endpoint 1 blocks 0-9.
  f.Send(Blocks('a', 4), 0, 0.0);
  f.Send(Blocks('a', 10), 1, 0.0);
  PickResult r = f.s.Pick(Req(Blocks('a', 10)), f.eps, 1.0);
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({1}));
  f.s.OnFinished(r.handle, 1.0);
  // A prompt diverging after block 5: the walk stops at block 6; 0 holds 4, 1 holds 6.
  r = f.s.Pick(Req(Blocks('a', 6) + Blocks('z', 4)), f.eps, 2.0);
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({0, 1, 2}));
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.4);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 0.6);
  f.s.OnFinished(r.handle, 2.0);
}

TEST(LlmdSticky, TheLastPartialBlockCounts) {
  Fixture f;
  // 4 full blocks + 100 characters: T = 5 blocks, N = ceil(1124 / 4) = 281 tokens.
  const std::string p = Blocks('a', 4) + std::string(100, 'q');
  f.Send(p, 0, 0.0);
  PickResult r = f.s.Pick(Req(p), f.eps, 1.0);
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({0}));
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0);
  f.s.OnFinished(r.handle, 1.0);
  // Same 4 blocks, another tail: 4 of 5 held, a = 0.8, still sticky.
  r = f.s.Pick(Req(Blocks('a', 4) + std::string(100, 'r')), f.eps, 2.0);
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({0}));
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.8);
  f.s.OnFinished(r.handle, 2.0);
}

TEST(LlmdSticky, TokenLoadScoreIsInflightPlusUncachedOverFourMebiTokens) {
  Fixture f;
  // 40,000 characters = 10,000 tokens, nothing cached anywhere, held before first token.
  f.Send(std::string(40000, 'k'), 0, 0.0, /*hold=*/true);
  EXPECT_EQ(f.s.InflightTokens(0), 10000);
  // Another uncached 2,000-token prompt: u = 2,000 on every endpoint.
  PickResult r = f.s.Pick(Req(std::string(8000, 'm')), f.eps, 1.0);
  ASSERT_EQ(r.candidates.size(), 3u);
  EXPECT_DOUBLE_EQ(r.Score(1, 0), 1.0 - 12000.0 / 4194304.0);
  EXPECT_DOUBLE_EQ(r.Score(1, 1), 1.0 - 2000.0 / 4194304.0);
  EXPECT_DOUBLE_EQ(r.totals[1], r.Score(1, 1));
  EXPECT_NE(r.ranked[0], 0u);  // 1 and 2 tie; either, at random
  f.s.OnFinished(r.handle, 1.0);
  // Saturates at 0: a load above 4,194,304 tokens scores 0, not below.
  f.Send(std::string(4 * 4194304, 'b'), 1, 2.0, /*hold=*/true);
  r = f.s.Pick(Req(std::string(8000, 'm')), f.eps, 3.0);
  EXPECT_DOUBLE_EQ(r.Score(1, 1), 0.0);
  EXPECT_EQ(r.ranked[0], 2u);
  f.s.OnFinished(r.handle, 3.0);
}

TEST(LlmdSticky, InflightTokensAreTheUncachedPartReleasedAtFirstToken) {
  Fixture f;
  f.Send(Blocks('a', 10), 0, 0.0);  // endpoint 0 caches 10 blocks (640 tokens)
  // 10 cached blocks + 5 new ones: u = 15 * 64 - 10 * 64 = 320 on endpoint 0.
  PickResult r = f.s.Pick(Req(Blocks('a', 10) + Blocks('k', 5)), f.eps, 1.0);
  f.s.OnDispatched(r.handle, 0, 1.0);
  EXPECT_EQ(f.s.InflightTokens(0), 320);
  // A retry on endpoint 2 moves it there with that endpoint's u (all 960 tokens).
  f.s.OnDispatched(r.handle, 2, 1.1);
  EXPECT_EQ(f.s.InflightTokens(0), 0);
  EXPECT_EQ(f.s.InflightTokens(2), 960);
  f.s.OnFirstToken(r.handle, 1.5);
  EXPECT_EQ(f.s.InflightTokens(2), 0);
  f.s.OnFinished(r.handle, 3.0);
  EXPECT_EQ(f.s.InflightTokens(2), 0);
  // Without a first token (no streaming, or a failure), the end releases it.
  const RequestHandle h = f.Send(Blocks('c', 3), 1, 4.0, /*hold=*/true);
  EXPECT_EQ(f.s.InflightTokens(1), 192);
  f.s.OnFinished(h, 5.0);
  EXPECT_EQ(f.s.InflightTokens(1), 0);
}

TEST(LlmdSticky, AffinityIsReleasedBeyond286704TokensOfExtraLoad) {
  Fixture f;
  f.Send(Blocks('a', 10), 0, 0.0);
  // Endpoint 0 gets exactly 286,704 uncached tokens in flight (1,146,816 characters).
  f.Send(std::string(286704 * 4, 'u'), 0, 1.0, /*hold=*/true);
  EXPECT_EQ(f.s.InflightTokens(0), 286704);
  PickResult r = f.s.Pick(Req(Blocks('a', 10)), f.eps, 2.0);
  // min I over S (286,704) - min I over the rest (0) is not above the release: sticky.
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({0}));
  f.s.OnFinished(r.handle, 2.0);
  // One more token in flight there: saturated, every endpoint is a candidate again and
  // the least loaded wins.
  f.Send("abcd", 0, 3.0, /*hold=*/true);
  EXPECT_EQ(f.s.InflightTokens(0), 286705);
  r = f.s.Pick(Req(Blocks('a', 10)), f.eps, 4.0);
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({0, 1, 2}));
  EXPECT_NE(r.ranked[0], 0u);
  f.s.OnFinished(r.handle, 4.0);
  // The release compares against the least loaded endpoint outside S: load it too, and
  // the difference is back under the release.
  f.Send(std::string(2 * 4, 'v'), 1, 5.0, /*hold=*/true);
  f.Send(std::string(2 * 4, 'w'), 2, 5.0, /*hold=*/true);
  r = f.s.Pick(Req(Blocks('a', 10)), f.eps, 6.0);
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({0}));
  f.s.OnFinished(r.handle, 6.0);
}

TEST(LlmdSticky, LruHoldsNumGpuBlocksEntriesFilledInChainOrder) {
  // 12 entries per endpoint: a 10-block chain then a 5-block one evicts the first chain's
  // first three blocks (its head: recorded first, least recent), so the walk over the
  // first chain stops at block 0.
  Fixture f(false, 2, /*gpu_blocks=*/12);
  f.Send(Blocks('a', 10), 0, 0.0);
  EXPECT_EQ(f.s.PrefixEntries(0), 10);
  f.Send(Blocks('k', 5), 0, 1.0);
  EXPECT_EQ(f.s.PrefixEntries(0), 12);
  PickResult r = f.s.Pick(Req(Blocks('a', 10)), f.eps, 2.0);
  EXPECT_EQ(f.Candidates(r), std::vector<uint32_t>({0, 1}));
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0.0);
  f.s.OnFinished(r.handle, 2.0);
  // The second chain is whole.
  r = f.s.Pick(Req(Blocks('k', 5)), f.eps, 3.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 1.0);
  f.s.OnFinished(r.handle, 3.0);
}

TEST(LlmdSticky, LruDefaultsTo31250EntriesWhenTheEngineDoesNotSay) {
  Fixture f(false, 1, /*gpu_blocks=*/0);
  // 16 prompts of 2,048 blocks (the producer's cap) = 32,768 entries offered.
  for (int i = 0; i < 16; ++i) {
    f.Send(std::string(1, static_cast<char>('A' + i)) + std::string(2048 * kBlock, 'p'), 0, i);
  }
  EXPECT_EQ(f.s.PrefixEntries(0), 31250);
}

TEST(LlmdSticky, AReloadKeepsTheLruAndTheLoadInFlight) {
  Fixture old_f;
  old_f.Send(Blocks('a', 10), 1, 0.0);
  const RequestHandle h = old_f.Send(Blocks('b', 4), 2, 0.5, /*hold=*/true);
  LlmdStickyScheduler next(Fixture::Config(/*precise=*/true), SchedulerOptions{});
  ASSERT_TRUE(next.AdoptStateFrom(old_f.s));
  EXPECT_EQ(next.InflightTokens(2), 256);
  PickResult r = next.Pick(Req(Blocks('a', 10)), old_f.eps, 1.0);
  EXPECT_EQ(std::vector<uint32_t>(r.candidates.begin(), r.candidates.end()),
            std::vector<uint32_t>({1}));
  next.OnFinished(r.handle, 1.0);
  next.OnFirstToken(h, 1.5);  // the old scheduler's handle, on the new one
  EXPECT_EQ(next.InflightTokens(2), 0);
  next.OnFinished(h, 2.0);
}

// ---- llm-d-precise ----

std::vector<uint32_t> Tokens(size_t n, uint32_t first) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

kvevents::KvEventBatch Stored(const std::vector<uint32_t>& tokens, size_t blocks,
                              uint64_t first_hash) {
  kvevents::KvEvent e;
  e.kind = kvevents::EventKind::kBlockStored;
  e.block_size = 16;
  for (size_t i = 0; i < blocks; ++i) e.block_hashes.push_back(first_hash + i);
  e.token_ids.assign(tokens.begin(), tokens.begin() + static_cast<long>(blocks * 16));
  kvevents::KvEventBatch b;
  b.events.push_back(e);
  return b;
}

TEST(LlmdPrecise, AffinityAndUncachedTokensComeFromTheEventIndex) {
  Fixture f(/*precise=*/true);
  kvevents::EventIndex index;  // 16-token keys, speculative entries 2 s
  for (uint32_t id = 0; id < 3; ++id) index.Expect(id, 0.0);
  // 640 tokens = 10 blocks of 64 = 40 keys. Endpoint 1 reports the first 512 (32 keys).
  const std::vector<uint32_t> tokens = Tokens(640, 1000);
  index.ApplyBatch(1, Stored(tokens, 32, 7000), 0.0);
  index.ApplyBatch(0, kvevents::KvEventBatch{}, 0.0);  // live, holding nothing
  std::vector<uint64_t> keys;
  index.RequestKeys("", tokens, &keys);
  ASSERT_EQ(keys.size(), 40u);
  const std::string prompt(640 * 4, 'x');  // outlives r, which views it
  SchedRequest r = Req(prompt);
  r.token_ids = tokens;
  r.events = &index;
  r.event_keys = keys;
  PickResult p = f.s.Pick(r, f.eps, 1.0);
  // a_1 = 32 keys * 16 / 64 / 10 = 0.8: only endpoint 1 stays.
  EXPECT_EQ(f.Candidates(p), std::vector<uint32_t>({1}));
  EXPECT_DOUBLE_EQ(p.Score(0, 0), 0.8);
  // u_1 = 640 - 512 = 128 tokens.
  EXPECT_DOUBLE_EQ(p.Score(1, 0), 1.0 - 128.0 / 4194304.0);
  f.s.OnDispatched(p.handle, 1, 1.0);
  EXPECT_EQ(f.s.InflightTokens(1), 128);
  f.s.OnFinished(p.handle, 1.0);
}

TEST(LlmdPrecise, EndpointsWithoutLiveEventsUseTheApproximateProducer) {
  Fixture f(/*precise=*/true);
  kvevents::EventIndex index;
  for (uint32_t id = 0; id < 3; ++id) index.Expect(id, 0.0);  // all unknown: no batch yet
  const std::vector<uint32_t> tokens = Tokens(640, 1000);
  std::vector<uint64_t> keys;
  index.RequestKeys("", tokens, &keys);
  const std::string prompt = Blocks('a', 10);  // 2,560 characters: 10 blocks, 640 tokens
  SchedRequest r = Req(prompt);
  r.token_ids = tokens;
  r.events = &index;
  r.event_keys = keys;
  // The router sent this prompt to endpoint 2 before: its LRU says so; no events say
  // otherwise (none are live), so endpoint 2 is sticky.
  PickResult p = f.s.Pick(r, f.eps, 0.0);
  f.s.OnDispatched(p.handle, 2, 0.0);
  f.s.OnFirstToken(p.handle, 0.0);
  f.s.OnFinished(p.handle, 0.0);
  p = f.s.Pick(r, f.eps, 1.0);
  EXPECT_EQ(f.Candidates(p), std::vector<uint32_t>({2}));
  f.s.OnFinished(p.handle, 1.0);
  // Once endpoint 2's events are live and report nothing cached, the LRU no longer counts.
  index.ApplyBatch(2, kvevents::KvEventBatch{}, 2.0);
  p = f.s.Pick(r, f.eps, 2.0);
  EXPECT_EQ(f.Candidates(p), std::vector<uint32_t>({0, 1, 2}));
  EXPECT_DOUBLE_EQ(p.Score(0, 2), 0.0);
  f.s.OnFinished(p.handle, 2.0);
}

TEST(LlmdPrecise, WithoutEventsItIsSticky) {
  Fixture a(/*precise=*/true), b(/*precise=*/false);
  for (Fixture* f : {&a, &b}) f->Send(Blocks('a', 10), 1, 0.0);
  PickResult pa = a.s.Pick(Req(Blocks('a', 9) + Blocks('x', 1)), a.eps, 1.0);
  PickResult pb = b.s.Pick(Req(Blocks('a', 9) + Blocks('x', 1)), b.eps, 1.0);
  EXPECT_EQ(a.Candidates(pa), b.Candidates(pb));
  EXPECT_DOUBLE_EQ(pa.Score(0, 0), pb.Score(0, 0));
  EXPECT_DOUBLE_EQ(pa.Score(1, 0), pb.Score(1, 0));
}

}  // namespace
}  // namespace kvroute::sched
