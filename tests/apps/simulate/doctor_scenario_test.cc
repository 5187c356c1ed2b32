// `kvroute doctor --scenario-out`'s scenario round trip: a history built from the vLLM
// fixture (advanced over a window, with request-size histograms) becomes YAML that the
// scenario loader accepts and the simulator runs.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "config/scenario_config.h"
#include "apps/doctor/diagnosis/doctor.h"
#include "apps/simulate/simulator.h"
#include "support/test_paths.h"

namespace kvroute::simulate {
namespace {

std::string Fixture() {
  std::ifstream in(
      kvroute::test_support::SourceDir() + "/tests/metrics/testdata/metrics-v0.10-engine-label.txt",
      std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

const std::string kSeries = "{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"";

// The fixture plus request-size histograms: `n` requests, 3/4 with prompts in (1000, 2000]
// and 1/4 in (2000, 5000]; outputs in (20, 50] and (200, 500].
std::string WithSizes(std::string text, double n) {
  const double bounds[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000};
  auto hist = [&](const std::string& name, double split_at, double split_hi) {
    std::string o = "# TYPE " + name + " histogram\n";
    for (double b : bounds) {
      const double c = b < split_at ? 0 : b < split_hi ? n * 0.75 : n;
      o += name + "_bucket" + kSeries + ",le=\"" + std::to_string(b) + "\"} " + std::to_string(c) +
           "\n";
    }
    o += name + "_bucket" + kSeries + ",le=\"+Inf\"} " + std::to_string(n) + "\n";
    o += name + "_count" + kSeries + "} " + std::to_string(n) + "\n";
    o += name + "_sum" + kSeries + "} 0\n";
    return o;
  };
  return text + hist("vllm:request_prompt_tokens", 2000, 5000) +
         hist("vllm:request_generation_tokens", 50, 500);
}

TEST(DoctorScenarioTest, ScenarioFromAFixtureHistoryLoadsAndRuns) {
  const std::string base = Fixture();
  // 30 s later: 300 more requests (10/s), 1.2M more prompt tokens queried, 30% hit.
  std::string later =
      Replace(base, "vllm:request_success_total" + kSeries + ",finished_reason=\"stop\"} 15012.0",
              "vllm:request_success_total" + kSeries + ",finished_reason=\"stop\"} 15312.0");
  later = Replace(later, "vllm:prefix_cache_queries_total" + kSeries + "} 8.2634112e+07",
                  "vllm:prefix_cache_queries_total" + kSeries + "} 8.3834112e+07");
  later = Replace(later, "vllm:prefix_cache_hits_total" + kSeries + "} 5.784384e+06",
                  "vllm:prefix_cache_hits_total" + kSeries + "} 6.144384e+06");
  std::vector<doctor::ReplicaHistory> hs;
  for (const char* name : {"r0", "r1"}) {
    hs.push_back({name,
                  std::string(name) + ":8000",
                  {doctor::ParseScrape(WithSizes(base, 1000), 0),
                   doctor::ParseScrape(WithSizes(later, 1300), 30)}});
    ASSERT_TRUE(hs.back().scrapes[1].garbage.empty()) << hs.back().scrapes[1].garbage[0];
  }
  const doctor::Report report = doctor::Diagnose(hs, doctor::DoctorOptions{});
  ASSERT_EQ(report.fleet.requests_per_s, 20.0);
  std::string error;
  const std::string yaml = doctor::ScenarioYaml(report, hs, &error);
  ASSERT_EQ(error, "");
  config::ConfigOr<config::Scenario> load = config::ParseScenario(yaml, "doctor.yaml", ".");
  ASSERT_TRUE(load.ok()) << load.error.ToString() << "\n" << yaml;
  config::Scenario s = *load.value;
  EXPECT_EQ(s.name, "doctor-observed");
  ASSERT_EQ(s.arrivals.stages.size(), 1u);
  EXPECT_EQ(s.arrivals.stages[0].rate, 20.0);
  EXPECT_EQ(s.arrivals.kind, workload::ArrivalKind::kPoisson);
  EXPECT_EQ(s.arrivals.num_requests, 1200);  // ~60 s
  EXPECT_EQ(s.fleet.replicas, 2);
  EXPECT_EQ(s.fleet.kv_blocks, 26304);
  EXPECT_EQ(s.policies, (std::vector<std::string>{"round-robin", "kvroute"}));
  EXPECT_EQ(s.workload.kind, workload::WorkloadKind::kSharedPrefix);
  EXPECT_EQ(s.workload.num_groups, 4);
  // The shared share is the best hit rate seen: 30% of the mean prompt.
  ASSERT_EQ(s.workload.question_len.components.size(), 2u);
  EXPECT_EQ(s.workload.question_len.components[0].weight, 0.75);
  ASSERT_EQ(s.workload.output_len.components.size(), 2u);
  EXPECT_EQ(s.workload.output_len.components[0].min, 21);
  EXPECT_EQ(s.workload.output_len.components[0].max, 50);

  s.arrivals.num_requests = 40;  // a small run is enough to show it runs
  for (const std::string& policy : {std::string("round-robin"), std::string("kvroute")}) {
    const SimulationResult r = RunSimulation(s, policy, -1);
    ASSERT_EQ(r.error, "") << policy;
    EXPECT_EQ(r.records.size(), 40u) << policy;
    EXPECT_EQ(r.report.succeeded, 40) << policy;
  }
}

TEST(DoctorScenarioTest, WithoutHistogramsOrReuseItIsARandomWorkloadOfMeanLengths) {
  // Old enough vLLM: no request-size histograms. 30 s: 60 requests, 120,000 prompt and
  // 6,000 generation tokens, no prefix hits (so no sharing is assumed).
  const std::string base = Fixture();
  std::string later =
      Replace(base, "vllm:request_success_total" + kSeries + ",finished_reason=\"stop\"} 15012.0",
              "vllm:request_success_total" + kSeries + ",finished_reason=\"stop\"} 15072.0");
  later = Replace(later, "vllm:prompt_tokens_total" + kSeries + "} 8.2634112e+07",
                  "vllm:prompt_tokens_total" + kSeries + "} 8.2754112e+07");
  later = Replace(later, "vllm:generation_tokens_total" + kSeries + "} 1.1730411e+07",
                  "vllm:generation_tokens_total" + kSeries + "} 1.1736411e+07");
  later = Replace(later, "vllm:prefix_cache_queries_total" + kSeries + "} 8.2634112e+07",
                  "vllm:prefix_cache_queries_total" + kSeries + "} 8.2754112e+07");
  std::vector<doctor::ReplicaHistory> hs = {
      {"r0", "r0:8000", {doctor::ParseScrape(base, 0), doctor::ParseScrape(later, 30)}}};
  const doctor::Report report = doctor::Diagnose(hs, doctor::DoctorOptions{});
  std::string error;
  const std::string yaml = doctor::ScenarioYaml(report, hs, &error);
  ASSERT_EQ(error, "");
  config::ConfigOr<config::Scenario> load = config::ParseScenario(yaml, "doctor.yaml", ".");
  ASSERT_TRUE(load.ok()) << load.error.ToString() << "\n" << yaml;
  config::Scenario s = *load.value;
  EXPECT_EQ(s.workload.kind, workload::WorkloadKind::kRandom);
  ASSERT_EQ(s.workload.input_len.components.size(), 1u);
  EXPECT_EQ(s.workload.input_len.components[0].mean, 2000);  // 120,000 / 60
  EXPECT_EQ(s.workload.output_len.components[0].mean, 100);  // 6,000 / 60
  EXPECT_EQ(s.arrivals.num_requests, 120);                   // 2/s for 60 s
  s.arrivals.num_requests = 20;
  const SimulationResult r = RunSimulation(s, "kvroute", -1);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.report.succeeded, 20);
}

}  // namespace
}  // namespace kvroute::simulate
