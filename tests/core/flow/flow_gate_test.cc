// flow::FlowGate over a real routing core, in virtual time (no sockets, no sleeps): the
// late binding both front ends share (a request bound at dispatch time goes to the
// replica that freed, when that replica holds its prefix), the detector's room as the
// bound of one release, expiry, cancellation, and a pump started from a dispatch.
#include "core/flow/flow_gate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/routing_fixture.h"

namespace kvroute::flow {
namespace {

constexpr const char* kModel = "meta-llama/Llama-3.1-8B-Instruct";

std::vector<routing::EndpointSpec> Endpoints(int n) {
  std::vector<routing::EndpointSpec> v;
  for (int i = 0; i < n; ++i) {
    v.push_back(test_support::TestEndpoint(std::string(1, static_cast<char>('a' + i)), 9001 + i));
  }
  return v;
}

// A shared head of ~2,000 characters per group, then a per-request tail.
std::string Prompt(char group, int n) {
  std::string p(2048, group);
  p += " question " + std::to_string(n);
  return p;
}

sched::SchedRequest Req(const std::string& prompt) {
  sched::SchedRequest r;
  r.model = kModel;
  r.prompt = prompt;
  r.max_tokens = 32;
  return r;
}

// Records what the gate does with each request; Dispatch picks as a front end does.
struct Log {
  std::vector<std::string> dispatched;  // "<name>@<endpoint picked>"
  std::vector<std::string> expired;     // "<name>:<reason>"
};

class Waiter final : public FlowWaiter {
 public:
  Waiter(routing::RoutingCore& core, Log& log, std::string name, std::string prompt)
      : core_(core), log_(log), name_(std::move(name)), prompt_(std::move(prompt)) {}
  void Dispatch(double now_s, double) override {
    routing::PickRequest pr;
    pr.request = Req(prompt_);
    pr.dispatch_first = true;
    routing::PickResult r = core_.Pick(pr, now_s);
    log_.dispatched.push_back(name_ + "@" + (r.ok() ? r.endpoint(0).spec.name : "none"));
    if (on_dispatch) on_dispatch();
  }
  void Expire(flow::ExpireReason reason) override {
    log_.expired.push_back(name_ + ":" + std::string(flow::ExpireReasonName(reason)));
  }
  std::function<void()> on_dispatch;

 private:
  routing::RoutingCore& core_;
  Log& log_;
  std::string name_, prompt_;
};

class FlowGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    routing::CoreOptions o;
    o.scheduling.policy = "kvroute";
    o.health.staleness_s = 100.0;
    ASSERT_TRUE(core_.Configure(o, Endpoints(2), 0.0).ok());
  }

  // Teaches the core that endpoint `id` holds group `g`'s prefix (a request sent there).
  void Warm(uint32_t id, char g) {
    routing::PickRequest pr;
    const std::string p = Prompt(g, 0);
    pr.request = Req(p);
    routing::PickResult r = core_.Pick(pr, now_);
    ASSERT_TRUE(r.ok());
    core_.OnDispatched(r.handle, id, now_);
    core_.OnFirstToken(r.handle, now_);
    core_.OnFinished(r.handle, id, 200, now_);
  }

  void Scrape(uint32_t id, const std::string& waiting, const std::string& kv = "0.30") {
    core_.OnScrape(id, test_support::ScrapedLoad("4.0", waiting, kv, now_), now_);
  }

  flow::AdmitResult Admit(FlowGate& gate, const std::string& name, char group, int n,
                          std::shared_ptr<Waiter>* out = nullptr) {
    const std::string prompt = Prompt(group, n);
    auto w = std::make_shared<Waiter>(core_, log_, name, prompt);
    if (out) *out = w;
    flow::FlowRequest fr;
    fr.bytes = prompt.size();
    return gate.Admit(fr, w, Req(prompt));
  }

  // Both replicas saturated, x1 then y1 queued at `gate`, then at t=1.5 b's scrape shows
  // room for one; `gate` is not pumped. (A FlowGate reads the core only when called, so
  // it may be built before or after the scrapes.)
  void QueueX1AndY1UntilBHasRoom(FlowGate& gate) {
    Scrape(0, "6.0");
    Scrape(1, "6.0");
    Admit(gate, "x1", 'x', 1);
    Admit(gate, "y1", 'y', 1);
    now_ = 1.5;
    Scrape(1, "4.0");
  }

  // Teaches the core's latency model a constant TTFT (40 requests, engines reporting
  // `waiting` queued), then moves the clock on a second.
  void TrainConstantTtft(double ttft_s, const std::string& waiting = "0.0") {
    Scrape(0, waiting, "0.10");
    Scrape(1, waiting, "0.10");
    for (int i = 0; i < 40; ++i) {
      now_ += 0.5;
      const std::string p = Prompt(static_cast<char>('a' + i % 20), i);
      routing::PickRequest pr;
      pr.request = Req(p);
      pr.dispatch_first = true;
      routing::PickResult r = core_.Pick(pr, now_);
      ASSERT_TRUE(r.ok());
      core_.OnFirstToken(r.handle, now_ + ttft_s);
      core_.OnFinished(r.handle, r.ranked[0], 200, now_ + 2 * ttft_s, 20);
    }
    ASSERT_GE(core_.latency_stats().ttft_samples, 40u);
    now_ += 1.0;
  }

  // Admits one request of group `g` with `priority` and a TTFT objective (0: none).
  flow::AdmitResult AdmitWithObjective(FlowGate& gate, char g, int64_t priority,
                                       double slo_ttft_s) {
    const std::string prompt = Prompt(g, 1);
    sched::SchedRequest r = Req(prompt);
    r.slo_ttft_s = slo_ttft_s;
    flow::FlowRequest fr;
    fr.priority = priority;
    return gate.Admit(fr, std::make_shared<Waiter>(core_, log_, std::string(1, g), prompt), r);
  }

  std::function<double()> Clock() {
    return [this] { return now_; };
  }

  routing::RoutingCore core_;
  double now_ = 1.0;
  Log log_;
};

TEST_F(FlowGateTest, TheReplicaThatFreedTakesTheWaitingRequestWhosePrefixItHolds) {
  Warm(0, 'x');  // a holds x's prefix
  Warm(1, 'y');  // b holds y's
  Scrape(0, "6.0");
  Scrape(1, "6.0");  // both saturated: arrivals wait
  FlowGate gate(flow::FlowOptions{}, core_, Clock());
  EXPECT_EQ(Admit(gate, "x1", 'x', 1).outcome, flow::AdmitOutcome::kQueued);
  EXPECT_EQ(Admit(gate, "y1", 'y', 1).outcome, flow::AdmitOutcome::kQueued);
  EXPECT_EQ(Admit(gate, "x2", 'x', 2).outcome, flow::AdmitOutcome::kQueued);
  // b finishes a request and its next scrape shows room for one.
  now_ = 1.5;
  Scrape(1, "4.0");
  gate.Pump(1);
  // Late bound: y1, not x1 (first in order), goes, and its pick lands on b.
  EXPECT_EQ(log_.dispatched, (std::vector<std::string>{"y1@b"}));
  EXPECT_EQ(gate.stats().bands.at(0).dispatched_by_affinity, 1u);
  // a frees next (b is full again): x1 (in order and held there) goes to a.
  now_ = 2.0;
  Scrape(1, "6.0");
  Scrape(0, "4.0");
  gate.Pump(0);
  EXPECT_EQ(log_.dispatched, (std::vector<std::string>{"y1@b", "x1@a"}));
  EXPECT_TRUE(gate.waiting());
}

// A release a scrape causes (no replica freed) binds to the replica with the most room.
TEST_F(FlowGateTest, AScrapeReleaseBindsToTheReplicaWithTheMostRoom) {
  Warm(0, 'x');
  Warm(1, 'y');
  FlowGate gate(flow::FlowOptions{}, core_, Clock());
  QueueX1AndY1UntilBHasRoom(gate);
  EXPECT_EQ(core_.Load(now_).roomiest, 1u);
  gate.Pump();
  EXPECT_EQ(log_.dispatched, (std::vector<std::string>{"y1@b"}));
  EXPECT_EQ(gate.stats().bands.at(0).dispatched_by_affinity, 1u);
}

// Nobody holds anything: the first in order goes.
TEST_F(FlowGateTest, WithNothingHeldTheFirstInOrderGoes) {
  FlowGate gate(flow::FlowOptions{}, core_, Clock());
  QueueX1AndY1UntilBHasRoom(gate);
  gate.Pump(1);
  ASSERT_EQ(log_.dispatched.size(), 1u);
  EXPECT_EQ(log_.dispatched[0].substr(0, 3), "x1@");
  EXPECT_EQ(gate.stats().bands.at(0).dispatched_by_affinity, 0u);
}

// sheddable_reserve: a sheddable request is shed unless some replica has more room than
// the reserve; a priority-0 one is admitted against the plain verdict.
TEST_F(FlowGateTest, SheddableRequestsLeaveTheReserveFree) {
  flow::FlowOptions o;
  o.sheddable_reserve = 4;
  FlowGate gate(o, core_, Clock());
  Scrape(0, "1.0");
  Scrape(1, "2.0");  // most room: 4, not above the reserve
  auto admit = [&](int64_t priority) {
    flow::FlowRequest fr;
    fr.priority = priority;
    const std::string p = Prompt('z', static_cast<int>(priority) + 10);
    return gate.Admit(fr, std::make_shared<Waiter>(core_, log_, "z", p), Req(p));
  };
  EXPECT_EQ(admit(-1), (flow::AdmitResult{flow::AdmitOutcome::kRejected, flow::RejectReason::kSheddable}));
  EXPECT_EQ(admit(0).outcome, flow::AdmitOutcome::kDispatchNow);
  now_ = 1.5;
  Scrape(0, "0.0");  // room 5 there
  EXPECT_EQ(admit(-1).outcome, flow::AdmitOutcome::kDispatchNow);
}

// One pump releases at most the detector's room, read once: here a (holding every
// waiting request's prefix) is saturated and b has room for 2 (waiting 3).
TEST_F(FlowGateTest, OnePumpReleasesAtMostTheDetectorsRoom) {
  Warm(0, 'x');
  Scrape(0, "6.0");
  Scrape(1, "6.0");
  FlowGate gate(flow::FlowOptions{}, core_, Clock());
  for (int i = 0; i < 5; ++i) Admit(gate, "x" + std::to_string(i), 'x', i);
  now_ = 1.5;
  Scrape(1, "3.0");
  EXPECT_EQ(core_.Load(now_).room, 2);
  gate.Pump(1);
  EXPECT_EQ(log_.dispatched.size(), 2u);
  EXPECT_EQ(gate.stats().bands.at(0).waiting_requests, 3u);
}

// Issue 24: with a TTFT objective (here the pool default, 300 ms, and a cold latency
// model: the whole objective is the budget), a request that waited past it goes behind
// one that can still meet it; without slo_aware, arrival order.
TEST_F(FlowGateTest, ARequestPredictedToMissYieldsToOneThatCanStillMeetItsObjective) {
  for (const bool slo_aware : {true, false}) {
    SCOPED_TRACE(slo_aware);
    routing::RoutingCore core;
    routing::CoreOptions co;
    co.scheduling.policy = "kvroute";
    co.health.staleness_s = 100.0;
    co.default_slo_ttft_s = 0.3;
    ASSERT_TRUE(core.Configure(co, Endpoints(2), 0.0).ok());
    now_ = 1.0;
    core.OnScrape(0, test_support::ScrapedLoad("4.0", "6.0", "0.30", now_), now_);
    core.OnScrape(1, test_support::ScrapedLoad("4.0", "6.0", "0.30", now_), now_);
    flow::FlowOptions o;
    o.slo_aware = slo_aware;
    FlowGate gate(o, core, Clock());
    Log log;
    auto admit = [&](const std::string& name, char g) {
      const std::string prompt = Prompt(g, 1);
      flow::FlowRequest fr;
      return gate.Admit(fr, std::make_shared<Waiter>(core, log, name, prompt), Req(prompt));
    };
    ASSERT_EQ(admit("x1", 'x').outcome, flow::AdmitOutcome::kQueued);  // late from 1.3
    now_ = 1.4;
    ASSERT_EQ(admit("y1", 'y').outcome, flow::AdmitOutcome::kQueued);  // late from 1.7
    now_ = 1.5;
    core.OnScrape(1, test_support::ScrapedLoad("4.0", "4.0", "0.30", now_), now_);  // room 1
    gate.Pump();
    ASSERT_EQ(log.dispatched.size(), 1u);
    EXPECT_EQ(log.dispatched[0], slo_aware ? "y1@b" : "x1@b");
    const flow::BandStats b = gate.stats().bands.at(0);
    EXPECT_EQ(b.went_late, slo_aware ? 1u : 0u);
    EXPECT_TRUE(log.expired.empty());
  }
}

// A sheddable request whose predicted TTFT already reaches its objective is refused at
// admission although the pool has room; one with time left goes at once. The core's model
// learns a constant 200 ms TTFT first.
TEST_F(FlowGateTest, ASheddableRequestPredictedToMissIsRefusedAtOnce) {
  TrainConstantTtft(0.2);
  Scrape(0, "0.0", "0.10");
  Scrape(1, "0.0", "0.10");
  FlowGate gate(flow::FlowOptions{}, core_, Clock());
  auto admit = [&](int64_t priority, double slo_ttft_s) {
    return AdmitWithObjective(gate, 's', priority, slo_ttft_s);
  };
  EXPECT_EQ(admit(-1, 0.1), (flow::AdmitResult{flow::AdmitOutcome::kRejected,
                                               flow::RejectReason::kPredictedMiss}));
  EXPECT_EQ(admit(-1, 0.5).outcome, flow::AdmitOutcome::kDispatchNow);
  EXPECT_EQ(admit(-1, 0).outcome, flow::AdmitOutcome::kDispatchNow);  // no objective
  EXPECT_EQ(admit(0, 0.1).outcome, flow::AdmitOutcome::kDispatchNow);  // not sheddable
}

// The detector's fixed thresholds are no reason to wait when the model predicts the
// request meets its objective where it would go: both replicas report 6 waiting, and a
// request with a 500 ms objective (predicted 200 ms) goes at once; one with 100 ms waits.
// A sheddable request is still shed while saturated.
TEST_F(FlowGateTest, ARequestPredictedToMeetItsObjectiveGoesDespiteTheDetector) {
  TrainConstantTtft(0.2, "6.0");  // learned in the queued regime
  Scrape(0, "6.0");
  Scrape(1, "6.0");
  ASSERT_TRUE(core_.Load(now_).saturated_pool());
  FlowGate gate(flow::FlowOptions{}, core_, Clock());
  auto admit = [&](int64_t priority, double slo_ttft_s) {
    return AdmitWithObjective(gate, 'q', priority, slo_ttft_s);
  };
  EXPECT_EQ(admit(0, 0.5).outcome, flow::AdmitOutcome::kDispatchNow);
  EXPECT_EQ(admit(-1, 0.5), (flow::AdmitResult{flow::AdmitOutcome::kRejected,
                                               flow::RejectReason::kSheddable}));
  EXPECT_EQ(admit(0, 0.1).outcome, flow::AdmitOutcome::kQueued);
  // Something now waits in the band: the next one queues behind it, predicted fine or not.
  EXPECT_EQ(admit(0, 0.5).outcome, flow::AdmitOutcome::kQueued);
  // Without slo_aware the detector decides alone.
  flow::FlowOptions off;
  off.slo_aware = false;
  FlowGate plain(off, core_, Clock());
  const std::string prompt = Prompt('q', 2);
  sched::SchedRequest r = Req(prompt);
  r.slo_ttft_s = 0.5;
  flow::FlowRequest fr;
  EXPECT_EQ(plain.Admit(fr, std::make_shared<Waiter>(core_, log_, "p", prompt), r).outcome,
            flow::AdmitOutcome::kQueued);
}

// A pump with no room by the detector still releases the request the queue would send
// next when the model predicts it meets what is left of its objective with room (predicted
// TTFT within slo_release_fraction of the objective minus its wait; 0.25 here). The
// model learned a constant 200 ms with 6 waiting; both replicas report 6 waiting all along.
// Without slo_aware, or with slo_release_fraction 0, the detector's room alone releases.
TEST_F(FlowGateTest, APumpReleasesByPredictionWhenTheDetectorHasNoRoom) {
  TrainConstantTtft(0.2, "6.0");
  Scrape(0, "6.0");
  Scrape(1, "6.0");
  ASSERT_TRUE(core_.Load(now_).saturated_pool());
  const double t0 = now_;
  struct Case {
    bool slo_aware;
    double release_fraction;
    double waited;
    bool released;
  };
  // q: 0.2 <= 0.25 * (1.2 - 0.1) goes; 0.2 > 0.25 * (1.2 - 0.5) stays. x never fits.
  for (const Case c : {Case{true, 0.25, 0.1, true}, Case{true, 0.25, 0.5, false},
                       Case{true, 0.0, 0.1, false}, Case{false, 0.25, 0.1, false}}) {
    SCOPED_TRACE(testing::Message() << "slo_aware " << c.slo_aware << " fraction "
                                    << c.release_fraction << " waited " << c.waited);
    now_ = t0;
    log_ = {};
    flow::FlowOptions o;
    o.slo_aware = c.slo_aware;
    o.slo_release_fraction = c.release_fraction;
    FlowGate gate(o, core_, Clock());
    // x (objective 100 ms) is predicted to miss from the start: it goes behind q.
    ASSERT_EQ(AdmitWithObjective(gate, 'x', 0, 0.1).outcome, flow::AdmitOutcome::kQueued);
    ASSERT_EQ(AdmitWithObjective(gate, 'q', 0, 1.2).outcome, flow::AdmitOutcome::kQueued);
    now_ = t0 + c.waited;
    gate.Pump();
    ASSERT_EQ(log_.dispatched.size(), c.released ? 1u : 0u);
    if (c.released) {
      EXPECT_EQ(log_.dispatched[0].substr(0, 2), "q@");
    }
    EXPECT_EQ(gate.stats().bands.at(0).waiting_requests, c.released ? 1u : 2u);
    EXPECT_TRUE(log_.expired.empty());
  }
}

TEST_F(FlowGateTest, ExpiryAndCancelCallTheRightWaiterOnce) {
  Scrape(0, "6.0");
  Scrape(1, "6.0");
  flow::FlowOptions o;
  o.default_ttl_s = 2.0;
  FlowGate gate(o, core_, Clock());
  Admit(gate, "stays", 'x', 1);
  flow::FlowRequest fr;
  auto gone = std::make_shared<Waiter>(core_, log_, "gone", Prompt('y', 1));
  ASSERT_EQ(gate.Admit(fr, gone, Req(Prompt('y', 1))).outcome, flow::AdmitOutcome::kQueued);
  EXPECT_DOUBLE_EQ(gate.next_expiry(), 3.0);
  EXPECT_TRUE(gate.Cancel(fr.id));
  EXPECT_FALSE(gate.Cancel(fr.id));  // already gone
  now_ = 2.9;
  gate.Pump();
  EXPECT_TRUE(log_.expired.empty());
  now_ = 3.0;
  gate.Pump();
  EXPECT_EQ(log_.expired, (std::vector<std::string>{"stays:ttl"}));
  EXPECT_TRUE(log_.dispatched.empty());
  EXPECT_FALSE(gate.waiting());
  EXPECT_EQ(gate.next_expiry(), std::numeric_limits<double>::infinity());
  EXPECT_EQ(gate.stats().bands.at(0).cancelled, 1u);
}

// A dispatch that itself pumps (a front end whose dispatch ends a request at once) does
// not recurse: the running pump goes round again and the later request still goes.
TEST_F(FlowGateTest, APumpFromInsideADispatchRunsAsAnotherRound) {
  Scrape(0, "6.0");
  Scrape(1, "6.0");
  FlowGate gate(flow::FlowOptions{}, core_, Clock());
  std::shared_ptr<Waiter> first;
  Admit(gate, "first", 'x', 1, &first);
  Admit(gate, "second", 'y', 1);
  int depth = 0, max_depth = 0;
  first->on_dispatch = [&] {
    ++depth;
    max_depth = std::max(max_depth, depth);
    now_ = 1.6;
    Scrape(1, "3.0");  // more room shows up while the first dispatch runs
    gate.Pump(1);
    --depth;
  };
  now_ = 1.5;
  Scrape(0, "4.0");  // room for one
  gate.Pump(0);
  EXPECT_EQ(max_depth, 1);
  ASSERT_EQ(log_.dispatched.size(), 2u);
  EXPECT_EQ(log_.dispatched[0].substr(0, 6), "first@");
  EXPECT_EQ(log_.dispatched[1].substr(0, 7), "second@");
  EXPECT_FALSE(gate.waiting());
}

}  // namespace
}  // namespace kvroute::flow
