#include "simkit/suite/generator.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "config/scenario_config.h"
#include "support/test_paths.h"

namespace kvroute::suite {
namespace {

GeneratorOptions Options(uint64_t seed, int count) {
  GeneratorOptions o;
  o.seed = seed;
  o.count = count;
  o.traces = {kvroute::test_support::SourceDir() + "/examples/traces/mooncake-synthetic.jsonl"};
  return o;
}

TEST(GeneratorTest, TheSameSeedGivesTheSameSuiteAndAnotherSeedAnother) {
  const std::vector<GeneratedScenario> a = Generate(Options(1, 20)), b = Generate(Options(1, 20)),
                                       c = Generate(Options(2, 20));
  ASSERT_EQ(a.size(), 20u);
  int same_as_c = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].yaml, b[i].yaml) << i;
    EXPECT_EQ(a[i].name, b[i].name);
    same_as_c += a[i].yaml == c[i].yaml ? 1 : 0;
  }
  EXPECT_EQ(same_as_c, 0);
  // A longer suite begins with the shorter one (scenario i depends on seed and i alone).
  const std::vector<GeneratedScenario> longer = Generate(Options(1, 30));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(longer[i].yaml, a[i].yaml);
}

TEST(GeneratorTest, SixtyScenariosParseAndCoverEveryFamilyAndRegime) {
  const std::vector<GeneratedScenario> gen = Generate(Options(1, 60));
  std::map<std::string, int> families;
  std::set<std::string> regimes;
  int min_replicas = 1000, max_replicas = 0, faulted = 0, hetero = 0;
  for (const GeneratedScenario& g : gen) {
    config::ConfigOr<config::Scenario> sc = config::ParseScenario(g.yaml, g.name, ".");
    ASSERT_TRUE(sc.ok()) << g.name << ": " << sc.error.ToString() << "\n" << g.yaml;
    EXPECT_EQ(sc.value->name, g.name);
    ++families[g.family];
    regimes.insert(g.regime.substr(0, g.regime.find_first_of("-+")));
    int replicas = sc.value->fleet.replicas;
    if (!sc.value->fleet.groups.empty()) {
      replicas = 0;
      for (const auto& grp : sc.value->fleet.groups) replicas += grp.replicas;
      hetero += sc.value->fleet.groups.size() > 1 ? 1 : 0;
    }
    min_replicas = std::min(min_replicas, replicas);
    max_replicas = std::max(max_replicas, replicas);
    EXPECT_GE(replicas, 2) << g.name;
    EXPECT_LE(replicas, 64) << g.name;
    faulted += sc.value->faults.empty() ? 0 : 1;
  }
  for (const char* f : {"chat", "hot-prefix", "multi-turn", "agentic", "no-sharing", "lora", "trace"}) {
    EXPECT_GT(families[f], 0) << f;
  }
  EXPECT_EQ(regimes, (std::set<std::string>{"steady", "burst", "ramp", "scaled"}));
  EXPECT_LE(min_replicas, 4);
  EXPECT_GE(max_replicas, 32);
  EXPECT_GT(faulted, 0);
  EXPECT_GT(hetero, 0);
}

TEST(GeneratorTest, WithoutTracesThereIsNoTraceFamily) {
  GeneratorOptions o = Options(3, 40);
  o.traces.clear();
  for (const GeneratedScenario& g : Generate(o)) EXPECT_NE(g.family, "trace") << g.name;
}

TEST(EstimateCapacityTest, MoreReuseMoreAndLongerOutputsFewerRequestsAndKvBoundsTheBatch) {
  const double base = EstimateCapacity(2000, 200, 0.0, 26304);
  EXPECT_GT(base, 0.0);
  EXPECT_GT(EstimateCapacity(2000, 200, 0.9, 26304), base);
  EXPECT_LT(EstimateCapacity(2000, 400, 0.0, 26304), base);
  // 2,048 blocks hold 32,768 tokens: 14 sequences of 2,200 tokens, not 191.
  EXPECT_LT(EstimateCapacity(2000, 200, 0.0, 2048), base);
  EXPECT_EQ(EstimateCapacity(2000, 200, 0.0, 2048), EstimateCapacity(2000, 200, 0.0, 2049));
}

}  // namespace
}  // namespace kvroute::suite
