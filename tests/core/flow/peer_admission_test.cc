// The peers' admission as shipped (core/flow/peer_admission.h), pinned rule by rule: llm-d's
// utilization detector and its two admissions (sheddable refusal as shipped, flow control
// when turned on), Dynamo's router queue and busy rejection; the detectors as pure
// functions, then each admission through a FlowGate over a real routing core, in virtual
// time.
#include "core/flow/peer_admission.h"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/flow/flow_gate.h"
#include "support/routing_fixture.h"

namespace kvroute::flow {
namespace {

using Signal = routing::RoutingCore::PeerSignal;

Signal Fresh(double waiting, double kv, double at = 10.0, int64_t prefill = -1) {
  Signal s;
  s.scraped_at_s = at;
  s.kv_known = s.waiting_known = true;
  s.waiting = waiting;
  s.kv_usage = kv;
  s.active_prefill_tokens = prefill;
  return s;
}

TEST(PeerAdmissionTest, ThePoliciesThatHaveOneAndWhatTheirNamesTurnOn) {
  EXPECT_EQ(PeerAdmissionOf("llm-d-sticky", false), Admission::kLlmdShedOnly);
  EXPECT_EQ(PeerAdmissionOf("llm-d-precise", false), Admission::kLlmdShedOnly);
  EXPECT_EQ(PeerAdmissionOf("llm-d-sticky", true), Admission::kLlmdFlowControl);
  EXPECT_EQ(PeerAdmissionOf("llm-d-precise", true), Admission::kLlmdFlowControl);
  EXPECT_EQ(PeerAdmissionOf("dynamo-kv", true), Admission::kDynamoQueue);
  EXPECT_EQ(PeerAdmissionOf("dynamo-kv", false), std::nullopt);  // off as shipped
  EXPECT_EQ(PeerAdmissionOf("kvroute", true), std::nullopt);      // kvroute's is +flow
  EXPECT_EQ(PeerAdmissionOf("round-robin", false), std::nullopt);
  EXPECT_EQ(PeerAdmissionOf("gie-default", true), std::nullopt);
}

TEST(PeerAdmissionTest, EachPeersQueueAsItConfiguresIt) {
  const FlowOptions fc = PeerFlowOptions(Admission::kLlmdFlowControl);
  EXPECT_EQ(fc.default_ttl_s, 60.0);
  EXPECT_EQ(fc.no_endpoint_ttl_s, 60.0);
  EXPECT_EQ(fc.max_requests, 5000u);
  EXPECT_EQ(fc.max_bytes, uint64_t{1} << 30);
  EXPECT_EQ(fc.fairness, Fairness::kGlobal);
  EXPECT_EQ(fc.ordering, Ordering::kFcfs);
  EXPECT_EQ(fc.shed_below_priority, std::numeric_limits<int64_t>::min());
  EXPECT_FALSE(fc.slo_aware);
  EXPECT_EQ(fc.affinity_window, 1u);
  EXPECT_EQ(fc.llmd_queue_depth, 5.0);
  EXPECT_EQ(fc.llmd_kv_threshold, 0.8);
  EXPECT_EQ(fc.llmd_stale_s, 0.2);
  EXPECT_TRUE(Validate(fc).ok());

  const FlowOptions shed = PeerFlowOptions(Admission::kLlmdShedOnly);
  EXPECT_EQ(shed.shed_below_priority, 0);

  const FlowOptions dyn = PeerFlowOptions(Admission::kDynamoQueue, 4096);
  EXPECT_EQ(dyn.dynamo_queue_threshold, 2.0);
  EXPECT_EQ(dyn.dynamo_max_batched_tokens, 4096);
  EXPECT_EQ(dyn.dynamo_reject_kv, 0.85);
  EXPECT_EQ(dyn.default_ttl_s, 1e9);  // no TTL
  EXPECT_TRUE(Validate(dyn).ok());
}

TEST(PeerAdmissionTest, LlmdScoresEachEndpointByItsTighterLimitAndThePoolByTheMean) {
  const FlowOptions o = PeerFlowOptions(Admission::kLlmdFlowControl);
  // max(4/5, 0.2/0.8) = 0.8 and max(0/5, 0.96/0.8) = 1.2: mean 1.0, saturated.
  std::vector<Signal> pool = {Fresh(4, 0.2), Fresh(0, 0.96)};
  EXPECT_DOUBLE_EQ(LlmdSaturation(o, pool, 10.1), 1.0);
  EXPECT_EQ(PeerPoolState(o, pool, 10.1), PoolState::kSaturated);
  // One endpoint over its limits does not saturate the pool when the others are light.
  pool = {Fresh(10, 0.1), Fresh(0, 0.1), Fresh(0, 0.1)};
  EXPECT_DOUBLE_EQ(LlmdSaturation(o, pool, 10.1), (2.0 + 0.125 + 0.125) / 3);
  EXPECT_EQ(PeerPoolState(o, pool, 10.1), PoolState::kAvailable);
}

TEST(PeerAdmissionTest, LlmdCountsMissingOrStaleMetricsAsFullySaturated) {
  const FlowOptions o = PeerFlowOptions(Admission::kLlmdFlowControl);
  std::vector<Signal> pool = {Fresh(0, 0.0, 10.0), Fresh(0, 0.0, 10.0)};
  EXPECT_DOUBLE_EQ(LlmdSaturation(o, pool, 10.2), 0.0);   // 200 ms old: still fresh
  EXPECT_DOUBLE_EQ(LlmdSaturation(o, pool, 10.21), 1.0);  // older: both count 1
  pool[1].kv_known = false;
  EXPECT_DOUBLE_EQ(LlmdSaturation(o, pool, 10.1), 0.5);
  pool[1] = Signal{};  // never scraped
  EXPECT_DOUBLE_EQ(LlmdSaturation(o, pool, 10.1), 0.5);
  EXPECT_DOUBLE_EQ(LlmdSaturation(o, {}, 10.1), 1.0);
  EXPECT_EQ(PeerPoolState(o, {}, 10.1), PoolState::kEmpty);
}

TEST(PeerAdmissionTest, DynamoQueuesOnlyWhileEveryWorkerIsBusyByItsPrefillTokens) {
  const FlowOptions o = PeerFlowOptions(Admission::kDynamoQueue, 1000);  // busy above 2,000
  std::vector<Signal> pool = {Fresh(0, 0.1, 10, 2001), Fresh(0, 0.1, 10, 2000)};
  EXPECT_FALSE(DynamoAllBusy(o, pool));  // 2,000 is not above 2 x 1,000
  pool[1].active_prefill_tokens = 2001;
  EXPECT_TRUE(DynamoAllBusy(o, pool));
  EXPECT_EQ(PeerPoolState(o, pool, 10.0), PoolState::kSaturated);
  pool[0].active_prefill_tokens = -1;  // a worker the policy keeps no count for: never busy
  EXPECT_FALSE(DynamoAllBusy(o, pool));
  EXPECT_FALSE(DynamoAllBusy(o, {}));
}

TEST(PeerAdmissionTest, DynamoRejectsOnlyWhenEveryWorkersKvIsAboveItsThreshold) {
  FlowOptions o = PeerFlowOptions(Admission::kDynamoQueue);
  std::vector<Signal> pool = {Fresh(0, 0.86), Fresh(0, 0.85)};
  EXPECT_FALSE(DynamoRejects(o, pool));  // 0.85 is not above 0.85
  pool[1].kv_usage = 0.9;
  EXPECT_TRUE(DynamoRejects(o, pool));
  pool[1].kv_known = false;  // unknown is not busy
  EXPECT_FALSE(DynamoRejects(o, pool));
  pool[1].kv_known = true;
  o.dynamo_reject_kv = 0.0;  // off
  EXPECT_FALSE(DynamoRejects(o, pool));
}

// ---- through a FlowGate over a routing core ----

constexpr const char* kModel = "meta-llama/Llama-3.1-8B-Instruct";

// ~2,060 characters: about 515 prompt tokens at the router's estimate of 4 a token.
std::string Prompt(char group, int n) { return std::string(2048, group) + " q " + std::to_string(n); }

struct Log {
  std::vector<std::string> dispatched;  // names, in order
  std::vector<std::string> expired;
  std::vector<sched::RequestHandle> handles;
};

class Waiter final : public FlowWaiter {
 public:
  Waiter(routing::RoutingCore& core, Log& log, std::string name, std::string prompt)
      : core_(core), log_(log), name_(std::move(name)), prompt_(std::move(prompt)) {}
  void Dispatch(double now_s, double) override {
    routing::PickRequest pr;
    pr.request.model = kModel;
    pr.request.prompt = prompt_;
    pr.request.max_tokens = 16;
    pr.dispatch_first = true;
    routing::PickResult r = core_.Pick(pr, now_s);
    ASSERT_TRUE(r.ok());
    log_.dispatched.push_back(name_);
    log_.handles.push_back(r.handle);
  }
  void Expire(ExpireReason reason) override {
    log_.expired.push_back(name_ + ":" + std::string(ExpireReasonName(reason)));
  }

 private:
  routing::RoutingCore& core_;
  Log& log_;
  std::string name_, prompt_;
};

class PeerGateTest : public ::testing::Test {
 protected:
  void Configure(const std::string& policy) {
    routing::CoreOptions o;
    o.scheduling.policy = policy;
    o.health.staleness_s = 100.0;
    std::vector<routing::EndpointSpec> eps = {test_support::TestEndpoint("a", 9001),
                                              test_support::TestEndpoint("b", 9002)};
    ASSERT_TRUE(core_.Configure(o, eps, 0.0).ok());
  }
  void Scrape(uint32_t id, const std::string& waiting, const std::string& kv) {
    core_.OnScrape(id, test_support::ScrapedLoad("1.0", waiting, kv, now_), now_);
  }
  AdmitResult Admit(FlowGate& gate, const std::string& name, int64_t priority, char group = 'x') {
    const std::string prompt = Prompt(group, static_cast<int>(log_.dispatched.size() + 100));
    FlowRequest fr;
    fr.priority = priority;
    fr.bytes = prompt.size();
    sched::SchedRequest r;
    r.model = kModel;
    r.prompt = prompt;
    const AdmitResult a = gate.Admit(fr, std::make_shared<Waiter>(core_, log_, name, prompt), r);
    // As a front end does: a request dispatched at once is picked now.
    if (a.outcome == AdmitOutcome::kDispatchNow) Waiter(core_, log_, name, prompt).Dispatch(now_, 0);
    return a;
  }
  std::function<double()> Clock() {
    return [this] { return now_; };
  }

  routing::RoutingCore core_;
  double now_ = 1.0;
  Log log_;
};

TEST_F(PeerGateTest, LlmdAsShippedRefusesOnlySheddableRequestsWhileSaturated) {
  Configure("llm-d-sticky");
  FlowGate gate(PeerFlowOptions(Admission::kLlmdShedOnly), core_, Clock());
  Scrape(0, "5.0", "0.10");  // score 1.0
  Scrape(1, "5.0", "0.10");  // score 1.0: the mean is 1.0
  EXPECT_EQ(Admit(gate, "critical", 0).outcome, AdmitOutcome::kDispatchNow);
  const AdmitResult shed = Admit(gate, "batch", -1);
  EXPECT_EQ(shed.outcome, AdmitOutcome::kRejected);
  EXPECT_EQ(shed.reason, RejectReason::kSheddable);
  Scrape(1, "4.0", "0.10");  // mean 0.9
  EXPECT_EQ(Admit(gate, "batch2", -1).outcome, AdmitOutcome::kDispatchNow);
  now_ += 0.25;  // no scrape for 250 ms: both stale, fail closed
  EXPECT_EQ(Admit(gate, "batch3", -1).outcome, AdmitOutcome::kRejected);
  EXPECT_EQ(Admit(gate, "critical2", 0).outcome, AdmitOutcome::kDispatchNow);
  EXPECT_FALSE(gate.waiting());
  EXPECT_EQ(log_.dispatched, (std::vector<std::string>{"critical", "batch2", "critical2"}));
}

TEST_F(PeerGateTest, LlmdFlowControlHoldsEveryBandWhileSaturatedAndReleasesByPriorityWithoutABound) {
  Configure("llm-d-sticky");
  FlowGate gate(PeerFlowOptions(Admission::kLlmdFlowControl), core_, Clock());
  Scrape(0, "3.0", "0.90");  // max(0.6, 1.125)
  Scrape(1, "6.0", "0.10");  // max(1.2, 0.125): mean 1.1625
  EXPECT_EQ(Admit(gate, "b1", -1).outcome, AdmitOutcome::kQueued);  // sheddable waits too
  EXPECT_EQ(Admit(gate, "c1", 0).outcome, AdmitOutcome::kQueued);
  EXPECT_EQ(Admit(gate, "b2", -1).outcome, AdmitOutcome::kQueued);
  EXPECT_EQ(Admit(gate, "c2", 0).outcome, AdmitOutcome::kQueued);
  gate.Pump();
  EXPECT_TRUE(log_.dispatched.empty());
  now_ = 1.05;
  Scrape(0, "3.0", "0.50");  // max(0.6, 0.625)
  Scrape(1, "4.0", "0.10");  // max(0.8, 0.125): mean 0.7125
  gate.Pump();
  // The score moves only with the metrics: the whole queue goes, higher band first, FCFS.
  EXPECT_EQ(log_.dispatched, (std::vector<std::string>{"c1", "c2", "b1", "b2"}));
  EXPECT_FALSE(gate.waiting());
}

TEST_F(PeerGateTest, LlmdFlowControlExpiresAfterSixtySeconds) {
  Configure("llm-d-sticky");
  FlowGate gate(PeerFlowOptions(Admission::kLlmdFlowControl), core_, Clock());
  Scrape(0, "9.0", "0.10");
  Scrape(1, "9.0", "0.10");
  EXPECT_EQ(Admit(gate, "r", 0).outcome, AdmitOutcome::kQueued);
  EXPECT_DOUBLE_EQ(gate.next_expiry(), 61.0);
  now_ = 60.99;
  Scrape(0, "9.0", "0.10");
  Scrape(1, "9.0", "0.10");
  gate.Pump();
  EXPECT_TRUE(log_.expired.empty());
  now_ = 61.0;
  gate.Pump();
  EXPECT_EQ(log_.expired, (std::vector<std::string>{"r:ttl"}));
}

TEST_F(PeerGateTest, DynamoParksWhileEveryWorkerIsBusyAndReleasesAsPrefillsComplete) {
  Configure("dynamo-kv");
  // Busy above 2 x 200 = 400 active prefill tokens; each request brings ~515.
  FlowGate gate(PeerFlowOptions(Admission::kDynamoQueue, 200), core_, Clock());
  EXPECT_TRUE(gate.releases_on_first_token());
  Scrape(0, "0.0", "0.10");
  Scrape(1, "0.0", "0.10");
  EXPECT_EQ(Admit(gate, "r1", 0, 'x').outcome, AdmitOutcome::kDispatchNow);
  EXPECT_EQ(Admit(gate, "r2", 0, 'y').outcome, AdmitOutcome::kDispatchNow);  // b, the idle one
  std::vector<Signal> pool;
  core_.PeerSignals(now_, pool);
  ASSERT_EQ(pool.size(), 2u);
  EXPECT_GT(pool[0].active_prefill_tokens, 400);
  EXPECT_GT(pool[1].active_prefill_tokens, 400);
  // Every worker busy: parked, in one FCFS queue whatever the priority says.
  EXPECT_EQ(Admit(gate, "r3", -1, 'z').outcome, AdmitOutcome::kQueued);
  EXPECT_EQ(Admit(gate, "r4", 5, 'w').outcome, AdmitOutcome::kQueued);
  gate.Pump();
  EXPECT_EQ(log_.dispatched.size(), 2u);
  // r1's prefill completes: its worker is no longer busy, one request goes (and makes it
  // busy again).
  core_.OnFirstToken(log_.handles[0], now_);
  gate.Pump();
  EXPECT_EQ(log_.dispatched, (std::vector<std::string>{"r1", "r2", "r3"}));
  core_.OnFirstToken(log_.handles[1], now_);
  gate.Pump();
  EXPECT_EQ(log_.dispatched, (std::vector<std::string>{"r1", "r2", "r3", "r4"}));
  EXPECT_FALSE(gate.waiting());
}

TEST_F(PeerGateTest, DynamoRefusesWith529WhenEveryWorkersKvIsAboveTheThreshold) {
  Configure("dynamo-kv");
  FlowGate gate(PeerFlowOptions(Admission::kDynamoQueue), core_, Clock());
  Scrape(0, "0.0", "0.90");
  Scrape(1, "0.0", "0.80");
  EXPECT_EQ(Admit(gate, "r1", 0).outcome, AdmitOutcome::kDispatchNow);
  Scrape(1, "0.0", "0.86");
  const AdmitResult r = Admit(gate, "r2", 0);
  EXPECT_EQ(r.outcome, AdmitOutcome::kRejected);
  EXPECT_EQ(r.reason, RejectReason::kAllBusy);
  EXPECT_EQ(RejectReasonName(r.reason), "all_busy");
}

}  // namespace
}  // namespace kvroute::flow
