// `kvroute sidecar` (issue 25, item 4): the x-prefiller-host-port value it reads, and
// loopback runs in front of simulated vLLM replicas speaking NixlConnector's protocol
// (docs/SIM_API.md) and recording stand-ins that show exactly what each leg received.
// Every wait is bounded; no timing is asserted.
#include "apps/sidecar/sidecar.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/api/json_scan.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "metrics/metric_sum.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/stub_server.h"
#include "support/wait.h"

namespace kvroute::sidecar {
namespace {

using http::Fetch;
using kvroute::test_support::ClosedPort;
using kvroute::test_support::CompletionBody;
using kvroute::test_support::TokensPrompt;
using kvroute::test_support::RecordingUpstream;
using kvroute::test_support::WaitFor;
using metrics::testing::MetricSum;

// ---- the header ----

TEST(SidecarHeader, NamesAnIpAddressAndPort) {
  Prefiller p;
  EXPECT_EQ(ParsePrefiller("10.0.0.5:8000", {}, &p), PrefillerRefusal::kNone);
  EXPECT_EQ(p.host, "10.0.0.5");
  EXPECT_EQ(p.port, 8000);
  EXPECT_EQ(ParsePrefiller(" [fd00::7]:9 ", {}, &p), PrefillerRefusal::kNone);
  EXPECT_EQ(p.host, "fd00::7");
  EXPECT_EQ(p.port, 9);
  // Bytes after a NUL are no part of an address (a fuzz finding: the system parser stopped
  // at the NUL and took the rest for 10.0.0.2).
  EXPECT_EQ(ParsePrefiller(std::string("10.0.0.2\0x\"y:80", 15), {}, &p), PrefillerRefusal::kInvalid);
  EXPECT_FALSE(ParseCidrList(std::string("10.0.0.2\0/8", 11)).has_value());
  // A list names its first entry.
  EXPECT_EQ(ParsePrefiller("10.0.0.6:8001,10.0.0.7:8001", {}, &p), PrefillerRefusal::kNone);
  EXPECT_EQ(p.host, "10.0.0.6");
  for (const char* bad : {"", "10.0.0.5", "10.0.0.5:", "10.0.0.5:0", "10.0.0.5:65536", "10.0.0.5:80x",
                          "prefill-0.svc:8000", "fd00::7:8000", "[fd00::7]8000", "[fd00::7", ":8000",
                          "http://10.0.0.5:8000", "[fe80::1%eth0]:80"}) {
    EXPECT_EQ(ParsePrefiller(bad, {}, &p), PrefillerRefusal::kInvalid) << bad;
  }
}

TEST(SidecarHeader, AllowListHoldsTheAddressOrRefusesIt) {
  std::string error;
  auto allow = ParseCidrList("10.1.0.0/16, fd00::/8 ,192.168.1.7", &error);
  ASSERT_TRUE(allow.has_value()) << error;
  ASSERT_EQ(allow->size(), 3u);
  Prefiller p;
  EXPECT_EQ(ParsePrefiller("10.1.200.3:8000", *allow, &p), PrefillerRefusal::kNone);
  EXPECT_EQ(ParsePrefiller("10.2.0.1:8000", *allow, &p), PrefillerRefusal::kNotAllowed);
  EXPECT_EQ(ParsePrefiller("[fdff::1]:8000", *allow, &p), PrefillerRefusal::kNone);
  EXPECT_EQ(ParsePrefiller("[fe80::1]:8000", *allow, &p), PrefillerRefusal::kNotAllowed);
  EXPECT_EQ(ParsePrefiller("192.168.1.7:1", *allow, &p), PrefillerRefusal::kNone);
  EXPECT_EQ(ParsePrefiller("192.168.1.8:1", *allow, &p), PrefillerRefusal::kNotAllowed);
  // /0 holds every address of its family, not the other one's.
  auto any4 = ParseCidrList("0.0.0.0/0");
  ASSERT_TRUE(any4.has_value());
  EXPECT_EQ(ParsePrefiller("203.0.113.9:1", *any4, &p), PrefillerRefusal::kNone);
  EXPECT_EQ(ParsePrefiller("[::1]:1", *any4, &p), PrefillerRefusal::kNotAllowed);
  for (const char* bad : {"10.0.0.0/33", "fd00::/129", "10.0.0.0/", "10.0.0.0/x", "pods", "10.0.0.0/8,nope"}) {
    EXPECT_FALSE(ParseCidrList(bad, &error).has_value()) << bad;
    EXPECT_FALSE(error.empty()) << bad;
    error.clear();
  }
  EXPECT_TRUE(ParseCidrList("")->empty());
}

// ---- loopback ----

class SidecarTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (sidecar_) sidecar_->Stop();
    sidecar_.reset();
    fleet_.reset();
  }
  // r0 (a prefill pod's engine) and r1 (the decode pod's own engine).
  void StartFleet(const std::string& failure_policy = "fail") {
    std::vector<sim::ReplicaConfig> rs;
    for (int i = 0; i < 2; ++i) {
      rs.push_back(kvroute::test_support::SimReplica({.kv_blocks = 512, .time_scale = 0.0}));
      rs.back().name = i == 0 ? "r0" : "r1";
      rs.back().enable_prompt_tokens_details = true;
      rs.back().pd.load_failure_policy = failure_policy;
    }
    fleet_ = std::make_unique<sim::Fleet>(std::move(rs), 2);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  void StartSidecar(uint16_t engine_port, SidecarOptions o = {}) {
    o.listen_host = "127.0.0.1";
    o.listen_port = 0;
    o.engine_port = engine_port;
    o.threads = 2;
    o.log = false;
    sidecar_ = std::make_unique<Sidecar>(o);
    ASSERT_TRUE(sidecar_->Start().ok());
  }
  std::optional<http::ClientResponse> Post(const std::string& body, const std::string& prefiller,
                                           std::vector<std::pair<std::string, std::string>> headers = {}) {
    if (!prefiller.empty()) headers.emplace_back("x-prefiller-host-port", prefiller);
    return Fetch("127.0.0.1", sidecar_->port(), "POST", "/v1/completions", body, headers);
  }
  std::string SidecarMetrics() {
    auto r = Fetch("127.0.0.1", sidecar_->port(), "GET", "/sidecar/metrics");
    return r && r->status == 200 ? r->body : std::string();
  }
  double Sim(int i, std::string_view name) {
    auto r = Fetch("127.0.0.1", fleet_->port(i), "GET", "/metrics");
    return MetricSum(r && r->status == 200 ? r->body : std::string(), name);
  }
  std::string SimAddress(int i) { return "127.0.0.1:" + std::to_string(fleet_->port(i)); }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Sidecar> sidecar_;
};

TEST_F(SidecarTest, PrefillThereThenTheLocalEngineStreamsTheAnswer) {
  StartFleet();
  StartSidecar(fleet_->port(1));
  auto r = Post(CompletionBody(TokensPrompt(1000, 1), 5, /*stream=*/true, /*include_usage=*/true), SimAddress(0));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->body.find("\"completion_tokens\":5"), std::string::npos) << r->body;
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");
  // Prefill's cached tokens (a cold prompt: 0), not the tokens the decode engine pulled.
  EXPECT_EQ(api::IntAfterKey(r->body, "\"cached_tokens\""), 0) << r->body;
  // One prefill leg on r0 (1 token, nothing streamed); r1 pulled the prompt from it.
  EXPECT_EQ(Sim(0, "kvroute_sim_pd_prefill_requests_total"), 1);
  EXPECT_EQ(Sim(0, "vllm:generation_tokens_total"), 1);
  EXPECT_EQ(Sim(1, "kvroute_sim_pd_kv_pulls_total"), 1);
  EXPECT_GT(Sim(1, "kvroute_sim_pd_kv_pulled_tokens_total"), 900);
  EXPECT_EQ(Sim(1, "vllm:generation_tokens_total"), 5);
  std::string m = SidecarMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_sidecar_requests_total", {{"path", "pd"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "ok"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "decode"}, {"outcome", "ok"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total"), 2);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total"), 0);
}

TEST_F(SidecarTest, WithoutTheHeaderEverythingGoesToTheLocalEngineUnchanged) {
  StartFleet();
  StartSidecar(fleet_->port(1));
  auto r = Post(CompletionBody(TokensPrompt(1000, 2), 3), "");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Sim(0, "vllm:request_success_total"), 0);
  EXPECT_EQ(Sim(1, "vllm:request_success_total"), 1);
  EXPECT_EQ(Sim(1, "kvroute_sim_pd_decode_requests_total"), 0);
  // The picker scrapes the engine through the sidecar; /v1/models and errors pass too.
  auto metrics = Fetch("127.0.0.1", sidecar_->port(), "GET", "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(MetricSum(metrics->body, "vllm:request_success_total"), 1) << metrics->body;
  auto models = Fetch("127.0.0.1", sidecar_->port(), "GET", "/v1/models");
  ASSERT_TRUE(models.has_value());
  EXPECT_EQ(models->status, 200);
  EXPECT_NE(models->body.find(kvroute::test_support::kTestModel), std::string::npos) << models->body;
  auto bad = Post("{\"model\":", SimAddress(0));
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_EQ(Sim(0, "vllm:request_success_total"), 0);  // not JSON: no prefill leg
  std::string m = SidecarMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_sidecar_requests_total", {{"path", "local"}}), 2);
  EXPECT_EQ(MetricSum(m, "kvroute_sidecar_requests_total", {{"path", "passthrough"}}), 2);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total"), 0);
}

TEST_F(SidecarTest, LegsCarryTheirBodiesHeadersAndOneRequestId) {
  const std::string kv = R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[3,4],)"
                         R"("remote_engine_id":"p","remote_request_id":"cmpl-p","remote_host":"10.0.0.5",)"
                         R"("remote_port":5600,"tp_size":1})";
  RecordingUpstream prefill(R"({"id":"cmpl-p","choices":[{"index":0,"text":"a","finish_reason":"length"}],)"
                            R"("usage":{"prompt_tokens":300,"completion_tokens":1,"prompt_tokens_details":)"
                            R"({"cached_tokens":7}},"kv_transfer_params":)" + kv + "}");
  RecordingUpstream engine(R"({"id":"cmpl-d","choices":[{"index":0,"text":"abc","finish_reason":"length"}],)"
                           R"("usage":{"prompt_tokens":300,"completion_tokens":3,"prompt_tokens_details":)"
                           R"({"cached_tokens":288}},"kv_transfer_params":null})");
  StartSidecar(engine.port());
  const std::string prompt = TokensPrompt(300, 3);
  const std::string client = R"({"model":"m","prompt":")" + prompt +
                             R"(","max_tokens":3,"min_tokens":2,"stream":false})";
  auto r = Post(client, "127.0.0.1:" + std::to_string(prefill.port()),
                {{"x-request-id", "req-1"}, {"traceparent", "00-ab-cd-01"}, {"x-app", "kept"},
                 {"connection", "keep-alive, x-hop"}, {"x-hop", "dropped"}});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body, R"({"id":"cmpl-d","choices":[{"index":0,"text":"abc","finish_reason":"length"}],)"
                     R"("usage":{"prompt_tokens":300,"completion_tokens":3,"prompt_tokens_details":)"
                     R"({"cached_tokens":7}},"kv_transfer_params":null})");
  auto p = prefill.seen();
  auto d = engine.seen();
  ASSERT_EQ(p.size(), 1u);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(p[0].body, R"({"model":"m","prompt":")" + prompt +
                           R"(","stream":false,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,)"
                           R"("do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,)"
                           R"("remote_host":null,"remote_port":null}})");
  EXPECT_EQ(d[0].body, client.substr(0, client.size() - 1) + R"(,"kv_transfer_params":)" + kv + "}");
  for (const auto* seen : {&p[0], &d[0]}) {
    EXPECT_EQ(seen->target, "/v1/completions");
    EXPECT_EQ(seen->request_id, "req-1");
    EXPECT_EQ(seen->Header("traceparent"), "00-ab-cd-01");
    EXPECT_EQ(seen->Header("x-app"), "kept");
    EXPECT_EQ(seen->Header("x-hop"), "");                  // named by Connection: hop-by-hop
    EXPECT_EQ(seen->Header("x-prefiller-host-port"), "");  // the sidecar's own
  }
  // No X-Request-Id from the client: one made up, the same on both legs.
  r = Post(client, "127.0.0.1:" + std::to_string(prefill.port()));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  p = prefill.seen();
  d = engine.seen();
  ASSERT_EQ(p.size(), 2u);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(p[1].request_id.rfind("kvroute-", 0), 0u) << p[1].request_id;
  EXPECT_EQ(p[1].request_id, d[1].request_id);
}

TEST_F(SidecarTest, ADeadPrefillPodIsRetriedThenTheLocalEnginePrefills) {
  StartFleet();
  SidecarOptions o;
  o.prefill_max_retries = 2;
  StartSidecar(fleet_->port(1), o);
  auto r = Post(CompletionBody(TokensPrompt(1000, 4), 4, /*stream=*/true), "127.0.0.1:" + std::to_string(ClosedPort()));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");
  // The engine got the client's body as it came: no pull.
  EXPECT_EQ(Sim(1, "kvroute_sim_pd_decode_requests_total"), 0);
  EXPECT_EQ(Sim(1, "vllm:request_success_total"), 1);
  std::string m = SidecarMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "error"}}), 3);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total", {{"reason", "prefill_retry"}}), 2);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total", {{"reason", "local_prefill"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "decode"}}), 0);  // no remote decode
}

TEST_F(SidecarTest, APrefillPodOutsideTheAllowListIsNeverContacted) {
  StartFleet();
  SidecarOptions o;
  o.prefiller_allow = *ParseCidrList("10.0.0.0/8");
  StartSidecar(fleet_->port(1), o);
  for (const std::string& header : {SimAddress(0), std::string("prefill-0:8000")}) {
    auto r = Post(CompletionBody(TokensPrompt(1000, 5), 2), header);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_EQ(Sim(0, "vllm:request_success_total"), 0);
  EXPECT_EQ(Sim(1, "vllm:request_success_total"), 2);
  std::string m = SidecarMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_sidecar_prefiller_refused_total", {{"reason", "not_allowed"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_sidecar_prefiller_refused_total", {{"reason", "invalid"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_sidecar_requests_total", {{"path", "local"}}), 2);
}

TEST_F(SidecarTest, AFailedTransferIsServedAgainAsAnOrdinaryRequest) {
  // Prefill names an engine the decode replica cannot pull from; under
  // kv_load_failure_policy fail the engine answers 500 before any byte.
  StartFleet("fail");
  std::string blocks;  // the 62 full blocks of a 1,000-token prompt
  for (int i = 1; i <= 62; ++i) blocks += (i > 1 ? "," : "") + std::to_string(i);
  RecordingUpstream prefill(R"({"id":"cmpl-p","choices":[{"index":0,"text":"a","finish_reason":"length"}],)"
                            R"("usage":{"prompt_tokens":1000,"completion_tokens":1},"kv_transfer_params":)"
                            R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[)" +
                            blocks + R"(],"remote_engine_id":"gone","remote_request_id":"x",)"
                            R"("remote_host":"127.0.0.1","remote_port":1,"tp_size":1}})");
  StartSidecar(fleet_->port(1));
  auto r = Post(CompletionBody(TokensPrompt(1000, 6), 4, /*stream=*/true, /*include_usage=*/true),
                "127.0.0.1:" + std::to_string(prefill.port()));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->body.find("\"completion_tokens\":4"), std::string::npos) << r->body;
  EXPECT_EQ(Sim(1, "kvroute_sim_pd_kv_transfer_failures_total"), 1);
  EXPECT_EQ(Sim(1, "vllm:request_success_total"), 1);
  std::string m = SidecarMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "ok"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "decode"}, {"outcome", "error"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total", {{"reason", "decode_retry"}}), 1);
}

TEST_F(SidecarTest, AnUnreachableEngineIsAClearError) {
  StartSidecar(ClosedPort());
  auto r = Post(CompletionBody("hi", 2), "");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 502);
  EXPECT_NE(r->body.find("\"error\""), std::string::npos) << r->body;
  auto health = Fetch("127.0.0.1", sidecar_->port(), "GET", "/sidecar/healthz");
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->status, 200);
}

}  // namespace
}  // namespace kvroute::sidecar
