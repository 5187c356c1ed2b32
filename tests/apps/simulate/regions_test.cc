// kvroute simulate with several regions (issue 10): fleet.groups, the router's region,
// symmetric network delay, local-only runs, requests by region, the shipped scenarios.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "config/scenario_config.h"
#include "core/sched/dynamo_cost.h"
#include "apps/simulate/simulator.h"
#include "testdata.h"
#include "support/test_paths.h"

namespace kvroute::simulate {
namespace {

using config::Scenario;
using testing::MustParse;

// One request alone on one replica `delay` away: nothing else shares its steps.
Scenario OneRequest(double delay) {
  return MustParse(
      "workload: {type: random, input_len: 300, output_len: 20}\n"
      "arrivals: {process: constant, rate: 1, num_requests: 1}\n"
      "fleet:\n  groups:\n    - {replicas: 1, region: far, network_delay_s: " +
      std::to_string(delay) + "}\n");
}

TEST(RegionsTest, NetworkDelayAppliesOnTheRequestAndTheResponsePath) {
  const double d = 0.0625;
  SimulationResult near = RunSimulation(OneRequest(0.0), "round-robin", -1);
  SimulationResult far = RunSimulation(OneRequest(d), "round-robin", -1);
  ASSERT_EQ(near.error, "");
  ASSERT_EQ(far.records.size(), 1u);
  ASSERT_EQ(near.records.size(), 1u);
  const report::RequestRecord& a = near.records[0];
  const report::RequestRecord& b = far.records[0];
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  // There (the request reaches the engine d later) and back (the first token, and every
  // streamed token after it, reach the router d after their step). Exact but for the
  // rounding of the sums of virtual times.
  EXPECT_NEAR(b.ttft_s - a.ttft_s, 2 * d, 1e-12);
  EXPECT_NEAR(b.e2e_s - a.e2e_s, 2 * d, 1e-12);
  EXPECT_NEAR(b.max_itl_s, a.max_itl_s, 1e-12);  // the stream itself is only shifted
  EXPECT_EQ(b.output_tokens, a.output_tokens);
}

// Two regions, round-robin, no faults: 3 local replicas, 1 remote one.
const char* kTwoRegions = R"(
workload: {type: random, input_len: 200, output_len: 20}
arrivals: {process: constant, rate: 20, num_requests: 400}
fleet:
  kv_blocks: 2000
  groups:
    - {replicas: 3, region: us-east, zone: us-east-1a, network_delay_s: 0.0005}
    - {replicas: 1, region: eu-west, network_delay_s: 0.035}
router: {region: us-east}
)";

// Records the labels of every endpoint the scheduler is shown, into `seen` (the core owns
// the scheduler and destroys it with the run; the test owns what it saw).
struct SeenLabels {
  std::map<uint32_t, std::vector<std::pair<std::string, std::string>>> labels;
  std::map<uint32_t, std::string> regions;  // region/zone as the scheduler reads them
};
struct LabelRecorder : sched::DynamoCostScheduler {
  LabelRecorder(const sched::SchedulerOptions& o, SeenLabels* seen)
      : DynamoCostScheduler(Config{}, o), seen(seen) {}
  sched::PickResult Pick(const sched::SchedRequest& req,
                         std::span<const sched::EndpointState> endpoints, double now_s) override {
    for (const sched::EndpointState& e : endpoints) {
      seen->labels[e.id] = e.labels;
      seen->regions[e.id] = e.region + "/" + e.zone;
    }
    return DynamoCostScheduler::Pick(req, endpoints, now_s);
  }
  SeenLabels* seen;
};

TEST(RegionsTest, ReplicasCarryTheirGroupsRegionAndZoneLabels) {
  Scenario s = MustParse(kTwoRegions);
  SeenLabels rec;
  routing::CoreOptions options = SimulationCoreOptions(s, "dynamo-cost");
  options.scheduler_factory = [&](const sched::SchedulerOptions& o) {
    return std::make_unique<LabelRecorder>(o, &rec);
  };
  SimulationResult r = RunSimulationWith(s, options, "dynamo-cost", -1);
  ASSERT_EQ(r.error, "");
  using Labels = std::vector<std::pair<std::string, std::string>>;
  ASSERT_EQ(rec.labels.size(), 4u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rec.labels[i], (Labels{{"region", "us-east"}, {"zone", "us-east-1a"}})) << i;
  }
  EXPECT_EQ(rec.labels[3], (Labels{{"region", "eu-west"}}));
  EXPECT_EQ(rec.regions[0], "us-east/us-east-1a");
  EXPECT_EQ(rec.regions[3], "eu-west/");
}

// The router's region and each remote region's round trip (twice its one-way delay) reach
// the scheduler's options; a region-blind scenario sets neither.
TEST(RegionsTest, SchedulerOptionsCarryTheRouterRegionAndRoundTrips) {
  Scenario s = MustParse(R"(
workload: {type: random, input_len: 20, output_len: 2}
arrivals: {process: constant, rate: 10, num_requests: 10}
fleet:
  groups:
    - {replicas: 1, region: a, network_delay_s: 0.001}
    - {replicas: 1, region: b, network_delay_s: 0.035}
    - {replicas: 1, region: c, network_delay_s: 0.075}
    - {replicas: 1, region: b, network_delay_s: 0.040}
    - {replicas: 1}
router: {region: a}
)");
  const routing::CoreOptions o = SimulationCoreOptions(s, "kvroute");
  EXPECT_EQ(o.region, "a");
  using Rtts = std::vector<std::pair<std::string, double>>;
  EXPECT_EQ(o.region_rtt_s, (Rtts{{"b", 0.080}, {"c", 0.150}}));
  Scenario blind = MustParse(kTwoRegions);
  blind.router_region.clear();
  EXPECT_EQ(SimulationCoreOptions(blind, "kvroute").region, "");
  EXPECT_TRUE(SimulationCoreOptions(blind, "kvroute").region_rtt_s.empty());
}

TEST(RegionsTest, RequestsByRegionAddUp) {
  Scenario s = MustParse(kTwoRegions);
  SimulationResult r = RunSimulation(s, "round-robin", -1);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.report.requests, 400);
  const std::vector<report::RegionReport>& rows = r.report.regions;
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].region, "us-east");
  EXPECT_TRUE(rows[0].local);
  EXPECT_EQ(rows[0].replicas, 3);
  EXPECT_EQ(rows[1].region, "eu-west");
  EXPECT_FALSE(rows[1].local);
  EXPECT_EQ(rows[1].replicas, 1);
  // Round-robin over 4 replicas: 3 of 4 requests stay local.
  EXPECT_EQ(rows[0].requests, 300);
  EXPECT_EQ(rows[1].requests, 100);
  EXPECT_EQ(rows[0].requests + rows[1].requests, r.report.requests);
  EXPECT_EQ(rows[0].succeeded + rows[1].succeeded, r.report.succeeded);
  EXPECT_DOUBLE_EQ(rows[0].share + rows[1].share, 1.0);
  // The remote replica's first tokens come 2 x 35 ms later than a local one's.
  EXPECT_GT(rows[1].ttft_p50_s, rows[0].ttft_p50_s + 2 * (0.035 - 0.0005) - 1e-9);
  int64_t remote = 0;
  for (const report::RequestRecord& rec : r.records) remote += rec.endpoint == 3;
  EXPECT_EQ(remote, rows[1].requests);
  // No region anywhere: no rows.
  Scenario flat = MustParse(
      "workload: {type: random, input_len: 20, output_len: 2}\n"
      "arrivals: {process: constant, rate: 10, num_requests: 10}\nfleet: {replicas: 2}\n");
  EXPECT_TRUE(RunSimulation(flat, "round-robin", -1).report.regions.empty());
}

TEST(RegionsTest, LocalOnlyRemovesTheRemoteGroups) {
  Scenario s = MustParse(std::string(kTwoRegions) +
                         "faults:\n"
                         "  - {replica: 3, kind: crash, at: 1s, duration: 1s}\n"
                         "  - {replica: 2, kind: slow, at: 1s, duration: 1s, factor: 2}\n");
  EXPECT_TRUE(IsLocalOnly("local-only"));
  EXPECT_TRUE(IsLocalOnly("round-robin+local-only"));
  EXPECT_TRUE(IsLocalOnly("round-robin+local-only+flow"));
  EXPECT_FALSE(IsLocalOnly("round-robin+flow"));
  EXPECT_EQ(BasePolicy("local-only"), "kvroute");
  EXPECT_EQ(BasePolicy("local-only+flow"), "kvroute");
  EXPECT_EQ(BasePolicy("round-robin+local-only+flow"), "round-robin");
  EXPECT_EQ(BasePolicy("gie-default"), "gie-default");

  Scenario local;
  ASSERT_TRUE(LocalOnlyScenario(s, &local).ok());
  EXPECT_EQ(local.fleet.replicas, 3);
  ASSERT_EQ(local.fleet.groups.size(), 1u);
  EXPECT_EQ(local.fleet.groups[0].region, "us-east");
  ASSERT_EQ(local.faults.size(), 1u);  // the remote replica's crash is gone
  EXPECT_EQ(local.faults[0].replica, 2);
  EXPECT_EQ(local.faults[0].spec.kind, fault::FaultKind::kSlow);

  SimulationResult r = RunSimulation(s, "round-robin+local-only", -1);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.report.policy, "round-robin+local-only");
  EXPECT_EQ(r.report.succeeded, 400);
  for (const report::RequestRecord& rec : r.records) EXPECT_LT(rec.endpoint, 3);
  ASSERT_EQ(r.report.regions.size(), 1u);
  EXPECT_EQ(r.report.regions[0].region, "us-east");
  EXPECT_EQ(r.report.regions[0].requests, 400);
  EXPECT_EQ(RunSimulation(s, "local-only", -1).report.regions.at(0).requests, 400);

  // A router without a region has no local side to keep.
  Scenario blind = MustParse(
      "workload: {type: random, input_len: 20, output_len: 2}\n"
      "arrivals: {process: constant, rate: 10, num_requests: 10}\nfleet: {replicas: 2}\n");
  EXPECT_EQ(RunSimulation(blind, "local-only", -1).error,
            "local-only needs the router's region (router: {region: R} in the scenario)");
  // Unlabelled replicas count as local.
  Scenario mixed = MustParse(
      "workload: {type: random, input_len: 20, output_len: 2}\n"
      "arrivals: {process: constant, rate: 10, num_requests: 10}\n"
      "fleet: {groups: [{replicas: 1}, {replicas: 2, region: b}, {replicas: 1, region: a}]}\n"
      "router: {region: a}\n");
  ASSERT_TRUE(LocalOnlyScenario(mixed, &local).ok());
  EXPECT_EQ(local.fleet.replicas, 2);
}

// The shipped several-region scenarios load and run (fewer requests: a smoke test; the
// full runs are in docs/BENCHMARKS.md).
TEST(RegionsTest, ShippedScenariosRun) {
  for (const char* name : {"regions-2-local", "regions-2-spike", "regions-3"}) {
    config::ConfigOr<Scenario> load = config::LoadScenarioFile(
        kvroute::test_support::SourceDir() + "/examples/scenarios/" + name + ".yaml");
    ASSERT_TRUE(load.ok()) << load.error.ToString();
    Scenario s = *load.value;
    EXPECT_FALSE(s.router_region.empty()) << name;
    EXPECT_GE(s.fleet.groups.size(), 2u) << name;
    s.arrivals.num_requests = 150;
    for (const char* policy : {"kvroute", "local-only"}) {
      SimulationResult r = RunSimulation(s, policy, -1);
      ASSERT_EQ(r.error, "") << name << " " << policy;
      EXPECT_EQ(r.report.requests, 150) << name << " " << policy;
      int64_t served = 0;
      for (const report::RegionReport& row : r.report.regions) served += row.requests;
      EXPECT_EQ(served, r.report.requests) << name << " " << policy;
    }
  }
}

}  // namespace
}  // namespace kvroute::simulate
