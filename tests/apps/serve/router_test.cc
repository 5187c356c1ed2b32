// Loopback integration tests of `kvroute serve`: the router in-process in front of an
// in-process simulated fleet (sim::Fleet on port 0) and small stub upstreams for the
// failure cases. Every wait is bounded.
#include "apps/serve/router.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "config/router_config.h"
#include "core/api/openai.h"
#include "adapters/http/test_client.h"
#include "core/metrics/prom_parser.h"
#include "apps/sim/fleet.h"
#include "metrics/testdata_util.h"
#include "metrics/metric_sum.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/stub_server.h"
#include "support/wait.h"

namespace kvroute::router {
namespace {

using namespace std::chrono_literals;
using http::ClientResponse;
using http::Fetch;
using http::TestClient;

using kvroute::test_support::ClosedPort;
using kvroute::test_support::CompletionBody;
using kvroute::test_support::kTestModel;
using kvroute::test_support::StubUpstream;
using kvroute::test_support::WaitFor;

sim::ReplicaConfig Replica(double time_scale = 0.0, int kv_blocks = 512) {
  return kvroute::test_support::SimReplica({.kv_blocks = kv_blocks, .time_scale = time_scale});
}

// Sum of the router metric `name` over samples whose labels include `want`.
using metrics::testing::MetricSum;

class RouterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    fleet_.reset();
  }

  void StartFleet(std::vector<sim::ReplicaConfig> replicas) {
    for (std::size_t i = 0; i < replicas.size(); ++i) {
      replicas[i].name = "r";
      replicas[i].name += std::to_string(i);
    }
    fleet_ = std::make_unique<sim::Fleet>(std::move(replicas), 2);
    ASSERT_TRUE(fleet_->Start().ok());
  }

  std::string FleetEndpoints() {
    std::string s;
    for (int i = 0; i < fleet_->size(); ++i) {
      s += "    - {address: 127.0.0.1:" + std::to_string(fleet_->port(i)) + ", name: r" +
           std::to_string(i) + "}\n";
    }
    return s;
  }

  static std::string Yaml(const std::string& endpoints, const std::string& extra = "",
                          const std::string& policy = "round-robin") {
    return "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n  endpoints:\n" +
           endpoints + "scheduling:\n  policy: " + policy + "\n" + extra;
  }

  void StartRouter(const std::string& yaml, const std::string& path = "") {
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "test.yaml");
    ASSERT_TRUE(r.ok()) << r.error.ToString() << "\n" << yaml;
    RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = false;
    o.config_path = path;
    o.handle_signals = !path.empty();
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

  // Readiness needs one endpoint with fresh metrics; tests that count picks across
  // endpoints wait for all of them (a not-yet-scraped endpoint is excluded).
  void WaitAllFresh(int n) {
    ASSERT_TRUE(WaitFor([&] {
      return MetricSum(RouterMetrics(), "kvroute_endpoint_metrics_fresh") == n;
    }));
  }

  std::optional<ClientResponse> Post(std::string_view body,
                                     const std::vector<std::pair<std::string, std::string>>& headers = {},
                                     std::string_view path = "/v1/completions") {
    return Fetch("127.0.0.1", router_->port(), "POST", path, body, headers);
  }
  std::string RouterMetrics() {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? r->body : std::string();
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Router> router_;
};

// Every other path vLLM serves is forwarded to one endpoint as it came: method, target
// with its query, body byte for byte, the client's content type (multipart audio); the
// answer relayed with the endpoint named. Unknown paths and wrong methods are answered by
// the router at once in the OpenAI shape.
TEST_F(RouterTest, ForwardsEveryOtherVllmPathAsItCame) {
  test_support::RecordingUpstream up(R"({"ok":true})");
  StartRouter(Yaml("    - {address: 127.0.0.1:" + std::to_string(up.port()) + ", name: u}\n"));
  WaitReady();
  struct Case {
    std::string method, target, body, content_type;
  };
  const std::vector<Case> cases = {
      {"POST", "/v1/score", R"({"model":"m","text_1":"a","text_2":"b"})", "application/json"},
      {"POST", "/v1/rerank", R"({"model":"m","query":"q","documents":["d"]})", "application/json"},
      {"POST", "/rerank", R"({"model":"m","query":"q","documents":["d"]})", "application/json"},
      {"POST", "/v2/rerank", R"({"model":"m","query":"q","documents":["d"]})", "application/json"},
      {"POST", "/score", R"({"model":"m","text_1":"a","text_2":"b"})", "application/json"},
      {"POST", "/pooling", R"({"model":"m","input":"x"})", "application/json"},
      {"POST", "/classify", R"({"model":"m","input":"x"})", "application/json"},
      {"POST", "/tokenize", R"({"model":"m","prompt":"x"})", "application/json"},
      {"POST", "/detokenize", R"({"model":"m","tokens":[1,2]})", "application/json"},
      {"POST", "/v1/audio/transcriptions?x=1", "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--\r\n",
       "multipart/form-data; boundary=b"},
      {"POST", "/v1/audio/translations", "--b--\r\n", "multipart/form-data; boundary=b"},
      {"GET", "/v1/responses/resp_123", "", ""},
      {"POST", "/v1/responses/resp_123/cancel", "", ""},
  };
  for (const Case& c : cases) {
    std::vector<std::pair<std::string, std::string>> headers;
    if (!c.content_type.empty()) headers.emplace_back("content-type", c.content_type);
    auto r = Fetch("127.0.0.1", router_->port(), c.method, c.target, c.body, headers);
    ASSERT_TRUE(r.has_value()) << c.target;
    EXPECT_EQ(r->status, 200) << c.target << ": " << r->body;
    EXPECT_EQ(r->body, R"({"ok":true})") << c.target;
    EXPECT_EQ(r->Header("x-kvroute-endpoint"), "u") << c.target;
  }
  const auto seen = up.seen();
  ASSERT_EQ(seen.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(seen[i].method, cases[i].method) << cases[i].target;
    EXPECT_EQ(seen[i].target, cases[i].target);
    EXPECT_EQ(seen[i].body, cases[i].body) << cases[i].target;
    if (!cases[i].content_type.empty()) {
      EXPECT_EQ(seen[i].Header("content-type"), cases[i].content_type) << cases[i].target;
    }
  }
  // Not a path vLLM serves, or not its method: the router's own OpenAI-shaped answer.
  auto unknown = Fetch("127.0.0.1", router_->port(), "POST", "/v1/nothing", "{}");
  ASSERT_TRUE(unknown.has_value());
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(unknown->body,
            R"({"error":{"message":"Not found: /v1/nothing","type":"NotFoundError","param":null,"code":404}})");
  EXPECT_EQ(unknown->Header("x-kvroute-endpoint"), "");
  auto wrong = Fetch("127.0.0.1", router_->port(), "GET", "/v1/embeddings");
  ASSERT_TRUE(wrong.has_value());
  EXPECT_EQ(wrong->status, 405);
  EXPECT_NE(wrong->body.find("\"code\":405"), std::string::npos) << wrong->body;
  auto deep = Fetch("127.0.0.1", router_->port(), "GET", "/v1/responses/a/b");
  ASSERT_TRUE(deep.has_value());
  EXPECT_EQ(deep->status, 404);
  EXPECT_EQ(up.seen().size(), cases.size());  // none of them reached the upstream
}

// Embeddings and responses through serve against the sim: parsed, picked, answered in
// vLLM's shapes; the same embeddings input goes back to the endpoint that holds its prefix
// (the kvroute policy's prefix model), whichever of three.
TEST_F(RouterTest, EmbeddingsAndResponsesReachTheSimAndFollowTheirPrefix) {
  StartFleet({Replica(), Replica(), Replica()});
  StartRouter(Yaml(FleetEndpoints(), "", "kvroute"));
  WaitAllFresh(3);
  const std::string input(2000, 'e');
  std::set<std::string> where;
  for (int i = 0; i < 6; ++i) {
    auto r = Post(R"({"model":")" + std::string(kTestModel) + R"(","input":")" + input + R"("})", {},
                  "/v1/embeddings");
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_NE(r->body.find("\"object\":\"embedding\""), std::string::npos);
    where.insert(r->Header("x-kvroute-endpoint"));
  }
  EXPECT_EQ(where.size(), 1u);
  auto resp = Post(R"({"model":")" + std::string(kTestModel) + R"(","input":"hi","max_output_tokens":3})",
                   {}, "/v1/responses");
  ASSERT_TRUE(resp.has_value());
  ASSERT_EQ(resp->status, 200) << resp->body;
  EXPECT_NE(resp->body.find("\"object\":\"response\""), std::string::npos);
  EXPECT_NE(resp->body.find("\"output_tokens\":3"), std::string::npos) << resp->body;
  auto bad = Post(R"({"model":"m","input":[]})", {}, "/v1/embeddings");
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("\"param\":\"input\""), std::string::npos) << bad->body;
}

// Runtime LoRA loading goes to every usable endpoint; the answer says how many took it.
TEST_F(RouterTest, AdapterLoadingFansOutToEveryEndpoint) {
  test_support::RecordingUpstream a("Success"), b("Success");
  StartRouter(Yaml("    - {address: 127.0.0.1:" + std::to_string(a.port()) + ", name: a}\n" +
                   "    - {address: 127.0.0.1:" + std::to_string(b.port()) + ", name: b}\n"));
  WaitAllFresh(2);
  const std::string body = R"({"lora_name":"sql","lora_path":"/adapters/sql"})";
  auto r = Post(body, {{"authorization", "Bearer k"}}, "/v1/load_lora_adapter");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body, "Success");
  EXPECT_EQ(r->Header("x-kvroute-fanout"), "2/2");
  for (auto* up : {&a, &b}) {
    const auto seen = up->seen();
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].method, "POST");
    EXPECT_EQ(seen[0].target, "/v1/load_lora_adapter");
    EXPECT_EQ(seen[0].body, body);
    EXPECT_EQ(seen[0].Header("authorization"), "Bearer k");
  }
  auto u = Post(R"({"lora_name":"sql"})", {}, "/v1/unload_lora_adapter");
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->Header("x-kvroute-fanout"), "2/2");
  EXPECT_EQ(a.seen().back().target, "/v1/unload_lora_adapter");
}

// Every end-to-end request header reaches the replica (tracing's, the application's);
// hop-by-hop ones, those the Connection header names and the router's own control headers
// do not.
TEST_F(RouterTest, ForwardsEndToEndRequestHeadersOnly) {
  test_support::RecordingUpstream up(R"({"ok":true})");
  StartRouter(Yaml("    - {address: 127.0.0.1:" + std::to_string(up.port()) + ", name: u}\n"));
  WaitReady();
  auto r = Post(CompletionBody("Hello there", 2),
                {{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                 {"tracestate", "congo=t61rcWkgMzE"},
                 {"baggage", "userId=alice,serverNode=DF%2028"},
                 {"X-App-Tenant", "blue"},
                 {"authorization", "Bearer k"},
                 {"x-request-id", "r-1"},
                 {"Connection", "keep-alive, X-Hop-Only"},
                 {"X-Hop-Only", "drop me"},
                 {"Keep-Alive", "timeout=5"},
                 {"Proxy-Authorization", "Basic x"},
                 {"x-session-id", "s-1"},
                 {"x-llm-d-slo-ttft-ms", "500"},
                 {"x-gateway-destination-endpoint", "u"}});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  const auto seen = up.seen();
  ASSERT_EQ(seen.size(), 1u);
  const auto& h = seen[0];
  EXPECT_EQ(h.Header("traceparent"), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  EXPECT_EQ(h.Header("tracestate"), "congo=t61rcWkgMzE");
  EXPECT_EQ(h.Header("baggage"), "userId=alice,serverNode=DF%2028");
  EXPECT_EQ(h.Header("x-app-tenant"), "blue");
  EXPECT_EQ(h.Header("authorization"), "Bearer k");
  EXPECT_EQ(h.Header("x-request-id"), "r-1");
  for (const char* gone : {"x-hop-only", "keep-alive", "proxy-authorization", "x-session-id",
                           "x-llm-d-slo-ttft-ms", "x-gateway-destination-endpoint"}) {
    EXPECT_EQ(h.headers.count(gone), 0u) << gone;
  }
  EXPECT_EQ(h.Header("content-type"), "application/json");  // written once, by the client
}

TEST_F(RouterTest, ProxiesCompletionAndNamesTheEndpoint) {
  StartFleet({Replica()});
  StartRouter(Yaml(FleetEndpoints()));
  WaitReady();
  auto r = Post(CompletionBody("Hello there", 5));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->Header("x-kvroute-endpoint"), "r0");
  EXPECT_EQ(r->Header("content-type"), "application/json");
  EXPECT_NE(r->body.find("\"text_completion\""), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("\"completion_tokens\":5"), std::string::npos) << r->body;

  auto models = Fetch("127.0.0.1", router_->port(), "GET", "/v1/models");
  ASSERT_TRUE(models.has_value());
  EXPECT_EQ(models->status, 200);
  EXPECT_NE(models->body.find(kTestModel), std::string::npos) << models->body;

  auto health = Fetch("127.0.0.1", router_->port(), "GET", "/healthz");
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->status, 200);
}

// GET /v1/models answers the union of the usable endpoints' listings: each model once,
// as its replica wrote it (issue 26, item 1).
TEST_F(RouterTest, ModelsIsTheUnionOfTheReplicasListings) {
  std::vector<sim::ReplicaConfig> rs = {Replica(), Replica(), Replica()};
  rs[1].engine.model_name = "other/model";  // r0 and r2 serve the test model
  StartFleet(std::move(rs));
  // A fourth endpoint looks healthy to the scraper but answers 503: left out of the union.
  kvroute::test_support::StubUpstream restarting(kvroute::test_support::StubUpstream::Mode::kFail503);
  StartRouter(Yaml(FleetEndpoints() + "    - {address: " + restarting.address() + ", name: s}\n"));
  ASSERT_TRUE(WaitFor([&] {
    auto m = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    return m && MetricSum(m->body, "kvroute_endpoint_metrics_fresh") == 4;
  }));
  auto r = Fetch("127.0.0.1", router_->port(), "GET", "/v1/models");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body.rfind("{\"object\":\"list\",\"data\":[", 0), 0u) << r->body;
  auto count = [&](std::string_view needle) {
    int n = 0;
    for (std::size_t at = r->body.find(needle); at != std::string::npos; at = r->body.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"id\":\"test/model\""), 1) << r->body;
  EXPECT_EQ(count("\"id\":\"other/model\""), 1) << r->body;
  EXPECT_EQ(count("\"object\":\"model\""), 2) << r->body;
  EXPECT_EQ(count("\"parent\":null"), 2) << r->body;  // the replicas' fields, kept
  // The fleet gone, only the 503 stub usable: no listing to merge, a 502 that says so.
  fleet_.reset();
  ASSERT_TRUE(WaitFor([&] {
    auto m = Fetch("127.0.0.1", router_->port(), "GET", "/v1/models");
    return m && m->status == 502 && m->body.find("No endpoint answered GET /v1/models.") != std::string::npos;
  })) << "the router kept listing a dead fleet";
  // No endpoint usable at all: a 503 that says why.
  router_->Stop();
  router_.reset();
  StartRouter(Yaml("    - {address: " + kvroute::test_support::LoopbackAddress(kvroute::test_support::ClosedPort()) +
                   ", name: gone}\n"));
  auto gone = Fetch("127.0.0.1", router_->port(), "GET", "/v1/models");
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->status, 503) << gone->body;
  EXPECT_EQ(gone->Header("x-llm-d-request-dropped-reason"), "rejected-no-endpoints");
  EXPECT_NE(gone->body.find("\"code\":503"), std::string::npos) << gone->body;
}

// Latency objectives (issue 24) in request headers: counted against what the replica
// answered (a 1 ms TTFT objective is missed over loopback HTTP, a 60 s one met); a value
// that is not a positive number of milliseconds is a 400 naming the header.
TEST_F(RouterTest, SloHeadersAreCountedAndBadOnesRefused) {
  StartFleet({Replica()});
  StartRouter(Yaml(FleetEndpoints()));
  WaitReady();
  // Streamed: the first chunk is the first token. A non-streamed answer has no observable
  // TTFT and is not counted.
  auto met = Post(CompletionBody("slo one", 3, true), {{"x-llm-d-slo-ttft-ms", "60000"}});
  ASSERT_TRUE(met && met->status == 200);
  auto missed = Post(CompletionBody("slo two", 3, true), {{"x-slo-ttft-ms", "0.001"}});
  ASSERT_TRUE(missed && missed->status == 200);
  auto whole = Post(CompletionBody("slo whole", 3), {{"x-slo-ttft-ms", "0.001"}});
  ASSERT_TRUE(whole && whole->status == 200);
  std::string m;
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(m = RouterMetrics(), "kvroute_slo_requests_total", {{"type", "ttft"}}) == 2;
  })) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_slo_violations_total", {{"type", "ttft"}}), 1);
  // The streamed answers' chunks gave their token counts: 3 tokens each, so each is a TPOT
  // observation (the whole one is not: no cadence).
  EXPECT_EQ(MetricSum(m, "kvroute_slo_requests_total", {{"type", "tpot"}}), 0);  // no objective
  auto tpot = Post(CompletionBody("slo four", 3, true), {{"x-llm-d-slo-tpot-ms", "60000"}});
  ASSERT_TRUE(tpot && tpot->status == 200);
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(m = RouterMetrics(), "kvroute_slo_requests_total", {{"type", "tpot"}}) == 1;
  })) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_slo_violations_total", {{"type", "tpot"}}), 0);
  auto bad = Post(CompletionBody("slo three", 3), {{"x-llm-d-slo-tpot-ms", "soon"}});
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("\"param\":\"x-llm-d-slo-tpot-ms\""), std::string::npos) << bad->body;
  EXPECT_NE(bad->body.find("\"type\":\"BadRequestError\""), std::string::npos) << bad->body;
}

// x-llm-d-model-name-rewrite: the replica sees the body's model replaced (it serves only
// test/model: the client's alias alone is a 404 from it), and answers as that model.
TEST_F(RouterTest, ModelNameRewriteReplacesTheModelTheReplicaSees) {
  StartFleet({Replica()});
  StartRouter(Yaml(FleetEndpoints()));
  WaitReady();
  const std::string body = CompletionBody("rewrite me", 3, false, false, 0, "client-alias");
  auto plain = Post(body);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->status, 404) << plain->body;
  EXPECT_NE(plain->body.find("The model `client-alias` does not exist."), std::string::npos) << plain->body;
  auto renamed = Post(body, {{"x-llm-d-model-name-rewrite", std::string(kTestModel)}});
  ASSERT_TRUE(renamed.has_value());
  EXPECT_EQ(renamed->status, 200) << renamed->body;
  EXPECT_NE(renamed->body.find("\"model\":\"" + std::string(kTestModel) + "\""), std::string::npos) << renamed->body;
  EXPECT_EQ(renamed->body.find("client-alias"), std::string::npos) << renamed->body;
}

// An objective's own latency objectives (epp.objectives NAME: {slo: ...}) apply to a
// request naming it that states none in its headers; a header still wins.
TEST_F(RouterTest, AnObjectivesSloAppliesWhereTheHeadersStateNone) {
  StartFleet({Replica()});
  StartRouter(Yaml(FleetEndpoints(),
                   "epp:\n  objectives:\n    strict: {priority: 2, slo: {ttft: 1us}}\n"
                   "    relaxed: {slo: {ttft: 60s, tpot: 60s}}\n    batch: -1\n"));
  WaitReady();
  auto strict = Post(CompletionBody("obj one", 3, true), {{"x-llm-d-inference-objective", "strict"}});
  ASSERT_TRUE(strict && strict->status == 200);
  auto relaxed =
      Post(CompletionBody("obj two", 3, true), {{"x-gateway-inference-objective", "relaxed"}});
  ASSERT_TRUE(relaxed && relaxed->status == 200);
  // The header's 60 s wins over strict's 1 us.
  auto header = Post(CompletionBody("obj three", 3, true),
                     {{"x-llm-d-inference-objective", "strict"}, {"x-llm-d-slo-ttft-ms", "60000"}});
  ASSERT_TRUE(header && header->status == 200);
  // An objective without one (and an unknown objective): no objective, nothing counted.
  auto none = Post(CompletionBody("obj four", 3, true), {{"x-llm-d-inference-objective", "batch"}});
  ASSERT_TRUE(none && none->status == 200);
  auto unknown = Post(CompletionBody("obj five", 3, true), {{"x-llm-d-inference-objective", "x"}});
  ASSERT_TRUE(unknown && unknown->status == 200);
  std::string m;
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(m = RouterMetrics(), "kvroute_requests_total") == 5;
  })) << m;
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(m = RouterMetrics(), "kvroute_slo_requests_total", {{"type", "ttft"}}) == 3;
  })) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_slo_violations_total", {{"type", "ttft"}}), 1);  // strict
  EXPECT_EQ(MetricSum(m, "kvroute_slo_requests_total", {{"type", "tpot"}}), 1);    // relaxed
  EXPECT_EQ(MetricSum(m, "kvroute_slo_violations_total", {{"type", "tpot"}}), 0);
}

TEST_F(RouterTest, StreamsChunkByChunkAndCancelsOnDisconnect) {
  // ~6 ms per token in real time: 400 tokens would take ~2.4 s.
  StartFleet({Replica(/*time_scale=*/1.0)});
  StartRouter(Yaml(FleetEndpoints()));
  WaitReady();
  TestClient c("127.0.0.1", router_->port());
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRequest("POST", "/v1/completions", CompletionBody("Tell me a story", 400, true)));
  ClientResponse head;
  ASSERT_TRUE(c.ReadHead(&head)) << c.error();
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.Header("content-type"), "text/event-stream");
  EXPECT_EQ(head.Header("x-kvroute-endpoint"), "r0");
  auto first = c.ReadChunk();
  ASSERT_TRUE(first.has_value()) << c.error();
  EXPECT_EQ(first->data.substr(0, 6), "data: ");
  // The first token reached the client while the replica is still generating.
  EXPECT_EQ(fleet_->LiveRequests(0), 1);
  auto second = c.ReadChunk();
  ASSERT_TRUE(second.has_value()) << c.error();
  EXPECT_EQ(fleet_->LiveRequests(0), 1);
  // Client leaves: the router cancels the upstream request, so the replica aborts it.
  c.Close();
  EXPECT_TRUE(WaitFor([&] { return fleet_->LiveRequests(0) == 0; }, 3000ms));
  // Counted once the router has finished with the request (it may trail the replica).
  EXPECT_TRUE(WaitFor([&] {
    return MetricSum(RouterMetrics(), "kvroute_requests_total", {{"endpoint", "r0"}, {"code", "499"}}) == 1;
  })) << RouterMetrics();
}

TEST_F(RouterTest, StreamEndsWithDoneThroughTheRouter) {
  StartFleet({Replica()});
  StartRouter(Yaml(FleetEndpoints()));
  WaitReady();
  auto r = Post(CompletionBody("Hi", 4, true));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200);
  EXPECT_TRUE(r->chunked);
  ASSERT_GE(r->body.size(), 14u);
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");
}

TEST_F(RouterTest, SamePrefixSticksThenSpillsUnderLoad) {
  // 64 blocks of 16 tokens per replica. Shared prefix 256 tokens (16 blocks), each
  // request adds 128 unique prompt tokens (8 blocks) and keeps generating. The kvroute
  // policy keeps the prefix on one replica while the load difference is small, then its
  // load scorers (in-flight requests, KV usage) move the next one elsewhere.
  StartFleet({Replica(/*time_scale=*/1.0, /*kv_blocks=*/64), Replica(1.0, 64)});
  StartRouter(Yaml(FleetEndpoints(), "", "kvroute"));
  WaitAllFresh(2);
  const std::string prefix(1024, 'p');
  std::vector<std::unique_ptr<TestClient>> clients;
  std::vector<std::string> used;
  for (int i = 0; i < 10; ++i) {
    std::string suffix(512, static_cast<char>('a' + i));
    auto c = std::make_unique<TestClient>("127.0.0.1", router_->port());
    ASSERT_TRUE(c->Connect());
    ASSERT_TRUE(c->SendRequest("POST", "/v1/completions", CompletionBody(prefix + suffix, 300, true)));
    ClientResponse head;
    ASSERT_TRUE(c->ReadHead(&head)) << c->error();
    ASSERT_EQ(head.status, 200);
    ASSERT_TRUE(c->ReadChunk().has_value());  // started
    used.push_back(head.Header("x-kvroute-endpoint"));
    clients.push_back(std::move(c));
    if (used.back() != used.front()) break;
    std::this_thread::sleep_for(100ms);  // let a scrape see the new load
  }
  ASSERT_GE(used.size(), 3u);
  EXPECT_EQ(used[1], used[0]) << "same prefix should stick";
  EXPECT_NE(used.back(), used.front()) << "never spilled after " << used.size() << " requests";
  clients.clear();  // disconnect: replicas abort
}

TEST_F(RouterTest, SlowClientPausesTheUpstream) {
  StubUpstream flood(StubUpstream::Mode::kFlood);
  StartRouter(Yaml("    - {address: 127.0.0.1:" + std::to_string(flood.port()) + ", name: f}\n"));
  WaitReady();
  TestClient c("127.0.0.1", router_->port(), 10000ms);
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRequest("POST", "/v1/completions", CompletionBody("flood", 1, true)));
  ClientResponse head;
  ASSERT_TRUE(c.ReadHead(&head)) << c.error();
  ASSERT_EQ(head.status, 200);
  // The client stops reading. Once the router's backlog for it passes its bound, the
  // router stops reading the upstream, so the upstream soon cannot write any more:
  // what it got out is the bound plus the kernel's socket buffers, far from all of it.
  uint64_t last = 0;
  bool stalled = false;
  for (int i = 0; i < 80 && !stalled; ++i) {  // at most 8 s
    std::this_thread::sleep_for(100ms);
    uint64_t now = flood.flushed();
    stalled = now == last && now > 0;
    last = now;
  }
  ASSERT_TRUE(stalled) << "upstream never stalled; flushed " << flood.flushed();
  const uint64_t total = StubUpstream::kFloodChunk * StubUpstream::kFloodChunks;
  EXPECT_LT(flood.flushed(), total / 2) << "the router kept reading for a client that does not";
  // Reading again drains everything, intact and in order.
  ASSERT_TRUE(c.ReadBody(&head)) << c.error();
  ASSERT_EQ(head.body.size(), total);
  for (std::size_t i = 0; i < StubUpstream::kFloodChunks; ++i) {
    ASSERT_EQ(head.body[i * StubUpstream::kFloodChunk], static_cast<char>('a' + i % 26)) << i;
    ASSERT_EQ(head.body[(i + 1) * StubUpstream::kFloodChunk - 1], static_cast<char>('a' + i % 26)) << i;
  }
  EXPECT_EQ(flood.flushed(), total);
}

TEST_F(RouterTest, RetriesOnARefusedEndpoint) {
  StartFleet({Replica()});
  StubUpstream dead(StubUpstream::Mode::kOk);
  // The stub looks healthy to the scraper, then stops accepting: the scrape interval is
  // long enough that the router has no reason to doubt it when it picks.
  std::string endpoints = FleetEndpoints() + "    - {address: 127.0.0.1:" +
                          std::to_string(dead.port()) + ", name: dead}\n";
  std::string yaml = "threads: 2\npool:\n  scrape_interval: 30s\n  staleness: 60s\n  endpoints:\n" +
                     endpoints + "scheduling:\n  policy: round-robin\n";
  StartRouter(yaml);
  WaitReady();
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(RouterMetrics(), "kvroute_endpoint_metrics_fresh") == 2;
  }));
  dead.StopAccepting();
  for (int i = 0; i < 2; ++i) {
    auto r = Post(CompletionBody("retry me", 2));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->Header("x-kvroute-endpoint"), "r0");
  }
  // A request is counted when the router has finished answering it, which can come just
  // after the client read the last byte: wait for both.
  ASSERT_TRUE(WaitFor([&] { return MetricSum(RouterMetrics(), "kvroute_requests_total") == 2; }))
      << RouterMetrics();
  std::string m = RouterMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_retries_total"), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_upstream_errors_total", {{"endpoint", "dead"}, {"kind", "connect_refused"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_endpoint_up", {{"endpoint", "dead"}}), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_requests_total", {{"endpoint", "r0"}, {"code", "200"}}), 2);
}

TEST_F(RouterTest, BadRequestsGet400And413) {
  StartFleet({Replica()});
  StartRouter(Yaml(FleetEndpoints(), "limits: {max_body_bytes: 1KiB}\n"));
  auto bad = Post("{\"model\": \"m\", \"prompt\": ");
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("\"BadRequestError\""), std::string::npos) << bad->body;
  auto missing = Post("{\"prompt\": \"hi\"}");
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->status, 400);
  EXPECT_NE(missing->body.find("\"param\":\"model\""), std::string::npos) << missing->body;
  auto big = Post(CompletionBody(std::string(2000, 'x'), 1));
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->status, 413);
  EXPECT_NE(big->body.find("\"code\":413"), std::string::npos) << big->body;
  auto nowhere = Fetch("127.0.0.1", router_->port(), "GET", "/nope");
  ASSERT_TRUE(nowhere.has_value());
  EXPECT_EQ(nowhere->status, 404);
}

TEST_F(RouterTest, AllEndpointsDownGives503AndNotReady) {
  std::string endpoints = "    - 127.0.0.1:" + std::to_string(ClosedPort()) + "\n" +
                          "    - 127.0.0.1:" + std::to_string(ClosedPort()) + "\n";
  StartRouter(Yaml(endpoints));
  // Wait until the scraper has found both unreachable.
  ASSERT_TRUE(WaitFor([&] { return MetricSum(RouterMetrics(), "kvroute_endpoint_scrapes_failed_total") >= 2 &&
                                   MetricSum(RouterMetrics(), "kvroute_endpoint_up") == 0; }));
  auto r = Post(CompletionBody("anyone?", 1));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("\"ServiceUnavailableError\""), std::string::npos) << r->body;
  auto ready = Fetch("127.0.0.1", router_->port(), "GET", "/readyz");
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 503);
}

TEST_F(RouterTest, ConnectFailureGives502) {
  StubUpstream dead(StubUpstream::Mode::kOk);
  std::string yaml = "threads: 1\npool:\n  scrape_interval: 30s\n  staleness: 60s\n  endpoints:\n"
                     "    - {address: 127.0.0.1:" + std::to_string(dead.port()) +
                     ", name: dead}\nretries: {max_attempts: 1}\n";
  StartRouter(yaml);
  WaitReady();
  dead.StopAccepting();
  auto r = Post(CompletionBody("x", 1));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 502);
  EXPECT_EQ(r->Header("x-kvroute-endpoint"), "dead");
  EXPECT_NE(r->body.find("connect_refused"), std::string::npos) << r->body;
}

// A replica that answers 503 in a millisecond looks idle to every scrape. Each 503 is
// retried on the other endpoint (the client never sees it), and five in a row eject it.
TEST_F(RouterTest, FastFailingReplicaIsRetriedAroundThenEjected) {
  StubUpstream sick(StubUpstream::Mode::kFail503);
  StubUpstream good(StubUpstream::Mode::kOk);
  std::string yaml = Yaml("    - {address: 127.0.0.1:" + std::to_string(sick.port()) +
                              ", name: sick}\n    - {address: 127.0.0.1:" +
                              std::to_string(good.port()) + ", name: good}\n",
                          "outlier_detection: {consecutive_failures: 5, base_ejection: 60s}\n");
  StartRouter(yaml);
  WaitAllFresh(2);
  int retried = 0;
  for (int i = 0; i < 40; ++i) {
    auto r = Post(CompletionBody("x", 1));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200) << i << " " << r->body;
    EXPECT_EQ(r->Header("x-kvroute-endpoint"), "good");
    if (r->Header("x-kvroute-attempts") == "2") ++retried;
  }
  EXPECT_EQ(retried, 5);
  // Counted when answered (may trail the client's last byte): wait for all forty.
  ASSERT_TRUE(WaitFor([&] { return MetricSum(RouterMetrics(), "kvroute_requests_total") == 40; }))
      << RouterMetrics();
  std::string m = RouterMetrics();
  // Round-robin sends every other request to sick until its fifth 503 ejects it.
  EXPECT_EQ(MetricSum(m, "kvroute_upstream_errors_total", {{"endpoint", "sick"}, {"kind", "http_503"}}), 5);
  EXPECT_EQ(MetricSum(m, "kvroute_retries_total"), 5);
  EXPECT_EQ(MetricSum(m, "kvroute_endpoint_ejections_total", {{"endpoint", "sick"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_endpoint_ejected", {{"endpoint", "sick"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_requests_total", {{"endpoint", "good"}, {"code", "200"}}), 40);
}

// With the budget spent, a failed attempt is not retried: the client gets the endpoint's
// own 503 (status and OpenAI-shaped body as it sent them).
TEST_F(RouterTest, RetryBudgetBoundsRetriesOfAFailingReplica) {
  StubUpstream sick(StubUpstream::Mode::kFail503);
  StubUpstream good(StubUpstream::Mode::kOk);
  std::string yaml = Yaml("    - {address: 127.0.0.1:" + std::to_string(sick.port()) +
                              ", name: sick}\n    - {address: 127.0.0.1:" +
                              std::to_string(good.port()) + ", name: good}\n",
                          "outlier_detection: {consecutive_failures: 0}\n"
                          "retries: {max_attempts: 2, budget_ratio: 0, budget_min_retries: 2, "
                          "budget_window: 1m}\n");
  StartRouter(yaml);
  WaitAllFresh(2);
  int ok = 0, unavailable = 0;
  for (int i = 0; i < 10; ++i) {
    auto r = Post(CompletionBody("x", 1));
    ASSERT_TRUE(r.has_value());
    if (r->status == 200) ++ok;
    if (r->status == 503) {
      ++unavailable;
      EXPECT_EQ(r->Header("x-kvroute-endpoint"), "sick");
      EXPECT_NE(r->body.find("\"message\":\"engine is restarting\""), std::string::npos) << r->body;
    }
  }
  EXPECT_EQ(ok, 7);           // 5 served by good at once, 2 after a retry
  EXPECT_EQ(unavailable, 3);  // sick's later 503s, budget spent
  std::string m = RouterMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_retries_total"), 2);
  EXPECT_EQ(MetricSum(m, "kvroute_retries_denied_total"), 3);
  EXPECT_EQ(MetricSum(m, "kvroute_endpoint_ejections_total", {{"endpoint", "sick"}}), 0);
}

TEST_F(RouterTest, StuckUpstreamGives504) {
  StubUpstream stuck(StubUpstream::Mode::kNeverAnswer);
  std::string yaml = "threads: 1\npool:\n  scrape_interval: 20ms\n  endpoints:\n"
                     "    - {address: 127.0.0.1:" + std::to_string(stuck.port()) +
                     ", name: stuck}\ntimeouts: {first_byte: 200ms}\n";
  StartRouter(yaml);
  WaitReady();
  auto r = Post(CompletionBody("x", 1));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 504);
  EXPECT_NE(r->body.find("first_byte_timeout"), std::string::npos) << r->body;
  std::string m = RouterMetrics();
  EXPECT_EQ(MetricSum(m, "kvroute_upstream_errors_total", {{"endpoint", "stuck"}, {"kind", "first_byte_timeout"}}), 1);
}

TEST_F(RouterTest, ReplicaDyingMidStreamEndsWithAnErrorFrame) {
  StubUpstream dying(StubUpstream::Mode::kDieMidStream);
  std::string yaml = "threads: 1\npool:\n  scrape_interval: 20ms\n  endpoints:\n"
                     "    - {address: 127.0.0.1:" + std::to_string(dying.port()) + ", name: dying}\n";
  StartRouter(yaml);
  WaitReady();
  auto r = Post(CompletionBody("x", 10, true));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  const std::string expected_tail = "\n\ndata: {\"error\":{\"message\":\"upstream dying failed: reset\","
                                    "\"type\":\"InternalServerError\",\"param\":null,\"code\":502}}\n\n"
                                    "data: [DONE]\n\n";
  EXPECT_EQ(r->body, "data: {\"choices\":[{\"text\":\"par" + expected_tail);
}

TEST_F(RouterTest, RoutingHeadersOnlyWhenAllowed) {
  StartFleet({Replica(), Replica()});
  const std::string hint = "127.0.0.1:" + std::to_string(fleet_->port(1));
  for (bool allow : {false, true}) {
    if (router_) router_->Stop();
    StartRouter(Yaml(FleetEndpoints(), allow ? "allow_routing_headers: true\n" : ""));
    WaitAllFresh(2);
    std::map<std::string, int> by_endpoint;
    for (int i = 0; i < 4; ++i) {
      auto r = Post(CompletionBody("hint", 1), {{"x-gateway-destination-endpoint", hint}});
      ASSERT_TRUE(r.has_value());
      ASSERT_EQ(r->status, 200);
      ++by_endpoint[r->Header("x-kvroute-endpoint")];
    }
    if (allow) {
      EXPECT_EQ(by_endpoint["r1"], 4);
    } else {
      EXPECT_EQ(by_endpoint["r0"], 2);  // round-robin, hint ignored
      EXPECT_EQ(by_endpoint["r1"], 2);
    }
  }
}

TEST_F(RouterTest, SighupReloadsGoodConfigAndKeepsOldOnBadOne) {
  StartFleet({Replica(), Replica()});
  char path_template[] = "/tmp/kvroute-router-test-XXXXXX";
  int fd = mkstemp(path_template);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string path = path_template;
  auto write = [&](const std::string& text) {
    std::ofstream f(path, std::ios::trunc);
    f << text;
  };
  const std::string only_r0 = "    - {address: 127.0.0.1:" + std::to_string(fleet_->port(0)) + ", name: r0}\n";
  write(Yaml(only_r0));
  config::ConfigOr<config::RouterConfig> first = config::LoadRouterConfig(path);
  ASSERT_TRUE(first.ok());
  StartRouter(Yaml(only_r0), path);
  WaitReady();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Post(CompletionBody("a", 1))->Header("x-kvroute-endpoint"), "r0");

  // Good config: both replicas.
  write(Yaml(FleetEndpoints()));
  ASSERT_EQ(kill(getpid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] { return router_->reloads() == 1; }));
  // The new endpoint is used once it has fresh metrics (stale_policy exclude).
  ASSERT_TRUE(WaitFor([&] { return MetricSum(RouterMetrics(), "kvroute_endpoint_metrics_fresh") == 2; }));
  std::map<std::string, int> seen;
  for (int i = 0; i < 4; ++i) ++seen[Post(CompletionBody("b", 1))->Header("x-kvroute-endpoint")];
  EXPECT_EQ(seen["r0"], 2);
  EXPECT_EQ(seen["r1"], 2);

  // Bad config: rejected with file:line, the running one stays.
  write("threads: 2\npool:\n  scrape_intervall: 20ms\n");
  ASSERT_EQ(kill(getpid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(RouterMetrics(), "kvroute_config_reload_failures_total") == 1;
  }));
  EXPECT_EQ(router_->reloads(), 1u);
  std::string error = router_->Reload().message();
  EXPECT_EQ(error.rfind(path + ":3:", 0), 0u) << error;
  seen.clear();
  for (int i = 0; i < 4; ++i) ++seen[Post(CompletionBody("c", 1))->Header("x-kvroute-endpoint")];
  EXPECT_EQ(seen["r0"], 2);
  EXPECT_EQ(seen["r1"], 2);
  std::remove(path.c_str());
}

TEST_F(RouterTest, RouterMetricsAgreeWithReplicaCounts) {
  StartFleet({Replica(), Replica()});
  StartRouter(Yaml(FleetEndpoints(), "", "kvroute"));
  WaitReady();
  std::map<std::string, std::set<int>> prompts_by_endpoint;
  for (int i = 0; i < 7; ++i) {
    auto r = Post(CompletionBody("count " + std::to_string(i % 3) + std::string(300, 'q'), 2, i % 2 == 0));
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->status, 200);
    prompts_by_endpoint[r->Header("x-kvroute-endpoint")].insert(i % 3);
  }
  // The router counts a request once its side of the response is finished, which can come
  // just after the client has read the last byte of a stream: wait for all seven.
  ASSERT_TRUE(WaitFor([&] {
    const std::string now = RouterMetrics();
    return MetricSum(now, "kvroute_requests_total") == 7 &&
           MetricSum(now, "kvroute_endpoint_inflight") == 0;
  }));
  std::string m = RouterMetrics();
  ASSERT_FALSE(m.empty());
  metrics::ParseReport report;
  metrics::ParseAllSamples(m, &report);
  EXPECT_TRUE(report.ok()) << (report.errors.empty() ? "" : report.errors[0].message);
  double total = 0;
  for (int i = 0; i < 2; ++i) {
    std::string name = "r" + std::to_string(i);
    auto replica = Fetch("127.0.0.1", fleet_->port(i), "GET", "/metrics");
    ASSERT_TRUE(replica.has_value());
    double served = MetricSum(replica->body, "vllm:request_success_total");
    EXPECT_EQ(MetricSum(m, "kvroute_requests_total", {{"endpoint", name}, {"code", "200"}}), served)
        << name;
    total += served;
  }
  EXPECT_EQ(total, 7);
  EXPECT_EQ(MetricSum(m, "kvroute_scheduling_duration_seconds_count"), 7);
  EXPECT_EQ(MetricSum(m, "kvroute_plugin_score_count", {{"plugin", "prefix-cache-scorer"}}), 7);
  EXPECT_EQ(MetricSum(m, "kvroute_endpoint_inflight"), 0);
  EXPECT_GT(MetricSum(m, "kvroute_endpoint_scrapes_ok_total"), 0);
  // The prefix index holds each distinct prompt's 307 / 64 = 4 whole blocks once per
  // endpoint it was sent to (the three prompts differ from their first block on).
  for (int i = 0; i < 2; ++i) {
    std::string name = "r" + std::to_string(i);
    EXPECT_EQ(MetricSum(m, "kvroute_prefix_index_entries", {{"endpoint", name}}),
              4.0 * prompts_by_endpoint[name].size())
        << name;
  }
}

// The issue's fleet over real HTTP: replicas whose /metrics are the repository's vLLM
// fixtures (a busy data-parallel one, one at 96% KV under the old names, a calm one at
// 31% KV with an empty queue) plus one whose KV usage is NaN. Fresh requests go to the
// calm one, and the router's /metrics says the NaN endpoint's KV signal is unknown.
TEST_F(RouterTest, FixtureFleetWithANaNReplicaRoutesToTheCalmOne) {
  using namespace metrics::testing;
  StubUpstream busy(StubUpstream::Mode::kOk, V010DataParallel("0.95"));
  StubUpstream old96(StubUpstream::Mode::kOk, V06WithKv("0.96"));
  StubUpstream calm(StubUpstream::Mode::kOk, V010With("3.0", "0.0", "0.31"));
  StubUpstream nan(StubUpstream::Mode::kOk, V010With("2.0", "3.0", "NaN"));
  std::string eps;
  for (auto [name, port] : {std::pair<std::string, uint16_t>{"busy-dp", busy.port()},
                            {"old-96", old96.port()}, {"calm", calm.port()}, {"nan", nan.port()}}) {
    eps += "    - {address: 127.0.0.1:" + std::to_string(port) + ", name: " + name + "}\n";
  }
  StartRouter(Yaml(eps, "", "kvroute"));
  ASSERT_TRUE(WaitFor([&] { return MetricSum(RouterMetrics(), "kvroute_endpoint_metrics_fresh") == 4; }));
  std::map<std::string, int> seen;
  for (int i = 0; i < 40; ++i) {
    auto r = Post(CompletionBody("fresh request " + std::to_string(i) + std::string(400, 'x'), 4));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    ++seen[r->Header("x-kvroute-endpoint")];
  }
  EXPECT_EQ(seen["calm"], 40);
  EXPECT_EQ(seen["nan"], 0);
  const std::string m = RouterMetrics();
  EXPECT_NE(m.find("kvroute_endpoint_kv_usage{endpoint=\"nan\"} NaN\n"), std::string::npos) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_endpoint_signal_known", {{"endpoint", "nan"}, {"signal", "kv_usage"}}), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_endpoint_signal_known", {{"endpoint", "calm"}, {"signal", "kv_usage"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_endpoint_treatment", {{"endpoint", "nan"}, {"treatment", "last_resort"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_endpoint_kv_usage", {{"endpoint", "old-96"}}), 0.96);
}

// Reload keeps affinity: four same-prefix groups keep their replicas across a SIGHUP that
// changes the weights (the prefix index and in-flight accounting survive the reload).
TEST_F(RouterTest, SighupWithNewWeightsKeepsEachPrefixGroupOnItsReplica) {
  StartFleet({Replica(), Replica(), Replica(), Replica()});
  char path_template[] = "/tmp/kvroute-router-test-XXXXXX";
  int fd = mkstemp(path_template);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string path = path_template;
  auto profile = [&](int prefix, int kv, int load) {
    return "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n  endpoints:\n" +
           FleetEndpoints() +
           "plugins:\n  - {type: inflight-accounting}\n  - {type: prefix-cache-scorer}\n"
           "  - {type: kv-cache-utilization-scorer}\n"
           "  - {type: soft-load-scorer, parameters: {minSpread: 8}}\n"
           "schedulingProfiles:\n  - name: default\n    plugins:\n"
           "      - {pluginRef: prefix-cache-scorer, weight: " + std::to_string(prefix) + "}\n"
           "      - {pluginRef: kv-cache-utilization-scorer, weight: " + std::to_string(kv) + "}\n"
           "      - {pluginRef: soft-load-scorer, weight: " + std::to_string(load) + "}\n";
  };
  {
    std::ofstream f(path, std::ios::trunc);
    f << profile(3, 2, 4);
  }
  StartRouter(profile(3, 2, 4), path);
  WaitAllFresh(4);
  auto prompt = [](int g, int i) {
    std::string p = "group " + std::to_string(g) + " system prompt ";
    while (p.size() < 2048) p += static_cast<char>('a' + (g * 7 + p.size()) % 26);
    return p + " question " + std::to_string(i);
  };
  // Each group's first request streams slowly enough that the next group sees it in
  // flight, so the groups spread; then every group has a home.
  std::map<int, std::string> home;
  for (int g = 0; g < 4; ++g) {
    auto r = Post(CompletionBody(prompt(g, 0), 1));
    ASSERT_TRUE(r.has_value());
    home[g] = r->Header("x-kvroute-endpoint");
  }
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(Post(CompletionBody(prompt(g, 1), 1))->Header("x-kvroute-endpoint"), home[g]) << g;
  }
  std::set<std::string> homes;
  for (auto& [g, name] : home) homes.insert(name);
  EXPECT_GE(homes.size(), 2u);
  {
    std::ofstream f(path, std::ios::trunc);
    f << profile(5, 1, 2);
  }
  ASSERT_EQ(kill(getpid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] { return router_->reloads() == 1; }));
  // Groups in reverse order: a scheduler that forgot them would not even replay the same
  // tie-breaks.
  for (int i = 2; i < 5; ++i) {
    for (int g = 3; g >= 0; --g) {
      EXPECT_EQ(Post(CompletionBody(prompt(g, i), 1))->Header("x-kvroute-endpoint"), home[g])
          << "group " << g << " request " << i;
    }
  }
  const std::string m = RouterMetrics();
  EXPECT_GT(MetricSum(m, "kvroute_prefix_index_entries"), 0);
  std::remove(path.c_str());
}

// The router's own error body for `status` (OpenAI-shaped).
std::string OpenAiError(int status, std::string message) {
  return api::ErrorBody(api::MakeError(status, std::move(message)));
}

TEST_F(RouterTest, ClientLimitsFromTheConfigReachTheServerAndShowInMetrics) {
  StartFleet({Replica()});
  StartRouter(Yaml(FleetEndpoints(),
                   "limits: {max_connections: 4, max_header_bytes: 2KiB}\n"
                   "timeouts: {request_read: 200ms, keepalive_idle: 150ms}\n"));
  WaitReady();
  const uint16_t port = router_->port();
  // request_read: a request begun and never finished gets 408, then the close.
  TestClient slow("127.0.0.1", port, 3000ms);
  ASSERT_TRUE(slow.Connect());
  ASSERT_TRUE(slow.SendRaw("POST /v1/completions HTTP/1.1\r\nhost: a\r\n"));
  ClientResponse timed_out;
  ASSERT_TRUE(slow.ReadHead(&timed_out)) << slow.error();
  ASSERT_TRUE(slow.ReadBody(&timed_out)) << slow.error();
  EXPECT_EQ(timed_out.status, 408);
  EXPECT_EQ(timed_out.body, OpenAiError(408, "Request not received within 200 ms."));
  EXPECT_TRUE(slow.WaitForClose());
  // max_header_bytes: 431.
  auto big = Fetch("127.0.0.1", port, "GET", "/healthz", {}, {{"x-big", std::string(3000, 'h')}});
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->status, 431);
  EXPECT_EQ(big->body, OpenAiError(431, "Request header fields too large."));
  // keepalive_idle: a kept-alive connection left quiet is closed, with nothing sent.
  TestClient idle("127.0.0.1", port, 3000ms);
  ASSERT_TRUE(idle.Roundtrip("GET", "/healthz").has_value());
  ClientResponse none;
  EXPECT_FALSE(idle.ReadHead(&none));
  EXPECT_EQ(none.status, 0);
  // max_connections: four held, the fifth is refused with 503 without being read.
  std::vector<std::unique_ptr<TestClient>> held;
  ASSERT_TRUE(WaitFor([&] {  // the probes above have all been closed on the server's side
    return MetricSum(RouterMetrics(), "kvroute_http_open_connections") == 1;
  }));
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<TestClient>("127.0.0.1", port));
    ASSERT_TRUE(held.back()->Roundtrip("GET", "/healthz").has_value()) << held.back()->error();
  }
  TestClient over("127.0.0.1", port);
  ASSERT_TRUE(over.Connect());
  ClientResponse refused;
  ASSERT_TRUE(over.ReadHead(&refused)) << over.error();
  ASSERT_TRUE(over.ReadBody(&refused)) << over.error();
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.Header("connection"), "close");
  EXPECT_EQ(refused.body, OpenAiError(503, "Too many connections: the server's limit of 4 is "
                                         "reached; retry later."));
  // Metrics from one of the held connections (a new one would be refused).
  auto m = held[0]->Roundtrip("GET", "/metrics");
  ASSERT_TRUE(m.has_value()) << held[0]->error();
  const std::string& text = m->body;
  EXPECT_EQ(MetricSum(text, "kvroute_http_open_connections"), 4);
  EXPECT_EQ(MetricSum(text, "kvroute_http_connections_rejected_total"), 1);
  EXPECT_GE(MetricSum(text, "kvroute_http_connections_accepted_total"), 7);
  EXPECT_GE(MetricSum(text, "kvroute_http_idle_closed_total"), 1);
  EXPECT_EQ(MetricSum(text, "kvroute_http_accept_errors_total"), 0);
  using Labels = std::map<std::string, std::string>;
  EXPECT_EQ(MetricSum(text, "kvroute_http_requests_rejected_total", Labels{{"reason", "request_timeout"}}), 1);
  EXPECT_EQ(MetricSum(text, "kvroute_http_requests_rejected_total", Labels{{"reason", "header_too_large"}}), 1);
  for (const char* reason : {"too_many_headers", "body_too_large", "bad_request"}) {
    EXPECT_EQ(MetricSum(text, "kvroute_http_requests_rejected_total", Labels{{"reason", reason}}), 0)
        << reason;
  }
  // One leaves: a newcomer is served again.
  held.pop_back();
  EXPECT_TRUE(WaitFor([&] {
    auto r = Fetch("127.0.0.1", port, "GET", "/healthz");
    return r && r->status == 200;
  }));
}

TEST_F(RouterTest, ClientLeavingMidStreamFreesTheInFlightCount) {
  StartFleet({Replica(/*time_scale=*/1.0)});  // ~6 ms per token: 400 take ~2.4 s
  StartRouter(Yaml(FleetEndpoints()));
  WaitReady();
  TestClient c("127.0.0.1", router_->port());
  ASSERT_TRUE(c.SendRequest("POST", "/v1/completions", CompletionBody("Tell me a story", 400, true)));
  ClientResponse head;
  ASSERT_TRUE(c.ReadHead(&head)) << c.error();
  ASSERT_EQ(head.status, 200);
  ASSERT_TRUE(c.ReadChunk().has_value()) << c.error();
  EXPECT_EQ(MetricSum(RouterMetrics(), "kvroute_endpoint_inflight", {{"endpoint", "r0"}}), 1);
  c.Close();
  EXPECT_TRUE(WaitFor([&] {
    return MetricSum(RouterMetrics(), "kvroute_endpoint_inflight", {{"endpoint", "r0"}}) == 0;
  }, 3000ms));
  EXPECT_TRUE(WaitFor([&] { return fleet_->LiveRequests(0) == 0; }, 3000ms));
}

}  // namespace
}  // namespace kvroute::router
