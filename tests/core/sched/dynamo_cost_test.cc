// dynamo-cost: Dynamo's active-sequence accounting (blocks keyed by hash, counted once per
// worker; output blocks and their decay) and the cost it feeds. The accounting cases are
// the ones Dynamo's own tests of its ActiveSequences describe, restated with kvroute's
// chained text-block hashes (64 characters = one 16-token block).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

#include "core/kvevents/event_index.h"
#include "core/sched/dynamo_cost.h"
#include "sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;
using testing::MustBuildPolicy;
using testing::Req;

constexpr size_t kBlockChars = 64;

std::string Blocks(char c, size_t n) { return std::string(n * kBlockChars, c); }

struct Fixture {
  explicit Fixture(DynamoCostScheduler::Config config = {}, size_t endpoints = 2)
      : s(config, SchedulerOptions{}), eps(MakeEndpoints(endpoints)) {}

  // Picks, then dispatches to `endpoint` (whatever the pick said).
  RequestHandle Send(const std::string& prompt, uint32_t endpoint, double t,
                     int64_t max_tokens = 96) {
    SchedRequest r = Req(prompt);
    r.max_tokens = max_tokens;
    PickResult p = s.Pick(r, eps, t);
    EXPECT_TRUE(p.ok());
    s.OnDispatched(p.handle, endpoint, t);
    return p.handle;
  }

  DynamoCostScheduler s;
  std::vector<EndpointState> eps;
};

TEST(DynamoCost, CostIsPotentialPrefillPlusPotentialActiveBlocks) {
  Fixture f;
  const std::string prompt = Blocks('p', 10);  // 160 tokens, 10 blocks
  SchedRequest a = Req(prompt);
  a.max_tokens = 96;
  PickResult r = f.s.Pick(a, f.eps, 0.0);
  // Nothing cached, nothing active: prefill 160 / 16 = 10, decode 0 + 10 new blocks.
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 20.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 20.0);
  const RequestHandle first = r.handle;
  f.s.OnDispatched(first, 0, 0.0);
  EXPECT_EQ(f.s.ActiveBlocks(0), 10);
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 160);

  // Same prompt while the first is still prefilling: worker 0 has it cached (index) but
  // owes the first request's 160 prefill tokens; its blocks are already active.
  r = f.s.Pick(a, f.eps, 1.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), (0 + 160) / 16.0 + (10 + 0));
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 10 + 10);
  EXPECT_DOUBLE_EQ(r.Score(1, 0), 1.0);  // overlap
  EXPECT_DOUBLE_EQ(r.Score(1, 1), 0.0);
  f.s.OnFinished(r.handle, 1.0);  // never dispatched

  // Prefill done: worker 0 costs only its active blocks, which the new request shares.
  f.s.OnFirstToken(first, 1.5);
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 0);
  r = f.s.Pick(a, f.eps, 2.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 0 + 10 + 0);
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 10 + 10);
  EXPECT_EQ(r.ranked[0], 0u);
  f.s.OnFinished(r.handle, 2.0);

  // Half the prompt shared: 5 blocks cached, so 80 tokens to prefill; 5 blocks new.
  const std::string half = Blocks('p', 5) + Blocks('x', 5);
  r = f.s.Pick(Req(half), f.eps, 3.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 80 / 16.0 + (10 + 5));
  EXPECT_DOUBLE_EQ(r.Score(0, 1), 10 + 10);
  f.s.OnFinished(r.handle, 3.0);

  // After the 120 s TTL the index forgets the prefix; the in-flight request's blocks are
  // still active (the active set is not the index).
  r = f.s.Pick(a, f.eps, 200.0);
  EXPECT_DOUBLE_EQ(r.Score(1, 0), 0.0);
  EXPECT_DOUBLE_EQ(r.Score(0, 0), 10 + (10 + 0));
  f.s.OnFinished(r.handle, 200.0);
  f.s.OnFinished(first, 200.0);
  EXPECT_EQ(f.s.ActiveBlocks(0), 0);
}

// Dynamo's test_active_sequences_shared_blocks: a request whose blocks another in-flight
// request already holds adds only its own.
TEST(DynamoCost, SharedBlocksAreCountedOnce) {
  Fixture f;
  const std::string p = Blocks('a', 3);             // 3 blocks
  const std::string q = Blocks('q', 1);             // 1 block
  const std::string r = p + Blocks('r', 1);         // p's 3 blocks + 1 of its own
  const RequestHandle hp = f.Send(p, 0, 0.0);
  EXPECT_EQ(f.s.ActiveBlocks(0), 3);
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 48);
  const RequestHandle hq = f.Send(q, 0, 0.1);
  EXPECT_EQ(f.s.ActiveBlocks(0), 4);
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 64);
  const RequestHandle hr = f.Send(r, 0, 0.2);
  EXPECT_EQ(f.s.ActiveBlocks(0), 5);                // not 4 + 4
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 64 + 16);   // 3 of its 4 blocks were cached
  EXPECT_EQ(f.s.ActiveBlocks(1), 0);                // per worker

  f.s.OnFinished(hq, 1.0);
  EXPECT_EQ(f.s.ActiveBlocks(0), 4);
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 64);
  f.s.OnFinished(hr, 2.0);
  EXPECT_EQ(f.s.ActiveBlocks(0), 3);
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 48);
  f.s.OnFinished(hp, 3.0);
  EXPECT_EQ(f.s.ActiveBlocks(0), 0);
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 0);
}

TEST(DynamoCost, FreeingOneOfTwoSharersKeepsTheSharedBlocks) {
  Fixture f;
  const std::string prompt = Blocks('s', 10);
  const RequestHandle h1 = f.Send(prompt, 0, 0.0);
  const RequestHandle h2 = f.Send(prompt, 0, 0.1);
  const RequestHandle h3 = f.Send(prompt, 1, 0.2);
  EXPECT_EQ(f.s.ActiveBlocks(0), 10);  // two requests, ten unique blocks
  EXPECT_EQ(f.s.UniquePromptBlocks(0), 10u);
  EXPECT_EQ(f.s.ActiveBlocks(1), 10);
  f.s.OnFinished(h1, 1.0);
  EXPECT_EQ(f.s.ActiveBlocks(0), 10);  // h2 still holds them
  f.s.OnFinished(h2, 2.0);
  EXPECT_EQ(f.s.ActiveBlocks(0), 0);
  EXPECT_EQ(f.s.ActiveBlocks(1), 10);
  f.s.OnFinished(h3, 3.0);
  EXPECT_EQ(f.s.ActiveBlocks(1), 0);
}

// Dynamo's add_output_block with decay 1 - generated / expected: each new block re-weights
// the blocks only this request holds, so a request near its end counts for little.
TEST(DynamoCost, OutputBlocksDecayTowardTheEnd) {
  DynamoCostScheduler::Config config;
  config.track_output_blocks = true;
  Fixture f(config);
  const std::string prompt = Blocks('d', 10);  // 160 tokens: exactly 10 blocks
  const RequestHandle h = f.Send(prompt, 0, 0.0, /*max_tokens=*/64);
  f.s.OnFirstToken(h, 0.1);
  EXPECT_EQ(f.s.ActiveBlocks(0), 10);
  // Token 161 opens block 11: 11 blocks at 63/64.
  f.s.OnTokens(h, 1, 0.1);
  EXPECT_EQ(f.s.ActiveBlocks(0), 11);  // round(10.83)
  f.s.OnTokens(h, 16, 0.2);            // still inside block 11: nothing changes
  EXPECT_EQ(f.s.ActiveBlocks(0), 11);
  f.s.OnTokens(h, 17, 0.3);            // block 12, weight 47/64 each
  EXPECT_EQ(f.s.ActiveBlocks(0), 9);   // round(12 * 0.734)
  f.s.OnTokens(h, 33, 0.4);
  EXPECT_EQ(f.s.ActiveBlocks(0), 6);   // round(13 * 31/64)
  f.s.OnTokens(h, 49, 0.5);
  EXPECT_EQ(f.s.ActiveBlocks(0), 3);   // round(14 * 15/64)
  f.s.OnFinished(h, 0.6);
  EXPECT_EQ(f.s.ActiveBlocks(0), 0);
}

TEST(DynamoCost, DecaySparesBlocksAnotherRequestHolds) {
  DynamoCostScheduler::Config config;
  config.track_output_blocks = true;
  Fixture f(config);
  const std::string prompt = Blocks('d', 10);
  const RequestHandle h1 = f.Send(prompt, 0, 0.0, 64);
  const RequestHandle h2 = f.Send(prompt, 0, 0.0, 64);
  f.s.OnFirstToken(h1, 0.1);
  f.s.OnTokens(h1, 1, 0.1);
  f.s.OnTokens(h1, 17, 0.2);
  // The 10 shared prompt blocks keep weight 1; h1's 2 output blocks weigh 47/64 each.
  EXPECT_EQ(f.s.ActiveBlocks(0), 11);  // round(10 + 1.47)
  f.s.OnFinished(h2, 0.3);
  // Now h1 alone holds the prompt; its next block re-weights all 13 of its blocks.
  f.s.OnTokens(h1, 33, 0.4);
  EXPECT_EQ(f.s.ActiveBlocks(0), 6);  // round(13 * 31/64)
  f.s.OnFinished(h1, 0.5);
  EXPECT_EQ(f.s.ActiveBlocks(0), 0);
}

TEST(DynamoCost, OutputBlocksAreOffByDefaultAsInDynamo) {
  Fixture f;
  const RequestHandle h = f.Send(Blocks('d', 10), 0, 0.0, 64);
  f.s.OnFirstToken(h, 0.1);
  for (int64_t g = 1; g <= 64; ++g) f.s.OnTokens(h, g, 0.1 + g * 0.01);
  EXPECT_EQ(f.s.ActiveBlocks(0), 10);
  f.s.OnFinished(h, 1.0);
}

// The point of deduplication: requests with one system prompt on one worker add only
// their own blocks, so the worker holding the prefix keeps it.
TEST(DynamoCost, SamePrefixTrafficStaysWithItsWorker) {
  Fixture f({}, 4);
  const std::string system = Blocks('S', 64);  // a 1,024-token system prompt
  std::map<uint32_t, int> per_endpoint;
  for (int i = 0; i < 16; ++i) {
    const std::string prompt = system + Blocks(static_cast<char>('a' + i), 1);
    SchedRequest r = Req(prompt);
    r.max_tokens = 256;
    PickResult p = f.s.Pick(r, f.eps, i * 0.01);
    ASSERT_TRUE(p.ok());
    const uint32_t to = p.ranked[0];
    ++per_endpoint[to];
    f.s.OnDispatched(p.handle, to, i * 0.01);
    f.s.OnFirstToken(p.handle, i * 0.01 + 0.005);  // prefill done before the next
  }
  ASSERT_EQ(per_endpoint.size(), 1u);
  EXPECT_EQ(per_endpoint.begin()->second, 16);
  EXPECT_EQ(f.s.ActiveBlocks(per_endpoint.begin()->first), 64 + 16);
}

TEST(DynamoCost, DispatchingAgainMovesTheRequest) {
  Fixture f;
  const std::string prompt = Blocks('m', 10);
  SchedRequest r = Req(prompt);
  PickResult p = f.s.Pick(r, f.eps, 0.0);
  f.s.OnDispatched(p.handle, 0, 0.0);
  f.s.OnDispatched(p.handle, 1, 0.1);  // a retry on the fallback
  EXPECT_EQ(f.s.ActiveBlocks(0), 0);
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 0);
  EXPECT_EQ(f.s.ActiveBlocks(1), 10);
  f.s.OnFinished(p.handle, 1.0);
  EXPECT_EQ(f.s.ActiveBlocks(1), 0);
}

TEST(DynamoCost, RemovedEndpointForgetsItsRequests) {
  Fixture f;
  const RequestHandle h = f.Send(Blocks('e', 10), 0, 0.0);
  f.s.OnEndpointRemoved(0);
  EXPECT_EQ(f.s.ActiveBlocks(0), 0);
  f.s.OnFinished(h, 1.0);  // harmless
  EXPECT_EQ(f.s.ActiveBlocks(0), 0);
  EXPECT_EQ(f.s.ActivePrefillTokens(0), 0);
}

TEST(DynamoCost, VariantPolicyIsBuiltByNameButNotListed) {
  auto s = MustBuildPolicy("dynamo-cost-output-blocks");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->policy(), "dynamo-cost-output-blocks");
  for (std::string_view name : PolicyNames()) EXPECT_NE(name, "dynamo-cost-output-blocks");
  EXPECT_EQ(MustBuildPolicy("dynamo-cost")->policy(), "dynamo-cost");
}

// ---- dynamo-kv: the same cost on what the engines report ----

kvevents::KvEventBatch StoredOn(const std::vector<uint32_t>& tokens, uint64_t first_hash,
                                kvevents::Medium medium) {
  kvevents::KvEvent e;
  e.kind = kvevents::EventKind::kBlockStored;
  e.block_size = 16;
  e.medium = medium;
  for (size_t i = 0; i < tokens.size() / 16; ++i) e.block_hashes.push_back(first_hash + i);
  if (medium == kvevents::Medium::kGpu) e.token_ids = tokens;  // offloaded copies carry none
  kvevents::KvEventBatch b;
  b.events.push_back(e);
  return b;
}

TEST(DynamoKv, OverlapIsTheReportedCacheWeighedByTierWithoutSpeculativeEntries) {
  DynamoCostScheduler::Config c;
  c.events = true;
  Fixture f(c, 3);
  EXPECT_EQ(f.s.policy(), "dynamo-kv");
  EXPECT_EQ(MustBuildPolicy("dynamo-kv")->policy(), "dynamo-kv");
  EXPECT_TRUE(PolicyNeedsEvents("dynamo-kv"));
  EXPECT_FALSE(PolicyNeedsEvents("dynamo-cost"));

  std::vector<uint32_t> tokens(160);  // 10 blocks of 16
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(500 + i);
  kvevents::EventIndex index;
  for (uint32_t id = 0; id < 3; ++id) index.Expect(id, 0.0);
  // 0: on the GPU. 1: offloaded to the host, then dropped from the GPU. 2: live, nothing
  // reported, but a speculative entry from a dispatch a moment ago.
  index.ApplyBatch(0, StoredOn(tokens, 100, kvevents::Medium::kGpu), 0.0);
  index.ApplyBatch(1, StoredOn(tokens, 200, kvevents::Medium::kGpu), 0.0);
  index.ApplyBatch(1, StoredOn(tokens, 200, kvevents::Medium::kCpu), 0.0);
  kvevents::KvEvent rm;
  rm.kind = kvevents::EventKind::kBlockRemoved;
  for (uint64_t h = 200; h < 210; ++h) rm.block_hashes.push_back(h);
  kvevents::KvEventBatch rmb;
  rmb.events.push_back(rm);
  index.ApplyBatch(1, rmb, 0.0);
  index.ApplyBatch(2, kvevents::KvEventBatch{}, 0.0);
  std::vector<uint64_t> keys;
  index.RequestKeys("", tokens, &keys);
  index.AddSpeculative(2, keys, 0.5);

  const std::string prompt = Blocks('d', 10);  // 160 tokens of text: 10 blocks
  SchedRequest r = Req(prompt);
  r.max_tokens = 96;
  r.token_ids = tokens;
  r.events = &index;
  r.event_keys = keys;
  PickResult p = f.s.Pick(r, f.eps, 1.0);
  ASSERT_TRUE(p.ok());
  // Overlap: 10 GPU blocks; 10 host blocks at 0.75; none (speculative entries weigh 0).
  EXPECT_DOUBLE_EQ(p.Score(1, 0), 1.0);
  EXPECT_DOUBLE_EQ(p.Score(1, 1), 0.75);
  EXPECT_DOUBLE_EQ(p.Score(1, 2), 0.0);
  // Cost: (160 - overlap * 16) / 16 prefill blocks + 10 new active blocks.
  EXPECT_DOUBLE_EQ(p.Score(0, 0), 0 + 10);
  EXPECT_DOUBLE_EQ(p.Score(0, 1), 40 / 16.0 + 10);
  EXPECT_DOUBLE_EQ(p.Score(0, 2), 160 / 16.0 + 10);
  EXPECT_EQ(p.ranked[0], 0u);
  // Dispatched to the host-tier holder: its prefill is the 40 tokens not weighed as held.
  f.s.OnDispatched(p.handle, 1, 1.0);
  EXPECT_EQ(f.s.ActivePrefillTokens(1), 40);
  f.s.OnFinished(p.handle, 2.0);
}

TEST(DynamoKv, EndpointsWithoutLiveEventsUseThePredictedIndex) {
  DynamoCostScheduler::Config c;
  c.events = true;
  Fixture f(c, 2);
  std::vector<uint32_t> tokens(160);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(900 + i);
  kvevents::EventIndex index;
  index.Expect(0, 0.0);
  index.Expect(1, 0.0);  // neither has sent a batch: unknown
  std::vector<uint64_t> keys;
  index.RequestKeys("", tokens, &keys);
  const std::string prompt = Blocks('e', 10);  // outlives r, which views it
  SchedRequest r = Req(prompt);
  r.token_ids = tokens;
  r.events = &index;
  r.event_keys = keys;
  PickResult p = f.s.Pick(r, f.eps, 0.0);
  f.s.OnDispatched(p.handle, 1, 0.0);
  f.s.OnFinished(p.handle, 0.0);
  // The predicted index remembers endpoint 1; no live events contradict it.
  p = f.s.Pick(r, f.eps, 1.0);
  EXPECT_DOUBLE_EQ(p.Score(1, 1), 1.0);
  EXPECT_DOUBLE_EQ(p.Score(1, 0), 0.0);
  f.s.OnFinished(p.handle, 1.0);
  // Live and reporting nothing: the prediction no longer counts.
  index.ApplyBatch(1, kvevents::KvEventBatch{}, 2.0);
  p = f.s.Pick(r, f.eps, 2.0);
  EXPECT_DOUBLE_EQ(p.Score(1, 1), 0.0);
  f.s.OnFinished(p.handle, 2.0);
}

// ActiveBlockSet against a std::map, with hashes that all land in one bucket run so that
// probing and backward-shift deletion are exercised.
TEST(ActiveBlockSet, MatchesAReferenceMap) {
  std::mt19937_64 rng(7);
  ActiveBlockSet set;
  std::map<uint64_t, std::pair<uint32_t, double>> ref;
  for (int step = 0; step < 200000; ++step) {
    const uint64_t h = (rng() % 200) << 12;
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      auto& e = ref[h];
      if (e.first == 0) e.second = 1.0;
      ++e.first;
      ASSERT_EQ(set.Acquire(h), e.first);
    } else if (op == 1) {
      auto it = ref.find(h);
      double want = 0.0;
      if (it != ref.end() && --it->second.first == 0) {
        want = it->second.second;
        ref.erase(it);
      }
      ASSERT_DOUBLE_EQ(set.Release(h), want);
    } else {
      const double w = static_cast<double>(rng() % 100) / 100.0;
      auto it = ref.find(h);
      const double want = it == ref.end() ? 0.0 : w - it->second.second;
      if (it != ref.end()) it->second.second = w;
      ASSERT_DOUBLE_EQ(set.SetWeight(h, w), want);
    }
    ASSERT_EQ(set.size(), ref.size());
    if (step % 1000 == 0) {
      for (uint64_t k = 0; k < 200; ++k) {
        auto it = ref.find(k << 12);
        ASSERT_EQ(set.Refs(k << 12), it == ref.end() ? 0u : it->second.first);
      }
    }
  }
}

}  // namespace
}  // namespace kvroute::sched
