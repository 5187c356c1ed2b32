// `kvroute serve` runs prefill/decode pairs (issue 25, item 3): the two legs' bodies, and
// loopback runs against an in-process simulated fleet of prefill and decode replicas
// (the replicas speak vLLM's NixlConnector protocol, docs/SIM_API.md). Every wait is
// bounded; no timing is asserted.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "config/router_config.h"
#include "core/api/json_scan.h"
#include "adapters/http/test_client.h"
#include "apps/serve/router.h"
#include "apps/sim/fleet.h"
#include "metrics/metric_sum.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/stub_server.h"
#include "support/wait.h"

namespace kvroute::router {
namespace {

using http::Fetch;
using kvroute::test_support::CompletionBody;
using kvroute::test_support::TokensPrompt;
using kvroute::test_support::LoopbackServer;
using kvroute::test_support::RecordingUpstream;
using kvroute::test_support::StubUpstream;
using kvroute::test_support::WaitFor;
using metrics::testing::MetricSum;

// ---- through serve ----

// "r<i>", built so g++ 12 raises no false -Wrestrict on `"r" + std::to_string(i)`.
std::string Name(int i) {
  std::string s = "r";
  s += std::to_string(i);
  return s;
}

class PdServeTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    fleet_.reset();
  }

  // Replicas r0..r<n-1>, reporting cached prompt tokens.
  void StartFleet(int n) {
    std::vector<sim::ReplicaConfig> rs;
    for (int i = 0; i < n; ++i) {
      rs.push_back(kvroute::test_support::SimReplica({.kv_blocks = 512, .time_scale = 0.0}));
      rs.back().name = Name(i);
      rs.back().enable_prompt_tokens_details = true;
    }
    fleet_ = std::make_unique<sim::Fleet>(std::move(rs), 2);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  std::string Entry(const std::string& name, uint16_t port, const std::string& role) {
    return "    - {address: 127.0.0.1:" + std::to_string(port) + ", name: " + name +
           ", labels: {llm-d.ai/role: " + role + "}}\n";
  }
  std::string SimEntry(int i, const std::string& role) { return Entry(Name(i), fleet_->port(i), role); }

  void StartRouter(const std::string& endpoints, int fresh) {
    std::string yaml = "threads: 2\npool:\n  scrape_interval: 30s\n  staleness: 60s\n  endpoints:\n" +
                       endpoints + "scheduling:\n  policy: round-robin\n";
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "test.yaml");
    ASSERT_TRUE(r.ok()) << r.error.ToString() << "\n" << yaml;
    RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = false;
    router_ = std::make_unique<Router>(std::move(*r.value), o);
    ASSERT_TRUE(router_->Start().ok());
    ASSERT_TRUE(WaitFor([&] { return MetricSum(RouterMetrics(), "kvroute_endpoint_metrics_fresh") == fresh; }))
        << RouterMetrics();
  }

  std::string RouterMetrics() {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    return r && r->status == 200 ? r->body : std::string();
  }
  std::string SimMetrics(int i) {
    auto r = Fetch("127.0.0.1", fleet_->port(i), "GET", "/metrics");
    return r && r->status == 200 ? r->body : std::string();
  }
  double Sim(int i, std::string_view name) { return MetricSum(SimMetrics(i), name); }
  std::optional<http::ClientResponse> Post(const std::string& body) {
    return Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", body);
  }
  // Every request answered has been counted (the count follows the last byte).
  void WaitCounted(int n) {
    ASSERT_TRUE(WaitFor([&] { return MetricSum(RouterMetrics(), "kvroute_requests_total") == n; }))
        << RouterMetrics();
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Router> router_;
};

TEST_F(PdServeTest, LongPromptGoesPrefillThenDecodeAndStreamsTheDecodeAnswer) {
  StartFleet(4);
  StartRouter(SimEntry(0, "prefill") + SimEntry(1, "prefill") + SimEntry(2, "decode") +
                  SimEntry(3, "decode"),
              4);
  auto r = Post(CompletionBody(TokensPrompt(1000, 1), 5, /*stream=*/true, /*include_usage=*/true));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string decode = r->Header("x-kvroute-endpoint");
  const std::string prefill = r->Header("x-kvroute-prefill");
  ASSERT_TRUE(decode == "r2" || decode == "r3") << decode;
  ASSERT_TRUE(prefill == "r0" || prefill == "r1") << prefill;
  const int d = decode[1] - '0', p = prefill[1] - '0';
  // The client gets the decode leg's stream: 5 tokens, the usage chunk, [DONE].
  EXPECT_NE(r->body.find("\"completion_tokens\":5"), std::string::npos) << r->body;
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");
  // Cached tokens are prefill's (a cold prompt: 0), not the tokens decode pulled.
  EXPECT_EQ(api::IntAfterKey(r->body, "\"cached_tokens\""), 0) << r->body;
  WaitCounted(1);
  // One prefill leg on the prefill replica, nothing on the other; one decode leg that
  // pulled the prompt's blocks from it on the decode replica.
  EXPECT_EQ(Sim(p, "kvroute_sim_pd_prefill_requests_total"), 1);
  EXPECT_EQ(Sim(1 - p, "kvroute_sim_pd_prefill_requests_total"), 0);
  EXPECT_EQ(Sim(d, "kvroute_sim_pd_decode_requests_total"), 1);
  EXPECT_EQ(Sim(d, "kvroute_sim_pd_kv_pulls_total"), 1);
  EXPECT_GT(Sim(d, "kvroute_sim_pd_kv_pulled_tokens_total"), 0);
  EXPECT_EQ(Sim(5 - d, "kvroute_sim_pd_decode_requests_total"), 0);
  // The prefill leg generated 1 token and streamed nothing; decode generated the answer.
  EXPECT_EQ(MetricSum(SimMetrics(p), "vllm:generation_tokens_total"), 1);
  EXPECT_EQ(MetricSum(SimMetrics(d), "vllm:generation_tokens_total"), 5);
  std::string m = RouterMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "ok"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "decode"}, {"outcome", "ok"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total"), 2);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total"), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_prefill_queued_tokens"), 0);  // OnPrefillDone ran
  EXPECT_EQ(MetricSum(m, "kvroute_requests_total", {{"endpoint", decode}, {"code", "200"}}), 1);

  // Not streamed: the whole body, usage rewritten the same way.
  r = Post(CompletionBody(TokensPrompt(1000, 2), 3));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(r->Header("x-kvroute-prefill").empty());
  EXPECT_EQ(api::IntAfterKey(r->body, "\"cached_tokens\""), 0) << r->body;
  EXPECT_NE(r->body.find("\"completion_tokens\":3"), std::string::npos) << r->body;
  WaitCounted(2);
  m = RouterMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "ok"}}), 2);
  EXPECT_EQ(MetricSum(SimMetrics(0), "kvroute_sim_pd_prefill_requests_total") +
                MetricSum(SimMetrics(1), "kvroute_sim_pd_prefill_requests_total"),
            2);
}

TEST_F(PdServeTest, ShortPromptIsServedByADecodeReplicaAlone) {
  StartFleet(4);
  StartRouter(SimEntry(0, "prefill") + SimEntry(1, "prefill") + SimEntry(2, "decode") +
                  SimEntry(3, "decode"),
              4);
  auto r = Post(CompletionBody("a short prompt", 4, /*stream=*/true));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string decode = r->Header("x-kvroute-endpoint");
  EXPECT_TRUE(decode == "r2" || decode == "r3") << decode;
  EXPECT_EQ(r->Header("x-kvroute-prefill"), "");
  WaitCounted(1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Sim(i, "kvroute_sim_pd_prefill_requests_total"), 0) << i;
    EXPECT_EQ(Sim(i, "kvroute_sim_pd_decode_requests_total"), 0) << i;
  }
  EXPECT_EQ(Sim(0, "vllm:request_success_total") + Sim(1, "vllm:request_success_total"), 0);
  std::string m = RouterMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_pd_decisions_total", {{"decision", "short_prompt"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total"), 0);
}

TEST_F(PdServeTest, ADeadPrefillReplicaIsRetriedOnAnother) {
  StartFleet(2);  // r0 prefill, r1 decode
  StubUpstream dead(StubUpstream::Mode::kOk);
  // The dead prefill endpoint comes first (the lower id wins the tie between two idle,
  // cold prefill endpoints); it looks healthy to the scraper, then stops accepting.
  StartRouter(Entry("dead", dead.port(), "prefill") + SimEntry(0, "prefill") + SimEntry(1, "decode"), 3);
  dead.StopAccepting();
  auto r = Post(CompletionBody(TokensPrompt(1000, 3), 4, /*stream=*/true, /*include_usage=*/true));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->Header("x-kvroute-endpoint"), "r1");
  EXPECT_EQ(r->Header("x-kvroute-prefill"), "r0");
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");
  WaitCounted(1);
  EXPECT_EQ(Sim(0, "kvroute_sim_pd_prefill_requests_total"), 1);
  EXPECT_EQ(Sim(1, "kvroute_sim_pd_kv_pulls_total"), 1);
  std::string m = RouterMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_upstream_errors_total", {{"endpoint", "dead"}, {"kind", "connect_refused"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "error"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "ok"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total", {{"reason", "prefill_retry"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total", {{"reason", "local_prefill"}}), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_prefill_queued_tokens"), 0);
}

TEST_F(PdServeTest, WithNoPrefillLeftTheDecodeReplicaPrefillsLocally) {
  StartFleet(1);  // r0 decode
  StubUpstream dead(StubUpstream::Mode::kOk);
  StartRouter(Entry("dead", dead.port(), "prefill") + SimEntry(0, "decode"), 2);
  dead.StopAccepting();
  auto r = Post(CompletionBody(TokensPrompt(1000, 4), 4, /*stream=*/true, /*include_usage=*/true));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->Header("x-kvroute-endpoint"), "r0");
  EXPECT_EQ(r->Header("x-kvroute-prefill"), "");
  EXPECT_NE(r->body.find("\"completion_tokens\":4"), std::string::npos) << r->body;
  WaitCounted(1);
  // The decode replica got the client's body as it came: no pull.
  EXPECT_EQ(Sim(0, "kvroute_sim_pd_decode_requests_total"), 0);
  EXPECT_EQ(Sim(0, "vllm:request_success_total"), 1);
  std::string m = RouterMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "error"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "decode"}, {"outcome", "ok"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total", {{"reason", "local_prefill"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total", {{"reason", "prefill_retry"}}), 0);
}

TEST_F(PdServeTest, ADecodeLegFailingBeforeItsFirstByteIsRetriedAsAnOrdinaryRequest) {
  StartFleet(2);  // r0 prefill, r1 decode
  StubUpstream failing(StubUpstream::Mode::kFail503);  // a decode replica restarting
  StartRouter(SimEntry(0, "prefill") + Entry("failing", failing.port(), "decode") + SimEntry(1, "decode"), 3);
  // Round-robin puts each decode endpoint first once in two picks.
  for (int i = 0; i < 2; ++i) {
    auto r = Post(CompletionBody(TokensPrompt(1000, 10 + i), 4, /*stream=*/true, /*include_usage=*/true));
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->Header("x-kvroute-endpoint"), "r1");
    EXPECT_NE(r->body.find("\"completion_tokens\":4"), std::string::npos) << r->body;
  }
  WaitCounted(2);
  std::string m = RouterMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "ok"}}), 2);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "decode"}, {"outcome", "error"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_legs_total", {{"leg", "decode"}, {"outcome", "ok"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_pd_fallbacks_total", {{"reason", "decode_retry"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_upstream_errors_total", {{"endpoint", "failing"}, {"kind", "http_503"}}), 1);
  // The retry went as the client sent it (no pull): one decode leg reached r1.
  EXPECT_EQ(Sim(1, "kvroute_sim_pd_decode_requests_total"), 1);
  EXPECT_EQ(Sim(1, "vllm:request_success_total"), 2);
}

TEST_F(PdServeTest, LegsCarryTheirBodiesAndOneRequestId) {
  const std::string kv = R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[3,4],)"
                         R"("remote_engine_id":"p","remote_request_id":"cmpl-p","remote_host":"10.0.0.5",)"
                         R"("remote_port":5600,"tp_size":1,"a_future_field":{"x":[1,null]}})";
  RecordingUpstream prefill(R"({"id":"cmpl-p","object":"text_completion","choices":[{"index":0,"text":"a",)"
                            R"("finish_reason":"length"}],"usage":{"prompt_tokens":300,"total_tokens":301,)"
                            R"("completion_tokens":1,"prompt_tokens_details":{"cached_tokens":7}},)"
                            R"("kv_transfer_params":)" + kv + "}");
  RecordingUpstream decode(R"({"id":"cmpl-d","object":"text_completion","choices":[{"index":0,"text":"abc",)"
                           R"("finish_reason":"length"}],"usage":{"prompt_tokens":300,"total_tokens":303,)"
                           R"("completion_tokens":3,"prompt_tokens_details":{"cached_tokens":288}},)"
                           R"("kv_transfer_params":null})");
  StartRouter(Entry("p", prefill.port(), "prefill") + Entry("d", decode.port(), "decode"), 2);
  const std::string prompt = TokensPrompt(300, 5);
  const std::string client = R"({"model":"test/model","prompt":")" + prompt +
                             R"(","max_tokens":3,"min_tokens":2,"stream":false,"temperature":0})";
  auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", client,
                 {{"x-request-id", "client-id-1"}});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->Header("x-kvroute-endpoint"), "d");
  EXPECT_EQ(r->Header("x-kvroute-prefill"), "p");
  // The decode answer, its cached tokens prefill's.
  EXPECT_EQ(r->body, R"({"id":"cmpl-d","object":"text_completion","choices":[{"index":0,"text":"abc",)"
                     R"("finish_reason":"length"}],"usage":{"prompt_tokens":300,"total_tokens":303,)"
                     R"("completion_tokens":3,"prompt_tokens_details":{"cached_tokens":7}},)"
                     R"("kv_transfer_params":null})");
  auto p = prefill.seen();
  auto d = decode.seen();
  ASSERT_EQ(p.size(), 1u);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(p[0].target, "/v1/completions");
  EXPECT_EQ(p[0].body, R"({"model":"test/model","prompt":")" + prompt +
                           R"(","temperature":0,"stream":false,"max_tokens":1,"kv_transfer_params":)"
                           R"({"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,)"
                           R"("remote_block_ids":null,"remote_host":null,"remote_port":null}})");
  EXPECT_EQ(d[0].target, "/v1/completions");
  EXPECT_EQ(d[0].body, client.substr(0, client.size() - 1) + R"(,"kv_transfer_params":)" + kv + "}");
  EXPECT_EQ(p[0].request_id, "client-id-1");
  EXPECT_EQ(d[0].request_id, "client-id-1");

  // No X-Request-Id from the client: serve makes one up, the same on both legs.
  r = Post(CompletionBody(TokensPrompt(300, 6), 3));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  p = prefill.seen();
  d = decode.seen();
  ASSERT_EQ(p.size(), 2u);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(p[1].request_id.rfind("kvroute-", 0), 0u) << p[1].request_id;
  EXPECT_EQ(p[1].request_id, d[1].request_id);
  EXPECT_NE(p[1].request_id, "client-id-1");
}

}  // namespace
}  // namespace kvroute::router
