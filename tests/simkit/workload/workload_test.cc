#include "simkit/workload/workload.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "simkit/workload/arrivals.h"
#include "simkit/workload/distribution.h"
#include "simkit/workload/oracle.h"
#include "core/common/rng.h"

namespace kvroute::workload {
namespace {

ArrivalSpec Constant(double rate, int64_t n) {
  ArrivalSpec a;
  a.kind = ArrivalKind::kConstant;
  a.stages = {{rate}};
  a.num_requests = n;
  return a;
}

std::vector<RequestSpec> Generate(const WorkloadSpec& w, const ArrivalSpec& a, uint64_t seed) {
  EXPECT_EQ(w.Validate().ToString(), "OK");
  EXPECT_EQ(a.Validate().ToString(), "OK");
  RequestGenerator gen(w, a, seed);
  std::vector<RequestSpec> out;
  RequestSpec r;
  while (gen.Next(&r)) out.push_back(r);
  return out;
}

// The engine's output text stand-in for tests: 4-byte words "o<id><i> " (ids < 10, i < 100).
void FakeOutput(uint64_t id, int32_t tokens, std::string* out) {
  for (int32_t i = 0; i < tokens; ++i) {
    out->push_back('o');
    out->push_back(static_cast<char>('0' + id % 10));
    out->push_back(static_cast<char>('a' + i % 26));
    out->push_back(' ');
  }
}

TEST(RngTest, SameSeedSameSequenceDifferentSeedDifferent) {
  Rng a(7), b(7), c(8);
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    EXPECT_NE(x, c.Next());
  }
}

TEST(RngTest, GammaAndExponentialMeans) {
  Rng rng(1);
  double sum_exp = 0, sum_gamma = 0, sum_small = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    sum_exp += rng.Exponential(4.0);
    sum_gamma += rng.Gamma(3.0, 2.0);
    sum_small += rng.Gamma(0.25, 4.0);
  }
  EXPECT_NEAR(sum_exp / n, 0.25, 0.005);
  EXPECT_NEAR(sum_gamma / n, 6.0, 0.05);
  EXPECT_NEAR(sum_small / n, 1.0, 0.03);
}

TEST(LengthDistTest, FixedNormalAndMixture) {
  Rng rng(3);
  EXPECT_EQ(LengthDist::Fixed(42).Sample(rng), 42);
  const LengthDist n = LengthDist::Normal(10, 20, 15, 100);
  for (int i = 0; i < 1000; ++i) {
    const int64_t v = n.Sample(rng);
    EXPECT_GE(v, 10);
    EXPECT_LE(v, 20);
  }
  LengthDist mix;
  mix.components = {{3.0, 50, 50, 50, 0}, {1.0, 2000, 2000, 2000, 0}};
  std::map<int64_t, int> counts;
  for (int i = 0; i < 40000; ++i) counts[mix.Sample(rng)]++;
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts[50] / 40000.0, 0.75, 0.01);
  EXPECT_DOUBLE_EQ(mix.NominalMean(), (3 * 50 + 2000) / 4.0);
  EXPECT_EQ(LengthDist::Normal(5, 4, 4, 1).Validate(0).message(), "min must be <= max");
  EXPECT_EQ(LengthDist::Fixed(0).Validate(1).message(), "lengths must be >= 1");
}

TEST(ArrivalsTest, ConstantRateAndStages) {
  ArrivalSpec a;
  a.kind = ArrivalKind::kConstant;
  a.stages = {{1.0, 2.0}, {2.0, 1.0}};
  ASSERT_EQ(a.Validate().ToString(), "OK");
  ArrivalProcess p(a, 1);
  std::vector<double> times;
  while (auto t = p.Next()) times.push_back(*t);
  EXPECT_EQ(times, (std::vector<double>{0.0, 1.0, 2.0, 2.5}));
}

TEST(ArrivalsTest, CountAndDurationLimits) {
  ArrivalProcess p(Constant(10.0, 5), 1);
  int n = 0;
  while (p.Next()) ++n;
  EXPECT_EQ(n, 5);
  ArrivalSpec a = Constant(4.0, 0);
  a.duration_s = 1.0;
  ArrivalProcess q(a, 1);
  std::vector<double> times;
  while (auto t = q.Next()) times.push_back(*t);
  EXPECT_EQ(times, (std::vector<double>{0.0, 0.25, 0.5, 0.75}));
  ArrivalSpec unbounded;
  unbounded.stages = {{1.0}};
  EXPECT_EQ(unbounded.Validate().message(),
            "needs num_requests, duration_s or finite stage durations");
}

TEST(ArrivalsTest, PoissonAndGammaRatesAndBurstiness) {
  for (double burstiness : {1.0, 0.25}) {
    ArrivalSpec a;
    a.kind = burstiness == 1.0 ? ArrivalKind::kPoisson : ArrivalKind::kGamma;
    a.burstiness = burstiness;
    a.stages = {{50.0, 200.0}};
    ArrivalProcess p(a, 9);
    std::vector<double> gaps;
    double last = 0, t = 0;
    while (auto x = p.Next()) {
      t = *x;
      gaps.push_back(t - last);
      last = t;
    }
    EXPECT_NEAR(gaps.size() / 200.0, 50.0, 1.5) << burstiness;
    double mean = 0, var = 0;
    for (double g : gaps) mean += g;
    mean /= gaps.size();
    for (double g : gaps) var += (g - mean) * (g - mean);
    var /= gaps.size();
    // Gamma(k, 1/(rate k)) gaps: squared coefficient of variation 1/k.
    EXPECT_NEAR(var / (mean * mean), 1.0 / burstiness, 0.1 / burstiness) << burstiness;
  }
}

TEST(SharedPrefixTest, EveryPromptOncePerCycleWithExactLengthsAndSharing) {
  WorkloadSpec w;
  w.kind = WorkloadKind::kSharedPrefix;
  w.num_groups = 3;
  w.num_prompts_per_group = 4;
  w.system_prompt_len = LengthDist::Fixed(100);
  w.question_len = LengthDist::Normal(10, 30, 20, 5);
  w.output_len = LengthDist::Fixed(7);
  const auto reqs = Generate(w, Constant(10, 24), 5);
  ASSERT_EQ(reqs.size(), 24u);
  std::map<uint64_t, int> question_uses;
  std::map<int64_t, std::set<uint64_t>> system_keys_by_group;
  std::string text;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestSpec& r = reqs[i];
    EXPECT_EQ(r.id, i);
    EXPECT_DOUBLE_EQ(r.arrival_s, 0.1 * i);
    EXPECT_EQ(r.max_tokens, 7);
    ASSERT_EQ(r.segments.size(), 2u);
    EXPECT_EQ(r.segments[0].tokens, 100);
    EXPECT_GE(r.segments[1].tokens, 10);
    EXPECT_LE(r.segments[1].tokens, 30);
    EXPECT_EQ(r.prompt_tokens, 100 + r.segments[1].tokens);
    system_keys_by_group[r.group_id].insert(r.segments[0].key);
    question_uses[r.segments[1].key]++;
    RenderPrompt(r, nullptr, &text);
    EXPECT_EQ(text.size(), 4u * r.prompt_tokens);  // 4 bytes per stand-in token
    if (i == 11) {
      // First cycle: all 12 prompts exactly once.
      EXPECT_EQ(question_uses.size(), 12u);
    }
  }
  EXPECT_EQ(question_uses.size(), 12u);
  for (const auto& [key, uses] : question_uses) EXPECT_EQ(uses, 2);
  ASSERT_EQ(system_keys_by_group.size(), 3u);
  std::set<uint64_t> all_system;
  for (const auto& [g, keys] : system_keys_by_group) {
    EXPECT_EQ(keys.size(), 1u);
    all_system.insert(*keys.begin());
  }
  EXPECT_EQ(all_system.size(), 3u);

  // Same group: identical first 400 bytes, different next word.
  std::string a, b;
  const RequestSpec* first = &reqs[0];
  const RequestSpec* other = nullptr;
  for (const auto& r : reqs) {
    if (r.group_id == first->group_id && r.segments[1].key != first->segments[1].key) other = &r;
  }
  ASSERT_NE(other, nullptr);
  RenderPrompt(*first, nullptr, &a);
  RenderPrompt(*other, nullptr, &b);
  EXPECT_EQ(a.substr(0, 400), b.substr(0, 400));
  EXPECT_NE(a.substr(400, 4), b.substr(400, 4));
}

TEST(SharedPrefixTest, DeterministicGivenSeed) {
  WorkloadSpec w;
  w.num_groups = 2;
  w.num_prompts_per_group = 3;
  w.question_len = LengthDist::Normal(5, 50, 20, 10);
  w.output_len = LengthDist::Normal(5, 50, 20, 10);
  ArrivalSpec a;
  a.stages = {{5.0}};
  a.num_requests = 50;
  const auto x = Generate(w, a, 11), y = Generate(w, a, 11), z = Generate(w, a, 12);
  ASSERT_EQ(x.size(), y.size());
  bool differs = false;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].arrival_s, y[i].arrival_s);
    EXPECT_EQ(x[i].max_tokens, y[i].max_tokens);
    ASSERT_EQ(x[i].segments.size(), 1u);  // no system prompt
    EXPECT_EQ(x[i].segments[0].key, y[i].segments[0].key);
    differs |= x[i].arrival_s != z[i].arrival_s;
  }
  EXPECT_TRUE(differs);
}

TEST(MultiTurnTest, TurnsGrowAndDependOnThePreviousTurn) {
  WorkloadSpec w;
  w.kind = WorkloadKind::kMultiTurn;
  w.num_groups = 1;
  w.num_prompts_per_group = 2;  // two conversations
  w.system_prompt_len = LengthDist::Fixed(20);
  w.question_len = LengthDist::Fixed(5);
  w.output_len = LengthDist::Fixed(3);
  w.max_turns = 3;
  w.think_time_s = 1.5;
  const auto reqs = Generate(w, Constant(1, 40), 1);
  ASSERT_EQ(reqs.size(), 40u);
  // Per conversation: turns 0, 1, 2 in order, each after the previous turn; at most 3.
  std::map<int64_t, std::vector<const RequestSpec*>> by_conv;
  for (const auto& r : reqs) by_conv[r.conversation_id].push_back(&r);
  EXPECT_GT(by_conv.size(), 2u);  // conversations restart after max_turns
  const RequestSpec* third_turn = nullptr;
  for (const auto& [conv, turns] : by_conv) {
    ASSERT_LE(turns.size(), 3u);
    for (size_t t = 0; t < turns.size(); ++t) {
      const RequestSpec& r = *turns[t];
      EXPECT_EQ(r.turn, static_cast<int32_t>(t));
      EXPECT_EQ(r.prompt_tokens, 20 + 5 + r.turn * (3 + 5));
      if (t == 0) {
        EXPECT_EQ(r.after_request, -1);
        EXPECT_EQ(r.think_time_s, 0.0);
      } else {
        EXPECT_EQ(r.after_request, static_cast<int64_t>(turns[t - 1]->id));
        EXPECT_EQ(r.think_time_s, 1.5);
      }
      if (t == 2 && third_turn == nullptr) third_turn = &r;
    }
  }
  ASSERT_NE(third_turn, nullptr);
  const RequestSpec& second = reqs[static_cast<size_t>(third_turn->after_request)];
  // A third turn = the second turn's prompt + the second turn's output + a new question.
  std::string t2, t3, out2;
  RenderPrompt(second, FakeOutput, &t2);
  RenderPrompt(*third_turn, FakeOutput, &t3);
  FakeOutput(second.id, 3, &out2);
  EXPECT_EQ(t3.substr(0, t2.size()), t2);
  EXPECT_EQ(t3.substr(t2.size(), out2.size()), out2);
  EXPECT_EQ(t3.size(), 4u * third_turn->prompt_tokens);
}

TEST(RandomWorkloadTest, NothingShared) {
  WorkloadSpec w;
  w.kind = WorkloadKind::kRandom;
  w.input_len = LengthDist::Fixed(64);
  const auto reqs = Generate(w, Constant(100, 200), 2);
  std::set<uint64_t> keys;
  std::set<std::string> first_words;
  std::string text;
  for (const auto& r : reqs) {
    ASSERT_EQ(r.segments.size(), 1u);
    EXPECT_EQ(r.prompt_tokens, 64);
    keys.insert(r.segments[0].key);
    RenderPrompt(r, nullptr, &text);
    first_words.insert(text.substr(0, 16));
  }
  EXPECT_EQ(keys.size(), 200u);
  EXPECT_EQ(first_words.size(), 200u);
}

TEST(ChatRenderTest, ExtentsCoverTheRenderedText) {
  WorkloadSpec w;
  w.kind = WorkloadKind::kMultiTurn;
  w.endpoint = api::Endpoint::kChatCompletions;
  w.system_prompt_len = LengthDist::Fixed(8);
  w.question_len = LengthDist::Fixed(2);
  w.output_len = LengthDist::Fixed(3);
  const auto reqs = Generate(w, Constant(1, 2), 1);
  std::string text;
  std::vector<PrefixExtent> ext;
  RenderPrompt(reqs[1], FakeOutput, &text, &ext);
  ASSERT_EQ(ext.size(), 5u);  // system, user, assistant, user, generation prompt
  size_t total = 0;
  for (const auto& e : ext) total += e.bytes;
  EXPECT_EQ(total, text.size());
  const auto msgs = ChatMessages(reqs[1], FakeOutput);
  ASSERT_EQ(msgs.size(), 4u);
  std::vector<api::ChatMessage> views;
  for (const auto& m : msgs) views.push_back({RoleName(m.role), m.content});
  EXPECT_EQ(api::RenderChat(views), text);
  // The first extent is the whole system message: "<|system|>\n" + 32 bytes + "\n".
  EXPECT_EQ(ext[0].bytes, 11u + 32u + 1u);
}

TEST(OracleTest, BlockGranularLongestPrefix) {
  PrefixOracle o(16, 4);
  const PrefixExtent sys{1, 100 * 4}, q1{2, 30 * 4}, q2{3, 30 * 4};
  std::vector<PrefixExtent> a{sys, q1}, b{sys, q2};
  EXPECT_EQ(o.Observe(a, 130), 0);
  EXPECT_EQ(o.Observe(b, 130), 96);   // 100 common tokens -> 6 blocks
  EXPECT_EQ(o.Observe(a, 130), 128);  // all 130 common, capped at floor(129/16)*16
  std::vector<PrefixExtent> exact{{9, 64 * 4}};
  EXPECT_EQ(o.Observe(exact, 64), 0);
  EXPECT_EQ(o.Observe(exact, 64), 48);  // floor(63/16)*16: last token recomputed
  EXPECT_EQ(o.queried_tokens(), 130 * 3 + 64 * 2);
  EXPECT_EQ(o.hit_tokens(), 96 + 128 + 48);
  EXPECT_DOUBLE_EQ(o.HitRate(), (96.0 + 128 + 48) / (130 * 3 + 128));
  // A prefix of a longer inserted chain also matches.
  std::vector<PrefixExtent> just_sys{sys};
  EXPECT_EQ(o.BestHit(just_sys, 100), 96);
  // Same key, different size: the shorter text is a prefix of the longer one.
  std::vector<PrefixExtent> longer{{1, 120 * 4}};
  EXPECT_EQ(o.BestHit(longer, 120), 96);  // the 100 recorded tokens
  std::vector<PrefixExtent> shorter{{1, 40 * 4}, {7, 40 * 4}};
  EXPECT_EQ(o.BestHit(shorter, 80), 32);  // 40 tokens, then a different segment
  std::vector<PrefixExtent> other{{5, 100 * 4}};
  EXPECT_EQ(o.BestHit(other, 100), 0);
}

}  // namespace
}  // namespace kvroute::workload

namespace kvroute::workload {
namespace {

WorkloadSpec AdapterWorkload(double share, double zipf) {
  WorkloadSpec w;
  w.kind = WorkloadKind::kRandom;
  w.input_len = LengthDist::Fixed(8);
  w.output_len = LengthDist::Fixed(4);
  w.adapters = {4, zipf, share};
  return w;
}

TEST(WorkloadAdapterTest, ShareAndZipfSkewAreHonouredDeterministically) {
  const std::vector<RequestSpec> a = Generate(AdapterWorkload(0.8, 1.0), Constant(100, 20000), 7);
  const std::vector<RequestSpec> b = Generate(AdapterWorkload(0.8, 1.0), Constant(100, 20000), 7);
  std::map<int32_t, int> counts;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].adapter, b[i].adapter);
    ++counts[a[i].adapter];
  }
  EXPECT_NEAR(counts[-1] / 20000.0, 0.2, 0.01);
  // Zipf 1 over 4: weights 1, 1/2, 1/3, 1/4 (sum 25/12) of the 80%.
  const double named = 20000.0 * 0.8;
  EXPECT_NEAR(counts[0] / named, 12.0 / 25, 0.015);
  EXPECT_NEAR(counts[1] / named, 6.0 / 25, 0.015);
  EXPECT_NEAR(counts[2] / named, 4.0 / 25, 0.015);
  EXPECT_NEAR(counts[3] / named, 3.0 / 25, 0.015);
  EXPECT_EQ(AdapterName(3), "adapter-3");
}

TEST(WorkloadAdapterTest, AdaptersDoNotShiftTheOtherDraws) {
  WorkloadSpec plain = AdapterWorkload(0.0, 1.0);
  plain.adapters.count = 0;
  const std::vector<RequestSpec> with = Generate(AdapterWorkload(1.0, 0.0), Constant(10, 50), 3);
  const std::vector<RequestSpec> without = Generate(plain, Constant(10, 50), 3);
  ASSERT_EQ(with.size(), without.size());
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_GE(with[i].adapter, 0);
    EXPECT_EQ(without[i].adapter, -1);
    EXPECT_EQ(with[i].arrival_s, without[i].arrival_s);
    EXPECT_EQ(with[i].segments[0].key, without[i].segments[0].key);
  }
}

TEST(WorkloadAdapterTest, EveryTurnOfAConversationKeepsItsAdapter) {
  WorkloadSpec w;
  w.kind = WorkloadKind::kMultiTurn;
  w.num_groups = 2;
  w.num_prompts_per_group = 3;
  w.max_turns = 4;
  w.adapters = {8, 1.0, 0.5};
  std::map<int64_t, int32_t> by_conversation;
  for (const RequestSpec& r : Generate(w, Constant(10, 100), 5)) {
    auto [it, inserted] = by_conversation.emplace(r.conversation_id, r.adapter);
    EXPECT_EQ(it->second, r.adapter) << "conversation " << r.conversation_id;
  }
  EXPECT_GT(by_conversation.size(), 6u);
}

}  // namespace
}  // namespace kvroute::workload
