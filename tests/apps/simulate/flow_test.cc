// Flow control in `kvroute simulate` (issue 11, step 3), in virtual time.
#include <gtest/gtest.h>

#include <string>

#include "config/scenario_config.h"
#include "simkit/report/writers.h"
#include "apps/simulate/simulator.h"
#include "testdata.h"

namespace kvroute::simulate {
namespace {

using config::Scenario;
using testing::MustParse;

// Two small replicas (8 sequences each) offered far more than they serve: the router's
// view saturates (waiting >= 5 everywhere) within the first scrapes.
std::string Overloaded(const std::string& extra) {
  return R"(
seed: 5
workload:
  type: shared-prefix
  num_groups: 4
  num_prompts_per_group: 8
  system_prompt_len: 1000
  question_len: 50
  output_len: 100
arrivals: {process: poisson, rate: 200, num_requests: 300}
fleet:
  replicas: 2
  engine_preset: llama3-8b-h100
  max_num_seqs: 8
  scrape_interval_s: 0.05
  network_delay_s: 0.001
slo: {ttft_s: 1.0}
)" + extra;
}

TEST(SimulateFlowTest, SaturatedRequestsWaitAtTheRouterAndAreDispatchedLater) {
  Scenario s = MustParse(Overloaded("flow: {ttl: 600s}\n"));
  SimulationResult off = RunSimulation(s, "kvroute", -1);
  SimulationResult on = RunSimulation(s, "kvroute+flow", -1);
  ASSERT_EQ(on.error, "");
  EXPECT_FALSE(off.report.flow_enabled);
  EXPECT_EQ(off.report.flow_queued, 0);
  EXPECT_TRUE(on.report.flow_enabled);
  EXPECT_EQ(on.report.policy, "kvroute+flow");
  EXPECT_GT(on.report.flow_queued, 100);
  EXPECT_EQ(on.report.flow_shed, 0);
  EXPECT_EQ(on.report.flow_expired, 0);
  // Everything queued is dispatched in the end and served.
  EXPECT_EQ(on.report.requests, 300);
  EXPECT_EQ(on.report.succeeded, 300);
  EXPECT_GT(on.report.router_wait_mean_s, 0.0);
  EXPECT_GE(on.report.router_wait_p99_s, on.report.router_wait_mean_s);
  // The engines' queues stay short: the waiting happens at the router.
  EXPECT_LT(on.report.waiting_max, off.report.waiting_max);
}

TEST(SimulateFlowTest, UnloadedRouterWithFlowControlBehavesAsWithout) {
  Scenario s = MustParse(R"(
seed: 2
workload: {type: shared-prefix, num_groups: 4, num_prompts_per_group: 4,
           system_prompt_len: 500, question_len: 50, output_len: 20}
arrivals: {process: poisson, rate: 5, num_requests: 60}
fleet: {replicas: 2, scrape_interval_s: 0.05}
)");
  SimulationResult off = RunSimulation(s, "kvroute", -1);
  SimulationResult on = RunSimulation(s, "kvroute+flow", -1);
  EXPECT_EQ(on.report.flow_queued, 0);
  ASSERT_EQ(on.records.size(), off.records.size());
  for (size_t i = 0; i < on.records.size(); ++i) {
    EXPECT_EQ(on.records[i].id, off.records[i].id);
    EXPECT_EQ(on.records[i].endpoint, off.records[i].endpoint);
    EXPECT_DOUBLE_EQ(on.records[i].ttft_s, off.records[i].ttft_s);
  }
}

TEST(SimulateFlowTest, SheddableFloodIsRejectedWhileInteractiveIsServed) {
  Scenario s = MustParse(Overloaded(R"(flow: {enabled: true, ttl: 600s}
tenants:
  - {name: interactive, share: 0.2, priority: 0}
  - {name: batch, share: 0.8, priority: -1}
)"));
  SimulationResult r = RunSimulation(s, "round-robin", -1);  // enabled: every policy
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.report.tenants.size(), 2u);
  const report::TenantReport& interactive = r.report.tenants[0];
  const report::TenantReport& batch = r.report.tenants[1];
  EXPECT_EQ(interactive.name, "interactive");
  EXPECT_GT(interactive.requests, 30);
  EXPECT_EQ(interactive.shed, 0);
  EXPECT_EQ(interactive.succeeded, interactive.requests);
  EXPECT_GT(batch.shed, 50);
  EXPECT_EQ(batch.shed, r.report.flow_shed);
  EXPECT_EQ(interactive.requests + batch.requests, 300);
  EXPECT_EQ(r.report.errors_by_kind.at("shed"), batch.shed);
  // Without flow control nothing is shed: everyone waits in the engines.
  Scenario plain = s;
  plain.flow.enabled = false;
  SimulationResult p = RunSimulation(plain, "round-robin", -1);
  EXPECT_EQ(p.report.tenants[1].shed, 0);
  EXPECT_EQ(p.report.succeeded, 300);
}

TEST(SimulateFlowTest, RequestsPastTheirTtlExpireAtTheRouter) {
  Scenario s = MustParse(Overloaded("flow: {ttl: 100ms}\n"));
  SimulationResult r = RunSimulation(s, "kvroute+flow", -1);
  EXPECT_GT(r.report.flow_expired, 0);
  EXPECT_EQ(r.report.errors_by_kind.at("shed"), r.report.flow_expired);
  EXPECT_EQ(r.report.succeeded + r.report.flow_expired, 300);
  // Nothing is dispatched after it waited its TTL.
  EXPECT_LE(r.report.router_wait_p99_s, 0.1);
}

// The peers' admission (core/flow/peer_admission.h) in simulate: llm-d as shipped sheds a
// sheddable tenant while saturated and queues nothing; its flow control (+admission)
// queues every band; Dynamo's queue (+admission) parks requests only while every worker is
// busy by its prefill tokens; a policy without an admission of its own cannot take the
// suffix.
TEST(SimulateFlowTest, LlmdAsShippedShedsTheSheddableTenantAndQueuesNothing) {
  Scenario s = MustParse(Overloaded(R"(tenants:
  - {name: interactive, share: 0.2, priority: 0}
  - {name: batch, share: 0.8, priority: -1}
)"));
  SimulationResult r = RunSimulation(s, "llm-d-sticky", -1);
  ASSERT_EQ(r.error, "");
  EXPECT_TRUE(r.report.flow_enabled);
  EXPECT_EQ(r.report.flow_queued, 0);
  EXPECT_EQ(r.report.tenants[0].shed, 0);
  EXPECT_GT(r.report.tenants[1].shed, 50);
  EXPECT_EQ(r.report.tenants[1].shed, r.report.flow_shed);
  EXPECT_EQ(r.report.succeeded + r.report.flow_shed, 300);
  // Without a sheddable tenant the run has no gate at all.
  Scenario plain = MustParse(Overloaded(""));
  SimulationResult p = RunSimulation(plain, "llm-d-sticky", -1);
  EXPECT_FALSE(p.report.flow_enabled);
  EXPECT_EQ(p.report.succeeded, 300);
}

TEST(SimulateFlowTest, LlmdFlowControlQueuesEveryBandAndServesThemAll) {
  Scenario s = MustParse(Overloaded(R"(tenants:
  - {name: interactive, share: 0.2, priority: 0}
  - {name: batch, share: 0.8, priority: -1}
)"));
  SimulationResult r = RunSimulation(s, "llm-d-sticky+admission", -1);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.report.policy, "llm-d-sticky+admission");
  EXPECT_GT(r.report.flow_queued, 100);
  EXPECT_EQ(r.report.flow_shed, 0);  // nothing refused for being sheddable
  EXPECT_EQ(r.report.flow_expired, 0);  // 60 s TTL: the backlog drains within it
  EXPECT_EQ(r.report.succeeded, 300);
}

TEST(SimulateFlowTest, DynamoParksRequestsOnlyWhileEveryWorkerIsBusy) {
  // Long prompts with nothing shared: each worker's active prefill tokens pass 2 x 8,192.
  Scenario s = MustParse(R"(
seed: 3
workload: {type: shared-prefix, num_groups: 300, num_prompts_per_group: 1,
           system_prompt_len: 6000, question_len: 100, output_len: 50}
arrivals: {process: poisson, rate: 300, num_requests: 300}
fleet: {replicas: 2, engine_preset: llama3-8b-h100, scrape_interval_s: 0.05}
)");
  SimulationResult plain = RunSimulation(s, "dynamo-kv", -1);
  SimulationResult adm = RunSimulation(s, "dynamo-kv+admission", -1);
  ASSERT_EQ(adm.error, "");
  EXPECT_FALSE(plain.report.flow_enabled);  // off as shipped
  EXPECT_GT(adm.report.flow_queued, 50);
  EXPECT_EQ(adm.report.flow_expired, 0);  // no TTL
  EXPECT_EQ(adm.report.succeeded, 300);
  EXPECT_GT(adm.report.router_wait_mean_s, 0.0);
  EXPECT_LT(adm.report.waiting_max, plain.report.waiting_max);
}

TEST(SimulateFlowTest, AdmissionSuffixOnlyForPeersThatHaveOne) {
  Scenario s = MustParse(Overloaded(""));
  Status st;
  EXPECT_FALSE(GateOptions(s, "kvroute+admission", &st).has_value());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("kvroute has no admission of its own"), std::string::npos);
  SimulationResult r = RunSimulation(s, "round-robin+admission", -1);
  EXPECT_NE(r.error.find("round-robin has no admission"), std::string::npos);
  const auto dyn = GateOptions(s, "dynamo-kv+admission", &st);
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(dyn.has_value());
  EXPECT_EQ(dyn->admission, flow::Admission::kDynamoQueue);
  EXPECT_EQ(dyn->dynamo_max_batched_tokens, 8192);  // the preset's max_num_batched_tokens
  EXPECT_EQ(BasePolicy("llm-d-precise+admission"), "llm-d-precise");
}

TEST(SimulateFlowTest, SameSeedSameReport) {
  Scenario s = MustParse(Overloaded(R"(flow: {ttl: 1s}
tenants: [{name: a, share: 1, priority: 0}, {name: b, share: 1, priority: -1}]
)"));
  SimulationResult a = RunSimulation(s, "kvroute+flow", -1);
  SimulationResult b = RunSimulation(s, "kvroute+flow", -1);
  a.report.wall_s = b.report.wall_s = 0;
  report::ReportMeta meta;
  EXPECT_EQ(report::ReportJson(meta, {&a.report, 1}), report::ReportJson(meta, {&b.report, 1}));
  EXPECT_EQ(a.events, b.events);
}

}  // namespace
}  // namespace kvroute::simulate
