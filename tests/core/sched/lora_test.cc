// LoRA adapters on the router side (issue 26): which requests name an adapter, llm-d's
// lora-affinity rule on hand-made endpoint states, its place in the kvroute policy, and
// the approximate prefix chains keyed by adapter.
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "core/sched/lora.h"
#include "core/sched/prefix_index.h"
#include "sched_test_util.h"

namespace kvroute::sched {
namespace {

using metrics::AdapterKey;
using metrics::EngineMetrics;
using testing::MakeEndpoints;
using testing::MustBuild;
using testing::MustBuildPolicy;
using testing::Plugin;
using testing::Req;
using testing::SpecOf;

constexpr std::string_view kBase = "meta-llama/Llama-3.1-8B-Instruct";

// The LoRA state a scrape of vllm:lora_requests_info gives, on a vLLM serving kBase.
void SetLora(EndpointState& e, int64_t max_lora, std::initializer_list<std::string_view> running,
             std::initializer_list<std::string_view> waiting = {}) {
  EngineMetrics& m = e.engine;
  m.present |= EngineMetrics::kLora;
  m.base_model_key = AdapterKey(kBase);
  m.max_lora = max_lora;
  m.n_running_loras = 0;
  m.n_waiting_loras = 0;
  for (std::string_view n : running) m.running_loras[m.n_running_loras++] = AdapterKey(n);
  for (std::string_view n : waiting) m.waiting_loras[m.n_waiting_loras++] = AdapterKey(n);
}

TEST(LoraAffinity, LlmdRule) {
  EngineMetrics m;
  m.present = EngineMetrics::kLora;
  m.max_lora = 3;
  m.running_loras[0] = AdapterKey("a");
  m.waiting_loras[0] = AdapterKey("w");
  m.n_running_loras = 1;
  m.n_waiting_loras = 1;
  EXPECT_EQ(LoraAffinity(m, AdapterKey("a")), 1.0);  // running there
  EXPECT_EQ(LoraAffinity(m, AdapterKey("new")), 0.8);  // 1 + 1 < 3: room to load
  EXPECT_EQ(LoraAffinity(m, AdapterKey("w")), 0.8);    // room wins over waiting
  m.max_lora = 2;                                      // 1 + 1 == 2: full
  EXPECT_EQ(LoraAffinity(m, AdapterKey("a")), 1.0);
  EXPECT_EQ(LoraAffinity(m, AdapterKey("w")), 0.6);    // waiting there
  EXPECT_EQ(LoraAffinity(m, AdapterKey("new")), 0.0);  // nothing
  m.max_lora = 0;
  EXPECT_EQ(LoraAffinity(m, AdapterKey("new")), 0.0);
}

// With truncated lists an adapter not found may be there, and the room is unknown.
TEST(LoraAffinity, TruncatedListsClaimNoRoom) {
  EngineMetrics m;
  m.present = EngineMetrics::kLora;
  m.max_lora = 64;
  m.lora_truncated = true;
  for (size_t i = 0; i < EngineMetrics::kMaxLoraListed; ++i) {
    m.running_loras[i] = AdapterKey("r" + std::to_string(i));
  }
  m.n_running_loras = EngineMetrics::kMaxLoraListed;
  m.n_waiting_loras = 1;
  m.waiting_loras[0] = AdapterKey("w");
  EXPECT_EQ(LoraAffinity(m, AdapterKey("r3")), 1.0);
  EXPECT_EQ(LoraAffinity(m, AdapterKey("w")), 0.6);
  EXPECT_EQ(LoraAffinity(m, AdapterKey("other")), 0.0);  // 17 < 64, but more are unlisted
  m.lora_truncated = false;
  EXPECT_EQ(LoraAffinity(m, AdapterKey("other")), 0.8);
}

TEST(AdapterRequestKey, DecidedByWhatTheEndpointsReport) {
  auto eps = MakeEndpoints(2);
  // No LoRA state anywhere: nothing tells an adapter apart.
  EXPECT_EQ(AdapterRequestKey("sql-lora", eps, 0.0, 2.0), 0u);
  SetLora(eps[0], 2, {"sql-lora"});
  EXPECT_EQ(AdapterRequestKey("sql-lora", eps, 0.0, 2.0), AdapterKey("sql-lora"));
  // Listed nowhere, but not the base model: an adapter to load.
  EXPECT_EQ(AdapterRequestKey("new-lora", eps, 0.0, 2.0), AdapterKey("new-lora"));
  // The base model, and the empty model.
  EXPECT_EQ(AdapterRequestKey(kBase, eps, 0.0, 2.0), 0u);
  EXPECT_EQ(AdapterRequestKey("", eps, 0.0, 2.0), 0u);
  // Stale or unknown LoRA state counts for nothing.
  EXPECT_EQ(AdapterRequestKey("sql-lora", eps, 10.0, 2.0), 0u);
  eps[0].engine.present &= ~EngineMetrics::kLora;
  EXPECT_EQ(AdapterRequestKey("sql-lora", eps, 0.0, 2.0), 0u);
  // Base model unknown (no model label): only a listed adapter is known to be one.
  SetLora(eps[1], 2, {"chat-lora"});
  eps[1].engine.base_model_key = 0;
  EXPECT_EQ(AdapterRequestKey("chat-lora", eps, 0.0, 2.0), AdapterKey("chat-lora"));
  EXPECT_EQ(AdapterRequestKey("other", eps, 0.0, 2.0), 0u);
  // Some endpoint serving the model as its base model makes it a base-model request.
  eps[1].engine.base_model_key = AdapterKey("chat-lora");
  EXPECT_EQ(AdapterRequestKey("chat-lora", eps, 0.0, 2.0), 0u);
}

// Each case of the rule through a Pick, read back from the per-plugin scores.
TEST(LoraAffinityScorer, ScoresEachCase) {
  auto s = MustBuild(SpecOf({Plugin("lora-affinity-scorer")}));
  auto eps = MakeEndpoints(5);
  SetLora(eps[0], 2, {"a"});            // running: 1.0
  SetLora(eps[1], 2, {"b"});            // room (1 < 2): 0.8
  SetLora(eps[2], 2, {"b"}, {"a"});     // full, waiting there: 0.6
  SetLora(eps[3], 2, {"b", "c"});       // full, not there: 0
  /* eps[4]: no LoRA state */           // unknown: 0
  PickResult r = s->Pick(Req("x", "a"), eps, 0.5);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.candidates.size(), 5u);
  EXPECT_EQ(r.scorer_names[0], "lora-affinity-scorer");
  EXPECT_EQ(r.Score(0, 0), 1.0);
  EXPECT_EQ(r.Score(0, 1), 0.8);
  EXPECT_EQ(r.Score(0, 2), 0.6);
  EXPECT_EQ(r.Score(0, 3), 0.0);
  EXPECT_EQ(r.Score(0, 4), 0.0);
  EXPECT_EQ(r.ranked[0], 0u);
}

TEST(LoraAffinityScorer, StaleOrInvalidStateScoresZero) {
  auto s = MustBuild(SpecOf({Plugin("lora-affinity-scorer", {{"staleAfterSeconds", 1.0}})}));
  auto eps = MakeEndpoints(3);
  SetLora(eps[0], 2, {"a"});
  SetLora(eps[1], 2, {"a"});
  SetLora(eps[2], 2, {"a"});
  eps[1].scraped_at_s = -5.0;  // 5.5 s old at t = 0.5
  eps[2].engine.present &= ~EngineMetrics::kLora;
  eps[2].engine.invalid |= EngineMetrics::kLora;
  PickResult r = s->Pick(Req("x", "a"), eps, 0.5);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.Score(0, 0), 1.0);
  EXPECT_EQ(r.Score(0, 1), 0.0);
  EXPECT_EQ(r.Score(0, 2), 0.0);
  // A failed last scrape is not fresh either.
  eps[0].scrape_ok = false;
  r = s->Pick(Req("x", "a"), eps, 0.5);
  EXPECT_EQ(r.Score(0, 0), 0.0);
}

// A base-model request scores 0 everywhere, whatever the adapters: the scorer adds
// nothing to any total.
TEST(LoraAffinityScorer, BaseModelRequestIsNeutral) {
  auto s = MustBuild(SpecOf({Plugin("lora-affinity-scorer")}));
  auto eps = MakeEndpoints(3);
  SetLora(eps[0], 2, {"a"});
  SetLora(eps[1], 1, {});
  PickResult r = s->Pick(Req("x", kBase), eps, 0.0);
  ASSERT_TRUE(r.ok());
  for (size_t c = 0; c < 3; ++c) EXPECT_EQ(r.Score(0, c), 0.0) << c;
  for (double t : r.totals) EXPECT_EQ(t, 0.0);
}

// The kvroute policy carries the filter and the scorer with weight 3; kvroute-lora-blind
// neither.
TEST(LoraAffinityScorer, InTheKvroutePolicy) {
  auto spec = PolicyAsSpec("kvroute");
  ASSERT_TRUE(spec.has_value());
  double weight = -1;
  for (const ProfilePluginRef& ref : spec->profiles[0].plugins) {
    if (ref.plugin_ref == "lora-affinity-scorer") weight = ref.weight;
  }
  EXPECT_EQ(weight, 3.0);
  auto blind = PolicyAsSpec("kvroute-lora-blind");
  ASSERT_TRUE(blind.has_value());
  ASSERT_EQ(blind->plugins.size() + 2, spec->plugins.size());
  for (const PluginSpec& p : blind->plugins) {
    EXPECT_NE(p.type, "lora-affinity-scorer");
    EXPECT_NE(p.type, "lora-affinity-filter");
  }
  for (const ProfilePluginRef& ref : blind->profiles[0].plugins) {
    EXPECT_NE(ref.plugin_ref, "lora-affinity-scorer");
    EXPECT_NE(ref.plugin_ref, "lora-affinity-filter");
  }
  EXPECT_TRUE(MustBuildPolicy("kvroute-lora-blind") != nullptr);
}

// kvroute at equal load: each adapter goes to the replica running it; a new adapter goes
// where there is room; a replica far more loaded loses even its adapter's requests.
// The first ranked endpoint of an undispatched pick (its handle released at once).
uint32_t First(Scheduler& s, std::string_view model, std::span<const EndpointState> eps) {
  PickResult r = s.Pick(Req("x", model), eps, 0.0);
  EXPECT_TRUE(r.ok());
  const uint32_t first = r.ranked.empty() ? ~0u : r.ranked[0];
  s.OnFinished(r.handle, 0.0);
  return first;
}

TEST(LoraAffinityScorer, KvroutePicks) {
  auto s = MustBuildPolicy("kvroute");
  auto eps = MakeEndpoints(2);
  SetLora(eps[0], 2, {"a"});
  SetLora(eps[1], 2, {"b"});
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(First(*s, "a", eps), 0u);
    EXPECT_EQ(First(*s, "b", eps), 1u);
  }
  SetLora(eps[0], 2, {"a"}, {"d"});  // full
  for (int i = 0; i < 20; ++i) EXPECT_EQ(First(*s, "c", eps), 1u);
  SetLora(eps[0], 2, {"a"});
  eps[0].running = 30;
  eps[0].waiting = 0;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(First(*s, "a", eps), 1u);
}

// Room counts distinct adapters: one running and waiting (a request of it queued behind
// its running ones) takes one batch slot. llm-d adds the lists' lengths and would see none.
TEST(LoraAffinity, AnAdapterBothRunningAndWaitingTakesOneSlot) {
  auto eps = MakeEndpoints(1);
  SetLora(eps[0], 2, {"b"}, {"b"});
  EXPECT_EQ(LoraAffinity(eps[0].engine, AdapterKey("c")), 0.8);
  SetLora(eps[0], 2, {"b"}, {"d"});
  EXPECT_EQ(LoraAffinity(eps[0].engine, AdapterKey("c")), 0.0);
}

// The lora-affinity-filter: a new adapter never goes where max_loras is reached without it
// while another endpoint can batch it, however much busier that one is (short of
// saturation); kvroute-lora-blind (no filter, no scorer) sends it to the idle one.
TEST(LoraAffinityFilter, ANewAdapterGoesWhereItCanBeBatched) {
  auto s = MustBuildPolicy("kvroute");
  auto blind = MustBuildPolicy("kvroute-lora-blind");
  auto eps = MakeEndpoints(2);
  SetLora(eps[0], 1, {"a"});  // full: one adapter per batch, a runs
  SetLora(eps[1], 2, {"b"});  // room for one more
  eps[1].running = 40;
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(First(*s, "c", eps), 1u) << i;
    EXPECT_EQ(First(*blind, "c", eps), 0u) << i;
  }
  SetLora(eps[1], 2, {"b"}, {"c"});  // c waits there: still batchable there, not on 0
  for (int i = 0; i < 20; ++i) EXPECT_EQ(First(*s, "c", eps), 1u) << i;
  SetLora(eps[1], 2, {"b"}, {"d"});  // no room anywhere: load decides
  for (int i = 0; i < 20; ++i) EXPECT_EQ(First(*s, "c", eps), 0u) << i;
  // A base-model request is never filtered.
  SetLora(eps[1], 2, {"b"});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(First(*s, kBase, eps), 0u) << i;
}

// The approximate prefix chain is rooted in the request's model, which for an adapter
// request is the adapter's name: the same prompt under two adapters, or under an adapter
// and the base model, shares no block.
TEST(LoraPrefixKeys, ApproximateChainsRootedInTheAdapter) {
  const std::string prompt(64 * 4, 'p');
  std::vector<uint64_t> a, b, base, base_again;
  HashPromptBlocks("lora-a", "", prompt, 64, 256, a);
  HashPromptBlocks("lora-b", "", prompt, 64, 256, b);
  HashPromptBlocks(kBase, "", prompt, 64, 256, base);
  HashPromptBlocks(kBase, "", prompt, 64, 256, base_again);
  ASSERT_EQ(a.size(), 4u);
  for (uint64_t k : a) {
    EXPECT_EQ(std::count(b.begin(), b.end(), k), 0);
    EXPECT_EQ(std::count(base.begin(), base.end(), k), 0);
  }
  EXPECT_EQ(base, base_again);

  // Through the prefix-cache-scorer: a prompt learned under adapter a on endpoint 0 is a
  // full match there for a, and no match for b or the base model.
  auto s = MustBuild(SpecOf({Plugin("prefix-cache-scorer")}));
  auto eps = MakeEndpoints(2);
  PickResult first = s->Pick(Req(prompt, "lora-a"), eps, 0.0);
  ASSERT_TRUE(first.ok());
  s->OnDispatched(first.handle, first.ranked[0], 0.0);
  const uint32_t holder = first.ranked[0];
  PickResult again = s->Pick(Req(prompt, "lora-a"), eps, 1.0);
  EXPECT_EQ(again.Score(0, holder), 1.0);
  PickResult other = s->Pick(Req(prompt, "lora-b"), eps, 1.0);
  EXPECT_EQ(other.Score(0, holder), 0.0);
  PickResult base_req = s->Pick(Req(prompt, kBase), eps, 1.0);
  EXPECT_EQ(base_req.Score(0, holder), 0.0);
}

}  // namespace
}  // namespace kvroute::sched
