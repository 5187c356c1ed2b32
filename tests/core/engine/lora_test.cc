// LoRA adapters in the simulated engine (EngineConfig::lora): the max_loras batch rule,
// the adapter LRU and its load cost, all in engine (virtual) time.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "core/engine/engine.h"

namespace kvroute::engine {
namespace {

// Blocks of 4 tokens; every step costs exactly 1 ms plus 0.5 s per adapter load.
EngineConfig LoraEngine(int max_loras, int max_cpu_loras) {
  EngineConfig c;
  c.block_size = 4;
  c.num_gpu_blocks = 257;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 1024;
  c.max_model_len = 4096;
  c.step = {1000.0, 0.0, 0.0, 0.0};
  c.lora.enabled = true;
  c.lora.max_loras = max_loras;
  c.lora.max_cpu_loras = max_cpu_loras;
  c.lora.load_s = 0.5;
  return c;
}

EngineRequest Req(uint64_t id, std::string lora, int max_tokens = 2, uint32_t base = 0) {
  EngineRequest r;
  r.id = id;
  r.prompt_tokens.resize(8);
  std::iota(r.prompt_tokens.begin(), r.prompt_tokens.end(), base);
  r.max_tokens = max_tokens;
  r.lora_name = std::move(lora);
  return r;
}

std::vector<uint64_t> Ids(const StepResult& s) {
  std::vector<uint64_t> ids;
  for (const RequestOutput& o : s.outputs) ids.push_back(o.id);
  return ids;
}

// Runs requests of one adapter each, one after another, until idle; returns the loads.
int64_t Serve(Engine& e, uint64_t id, const std::string& lora, double* now) {
  EXPECT_FALSE(e.AddRequest(Req(id, lora, 1)).has_value());
  while (e.HasWork()) *now += e.Step(*now).duration_s;
  return e.Stats().lora_loads;
}

using Names = std::vector<std::string>;

TEST(EngineLoraTest, ASecondAdapterWaitsUntilTheFirstsRequestsFinish) {
  Engine e(LoraEngine(/*max_loras=*/1, /*max_cpu_loras=*/1));
  ASSERT_FALSE(e.AddRequest(Req(1, "a")).has_value());
  ASSERT_FALSE(e.AddRequest(Req(2, "b")).has_value());
  ASSERT_FALSE(e.AddRequest(Req(3, "a")).has_value());

  // Step 1: 1 and 3 (adapter a) run; 2 is skipped without blocking 3. a loads once.
  StepResult s1 = e.Step(0.0);
  EXPECT_EQ(Ids(s1), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(s1.lora_loads, 1);
  EXPECT_DOUBLE_EQ(s1.duration_s, 0.001 + 0.5);
  Names running, waiting;
  e.LoraActivity(&running, &waiting);
  EXPECT_EQ(running, Names{"a"});
  EXPECT_EQ(waiting, Names{"b"});

  // Step 2: a's requests decode and finish; b is still held back (a is in the batch).
  StepResult s2 = e.Step(0.501);
  EXPECT_EQ(Ids(s2), (std::vector<uint64_t>{1, 3}));
  EXPECT_TRUE(s2.outputs[0].finished && s2.outputs[1].finished);
  EXPECT_EQ(s2.lora_loads, 0);
  EXPECT_DOUBLE_EQ(s2.duration_s, 0.001);

  // Step 3: b runs, loading it evicts a (cache of one).
  StepResult s3 = e.Step(0.502);
  EXPECT_EQ(Ids(s3), (std::vector<uint64_t>{2}));
  EXPECT_EQ(s3.lora_loads, 1);
  EXPECT_DOUBLE_EQ(s3.duration_s, 0.501);
  EXPECT_DOUBLE_EQ(s3.outputs[0].first_scheduled_s, 0.502);
  EngineStats st = e.Stats();
  EXPECT_EQ(st.lora_loads, 2);
  EXPECT_EQ(st.lora_evictions, 1);
  EXPECT_EQ(st.lora_skips, 2);
  EXPECT_EQ(st.loras_cached, 1);
  EXPECT_FALSE(e.LoraCached("a"));
  EXPECT_TRUE(e.LoraCached("b"));
  e.LoraActivity(&running, &waiting);
  EXPECT_EQ(running, Names{"b"});
  EXPECT_EQ(waiting, Names{});
}

TEST(EngineLoraTest, BaseModelRequestsCountNoAdapter) {
  Engine e(LoraEngine(1, 1));
  ASSERT_FALSE(e.AddRequest(Req(1, "a")).has_value());
  ASSERT_FALSE(e.AddRequest(Req(2, "")).has_value());
  ASSERT_FALSE(e.AddRequest(Req(3, "b")).has_value());
  ASSERT_FALSE(e.AddRequest(Req(4, "")).has_value());
  StepResult s = e.Step(0.0);
  EXPECT_EQ(Ids(s), (std::vector<uint64_t>{1, 2, 4}));
  EXPECT_EQ(e.Stats().waiting, 1);
}

TEST(EngineLoraTest, MaxLorasAdaptersShareABatch) {
  Engine e(LoraEngine(2, 2));
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_FALSE(e.AddRequest(Req(id, "l" + std::to_string(id))).has_value());
  }
  StepResult s = e.Step(0.0);
  EXPECT_EQ(Ids(s), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.lora_loads, 2);
  EXPECT_DOUBLE_EQ(s.duration_s, 0.001 + 2 * 0.5);
}

TEST(EngineLoraTest, TheLoadCostAppearsOncePerColdLoad) {
  Engine e(LoraEngine(1, 2));
  double now = 0.0;
  EXPECT_EQ(Serve(e, 1, "a", &now), 1);
  EXPECT_DOUBLE_EQ(now, 0.501);  // one step: prefill + the only token, plus the load
  EXPECT_EQ(Serve(e, 2, "a", &now), 1);  // warm: no load
  EXPECT_DOUBLE_EQ(now, 0.502);
  EXPECT_EQ(Serve(e, 3, "", &now), 1);   // the base model loads nothing
  EXPECT_DOUBLE_EQ(now, 0.503);
  EXPECT_EQ(e.Stats().lora_evictions, 0);
}

TEST(EngineLoraTest, TheCacheEvictsTheLeastRecentlyUsedAdapter) {
  Engine e(LoraEngine(1, 2));
  double now = 0.0;
  Serve(e, 1, "a", &now);
  Serve(e, 2, "b", &now);
  Serve(e, 3, "a", &now);  // a is now more recent than b
  EXPECT_EQ(e.Stats().lora_loads, 2);
  EXPECT_EQ(Serve(e, 4, "c", &now), 3);  // evicts b
  EXPECT_EQ(e.Stats().lora_evictions, 1);
  EXPECT_TRUE(e.LoraCached("a"));
  EXPECT_FALSE(e.LoraCached("b"));
  EXPECT_TRUE(e.LoraCached("c"));
  EXPECT_EQ(Serve(e, 5, "b", &now), 4);  // b again: a cold load, evicting a
  EXPECT_FALSE(e.LoraCached("a"));
  EXPECT_EQ(e.Stats().loras_cached, 2);
}

TEST(EngineLoraTest, EvictLoraForcesAReload) {
  Engine e(LoraEngine(1, 2));
  double now = 0.0;
  Serve(e, 1, "a", &now);
  EXPECT_TRUE(e.EvictLora("a"));
  EXPECT_FALSE(e.EvictLora("a"));
  EXPECT_EQ(Serve(e, 2, "a", &now), 2);
}

TEST(EngineLoraTest, DisabledLoraHasNoRuleAndNoCost) {
  EngineConfig c = LoraEngine(1, 1);
  c.lora.enabled = false;
  Engine e(c);
  ASSERT_FALSE(e.AddRequest(Req(1, "a")).has_value());
  ASSERT_FALSE(e.AddRequest(Req(2, "b")).has_value());
  StepResult s = e.Step(0.0);
  EXPECT_EQ(Ids(s), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.lora_loads, 0);
  EXPECT_DOUBLE_EQ(s.duration_s, 0.001);
}

TEST(EngineLoraTest, AdapterBlocksAreKeyedByAdapterAndCarryItsNameInEvents) {
  EngineConfig c = LoraEngine(2, 2);
  c.record_kv_events = true;
  Engine e(c);
  double now = 0.0;
  Serve(e, 1, "a", &now);
  // Same prompt: a hits its own blocks; b and the base model hit nothing.
  std::vector<uint32_t> prompt(8);
  std::iota(prompt.begin(), prompt.end(), 0u);
  EXPECT_EQ(e.PeekCachedTokens(prompt, {}, "a"), 4);
  EXPECT_EQ(e.PeekCachedTokens(prompt, {}, "b"), 0);
  EXPECT_EQ(e.PeekCachedTokens(prompt), 0);
  std::vector<KvEvent> events;
  e.DrainKvEvents(&events);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].kind, KvEventKind::kBlockStored);
  EXPECT_EQ(events[0].lora_name, "a");
}

}  // namespace
}  // namespace kvroute::engine
