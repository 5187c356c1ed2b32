// Building every plugin and policy by name, validation errors with lines, and the
// max-score ranking checked against a trivially correct reference.
#include "core/sched/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/profile_scheduler.h"
#include "sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;
using testing::MustBuild;
using testing::Plugin;
using testing::Req;
using testing::SpecOf;

TEST(Registry, BuildsEveryRegisteredPluginByName) {
  ASSERT_GE(PluginTypes().size(), 13u);
  auto eps = MakeEndpoints(3);
  for (std::string_view type : PluginTypes()) {
    SchedulingSpec spec = SpecOf({Plugin(std::string(type))});
    EXPECT_EQ(ValidateSchedulingSpec(spec), std::nullopt) << type;
    auto s = MustBuild(spec);
    ASSERT_NE(s, nullptr) << type;
    PickResult r = s->Pick(Req("some prompt text that is longer than one block of sixty-four "
                               "characters, surely"),
                           eps, 0.0);
    EXPECT_TRUE(r.ok()) << type;
    s->OnDispatched(r.handle, r.ranked[0], 0.0);
    s->OnFinished(r.handle, 1.0);
  }
}

TEST(Registry, BuildsEveryPolicyByName) {
  auto eps = MakeEndpoints(4);
  ASSERT_EQ(PolicyNames().size(), 10u);
  for (std::string_view name : PolicyNames()) {
    BuildResult b = BuildPolicy(name);
    ASSERT_TRUE(b.ok()) << name;
    EXPECT_EQ(b.scheduler->policy(), name);
    PickResult r = b.scheduler->Pick(Req("hello"), eps, 0.0);
    EXPECT_TRUE(r.ok()) << name;
    EXPECT_EQ(r.ranked.size(), 4u) << name;
  }
  BuildResult def = BuildScheduler(SchedulingSpec{});
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def.scheduler->policy(), "kvroute");
  EXPECT_FALSE(BuildPolicy("nope").ok());
}

TEST(Registry, PluginPoliciesHaveSpecs) {
  for (std::string_view name : {"round-robin", "random", "least-request", "gie-default", "kvroute"}) {
    auto spec = PolicyAsSpec(name);
    ASSERT_TRUE(spec.has_value()) << name;
    EXPECT_EQ(ValidateSchedulingSpec(*spec), std::nullopt) << name;
  }
  EXPECT_FALSE(PolicyAsSpec("sglang-cache-aware").has_value());
  auto gie = *PolicyAsSpec("gie-default");
  ASSERT_EQ(gie.profiles[0].plugins.size(), 4u);
  EXPECT_EQ(gie.profiles[0].plugins[0].plugin_ref, "prefix-cache-scorer");
  EXPECT_EQ(gie.profiles[0].plugins[0].weight, 3);
  EXPECT_EQ(gie.profiles[0].plugins[1].weight, 2);
  EXPECT_EQ(gie.profiles[0].plugins[2].weight, 2);
  for (const auto& p : gie.plugins) EXPECT_NE(p.type, "inflight-accounting");
}

// What each plugin type declares (Plugin::role, Plugin::consumed_fields), and the
// scheduler's view of it: a new plugin type fails here until it is listed.
TEST(Registry, EveryPluginDeclaresItsRoleAndConsumedFields) {
  using R = ScorerRole;
  using F = metrics::EngineMetrics;
  constexpr uint32_t kPrediction = F::kWaiting | F::kRunning | F::kKvUsage;
  const std::map<std::string_view, std::pair<R, uint32_t>> declared = {
      {"prefix-cache-scorer", {R::kPrefix, 0}},
      {"precise-prefix-cache-scorer", {R::kPrefix, 0}},
      {"kv-cache-utilization-scorer", {R::kKvCache, 0}},
      {"queue-depth-scorer", {R::kQueue, 0}},
      {"queue-scorer", {R::kQueue, 0}},
      {"running-requests-scorer", {R::kLoad, 0}},
      {"least-request-scorer", {R::kLoad, 0}},
      {"soft-load-scorer", {R::kLoad, 0}},
      {"recent-load-scorer", {R::kOther, 0}},
      {"lora-affinity-scorer", {R::kOther, F::kLora}},
      {"lora-affinity-filter", {R::kOther, F::kLora}},
      {"load-aware-scorer", {R::kLoad, 0}},
      {"swapped-requests-scorer", {R::kOther, F::kSwapped}},
      {"saturation-filter", {R::kOther, 0}},
      {"tpot-guard-filter", {R::kOther, 0}},
      {"locality-filter", {R::kOther, kPrediction}},
      {"inflight-accounting", {R::kOther, 0}},
      {"max-score-picker", {R::kOther, 0}},
      {"slo-headroom-picker", {R::kOther, kPrediction}},
      {"weighted-random-picker", {R::kOther, 0}},
      {"random-picker", {R::kOther, 0}},
      {"round-robin-picker", {R::kOther, 0}},
  };
  EXPECT_EQ(declared.size(), PluginTypes().size());
  for (std::string_view type : PluginTypes()) {
    auto it = declared.find(type);
    ASSERT_NE(it, declared.end()) << type;
    const auto [role, fields] = it->second;
    auto s = MustBuild(SpecOf({Plugin(std::string(type))}));
    auto* profile = dynamic_cast<ProfileScheduler*>(s.get());
    ASSERT_NE(profile, nullptr) << type;
    const auto found = std::find_if(profile->plugins().begin(), profile->plugins().end(),
                                    [&](const sched::Plugin* p) { return p->type() == type; });
    ASSERT_NE(found, profile->plugins().end()) << type;
    EXPECT_EQ((*found)->role(), role) << type;
    EXPECT_EQ((*found)->consumed_fields(), fields) << type;
    EXPECT_EQ(s->consumed_fields(), fields) << type;
    if (dynamic_cast<const Scorer*>(*found) != nullptr) {
      ASSERT_EQ(s->scorer_roles().size(), 1u) << type;
      EXPECT_EQ(s->scorer_roles()[0], role) << type;
    }
  }
}

// A policy's consumed fields are its plugins' union; the dedicated policies read nothing
// from EndpointState::engine.
TEST(Registry, PoliciesReportWhatTheyConsume) {
  using F = metrics::EngineMetrics;
  constexpr uint32_t kPrediction = F::kWaiting | F::kRunning | F::kKvUsage;
  SchedulerOptions regional;
  regional.region = "us";
  const std::vector<std::tuple<std::string_view, bool, uint32_t>> cases = {
      {"round-robin", false, 0},
      {"random", false, 0},
      {"least-request", false, 0},
      {"gie-default", false, 0},
      {"sglang-cache-aware", false, 0},
      {"dynamo-cost", false, 0},
      {"dynamo-kv", false, 0},
      {"llm-d-sticky", false, 0},
      {"llm-d-precise", false, 0},
      {"kvroute", false, F::kLora},
      {"kvroute", true, F::kLora | kPrediction},
      {"kvroute-region-blind", true, F::kLora},
      {"kvroute-slo", false, F::kLora | kPrediction},
      {"kvroute-lora-blind", false, 0},
      {"kvroute-blend", false, F::kLora},
      {"kvroute-blend", true, F::kLora | kPrediction},
  };
  for (const auto& [policy, region, fields] : cases) {
    BuildResult b = BuildPolicy(policy, region ? regional : SchedulerOptions{});
    ASSERT_TRUE(b.ok()) << policy;
    EXPECT_EQ(b.scheduler->consumed_fields(), fields) << policy << " region " << region;
  }
  using R = ScorerRole;
  BuildResult gie = BuildPolicy("gie-default");
  EXPECT_EQ(std::vector<R>(gie.scheduler->scorer_roles().begin(),
                           gie.scheduler->scorer_roles().end()),
            (std::vector<R>{R::kPrefix, R::kKvCache, R::kQueue}));
  BuildResult kv = BuildPolicy("kvroute");
  EXPECT_EQ(std::vector<R>(kv.scheduler->scorer_roles().begin(),
                           kv.scheduler->scorer_roles().end()),
            (std::vector<R>{R::kPrefix, R::kKvCache, R::kLoad, R::kOther, R::kOther}));
}

// The old blend stays available by name (issue 43): kvroute without its tpot-guard-filter
// is the blend, plugin for plugin and weight for weight, with or without a region; the
// measured variants add soft load by slowness (kvroute-speed-aware) and by work as well
// (kvroute-token-aware).
TEST(Registry, KvrouteBlendIsKvrouteWithoutTheGuard) {
  auto without_guard = [](SchedulingSpec spec) {
    std::erase_if(spec.plugins, [](const PluginSpec& p) { return p.type == "tpot-guard-filter"; });
    std::erase_if(spec.profiles[0].plugins,
                  [](const ProfilePluginRef& r) { return r.plugin_ref == "tpot-guard-filter"; });
    return spec;
  };
  auto without_param = [](SchedulingSpec spec, const std::string& param) {
    for (PluginSpec& p : spec.plugins) {
      if (p.type == "soft-load-scorer") p.parameters.erase(param);
    }
    return spec;
  };
  auto same = [](const SchedulingSpec& a, const SchedulingSpec& b) {
    ASSERT_EQ(a.plugins.size(), b.plugins.size());
    for (size_t i = 0; i < a.plugins.size(); ++i) {
      EXPECT_EQ(a.plugins[i].type, b.plugins[i].type);
      EXPECT_EQ(a.plugins[i].parameters, b.plugins[i].parameters);
    }
    ASSERT_EQ(a.profiles.size(), 1u);
    ASSERT_EQ(b.profiles.size(), 1u);
    ASSERT_EQ(a.profiles[0].plugins.size(), b.profiles[0].plugins.size());
    for (size_t i = 0; i < a.profiles[0].plugins.size(); ++i) {
      EXPECT_EQ(a.profiles[0].plugins[i].plugin_ref, b.profiles[0].plugins[i].plugin_ref);
      EXPECT_EQ(a.profiles[0].plugins[i].weight, b.profiles[0].plugins[i].weight);
    }
  };
  for (bool region : {false, true}) {
    SchedulerOptions o;
    if (region) o.region = "us";
    const auto k = PolicyAsSpec("kvroute", o);
    const auto blend = PolicyAsSpec("kvroute-blend", o);
    const auto speed = PolicyAsSpec("kvroute-speed-aware", o);
    const auto token = PolicyAsSpec("kvroute-token-aware", o);
    ASSERT_TRUE(k && blend && speed && token);
    // kvroute: the guard right after the saturation filter.
    EXPECT_EQ(k->plugins.size(), blend->plugins.size() + 1);
    const size_t at = region ? 3 : 2;
    EXPECT_EQ(k->plugins[at].type, "tpot-guard-filter");
    EXPECT_EQ(k->plugins[at - 1].type, "saturation-filter");
    EXPECT_EQ(k->profiles[0].plugins[at - 1].plugin_ref, "tpot-guard-filter");
    same(without_guard(*k), *blend);
    same(*k, without_param(*speed, "speedAware"));
    same(*speed, without_param(*token, "tokenAware"));
    EXPECT_EQ(region, k->plugins[0].type == "locality-filter");
  }
  for (std::string_view name : PolicyNames()) EXPECT_NE(name, "kvroute-blend");
}

TEST(Registry, InflightAccountingOnlyWhereWanted) {
  auto eps = MakeEndpoints(2);
  // With the marker, a dispatched request raises its endpoint's waiting before any
  // scrape; without it (gie-default), it does not.
  for (bool with : {true, false}) {
    std::vector<PluginSpec> plugins{Plugin("queue-scorer")};
    if (with) plugins.push_back(Plugin("inflight-accounting"));
    auto s = MustBuild(SpecOf(plugins));
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    s->OnDispatched(r.handle, 0, 0.0);
    r = s->Pick(Req("x"), eps, 0.1);
    EXPECT_DOUBLE_EQ(r.Score(0, 0), with ? 0.0 : 1.0);
  }
}

SchedulingSpec LinedSpec() {
  SchedulingSpec s;
  PluginSpec a = Plugin("prefix-cache-scorer", {{"blockSize", 64.0}});
  a.line = 2;
  PluginSpec b = Plugin("kv-cache-utilization-scorer");
  b.line = 4;
  s.plugins = {a, b};
  ProfileSpec prof;
  prof.line = 6;
  prof.plugins = {{"prefix-cache-scorer", 3, 8}, {"kv-cache-utilization-scorer", 2, 10}};
  s.profiles = {prof};
  return s;
}

TEST(Validate, AcceptsAGoodSpec) { EXPECT_EQ(ValidateSchedulingSpec(LinedSpec()), std::nullopt); }

TEST(Validate, UnknownPluginTypeWithLine) {
  SchedulingSpec s = LinedSpec();
  s.plugins[1].type = "kv-cache-utilisation-scorer";
  auto err = ValidateSchedulingSpec(s);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->line, 4);
  EXPECT_EQ(err->field, "plugins[1].type");
  EXPECT_NE(err->message.find("unknown plugin type 'kv-cache-utilisation-scorer'"),
            std::string::npos);
  EXPECT_FALSE(BuildScheduler(s).ok());
  EXPECT_EQ(BuildScheduler(s).error->line, 4);
}

TEST(Validate, DanglingPluginRefWithLine) {
  SchedulingSpec s = LinedSpec();
  s.profiles[0].plugins[1].plugin_ref = "queue-scorer";
  auto err = ValidateSchedulingSpec(s);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->line, 10);
  EXPECT_EQ(err->field, "schedulingProfiles[0].plugins[1].pluginRef");
}

TEST(Validate, NegativeWeightWithLine) {
  SchedulingSpec s = LinedSpec();
  s.profiles[0].plugins[0].weight = -1;
  auto err = ValidateSchedulingSpec(s);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->line, 8);
  EXPECT_EQ(err->field, "schedulingProfiles[0].plugins[0].weight");
}

TEST(Validate, BadParameters) {
  struct Case {
    std::string name;
    ParamValue value;
    std::string field;
  };
  for (const Case& c : std::vector<Case>{
           {"blockSize", -1.0, "plugins[0].parameters.blockSize"},
           {"blockSize", 0.0, "plugins[0].parameters.blockSize"},
           {"blockSize", 2.5, "plugins[0].parameters.blockSize"},
           {"blockSize", std::string("big"), "plugins[0].parameters.blockSize"},
           {"blocksize", 64.0, "plugins[0].parameters.blocksize"},
       }) {
    SchedulingSpec s = LinedSpec();
    s.plugins[0].parameters = {{c.name, c.value}};
    auto err = ValidateSchedulingSpec(s);
    ASSERT_TRUE(err.has_value()) << c.name;
    EXPECT_EQ(err->line, 2);
    EXPECT_EQ(err->field, c.field);
  }
  SchedulingSpec s = LinedSpec();
  s.plugins[1].parameters = {{"x", 1.0}};
  auto err = ValidateSchedulingSpec(s);
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->message.find("takes none"), std::string::npos);
}

TEST(Validate, StructuralErrors) {
  {
    SchedulingSpec s = LinedSpec();
    s.plugins[1].type = "prefix-cache-scorer";  // same default name twice
    auto err = ValidateSchedulingSpec(s);
    ASSERT_TRUE(err);
    EXPECT_EQ(err->field, "plugins[1].name");
  }
  {
    SchedulingSpec s = LinedSpec();
    s.policy = "kvroute";
    auto err = ValidateSchedulingSpec(s);
    ASSERT_TRUE(err);
    EXPECT_EQ(err->field, "policy");
  }
  {
    SchedulingSpec s;
    s.policy = "fastest";
    auto err = ValidateSchedulingSpec(s);
    ASSERT_TRUE(err);
    EXPECT_EQ(err->field, "policy");
  }
  {
    SchedulingSpec s = LinedSpec();
    PluginSpec p1 = Plugin("max-score-picker");
    p1.line = 20;
    PluginSpec p2 = Plugin("random-picker");
    p2.line = 21;
    s.plugins.push_back(p1);
    s.plugins.push_back(p2);
    s.profiles[0].plugins.push_back({"max-score-picker", 1, 22});
    s.profiles[0].plugins.push_back({"random-picker", 1, 23});
    auto err = ValidateSchedulingSpec(s);
    ASSERT_TRUE(err);
    EXPECT_EQ(err->line, 21);
  }
  {
    SchedulingSpec s = LinedSpec();
    s.profiles.push_back(ProfileSpec{"second", {}, 30});
    auto err = ValidateSchedulingSpec(s);
    ASSERT_TRUE(err);
    EXPECT_EQ(err->line, 30);
  }
}

TEST(Validate, NoProfileUsesEveryPluginWithWeightOne) {
  SchedulingSpec s = LinedSpec();
  s.profiles.clear();
  auto sched = MustBuild(s);
  auto eps = MakeEndpoints(2);
  PickResult r = sched->Pick(Req("x"), eps, 0.0);
  ASSERT_EQ(r.weights.size(), 2u);
  EXPECT_EQ(r.weights[0], 1.0);
  EXPECT_EQ(r.weights[1], 1.0);
}

// The full weighted-scorer pipeline on random endpoint states (with many ties) against a
// reference that computes the formulas directly and sorts.
TEST(MaxScorePicker, MatchesReferenceOnRandomStates) {
  Rng gen(2024);
  SchedulerOptions o;
  o.max_ranked = 0;  // rank everything
  o.seed = 99;
  auto s = MustBuild(SpecOf({Plugin("kv-cache-utilization-scorer"), Plugin("queue-scorer"),
                             Plugin("max-score-picker")},
                            {2.0, 1.0, 1.0}),
                     o);
  std::vector<int> first_counts(3, 0);
  for (int iter = 0; iter < 500; ++iter) {
    const size_t n = 1 + gen.Below(30);
    auto eps = MakeEndpoints(n);
    for (auto& e : eps) {
      e.kv_usage = 0.25 * static_cast<double>(gen.Below(4));
      e.waiting = static_cast<double>(gen.Below(4));
      e.healthy = gen.Below(8) != 0;
    }
    // Reference.
    std::vector<uint32_t> healthy;
    double qmin = 1e9, qmax = -1e9;
    for (auto& e : eps) {
      if (!e.healthy) continue;
      healthy.push_back(e.id);
      qmin = std::min(qmin, e.waiting);
      qmax = std::max(qmax, e.waiting);
    }
    auto total = [&](uint32_t id) {
      const EndpointState& e = eps[id];
      const double kv = 1.0 - e.kv_usage;
      const double q = qmax > qmin ? (qmax - e.waiting) / (qmax - qmin) : 1.0;
      return 2.0 * kv + 1.0 * q;
    };
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    if (healthy.empty()) {
      EXPECT_EQ(r.status, PickStatus::kNoHealthyEndpoint);
      continue;
    }
    ASSERT_TRUE(r.ok());
    std::vector<double> expected;
    for (uint32_t id : healthy) expected.push_back(total(id));
    std::sort(expected.rbegin(), expected.rend());
    ASSERT_EQ(r.ranked.size(), healthy.size());
    std::vector<uint32_t> ids(r.ranked.begin(), r.ranked.end());
    std::vector<uint32_t> sorted_ids = ids;
    std::sort(sorted_ids.begin(), sorted_ids.end());
    EXPECT_EQ(sorted_ids, healthy);  // a permutation of the healthy endpoints
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_NEAR(total(ids[i]), expected[i], 1e-12) << "iter " << iter << " rank " << i;
    }
    s->OnFinished(r.handle, 0.0);
  }
  // Ties are broken at random: three identical endpoints each win sometimes.
  auto eps = MakeEndpoints(3);
  for (int i = 0; i < 300; ++i) {
    PickResult r = s->Pick(Req("x"), eps, 0.0);
    first_counts[r.ranked[0]]++;
    s->OnFinished(r.handle, 0.0);
  }
  for (int c : first_counts) EXPECT_GT(c, 60);
}

TEST(RankByMaxScore, TopKOfReference) {
  Rng gen(5);
  Rng rng(6);
  std::vector<uint32_t> scratch, ranked;
  std::vector<uint64_t> tiebreak;
  for (int iter = 0; iter < 300; ++iter) {
    const size_t n = 1 + gen.Below(40);
    const size_t k = gen.Below(6);
    std::vector<double> totals(n);
    for (auto& t : totals) t = static_cast<double>(gen.Below(5));
    RankByMaxScore(totals, k, rng, scratch, tiebreak, ranked);
    std::vector<double> ref = totals;
    std::sort(ref.rbegin(), ref.rend());
    const size_t want = k == 0 ? n : std::min(k, n);
    ASSERT_EQ(ranked.size(), want);
    std::vector<uint32_t> uniq = ranked;
    std::sort(uniq.begin(), uniq.end());
    EXPECT_EQ(std::unique(uniq.begin(), uniq.end()), uniq.end());
    for (size_t i = 0; i < want; ++i) EXPECT_EQ(totals[ranked[i]], ref[i]);
  }
}

}  // namespace
}  // namespace kvroute::sched
