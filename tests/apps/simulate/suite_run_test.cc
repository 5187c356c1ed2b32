// `kvroute simulate --suite`: the ratio to the best peer, the summary, the tables, and a
// small generated suite run end to end on the routing core.
#include "apps/simulate/suite_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "config/scenario_config.h"
#include "config/suite_config.h"
#include "support/test_paths.h"

namespace kvroute::simulate {
namespace {

// `good` requests met both objectives; goodput a second is deliberately unrelated (a
// straggler's span): the suite compares the counts.
report::PolicyReport P(std::string name, int64_t good, double hit = 0.5, double p99 = 0.1) {
  report::PolicyReport r;
  r.policy = std::move(name);
  r.good = good;
  r.goodput_requests_per_s = 1000.0 / static_cast<double>(good);
  r.prefix_hit_rate = hit;
  r.ttft_s.p99 = p99;
  return r;
}

SuiteResult Constructed() {
  SuiteResult s;
  s.name = "t";
  s.policies = {"round-robin", "llm-d-sticky", "kvroute"};
  s.runs.push_back({"a", "file", "", {P("round-robin", 100), P("llm-d-sticky", 200), P("kvroute", 220)}});
  s.runs.push_back({"b", "chat steady", "", {P("round-robin", 1000), P("llm-d-sticky", 800), P("kvroute", 995)}});
  s.runs.push_back({"c", "file", "scenario did not load", {}});
  return s;
}

TEST(SuiteSummaryTest, RatiosAreToTheBestPeerOtherThanThePolicyItself) {
  const SuiteResult s = Constructed();
  EXPECT_DOUBLE_EQ(*RatioToBestPeer(s.runs[0], "kvroute"), 220.0 / 200.0);
  EXPECT_DOUBLE_EQ(*RatioToBestPeer(s.runs[0], "llm-d-sticky"), 200.0 / 100.0);  // itself excluded
  EXPECT_DOUBLE_EQ(*RatioToBestPeer(s.runs[1], "kvroute"), 995.0 / 1000.0);
  EXPECT_FALSE(RatioToBestPeer(s.runs[2], "kvroute").has_value());
  const std::vector<PolicySummary> sum = SummarizeSuite(s);
  ASSERT_EQ(sum.size(), 3u);
  const PolicySummary& k = sum[2];
  EXPECT_EQ(k.policy, "kvroute");
  EXPECT_EQ(k.runs, 2);
  EXPECT_DOUBLE_EQ(k.worst, 0.995);
  EXPECT_DOUBLE_EQ(k.geomean, std::sqrt(1.1 * 0.995));
  EXPECT_EQ(k.within_1pct, 2);
  EXPECT_EQ(k.ahead_10pct, 1);
  EXPECT_EQ(k.behind_1pct, 0);
  EXPECT_EQ(sum[1].worst, 0.8);  // llm-d-sticky in b: 8 / 10
  EXPECT_EQ(sum[1].behind_1pct, 1);
}

TEST(SuiteSummaryTest, MarkdownHasTheSummaryAndTheReferencesRows) {
  const std::string md = SuiteMarkdown(Constructed(), "kvroute", false);
  EXPECT_EQ(md.substr(0, md.find("\n\n")), "## Suite t: 3 scenarios (2 ran) x 3 policies");
  EXPECT_NE(md.find("| kvroute | 2 | 0.995 | 1.046 | 2 | 1 | 0 |\n"), std::string::npos) << md;
  EXPECT_NE(md.find("| a | file | llm-d-sticky | 200 | 220 | 1.100 | 50.0% / 50.0% | 100 ms / 100 ms |\n"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| c | file | error: scenario did not load | | | | | |\n"), std::string::npos) << md;
  EXPECT_EQ(md.find("Every policy per scenario"), std::string::npos);
  EXPECT_NE(SuiteMarkdown(Constructed(), "kvroute", true).find("#### b (chat steady)"), std::string::npos);
  const std::string json = SuiteJson(Constructed());
  EXPECT_NE(json.find("{\"name\": \"c\", \"kind\": \"file\", \"error\": \"scenario did not load\", \"policies\": {}}"),
            std::string::npos)
      << json;
}

TEST(SuiteRunTest, WritesEachGeneratedScenarioAsAFileThatLoadsAlone) {
  config::ConfigOr<config::SuiteSpec> spec = config::ParseSuite(
      "name: w\n"
      "generate: {count: 4, seed: 7, min_requests: 50, max_requests: 60}\n"
      "policies: [round-robin, kvroute]\n",
      "w.yaml", ".");
  ASSERT_TRUE(spec.ok()) << spec.error.ToString();
  const std::string dir = ::testing::TempDir() + "/suite-write";
  std::vector<std::string> written;
  ASSERT_TRUE(WriteSuiteScenarios(*spec.value, std::optional<uint64_t>(9), dir, &written).ok());
  ASSERT_EQ(written.size(), 4u);
  for (const std::string& path : written) {
    EXPECT_NE(path.find("/gen-9-"), std::string::npos) << path;  // the seed given wins
    config::ConfigOr<config::Scenario> sc = config::LoadScenarioFile(path);
    ASSERT_TRUE(sc.ok()) << path << ": " << sc.error.ToString();
    EXPECT_EQ(sc.value->policies, (std::vector<std::string>{"round-robin", "kvroute"}));
    EXPECT_EQ(dir + "/" + sc.value->name + ".yaml", path);
  }
  config::ConfigOr<config::SuiteSpec> files_only =
      config::ParseSuite("name: f\nscenarios: [a.yaml]\n", "f.yaml", ".");
  ASSERT_TRUE(files_only.ok()) << files_only.error.ToString();
  const Status none = WriteSuiteScenarios(*files_only.value, std::nullopt, dir, &written);
  EXPECT_FALSE(none.ok());
  EXPECT_EQ(none.message(), "the suite generates no scenario");
}

TEST(SuiteRunTest, RunsFilesAndGeneratedScenariosUnderEveryPolicy) {
  const std::string dir = kvroute::test_support::SourceDir() + "/examples";
  config::ConfigOr<config::SuiteSpec> spec = config::ParseSuite(
      "name: tiny\n"
      "scenarios: [scenarios/faults.yaml, scenarios/missing.yaml]\n"
      "generate: {count: 2, seed: 7, min_requests: 100, max_requests: 150}\n"
      "policies: [round-robin, kvroute]\n",
      "tiny.yaml", dir);
  ASSERT_TRUE(spec.ok()) << spec.error.ToString();
  const SuiteResult r = RunSuite(*spec.value, std::nullopt, {}, false);
  ASSERT_EQ(r.runs.size(), 4u);
  EXPECT_EQ(r.runs[0].scenario, "faults");
  EXPECT_EQ(r.runs[0].error, "");
  ASSERT_EQ(r.runs[0].reports.size(), 2u);
  EXPECT_EQ(r.runs[0].reports[1].policy, "kvroute");
  EXPECT_NE(r.runs[1].error.find("missing.yaml"), std::string::npos) << r.runs[1].error;
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_EQ(r.runs[i].error, "") << r.runs[i].scenario;
    EXPECT_EQ(r.runs[i].scenario.rfind("gen-7-0" + std::to_string(i - 2) + "-", 0), 0u) << r.runs[i].scenario;
    ASSERT_EQ(r.runs[i].reports.size(), 2u);
    EXPECT_GE(r.runs[i].reports[0].requests, 100);
    EXPECT_LE(r.runs[i].reports[0].requests, 150);
  }
  // --suite-seed: another generated pair, the files unchanged.
  const SuiteResult other = RunSuite(*spec.value, uint64_t{8}, {"kvroute"}, false);
  EXPECT_EQ(other.policies, std::vector<std::string>{"kvroute"});
  EXPECT_EQ(other.runs[2].scenario.rfind("gen-8-00-", 0), 0u);
}

TEST(SuiteConfigTest, ErrorsNameTheLineAndField) {
  auto err = [](std::string_view y) { return config::ParseSuite(y, "s.yaml", ".").error.ToString(); };
  EXPECT_EQ(err("name: x\n"), "s.yaml:1: a suite needs scenarios, generate or both");
  EXPECT_EQ(err("generate: {count: 0}\n").rfind("s.yaml:1: generate.count: ", 0), 0u) << err("generate: {count: 0}\n");
  EXPECT_EQ(err("generate:\n  min_requests: 10\n  max_requests: 5\n"),
            "s.yaml:2: generate: max_requests must be >= min_requests");
  EXPECT_EQ(err("scenarios: [a.yaml]\npolicy: [x]\n").rfind("s.yaml:2: policy: unknown key", 0), 0u);
}

}  // namespace
}  // namespace kvroute::simulate
