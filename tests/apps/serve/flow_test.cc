// Flow control in `kvroute serve` over loopback: a real router with `flow.enabled` in
// front of the saturable fleet of support/flow_fixture.h (one replica slow enough that
// requests stay in flight; one big prompt saturates it). Every wait is bounded; TTLs are
// short real times (the router reads a monotonic clock).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "config/router_config.h"
#include "core/api/openai.h"
#include "adapters/http/test_client.h"
#include "apps/serve/router.h"
#include "apps/sim/fleet.h"
#include "metrics/metric_sum.h"
#include "support/flow_fixture.h"
#include "support/openai_body.h"
#include "support/wait.h"

namespace kvroute::router {
namespace {

using namespace std::chrono_literals;
using http::ClientResponse;
using http::Fetch;
using http::TestClient;
using metrics::testing::MetricSum;
using Headers = std::vector<std::pair<std::string, std::string>>;
using kvroute::test_support::BigPrompt;

std::string Body(std::string_view prompt, int max_tokens, bool stream, int priority = 0) {
  return kvroute::test_support::CompletionBody(prompt, max_tokens, stream, false, priority);
}

using kvroute::test_support::WaitFor;

class FlowTest : public ::testing::Test, public kvroute::test_support::FlowSignals {
 protected:
  void TearDown() override {
    clients_.clear();
    if (router_) router_->Stop();
    router_.reset();
    fleet_.reset();
  }

  void StartFleet() {
    fleet_ = kvroute::test_support::SaturableFleet();
    ASSERT_TRUE(fleet_->Start().ok());
  }

  // `flow` holds the keys under `flow:` besides `enabled`; `extra` more top-level YAML.
  void StartRouter(const std::string& flow, const std::string& extra = "", bool enabled = true,
                   const std::string& endpoints = "") {
    const std::string eps =
        endpoints.empty() ? kvroute::test_support::FlowEndpoint(fleet_->port(0)) : endpoints;
    const std::string yaml =
        "threads: 2\n" + kvroute::test_support::FlowConfigYaml(eps, enabled, flow, extra);
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "test.yaml");
    ASSERT_TRUE(r.ok()) << r.error.ToString() << "\n" << yaml;
    RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = false;
    router_ = std::make_unique<Router>(std::move(*r.value), o);
    Status st = router_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void WaitReady() {
    ASSERT_TRUE(WaitFor([&] {
      auto r = Fetch("127.0.0.1", router_->port(), "GET", "/readyz");
      return r && r->status == 200;
    }));
  }

  std::string Metrics() override {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? r->body : std::string();
  }

  // Sends a request on a connection of its own and leaves the response unread.
  TestClient* Send(const std::string& body, const Headers& headers = {}) {
    auto c = std::make_unique<TestClient>("127.0.0.1", router_->port(), 10000ms);
    EXPECT_TRUE(c->SendRequest("POST", "/v1/completions", body, headers)) << c->error();
    clients_.push_back(std::move(c));
    return clients_.back().get();
  }

  // A streamed request that fills most of the KV cache and keeps generating for
  // `max_tokens` (~6 ms each); returns once its first token arrived and the router
  // counts the pool saturated.
  TestClient* Saturate(char c, int max_tokens = 250) {
    TestClient* t = Send(Body(BigPrompt(c), max_tokens, true));
    ClientResponse head;
    EXPECT_TRUE(t->ReadHead(&head)) << t->error();
    EXPECT_EQ(head.status, 200);
    EXPECT_TRUE(t->ReadChunk().has_value()) << t->error();
    EXPECT_TRUE(WaitSaturated()) << Metrics();
    return t;
  }

  // Sends `body` and waits until `waiting` requests wait in the flow queue.
  TestClient* Queue(const std::string& body, double waiting, const Headers& headers = {}) {
    TestClient* t = Send(body, headers);
    EXPECT_TRUE(WaitFor([&] { return Waiting() == waiting; })) << Metrics();
    return t;
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Router> router_;
  std::vector<std::unique_ptr<TestClient>> clients_;
};

TEST_F(FlowTest, QueuedWhileSaturatedThenDispatchedWhenARequestFinishes) {
  StartFleet();
  StartRouter("");
  WaitReady();
  TestClient* a = Saturate('a', 150);
  TestClient* b = Queue(Body("hello", 4, false), 1);
  EXPECT_EQ(Metric("kvroute_flow_waiting_requests", {{"priority", "0"}}), 1);
  EXPECT_GT(Metric("kvroute_flow_waiting_bytes", {{"priority", "0"}}), 0);
  EXPECT_EQ(fleet_->LiveRequests(0), 1);  // only A reached the replica
  // A runs to its end; its completion frees the capacity B waited for.
  ClientResponse rest;
  ASSERT_TRUE(a->ReadBody(&rest)) << a->error();
  ClientResponse got;
  ASSERT_TRUE(b->ReadHead(&got)) << b->error();
  ASSERT_TRUE(b->ReadBody(&got)) << b->error();
  EXPECT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Header("x-kvroute-endpoint"), "r0");
  const std::string m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvroute_flow_waiting_requests"), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_flow_waiting_bytes"), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_flow_dispatched_total", {{"cause", "order"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_flow_dispatched_total", {{"cause", "immediate"}}), 1);
  // Two dispatches recorded: A at once (0 s), B after waiting for A.
  EXPECT_EQ(MetricSum(m, "kvroute_flow_wait_seconds_count", {{"priority", "0"}}), 2);
  EXPECT_GT(MetricSum(m, "kvroute_flow_wait_seconds_sum", {{"priority", "0"}}), 0.0);
  // The router counts a request when its proxying ends, which may come just after the
  // client has read the last byte: wait for both to be counted (and never more).
  EXPECT_TRUE(WaitFor([&] {
    return MetricSum(Metrics(), "kvroute_requests_total", {{"endpoint", "r0"}, {"code", "200"}}) >= 2;
  }));
  EXPECT_EQ(MetricSum(Metrics(), "kvroute_requests_total", {{"endpoint", "r0"}, {"code", "200"}}), 2);
}

TEST_F(FlowTest, SheddableGets429AtOnceWhileSaturated) {
  StartFleet();
  StartRouter("", "epp:\n  objectives: {batch: -1}\n");
  WaitReady();
  TestClient* a = Saturate('a');
  // vLLM's priority 3 (less important) is band -3; the objective `batch` is band -1.
  for (const auto& [body, headers] :
       {std::pair{Body("hello", 4, false, 3), Headers{}},
        std::pair{Body("hello", 4, false), Headers{{"x-gateway-inference-objective", "batch"}}}}) {
    const auto start = std::chrono::steady_clock::now();
    auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", body, headers);
    ASSERT_TRUE(r.has_value());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1000ms);  // at once, not after a wait
    EXPECT_EQ(r->status, 429) << r->body;
    EXPECT_EQ(r->Header("retry-after"), "1");
    EXPECT_EQ(r->Header("x-llm-d-request-dropped-reason"), "rejected-saturated");
    EXPECT_NE(r->body.find("\"type\":\"RateLimitError\""), std::string::npos) << r->body;
    EXPECT_NE(r->body.find("sheddable"), std::string::npos) << r->body;
  }
  EXPECT_EQ(Metric("kvroute_flow_rejected_total", {{"reason", "sheddable"}}), 2);
  // Counted right after the answer is handed to the connection: wait for it.
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_requests_total", {{"endpoint", ""}, {"code", "429"}}) >= 2; }));
  EXPECT_EQ(Metric("kvroute_requests_total", {{"endpoint", ""}, {"code", "429"}}), 2);
  EXPECT_EQ(fleet_->LiveRequests(0), 1);
  a->Close();
  // Unsaturated, a sheddable request goes through.
  ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_kv_usage_adjusted") < 0.8; }));
  auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", Body("hello", 4, false, 3));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200) << r->body;
}

// capture: requests flow control answers without a pick are captured too (status 429),
// as are the one cancelled mid-stream (499) and the one served (200).
TEST_F(FlowTest, CaptureWritesRefusedAndCancelledRequestsWithTheirStatus) {
  const std::string path = ::testing::TempDir() + "/kvroute-flow-capture.jsonl";
  std::remove(path.c_str());
  std::remove((path + ".1").c_str());
  StartFleet();
  StartRouter("", "epp:\n  objectives: {batch: -1}\ncapture: {path: " + path + ", block_size: 16}\n");
  WaitReady();
  TestClient* a = Saturate('a');
  auto shed = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", Body("hello", 4, false, 3));
  ASSERT_TRUE(shed.has_value());
  EXPECT_EQ(shed->status, 429);
  a->Close();
  ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_kv_usage_adjusted") < 0.8; }));
  auto ok = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", Body("hello", 4, false));
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200);
  ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_capture_lines_total", {{"result", "written"}}) == 3; }))
      << Metrics();
  router_->Stop();
  router_.reset();
  std::ifstream f(path);
  std::multiset<std::string> statuses;
  std::string line;
  while (std::getline(f, line)) {
    const auto at = line.find("\"status\": ");
    ASSERT_NE(at, std::string::npos) << line;
    statuses.insert(line.substr(at + 10, 3));
    EXPECT_EQ(line.rfind("{\"timestamp\": ", 0), 0u) << line;
  }
  EXPECT_EQ(statuses, (std::multiset<std::string>{"200", "429", "499"}));
  std::remove(path.c_str());
}

TEST_F(FlowTest, PastItsTtlAWaitingRequestGets429WithRetryAfter) {
  StartFleet();
  StartRouter("  ttl: 300ms\n");
  WaitReady();
  Saturate('a', 300);  // ~1.8 s
  const auto start = std::chrono::steady_clock::now();
  TestClient* b = Send(Body("hello", 4, false));
  ClientResponse got;
  ASSERT_TRUE(b->ReadHead(&got)) << b->error();
  ASSERT_TRUE(b->ReadBody(&got)) << b->error();
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(got.status, 429) << got.body;
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 1500ms);  // the TTL, not the saturating request's end
  EXPECT_EQ(got.Header("retry-after"), "1");
  EXPECT_EQ(got.Header("x-llm-d-request-dropped-reason"), "rejected-ttl-expired");
  EXPECT_EQ(got.Header("content-type"), "application/json");
  EXPECT_NE(got.body.find("{\"error\":{\"message\":"), std::string::npos) << got.body;
  EXPECT_NE(got.body.find("\"type\":\"RateLimitError\""), std::string::npos) << got.body;
  EXPECT_NE(got.body.find("\"code\":429"), std::string::npos) << got.body;
  const std::string m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvroute_flow_expired_total", {{"reason", "ttl"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_flow_waiting_requests"), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_flow_dispatched_total", {{"cause", "order"}}), 0);
  EXPECT_EQ(fleet_->LiveRequests(0), 1);
}

TEST_F(FlowTest, OverTheBandBoundGets429) {
  StartFleet();
  StartRouter("  max_requests: 1\n");
  WaitReady();
  TestClient* a = Saturate('a');
  TestClient* b = Queue(Body("hello", 4, false), 1);
  auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", Body("again", 4, false));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(r->Header("retry-after"), "1");
  EXPECT_EQ(r->Header("x-llm-d-request-dropped-reason"), "rejected-saturated");
  EXPECT_NE(r->body.find("\"type\":\"RateLimitError\""), std::string::npos) << r->body;
  EXPECT_EQ(Metric("kvroute_flow_rejected_total", {{"reason", "band_full_requests"}}), 1);
  EXPECT_EQ(Waiting(), 1);
  a->Close();  // the queued one still gets through
  ClientResponse got;
  ASSERT_TRUE(b->ReadHead(&got)) << b->error();
  EXPECT_EQ(got.status, 200);
}

TEST_F(FlowTest, ClientLeavingWhileQueuedLeavesNothing) {
  StartFleet();
  StartRouter("");
  WaitReady();
  TestClient* a = Saturate('a');
  TestClient* b = Queue(Body("hello", 4, false), 1);
  b->Close();
  EXPECT_TRUE(WaitFor([&] { return Waiting() == 0; })) << Metrics();
  EXPECT_EQ(Metric("kvroute_flow_cancelled_total"), 1);
  EXPECT_EQ(Metric("kvroute_flow_waiting_bytes"), 0);
  // Counted right after the answer is handed to the connection: wait for it.
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_requests_total", {{"endpoint", ""}, {"code", "499"}}) >= 1; }));
  EXPECT_EQ(Metric("kvroute_requests_total", {{"endpoint", ""}, {"code", "499"}}), 1);
  // Capacity frees: nothing is left to dispatch.
  a->Close();
  EXPECT_TRUE(WaitFor([&] { return fleet_->LiveRequests(0) == 0; }));
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_kv_usage_adjusted") < 0.8; }));
  std::this_thread::sleep_for(100ms);  // a few scrapes, each a chance to dispatch
  EXPECT_EQ(Metric("kvroute_flow_dispatched_total", {{"cause", "order"}}), 0);
  EXPECT_EQ(fleet_->LiveRequests(0), 0);
}

TEST_F(FlowTest, AHigherPriorityQueuedLaterGoesFirst) {
  StartFleet();
  StartRouter("", "epp:\n  objectives: {interactive: 1}\n");
  WaitReady();
  TestClient* a = Saturate('a');
  // Each waiting request saturates the pool again once dispatched: one goes per release.
  Queue(Body(BigPrompt('b'), 250, true), 1);
  Queue(Body(BigPrompt('c'), 250, true), 2);
  TestClient* p = Queue(Body(BigPrompt('p'), 250, true), 3,
                        {{"x-gateway-inference-objective", "interactive"}});
  EXPECT_EQ(Metric("kvroute_flow_waiting_requests", {{"priority", "0"}}), 2);
  EXPECT_EQ(Metric("kvroute_flow_waiting_requests", {{"priority", "1"}}), 1);
  a->Close();  // the finish frees room for one
  ClientResponse head;
  ASSERT_TRUE(p->ReadHead(&head)) << p->error();
  EXPECT_EQ(head.status, 200);
  const std::string m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvroute_flow_waiting_requests", {{"priority", "1"}}), 0);
  // p overtook requests queued before it: when its head arrives, at least one priority-0
  // request still waits (FIFO would have sent both first). Usually both wait; on a loaded
  // machine a scrape between p's dispatch and this read may release one more.
  const double low_waiting = MetricSum(m, "kvroute_flow_waiting_requests", {{"priority", "0"}});
  EXPECT_GE(low_waiting, 1) << m;
  EXPECT_EQ(low_waiting + MetricSum(m, "kvroute_flow_dispatched_total", {{"cause", "order"}}), 3) << m;
}

TEST_F(FlowTest, NoEndpointReadyWaitsItsNoEndpointTtlThen503) {
  StartFleet();
  // An endpoint nobody listens on: never ready.
  StartRouter("  no_endpoint_ttl: 200ms\n", "", true, "    - {address: 127.0.0.1:1, name: dead}\n");
  const auto start = std::chrono::steady_clock::now();
  auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", Body("hello", 4, false));
  ASSERT_TRUE(r.has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_NE(r->body.find("\"code\":503"), std::string::npos) << r->body;
  EXPECT_EQ(r->Header("x-llm-d-request-dropped-reason"), "rejected-no-endpoints");
  EXPECT_EQ(Metric("kvroute_flow_expired_total", {{"reason", "no_endpoint_ttl"}}), 1);
}

TEST_F(FlowTest, DisabledDispatchesAtArrivalAndExportsNothing) {
  StartFleet();
  StartRouter("  max_requests: 1\n", "", /*enabled=*/false);
  WaitReady();
  TestClient* a = Saturate('a', 150);
  auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", Body("hello", 4, false));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Metrics().find("kvroute_flow_"), std::string::npos);
  a->Close();
}

}  // namespace
}  // namespace kvroute::router
