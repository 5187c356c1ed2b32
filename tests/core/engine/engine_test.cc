#include "core/engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

namespace kvroute::engine {
namespace {

// A small engine: blocks of 4 tokens, `usable` blocks (plus the reserved block 0).
EngineConfig Small(int usable, int budget = 1024, int max_seqs = 16) {
  EngineConfig c;
  c.block_size = 4;
  c.num_gpu_blocks = usable + 1;
  c.max_num_seqs = max_seqs;
  c.max_num_batched_tokens = budget;
  c.max_model_len = 4096;
  return c;
}

// `n` token ids base, base+1, ...: distinct prompts for distinct bases.
std::vector<uint32_t> Toks(int n, uint32_t base) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), base);
  return t;
}

EngineRequest Req(uint64_t id, std::vector<uint32_t> prompt, int max_tokens,
                  double arrival = 0.0) {
  EngineRequest r;
  r.id = id;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = max_tokens;
  r.arrival_s = arrival;
  return r;
}

// Steps until idle (bounded); returns every output, in order.
std::vector<RequestOutput> Drain(Engine& e, double* now, int max_steps = 10000) {
  std::vector<RequestOutput> all;
  for (int i = 0; i < max_steps && e.HasWork(); ++i) {
    StepResult r = e.Step(*now);
    *now += r.duration_s;
    all.insert(all.end(), r.outputs.begin(), r.outputs.end());
  }
  EXPECT_FALSE(e.HasWork()) << "engine did not drain";
  return all;
}

const RequestOutput* Find(const StepResult& s, uint64_t id) {
  for (const auto& o : s.outputs) {
    if (o.id == id) return &o;
  }
  return nullptr;
}

TEST(StepModelTest, Formula) {
  StepModel m;  // 5753 + 17.25 p + 6 d + 0.05 ctx
  EXPECT_DOUBLE_EQ(m.StepSeconds(100, 3, 1000), (5753 + 1725 + 18 + 50) * 1e-6);
  EXPECT_DOUBLE_EQ(m.StepSeconds(0, 1, 2000), (5753 + 6 + 100) * 1e-6);
  EXPECT_EQ(m.StepSeconds(0, 0, 0), 0.0);
}

TEST(PresetTest, KnownPresets) {
  auto names = PresetNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "llama3-8b-h100"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "small-kv"), names.end());
  for (const auto& n : names) EXPECT_TRUE(PresetConfig(n).has_value()) << n;
  auto h100 = PresetConfig("llama3-8b-h100");
  EXPECT_EQ(h100->block_size, 16);
  EXPECT_EQ(h100->num_gpu_blocks, 26304);
  EXPECT_EQ(h100->max_num_seqs, 256);
  EXPECT_EQ(h100->max_num_batched_tokens, 8192);
  // A batch-1 decode at 4k context: ~6 ms.
  const double decode = h100->step.StepSeconds(0, 1, 4096);
  EXPECT_GT(decode, 0.0058);
  EXPECT_LT(decode, 0.0070);
  EXPECT_EQ(PresetConfig("small-kv")->num_gpu_blocks, 2048);
  EXPECT_FALSE(PresetConfig("nope").has_value());
}

TEST(EngineTest, RejectsInvalidRequests) {
  Engine e(Small(8));  // 32 tokens of KV, max_model_len 4096
  EXPECT_TRUE(e.AddRequest(Req(1, {}, 4)).has_value());
  EXPECT_TRUE(e.AddRequest(Req(1, Toks(4, 0), 0)).has_value());
  EXPECT_TRUE(e.AddRequest(Req(1, Toks(4000, 0), 97)).has_value());  // > max_model_len
  EXPECT_TRUE(e.AddRequest(Req(1, Toks(30, 0), 3)).has_value());      // 33 tokens > cache
  EXPECT_FALSE(e.AddRequest(Req(1, Toks(30, 0), 2)).has_value());     // exactly fits
  EXPECT_TRUE(e.AddRequest(Req(1, Toks(4, 0), 2)).has_value());       // duplicate id
  EXPECT_EQ(e.Stats().waiting, 1);
  EXPECT_EQ(e.Stats().prompt_tokens, 30);
}

TEST(EngineTest, GeneratesMaxTokensAndReportsTimes) {
  Engine e(Small(16));
  ASSERT_FALSE(e.AddRequest(Req(7, Toks(10, 0), 3, 0.5)).has_value());
  double now = 1.0;
  StepResult s1 = e.Step(now);
  ASSERT_EQ(s1.outputs.size(), 1u);
  EXPECT_EQ(s1.prefill_tokens, 10);
  EXPECT_EQ(s1.decode_seqs, 0);
  EXPECT_TRUE(s1.outputs[0].first_token);
  EXPECT_EQ(s1.outputs[0].new_tokens, 1);
  EXPECT_DOUBLE_EQ(s1.outputs[0].first_token_s, now + s1.duration_s);
  EXPECT_DOUBLE_EQ(s1.outputs[0].first_scheduled_s, 1.0);
  EXPECT_DOUBLE_EQ(s1.outputs[0].arrival_s, 0.5);
  now += s1.duration_s;
  StepResult s2 = e.Step(now);
  EXPECT_EQ(s2.decode_seqs, 1);
  EXPECT_EQ(s2.prefill_tokens, 0);
  EXPECT_FALSE(s2.outputs[0].first_token);
  EXPECT_FALSE(s2.outputs[0].finished);
  now += s2.duration_s;
  StepResult s3 = e.Step(now);
  ASSERT_TRUE(s3.outputs[0].finished);
  EXPECT_EQ(s3.outputs[0].reason, FinishReason::kLength);
  EXPECT_EQ(s3.outputs[0].completion_tokens, 3);
  EXPECT_EQ(s3.outputs[0].prompt_tokens, 10);
  EXPECT_DOUBLE_EQ(s3.outputs[0].finish_s, now + s3.duration_s);
  EXPECT_FALSE(e.HasWork());
  EngineStats st = e.Stats();
  EXPECT_EQ(st.generation_tokens, 3);
  EXPECT_EQ(st.finished_length, 1);
  EXPECT_EQ(e.Step(now).duration_s, 0.0);
}

TEST(EngineTest, StepDurationFollowsTheModel) {
  Engine e(Small(16));
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(10, 0), 5)).has_value());
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(6, 100), 5)).has_value());
  const StepModel& m = e.config().step;
  StepResult s1 = e.Step(0);
  EXPECT_EQ(s1.prefill_tokens, 16);
  EXPECT_EQ(s1.resident_context_tokens, 16);
  EXPECT_DOUBLE_EQ(s1.duration_s, m.StepSeconds(16, 0, 16));
  EXPECT_DOUBLE_EQ(s1.duration_s, (5753 + 17.25 * 16 + 0.05 * 16) * 1e-6);
  StepResult s2 = e.Step(s1.duration_s);
  EXPECT_EQ(s2.decode_seqs, 2);
  EXPECT_EQ(s2.resident_context_tokens, 11 + 7);
  EXPECT_DOUBLE_EQ(s2.duration_s, (5753 + 6.0 * 2 + 0.05 * 18) * 1e-6);
}

TEST(PrefixCacheTest, HitIsCappedBelowThePromptLength) {
  for (int n : {5, 8, 9, 10, 12, 13}) {
    Engine e(Small(64));
    double now = 0;
    ASSERT_FALSE(e.AddRequest(Req(1, Toks(n, 0), 1)).has_value());
    Drain(e, &now);
    EXPECT_EQ(e.Stats().prefix_queries_tokens, n);
    EXPECT_EQ(e.Stats().prefix_hits_tokens, 0);
    const int expected = (n - 1) / 4 * 4;
    EXPECT_EQ(e.PeekCachedTokens(Toks(n, 0)), expected) << n;
    ASSERT_FALSE(e.AddRequest(Req(2, Toks(n, 0), 1)).has_value());
    auto out = Drain(e, &now);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].cached_tokens, expected) << n;
    EXPECT_EQ(e.Stats().prefix_queries_tokens, 2 * n);
    EXPECT_EQ(e.Stats().prefix_hits_tokens, expected);
  }
}

TEST(PrefixCacheTest, HitsSkipPrefill) {
  Engine e(Small(64));
  double now = 0;
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(20, 0), 1)).has_value());
  Drain(e, &now);
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(22, 0), 1)).has_value());  // extends request 1
  StepResult s = e.Step(now);
  EXPECT_EQ(s.outputs[0].cached_tokens, 20);
  EXPECT_EQ(s.prefill_tokens, 2);
  EXPECT_EQ(s.resident_context_tokens, 22);
}

TEST(PrefixCacheTest, SharedWithinTheSameStep) {
  // Blocks are cached when allocated, so a second identical prompt admitted in the same
  // step already shares the first one's full blocks (as in vLLM).
  Engine e(Small(64));
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(12, 0), 1)).has_value());
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(12, 0), 1)).has_value());
  StepResult s = e.Step(0);
  ASSERT_EQ(s.outputs.size(), 2u);
  EXPECT_EQ(s.outputs[0].cached_tokens, 0);
  EXPECT_EQ(s.outputs[1].cached_tokens, 8);
  EXPECT_EQ(s.prefill_tokens, 12 + 4);
}

TEST(PrefixCacheTest, CacheSaltAndLoraSeparateCaches) {
  Engine e(Small(64));
  double now = 0;
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(12, 0), 1)).has_value());
  Drain(e, &now);
  EXPECT_EQ(e.PeekCachedTokens(Toks(12, 0)), 8);
  EXPECT_EQ(e.PeekCachedTokens(Toks(12, 0), "tenant-a"), 0);
  EXPECT_EQ(e.PeekCachedTokens(Toks(12, 0), "", "adapter"), 0);

  EngineRequest salted = Req(2, Toks(12, 0), 1);
  salted.cache_salt = "tenant-a";
  ASSERT_FALSE(e.AddRequest(salted).has_value());
  auto out = Drain(e, &now);
  EXPECT_EQ(out[0].cached_tokens, 0);

  EngineRequest salted_again = Req(3, Toks(12, 0), 1);
  salted_again.cache_salt = "tenant-a";
  ASSERT_FALSE(e.AddRequest(salted_again).has_value());
  out = Drain(e, &now);
  EXPECT_EQ(out[0].cached_tokens, 8);
  EXPECT_EQ(e.PeekCachedTokens(Toks(12, 0), "tenant-b"), 0);

  EngineRequest lora = Req(4, Toks(12, 0), 1);
  lora.lora_name = "adapter";
  ASSERT_FALSE(e.AddRequest(lora).has_value());
  out = Drain(e, &now);
  EXPECT_EQ(out[0].cached_tokens, 0);
  EXPECT_EQ(e.PeekCachedTokens(Toks(12, 0), "", "adapter"), 8);
  EXPECT_EQ(e.Stats().prefix_hits_tokens, 8);
  EXPECT_EQ(e.Stats().prefix_queries_tokens, 48);
}

TEST(PrefixCacheTest, DisabledCachesNothing) {
  EngineConfig c = Small(64);
  c.enable_prefix_caching = false;
  Engine e(c);
  double now = 0;
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(12, 0), 1)).has_value());
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(12, 0), 1)).has_value());
  auto out = Drain(e, &now);
  EXPECT_EQ(out[1].cached_tokens, 0);
  EXPECT_EQ(e.Stats().num_cached_blocks, 0);
  EXPECT_EQ(e.Stats().prefix_queries_tokens, 0);
}

TEST(PrefixCacheTest, EvictionTakesTheFreedChainTailFirst) {
  Engine e(Small(4));  // blocks 1..4
  double now = 0;
  // A: 12 prompt tokens = 3 full cached blocks; freed tail-first, the list becomes
  // [unused, a2, a1, a0].
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(12, 0), 1)).has_value());
  Drain(e, &now);
  EXPECT_EQ(e.Stats().num_cached_blocks, 3);
  EXPECT_EQ(e.Stats().num_free_blocks, 4);
  EXPECT_EQ(e.PeekCachedTokens(Toks(13, 0)), 12);
  // B needs 2 blocks: the unused one and A's last block.
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(8, 100), 1)).has_value());
  Drain(e, &now);
  EXPECT_EQ(e.PeekCachedTokens(Toks(13, 0)), 8);  // a0 and a1 survive
  EXPECT_EQ(e.PeekCachedTokens(Toks(9, 100)), 8);
  EXPECT_EQ(e.Stats().num_cached_blocks, 4);
  // The list is now [a1, a0, b1, b0]. A again: its hits (a0, a1) leave the list, its third
  // block evicts b1, and all of A goes back to the tail: [b0, a2, a1, a0].
  ASSERT_FALSE(e.AddRequest(Req(3, Toks(12, 0), 1)).has_value());
  auto out = Drain(e, &now);
  EXPECT_EQ(out[0].cached_tokens, 8);
  EXPECT_EQ(e.PeekCachedTokens(Toks(9, 100)), 4);
  EXPECT_EQ(e.PeekCachedTokens(Toks(13, 0)), 12);
  // One more block evicts b0, the least recently used, and leaves A whole.
  ASSERT_FALSE(e.AddRequest(Req(4, Toks(4, 200), 1)).has_value());
  Drain(e, &now);
  EXPECT_EQ(e.PeekCachedTokens(Toks(9, 100)), 0);
  EXPECT_EQ(e.PeekCachedTokens(Toks(13, 0)), 12);
}

TEST(SchedulerTest, ChunkedPrefillRespectsTheBudget) {
  Engine e(Small(64, /*budget=*/32));
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(100, 0), 2)).has_value());
  double now = 0;
  const int expected_prefill[] = {32, 32, 32, 4 + 10};
  for (int i = 0; i < 4; ++i) {
    if (i == 1) {
      ASSERT_FALSE(e.AddRequest(Req(2, Toks(10, 500), 1)).has_value());
    }
    StepResult s = e.Step(now);
    now += s.duration_s;
    EXPECT_EQ(s.prefill_tokens, expected_prefill[i]) << "step " << i;
    const RequestOutput* o = Find(s, 1);
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(o->new_tokens, i == 3 ? 1 : 0) << "step " << i;
    EXPECT_EQ(o->first_token, i == 3);
    if (i == 1 || i == 2) {
      EXPECT_EQ(s.num_scheduled, 1);  // no budget left for request 2
    }
    // Step 4 has 28 tokens of budget left after request 1's last chunk: request 2 goes in.
    if (i == 3) {
      EXPECT_NE(Find(s, 2), nullptr);
    }
  }
  EXPECT_EQ(e.Stats().running, 1);  // request 2 finished with its single token
  StepResult s5 = e.Step(now);
  EXPECT_EQ(s5.decode_seqs, 1);
  EXPECT_TRUE(s5.outputs[0].finished);
}

TEST(SchedulerTest, MaxNumSeqsLimitsTheBatch) {
  Engine e(Small(64, 1024, /*max_seqs=*/2));
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(4, 0), 2)).has_value());
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(4, 100), 3)).has_value());
  ASSERT_FALSE(e.AddRequest(Req(3, Toks(4, 200), 1)).has_value());
  StepResult s1 = e.Step(0);
  EXPECT_EQ(s1.num_scheduled, 2);
  EXPECT_EQ(e.Stats().running, 2);
  EXPECT_EQ(e.Stats().waiting, 1);
  StepResult s2 = e.Step(1);  // request 1 finishes at the end of this step
  EXPECT_EQ(s2.num_scheduled, 2);
  EXPECT_EQ(Find(s2, 3), nullptr);
  StepResult s3 = e.Step(2);
  EXPECT_NE(Find(s3, 3), nullptr);
  EXPECT_EQ(s3.num_scheduled, 2);
}

TEST(SchedulerTest, PreemptsTheMostRecentlyAdmittedAndRequeuesItAtTheHead) {
  // 4 blocks of 4 tokens; two sequences of 4 prompt tokens grow until they need a
  // third block each.
  Engine e(Small(4, 1024, /*max_seqs=*/2));
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(4, 0), 8)).has_value());     // A
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(4, 100), 10)).has_value());  // B
  ASSERT_FALSE(e.AddRequest(Req(3, Toks(4, 200), 1)).has_value());   // C, over max_seqs
  double now = 0;
  for (int step = 1; step <= 5; ++step) {
    StepResult s = e.Step(now);
    now += s.duration_s;
    EXPECT_EQ(s.num_scheduled, 2) << step;
    EXPECT_EQ(s.num_preempted, 0) << step;
  }
  EXPECT_EQ(e.Stats().num_free_blocks, 0);
  // Step 6: A needs a third block; B (admitted last) is preempted. C would fit in the
  // block B left, but nothing is admitted in a step that preempted.
  StepResult s6 = e.Step(now);
  now += s6.duration_s;
  EXPECT_EQ(s6.num_preempted, 1);
  ASSERT_EQ(s6.num_scheduled, 1);
  EXPECT_EQ(s6.outputs[0].id, 1u);
  EngineStats st = e.Stats();
  EXPECT_EQ(st.preemptions, 1);
  EXPECT_EQ(st.running, 1);
  EXPECT_EQ(st.waiting, 2);
  EXPECT_EQ(st.num_free_blocks, 1);
  // Step 7: B is at the head but does not fit; C behind it waits too (FCFS).
  StepResult s7 = e.Step(now);
  now += s7.duration_s;
  EXPECT_EQ(s7.num_scheduled, 1);
  // Step 8: A finishes (8 tokens).
  StepResult s8 = e.Step(now);
  now += s8.duration_s;
  ASSERT_TRUE(s8.outputs[0].finished);
  // Step 9: B resumes first, recomputing prompt + 5 generated tokens; its first block
  // is still cached (its second was taken by A).
  StepResult s9 = e.Step(now);
  now += s9.duration_s;
  ASSERT_EQ(s9.num_scheduled, 2);
  EXPECT_EQ(s9.outputs[0].id, 2u);
  EXPECT_EQ(s9.outputs[1].id, 3u);
  EXPECT_EQ(s9.outputs[0].cached_tokens, 4);
  EXPECT_EQ(s9.outputs[0].num_preemptions, 1);
  EXPECT_EQ(s9.outputs[0].new_tokens, 1);
  EXPECT_FALSE(s9.outputs[0].first_token);
  EXPECT_EQ(s9.outputs[0].completion_tokens, 6);
  EXPECT_EQ(s9.prefill_tokens, 5 + 4);
  st = e.Stats();
  EXPECT_EQ(st.prefix_hits_tokens, 4);
  EXPECT_EQ(st.prefix_queries_tokens, 4 + 4 + 9 + 4);
  auto rest = Drain(e, &now);
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back().id, 2u);
  EXPECT_EQ(rest.back().completion_tokens, 10);
  EXPECT_EQ(e.Stats().generation_tokens, 8 + 10 + 1);
  EXPECT_EQ(e.Stats().num_free_blocks, 4);
}

TEST(SchedulerTest, NoAdmissionInAStepThatPreempted) {
  // Priority scheduling so that, after the preemption, a request that fits (H) is at the
  // head of the waiting queue, ahead of the victim.
  EngineConfig c = Small(4, 1024, /*max_seqs=*/2);
  c.priority_scheduling = true;
  Engine e(c);
  EngineRequest a = Req(1, Toks(4, 0), 10);
  a.priority = 0;
  EngineRequest b = Req(2, Toks(4, 100), 10);
  b.priority = 5;
  ASSERT_FALSE(e.AddRequest(a).has_value());
  ASSERT_FALSE(e.AddRequest(b).has_value());
  double now = 0;
  now += e.Step(now).duration_s;
  EngineRequest h = Req(3, Toks(3, 200), 1, now);
  h.priority = 1;
  ASSERT_FALSE(e.AddRequest(h).has_value());  // waits: max_num_seqs
  for (int step = 2; step <= 5; ++step) {
    StepResult s = e.Step(now);
    now += s.duration_s;
    ASSERT_EQ(s.num_scheduled, 2) << step;
  }
  // Step 6: A needs a third block and B goes. H fits in the block left, but waits.
  StepResult s6 = e.Step(now);
  now += s6.duration_s;
  EXPECT_EQ(s6.num_preempted, 1);
  ASSERT_EQ(s6.num_scheduled, 1);
  EXPECT_EQ(s6.outputs[0].id, 1u);
  EXPECT_EQ(e.Stats().num_free_blocks, 1);
  // Step 7: H is admitted; B stays queued.
  StepResult s7 = e.Step(now);
  ASSERT_EQ(s7.num_scheduled, 2);
  EXPECT_EQ(s7.outputs[1].id, 3u);
  EXPECT_EQ(e.Stats().waiting, 1);
}

TEST(SchedulerTest, PriorityOrdersTheWaitingQueue) {
  EngineConfig c = Small(64, 1024, /*max_seqs=*/1);
  c.priority_scheduling = true;
  Engine e(c);
  auto add = [&](uint64_t id, int64_t prio, double arrival) {
    EngineRequest r = Req(id, Toks(4, static_cast<uint32_t>(id * 100)), 1, arrival);
    r.priority = prio;
    ASSERT_FALSE(e.AddRequest(r).has_value());
  };
  add(1, 5, 0.0);
  add(2, 1, 1.0);
  add(4, 1, 0.5);
  add(3, 1, 0.5);
  double now = 2;
  std::vector<uint64_t> order;
  for (const auto& o : Drain(e, &now)) order.push_back(o.id);
  EXPECT_EQ(order, (std::vector<uint64_t>{3, 4, 2, 1}));
}

TEST(SchedulerTest, FcfsIgnoresPriority) {
  Engine e(Small(64, 1024, /*max_seqs=*/1));
  for (uint64_t id : {5, 2, 9}) {
    EngineRequest r = Req(id, Toks(4, 0), 1);
    r.priority = static_cast<int64_t>(id);
    ASSERT_FALSE(e.AddRequest(r).has_value());
  }
  double now = 0;
  std::vector<uint64_t> order;
  for (const auto& o : Drain(e, &now)) order.push_back(o.id);
  EXPECT_EQ(order, (std::vector<uint64_t>{5, 2, 9}));
}

TEST(SchedulerTest, PriorityPreemptsTheLeastImportant) {
  EngineConfig c = Small(4);
  c.priority_scheduling = true;
  Engine e(c);
  EngineRequest low = Req(1, Toks(4, 0), 10, 0.0);
  low.priority = 10;
  ASSERT_FALSE(e.AddRequest(low).has_value());
  double now = 0;
  now += e.Step(now).duration_s;  // low admitted first
  EngineRequest high = Req(2, Toks(4, 100), 10, 1.0);
  high.priority = 0;
  ASSERT_FALSE(e.AddRequest(high).has_value());
  // low grows to 9 tokens (needing a 3rd block) at step 6 while high holds 2 blocks.
  for (int step = 2; step <= 5; ++step) {
    StepResult s = e.Step(now);
    now += s.duration_s;
    EXPECT_EQ(s.num_preempted, 0) << step;
  }
  StepResult s6 = e.Step(now);
  now += s6.duration_s;
  EXPECT_EQ(s6.num_preempted, 1);
  // FCFS would have preempted `high` (admitted last); priority takes `low`, which was
  // the request being scheduled, so the step ends there.
  EXPECT_EQ(s6.num_scheduled, 0);
  EngineStats st = e.Stats();
  EXPECT_EQ(st.running, 1);
  EXPECT_EQ(st.waiting, 1);
  StepResult s7 = e.Step(now);
  ASSERT_EQ(s7.num_scheduled, 1);
  EXPECT_EQ(s7.outputs[0].id, 2u);
}

TEST(EngineTest, KvCacheUsageCountsReferencedBlocksOnly) {
  Engine e(Small(10));
  EXPECT_DOUBLE_EQ(e.Stats().kv_cache_usage, 0.0);
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(10, 0), 5)).has_value());
  double now = 0;
  now += e.Step(now).duration_s;  // 10 tokens -> 3 blocks
  EXPECT_DOUBLE_EQ(e.Stats().kv_cache_usage, 0.3);
  now += e.Step(now).duration_s;  // 11
  now += e.Step(now).duration_s;  // 12
  EXPECT_DOUBLE_EQ(e.Stats().kv_cache_usage, 0.3);
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(7, 100), 4)).has_value());
  now += e.Step(now).duration_s;  // request 1: 13 -> 4 blocks; request 2: 2 blocks
  EXPECT_DOUBLE_EQ(e.Stats().kv_cache_usage, 0.6);
  EXPECT_EQ(e.Stats().num_free_blocks, 4);
  Drain(e, &now);
  EngineStats st = e.Stats();
  EXPECT_DOUBLE_EQ(st.kv_cache_usage, 0.0);
  EXPECT_EQ(st.num_free_blocks, 10);
  EXPECT_EQ(st.num_cached_blocks, 3 + 2);  // cached but free: counted as free
}

TEST(EngineTest, AbortFreesBlocks) {
  Engine e(Small(10, /*budget=*/8));
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(12, 0), 4)).has_value());
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(12, 100), 4)).has_value());
  e.Step(0);  // request 1: 8 tokens, request 2 waits (no budget)
  EXPECT_EQ(e.Stats().num_free_blocks, 8);
  EXPECT_TRUE(e.Abort(1));
  EXPECT_FALSE(e.Abort(1));
  EXPECT_TRUE(e.Abort(2));
  EXPECT_FALSE(e.Abort(99));
  EngineStats st = e.Stats();
  EXPECT_EQ(st.num_free_blocks, 10);
  EXPECT_DOUBLE_EQ(st.kv_cache_usage, 0.0);
  EXPECT_EQ(st.finished_abort, 2);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_FALSE(e.HasWork());
  EXPECT_EQ(e.Step(1).num_scheduled, 0);
  // The id can be reused once it is gone.
  EXPECT_FALSE(e.AddRequest(Req(1, Toks(4, 0), 1)).has_value());
}

TEST(EngineTest, OutputLengthSettings) {
  EngineConfig c = Small(64);
  c.fixed_output_tokens = 3;
  Engine e(c);
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(4, 0), 10)).has_value());
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(4, 100), 2)).has_value());  // max_tokens first
  EngineRequest own = Req(3, Toks(4, 200), 10);
  own.stop_after_tokens = 5;
  ASSERT_FALSE(e.AddRequest(own).has_value());
  double now = 0;
  std::map<uint64_t, RequestOutput> last;
  for (const auto& o : Drain(e, &now)) last[o.id] = o;
  EXPECT_EQ(last[1].completion_tokens, 3);
  EXPECT_EQ(last[1].reason, FinishReason::kStop);
  EXPECT_EQ(last[2].completion_tokens, 2);
  EXPECT_EQ(last[2].reason, FinishReason::kLength);
  EXPECT_EQ(last[3].completion_tokens, 5);
  EXPECT_EQ(last[3].reason, FinishReason::kStop);
  EXPECT_EQ(e.Stats().finished_stop, 2);
  EXPECT_EQ(e.Stats().finished_length, 1);
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
}

TEST(EngineTest, DrawnOutputLengthsAreDeterministicPerRequest) {
  EngineConfig c = Small(4000, 8192, 256);
  c.mean_output_tokens = 20;
  c.output_seed = 7;
  auto run = [&](bool reversed) {
    Engine e(c);
    for (int i = 0; i < 200; ++i) {
      const uint64_t id = reversed ? 199 - i : i;
      EXPECT_FALSE(e.AddRequest(Req(id, Toks(4, 0), 1000)).has_value());
    }
    double now = 0;
    std::map<uint64_t, int> len;
    for (const auto& o : Drain(e, &now)) {
      if (o.finished) len[o.id] = o.completion_tokens;
    }
    return len;
  };
  const auto a = run(false);
  const auto b = run(true);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 200u);
  double sum = 0;
  int distinct = 0, prev = -1;
  for (auto [id, n] : a) {
    EXPECT_GE(n, 1);
    sum += n;
    distinct += n != prev;
    prev = n;
  }
  EXPECT_NEAR(sum / 200, 20.0, 4.0);
  EXPECT_GT(distinct, 50);
}

TEST(EngineTest, KvEventsRecordStoresAndRemovals) {
  EngineConfig c = Small(3);
  c.record_kv_events = true;
  Engine e(c);
  double now = 0;
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(8, 0), 1)).has_value());
  Drain(e, &now);
  std::vector<KvEvent> ev;
  e.DrainKvEvents(&ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KvEventKind::kBlockStored);
  ASSERT_EQ(ev[0].block_hashes.size(), 2u);
  EXPECT_FALSE(ev[0].parent_hash.has_value());
  EXPECT_EQ(ev[0].token_ids, Toks(8, 0));
  const auto t = Toks(8, 0);
  const uint64_t h0 = BlockHash(c.hash_seed, std::span(t).first(4), "", "");
  EXPECT_EQ(ev[0].block_hashes[0], h0);
  EXPECT_EQ(ev[0].block_hashes[1], BlockHash(h0, std::span(t).subspan(4, 4), "", ""));
  // 3 blocks: the unused one, then request 1's last block (evicted).
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(8, 100), 1)).has_value());
  Drain(e, &now);
  ev.clear();
  e.DrainKvEvents(&ev);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, KvEventKind::kBlockRemoved);
  EXPECT_EQ(ev[0].block_hashes, std::vector<uint64_t>{ev[0].block_hashes[0]});
  EXPECT_EQ(ev[0].block_hashes[0], BlockHash(h0, std::span(t).subspan(4, 4), "", ""));
  EXPECT_EQ(ev[1].kind, KvEventKind::kBlockStored);
}

// POST /reset_prefix_cache: refused (false, nothing changes) while a request holds
// blocks; afterwards every hash is forgotten and one AllBlocksCleared is recorded.
TEST(EngineTest, ResetPrefixCacheMirrorsVllm) {
  EngineConfig c = Small(8);
  c.record_kv_events = true;
  Engine e(c);
  double now = 0;
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(9, 0), 4)).has_value());
  now += e.Step(now).duration_s;  // prefill: request 1 holds its blocks
  ASSERT_TRUE(e.HasWork());
  std::vector<KvEvent> ev;
  e.DrainKvEvents(&ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_FALSE(e.ResetPrefixCache());
  EXPECT_EQ(e.Stats().num_cached_blocks, 2);
  ev.clear();
  e.DrainKvEvents(&ev);
  EXPECT_TRUE(ev.empty());
  Drain(e, &now);
  e.DrainKvEvents(&ev);
  ev.clear();
  EXPECT_EQ(e.PeekCachedTokens(Toks(9, 0)), 8);
  EXPECT_TRUE(e.ResetPrefixCache());
  EXPECT_EQ(e.Stats().num_cached_blocks, 0);
  EXPECT_EQ(e.PeekCachedTokens(Toks(9, 0)), 0);
  e.DrainKvEvents(&ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KvEventKind::kAllBlocksCleared);
  EXPECT_TRUE(ev[0].block_hashes.empty());
  // The same prompt again: a miss, and its blocks are stored (not removed: the reset
  // forgot them without BlockRemoved events).
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(9, 0), 1)).has_value());
  Drain(e, &now);
  ev.clear();
  e.DrainKvEvents(&ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KvEventKind::kBlockStored);
  EXPECT_EQ(ev[0].block_hashes.size(), 2u);
  EXPECT_EQ(e.Stats().num_free_blocks, 8);  // all usable blocks free again
}

// Random traffic on a tight cache: every request finishes with exactly its tokens, and
// all blocks come back.
TEST(EngineTest, RandomWorkloadConservesBlocksAndTokens) {
  for (bool priority : {false, true}) {
    EngineConfig c = Small(40, 24, 6);
    c.priority_scheduling = priority;
    Engine e(c);
    std::mt19937_64 rng(12345);
    double now = 0;
    int64_t expected_tokens = 0;
    int added = 0, aborted = 0;
    std::map<uint64_t, int> done;
    for (int step = 0; step < 4000 && (added < 150 || e.HasWork()); ++step) {
      if (added < 150 && rng() % 3 == 0) {
        // Shared prefixes: a few base prompts, random lengths.
        const int len = 1 + static_cast<int>(rng() % 40);
        const int max_tokens = 1 + static_cast<int>(rng() % 30);
        EngineRequest r = Req(added, Toks(len, static_cast<uint32_t>(rng() % 3) * 1000),
                              max_tokens, now);
        r.priority = static_cast<int64_t>(rng() % 3);
        ASSERT_FALSE(e.AddRequest(r).has_value());
        expected_tokens += max_tokens;
        ++added;
      }
      if (rng() % 50 == 0 && added > 0) {
        const uint64_t id = rng() % added;
        if (!done.contains(id) && e.Abort(id)) {
          done[id] = -1;
          ++aborted;
        }
      }
      StepResult s = e.Step(now);
      now += s.duration_s > 0 ? s.duration_s : 0.001;
      for (const auto& o : s.outputs) {
        if (!o.finished) continue;
        ASSERT_FALSE(done.contains(o.id));
        done[o.id] = o.completion_tokens;
      }
      const EngineStats st = e.Stats();
      ASSERT_LE(st.running, 6);
      ASSERT_GE(st.num_free_blocks, 0);
      ASSERT_LE(st.num_free_blocks, 40);
    }
    EXPECT_FALSE(e.HasWork());
    EXPECT_EQ(static_cast<int>(done.size()), added);
    const EngineStats st = e.Stats();
    EXPECT_EQ(st.num_free_blocks, 40);
    EXPECT_EQ(st.finished_length + st.finished_abort, added);
    EXPECT_EQ(st.finished_abort, aborted);
    EXPECT_GT(st.preemptions, 0);
    EXPECT_GT(st.prefix_hits_tokens, 0);
    EXPECT_LE(st.generation_tokens, expected_tokens);
  }
}

// ---- P/D: prefill legs hold their blocks, decode legs load theirs -------------------

EngineRequest PrefillLeg(uint64_t id, std::vector<uint32_t> prompt, double lease_s) {
  EngineRequest r = Req(id, std::move(prompt), 1);
  r.kv_hold_s = lease_s;
  return r;
}

TEST(EnginePdTest, PrefillLegHoldsThePromptsFullBlocksUntilReleased) {
  Engine e(Small(64));
  ASSERT_FALSE(e.AddRequest(PrefillLeg(1, Toks(10, 100), 30.0)));
  double now = 0;
  std::vector<RequestOutput> out = Drain(e, &now);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].reason, FinishReason::kLength);
  // 10 tokens of blocks of 4: two full blocks held, the partial third freed.
  std::span<const int32_t> held = e.HeldBlocks(1);
  EXPECT_EQ(held.size(), 2u);
  EngineStats st = e.Stats();
  EXPECT_EQ(st.kv_holds, 1);
  EXPECT_EQ(st.kv_held_blocks, 2);
  EXPECT_EQ(st.num_free_blocks, 62);
  EXPECT_DOUBLE_EQ(st.kv_cache_usage, 2.0 / 64);
  EXPECT_FALSE(e.HasWork());
  EXPECT_FALSE(e.ResetPrefixCache());  // held blocks are in use, as in vLLM
  EXPECT_EQ(e.PeekCachedTokens(Toks(10, 100)), 8);
  ASSERT_TRUE(e.NextHoldExpiryS().has_value());
  EXPECT_DOUBLE_EQ(*e.NextHoldExpiryS(), out[0].finish_s + 30.0);

  EXPECT_TRUE(e.ReleaseHold(1));
  EXPECT_FALSE(e.ReleaseHold(1));
  st = e.Stats();
  EXPECT_EQ(st.kv_holds, 0);
  EXPECT_EQ(st.kv_held_blocks, 0);
  EXPECT_EQ(st.kv_holds_released, 1);
  EXPECT_EQ(st.kv_holds_expired, 0);
  EXPECT_EQ(st.num_free_blocks, 64);
  EXPECT_TRUE(e.HeldBlocks(1).empty());
  EXPECT_FALSE(e.NextHoldExpiryS().has_value());
  EXPECT_EQ(e.PeekCachedTokens(Toks(10, 100)), 8);  // freed with their hashes
}

TEST(EnginePdTest, HoldExpiresAtTheEndOfItsLease) {
  Engine e(Small(64));
  ASSERT_FALSE(e.AddRequest(PrefillLeg(1, Toks(16, 100), 30.0)));
  double now = 0;
  std::vector<RequestOutput> out = Drain(e, &now);
  ASSERT_EQ(out.size(), 1u);
  const double end = out[0].finish_s + 30.0;
  EXPECT_EQ(e.HeldBlocks(1).size(), 4u);
  EXPECT_EQ(e.ExpireHolds(std::nextafter(end, 0.0)), 0);
  EXPECT_EQ(e.Stats().kv_holds, 1);
  EXPECT_EQ(e.ExpireHolds(end), 1);
  EngineStats st = e.Stats();
  EXPECT_EQ(st.kv_holds, 0);
  EXPECT_EQ(st.kv_holds_expired, 1);
  EXPECT_EQ(st.num_free_blocks, 64);
  EXPECT_FALSE(e.ReleaseHold(1));
}

TEST(EnginePdTest, AStepExpiresHoldsFirst) {
  Engine e(Small(64));
  ASSERT_FALSE(e.AddRequest(PrefillLeg(1, Toks(16, 100), 1.0)));
  double now = 0;
  Drain(e, &now);
  ASSERT_EQ(e.Stats().kv_holds, 1);
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(8, 500), 1, now + 5.0)));
  e.Step(now + 5.0);
  EXPECT_EQ(e.Stats().kv_holds, 0);
  EXPECT_EQ(e.Stats().kv_holds_expired, 1);
}

TEST(EnginePdTest, NoHoldUnderOneBlockOrWithoutALengthFinish) {
  Engine e(Small(64));
  ASSERT_FALSE(e.AddRequest(PrefillLeg(1, Toks(3, 100), 30.0)));  // shorter than a block
  EngineRequest stop = PrefillLeg(2, Toks(12, 200), 30.0);
  stop.max_tokens = 2;
  stop.stop_after_tokens = 1;  // finishes by kStop
  ASSERT_FALSE(e.AddRequest(std::move(stop)));
  double now = 0;
  std::vector<RequestOutput> out = Drain(e, &now);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(e.HeldBlocks(1).empty());
  EXPECT_TRUE(e.HeldBlocks(2).empty());
  EXPECT_EQ(e.Stats().kv_holds, 0);
  EXPECT_EQ(e.Stats().num_free_blocks, 64);
}

TEST(EnginePdTest, DecodeLegWaitsForItsKvThenPrefillsOnlyTheRest) {
  const EngineConfig c = Small(64);
  Engine e(c);
  EngineRequest r = Req(1, Toks(40, 100), 2);
  r.kv_load_tokens = 32;
  r.kv_ready_s = 0.5;
  ASSERT_FALSE(e.AddRequest(std::move(r)));
  EXPECT_EQ(e.Stats().waiting, 1);
  EXPECT_EQ(e.Stats().waiting_for_remote_kvs, 1);
  ASSERT_TRUE(e.NextKvReadyS().has_value());
  EXPECT_DOUBLE_EQ(*e.NextKvReadyS(), 0.5);

  StepResult s = e.Step(0.0);  // WAITING_FOR_REMOTE_KVS: nothing to schedule
  EXPECT_EQ(s.num_scheduled, 0);
  EXPECT_EQ(s.duration_s, 0.0);
  EXPECT_TRUE(e.HasWork());
  EXPECT_EQ(e.Stats().num_free_blocks, 64);  // nothing allocated before the load ends

  s = e.Step(0.5);
  ASSERT_EQ(s.num_scheduled, 1);
  EXPECT_EQ(s.prefill_tokens, 8);  // 40 - 32 loaded
  EXPECT_EQ(s.resident_context_tokens, 40);
  EXPECT_DOUBLE_EQ(s.duration_s, c.step.StepSeconds(8, 0, 40));
  const RequestOutput& o = s.outputs[0];
  EXPECT_TRUE(o.first_token);
  EXPECT_EQ(o.cached_tokens, 32);
  EXPECT_DOUBLE_EQ(o.first_scheduled_s, 0.5);
  EXPECT_DOUBLE_EQ(o.first_token_s, 0.5 + c.step.StepSeconds(8, 0, 40));
  EngineStats st = e.Stats();
  EXPECT_EQ(st.waiting_for_remote_kvs, 0);
  EXPECT_EQ(st.prefix_hits_tokens, 0);  // loaded tokens are not local hits
  EXPECT_EQ(st.prefix_queries_tokens, 40);
  EXPECT_FALSE(e.NextKvReadyS().has_value());
  // The loaded blocks are cached like computed ones.
  EXPECT_EQ(e.PeekCachedTokens(Toks(40, 100)), 36);
}

TEST(EnginePdTest, AWholeLoadedPromptStillComputesItsLastToken) {
  const EngineConfig c = Small(64);
  Engine e(c);
  EngineRequest r = Req(1, Toks(16, 100), 1);
  r.kv_load_tokens = 16;
  r.kv_ready_s = 0.25;
  ASSERT_FALSE(e.AddRequest(std::move(r)));
  e.Step(0.0);
  StepResult s = e.Step(0.25);
  ASSERT_EQ(s.num_scheduled, 1);
  EXPECT_EQ(s.prefill_tokens, 1);
  EXPECT_EQ(s.outputs[0].cached_tokens, 15);
  EXPECT_TRUE(s.outputs[0].finished);
}

TEST(EnginePdTest, ALoadingRequestDoesNotBlockTheQueue) {
  Engine e(Small(64));
  EngineRequest a = Req(1, Toks(40, 100), 1);
  a.kv_load_tokens = 40;
  a.kv_ready_s = 10.0;
  ASSERT_FALSE(e.AddRequest(std::move(a)));
  ASSERT_FALSE(e.AddRequest(Req(2, Toks(8, 500), 1)));
  StepResult s = e.Step(0.0);
  ASSERT_EQ(s.num_scheduled, 1);
  EXPECT_EQ(s.outputs[0].id, 2u);
  EXPECT_EQ(e.Stats().waiting, 1);
  EXPECT_TRUE(e.Abort(1));
  EXPECT_EQ(e.Stats().waiting_for_remote_kvs, 0);
  EXPECT_FALSE(e.HasWork());
}

TEST(EnginePdTest, ALongerLocalHitWinsOverTheLoad) {
  Engine e(Small(64));
  ASSERT_FALSE(e.AddRequest(Req(1, Toks(40, 100), 1)));
  double now = 0;
  Drain(e, &now);
  EngineRequest r = Req(2, Toks(40, 100), 1, now);
  r.kv_load_tokens = 8;
  r.kv_ready_s = now;
  ASSERT_FALSE(e.AddRequest(std::move(r)));
  StepResult s = e.Step(now);
  ASSERT_EQ(s.num_scheduled, 1);
  EXPECT_EQ(s.outputs[0].cached_tokens, 36);
  EXPECT_EQ(s.prefill_tokens, 4);
}

TEST(EnginePdTest, RejectsABadLoad) {
  Engine e(Small(64));
  EngineRequest r = Req(1, Toks(8, 100), 1);
  r.kv_load_tokens = 9;
  EXPECT_TRUE(e.AddRequest(r).has_value());
  r.kv_load_tokens = -1;
  EXPECT_TRUE(e.AddRequest(r).has_value());
  r.kv_load_tokens = 8;
  r.kv_hold_s = -1;
  EXPECT_TRUE(e.AddRequest(r).has_value());
  EXPECT_FALSE(e.HasWork());
}

}  // namespace
}  // namespace kvroute::engine
