// Flow control's series (core/flow/flow_metrics.h): kvroute's names and llm-d Router v1.0's
// (REFERENCE.md 17) from one FlowStats, with the same samples.
#include "core/flow/flow_metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/flow/flow_queue.h"
#include "core/metrics/prom_parser.h"

namespace kvroute::flow {
namespace {

FlowRequest Req(RequestId id, int64_t priority) {
  FlowRequest r;
  r.id = id;
  r.priority = priority;
  return r;
}

TEST(FlowMetrics, LlmdNamesCarryTheQueueItsWaitsAndEachBandsOutcomes) {
  FlowOptions o;
  o.default_ttl_s = 1.0;
  FlowQueue q(o);
  // Band 0: one at once, one queued then dispatched after 0.5 s, one cancelled.
  ASSERT_EQ(q.Admit(Req(1, 0), 0.0, PoolState::kAvailable).outcome, AdmitOutcome::kDispatchNow);
  ASSERT_EQ(q.Admit(Req(2, 0), 0.0, PoolState::kSaturated).outcome, AdmitOutcome::kQueued);
  ASSERT_EQ(q.Admit(Req(3, 0), 0.0, PoolState::kSaturated).outcome, AdmitOutcome::kQueued);
  ASSERT_TRUE(q.NextToDispatch(0.5).has_value());
  q.Cancel(3, 0.6);
  // Band 5: one waits past its TTL, one still waits.
  ASSERT_EQ(q.Admit(Req(4, 5), 0.7, PoolState::kSaturated).outcome, AdmitOutcome::kQueued);
  std::vector<Expired> expired;
  ASSERT_EQ(q.Expire(1.8, expired), 1u);
  ASSERT_EQ(q.Admit(Req(5, 5), 1.9, PoolState::kSaturated).outcome, AdmitOutcome::kQueued);

  std::string text;
  AppendFlowMetrics(text, q.stats());
  std::map<std::string, double> v;  // name,label=value,... -> value
  for (const auto& s : metrics::ParseAllSamples(text)) {
    std::string key = s.name;
    for (const auto& [k, val] : s.labels) key += "," + k + "=" + val;
    v[key] = s.value;
  }
  EXPECT_EQ(v["llm_d_epp_flow_control_queue_size,priority=0"], 0);
  EXPECT_EQ(v["llm_d_epp_flow_control_queue_size,priority=5"], 1);
  EXPECT_EQ(v["llm_d_epp_flow_control_queue_size,priority=5"], v["kvroute_flow_waiting_requests,priority=5"]);
  EXPECT_EQ(v["llm_d_epp_flow_control_request_queue_duration_seconds_count,priority=0"], 2);
  EXPECT_DOUBLE_EQ(v["llm_d_epp_flow_control_request_queue_duration_seconds_sum,priority=0"], 0.5);
  EXPECT_EQ(v["llm_d_epp_flow_control_request_queue_duration_seconds_sum,priority=0"],
            v["kvroute_flow_wait_seconds_sum,priority=0"]);
  EXPECT_EQ(v["llm_d_epp_flow_control_requests_total,outcome=dispatched,priority=0"], 2);
  EXPECT_EQ(v["llm_d_epp_flow_control_requests_total,outcome=cancelled,priority=0"], 1);
  EXPECT_EQ(v["llm_d_epp_flow_control_requests_total,outcome=expired,priority=0"], 0);
  EXPECT_EQ(v["llm_d_epp_flow_control_requests_total,outcome=expired,priority=5"], 1);
  EXPECT_EQ(v["llm_d_epp_flow_control_requests_total,outcome=dispatched,priority=5"], 0);
}

}  // namespace
}  // namespace kvroute::flow
