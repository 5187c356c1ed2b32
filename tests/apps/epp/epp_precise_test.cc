// Precise prefix routing through `kvroute epp` over loopback: `kvroute sim` replicas
// publishing vLLM KV-cache events over ZMQ, the picker in-process subscribing to them,
// tokenizing prompts with a replica's POST /tokenize before each pick, and a gRPC client
// playing Envoy (and Envoy's upstream: after the pick it sends the request to the chosen
// replica itself and hands the response back on the stream, so the picker reads the
// route receipt). The epp twin of tests/apps/serve/precise_routing_test.cc.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "metrics/metric_sum.h"
#include "config/router_config.h"
#include "core/engine/tokenizer.h"
#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"
#include "apps/epp/epp.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/kv_events_fleet.h"
#include "support/wait.h"

namespace kvroute::epp {
namespace {

using namespace std::chrono_literals;
namespace pb = ::envoy::service::ext_proc::v3;
namespace core_pb = ::envoy::config::core::v3;
namespace mode_pb = ::envoy::extensions::filters::http::ext_proc::v3;
using http::Fetch;
using metrics::testing::MetricSum;
using test_support::CompletionBody;
using test_support::WaitFor;

// A prompt of exactly `tokens` tokens, distinct per `tag`.
std::string Prompt(const std::string& tag, int tokens) { return test_support::TokensPrompt(tag, tokens); }

void AddHeader(pb::HttpHeaders* h, std::string k, std::string v) {
  core_pb::HeaderValue* hv = h->mutable_headers()->add_headers();
  hv->set_key(std::move(k));
  hv->set_raw_value(std::move(v));
}

class EppPreciseRouting : public ::testing::Test {
 protected:
  void SetUp() override {
    // 128 blocks of 16 tokens: a few long prompts evict the oldest.
    fleet_ = test_support::StartPublishingFleet(4, {.kv_blocks = 128});
    ASSERT_TRUE(fleet_);
  }

  // The picker over the fleet; `kv_events_extra`: more keys of pool.kv_events; `extra`:
  // more top-level YAML.
  void StartEpp(const std::string& kv_events_extra = "", const std::string& extra = "",
                const std::string& policy = "kvroute") {
    std::string y = "pool:\n  scrape_interval: 20ms\n  staleness: 1s\n"
                    "  kv_events: {speculative_ttl: 100ms" + kv_events_extra + "}\n  endpoints:\n" +
                    test_support::EventsEndpointsYaml(*fleet_);
    y += "scheduling:\n  policy: " + policy + "\n" + extra;
    config::ConfigOr<config::RouterConfig> c = config::ParseRouterConfig(y, "epp.yaml");
    ASSERT_TRUE(c.ok()) << c.error.ToString() << "\n" << y;
    EppOptions o;
    o.host = "127.0.0.1";
    o.grpc_port = 0;
    o.health_port = 0;
    o.metrics_port = 0;
    o.log = false;
    epp_ = std::make_unique<Epp>(std::move(*c.value), o);
    Status st = epp_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
    stub_ = pb::ExternalProcessor::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(epp_->grpc_port()), grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(WaitFor([&] { return epp_->Ready(); }));
  }
  void TearDown() override {
    if (epp_) epp_->Stop();
    epp_.reset();
    fleet_.reset();
  }

  std::string Metrics() {
    auto m = Fetch("127.0.0.1", epp_->metrics_port(), "GET", "/metrics");
    return m ? m->body : std::string();
  }

  // Directly to replica i, not through the picker.
  void Direct(int i, const std::string& prompt) { ASSERT_TRUE(test_support::DirectCompletion(*fleet_, i, prompt)); }

  // Every replica's events are live in the picker.
  void WaitAllLive() { ASSERT_TRUE(test_support::WaitAllEventsLive(*fleet_, [&] { return Metrics(); })); }

  double Blocks(int i) { return MetricSum(Metrics(), "kvroute_kv_events_blocks", {{"endpoint", "r" + std::to_string(i)}}); }

  // One request through the picker as Envoy sends it (FULL_DUPLEX_STREAMED), then to the
  // replica picked, its response handed back on the stream. The replica's name ("r3").
  std::string Through(const std::string& prompt) {
    const std::string body = CompletionBody(prompt, 1);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auto stream = stub_->Process(&ctx);
    pb::ProcessingRequest h;
    AddHeader(h.mutable_request_headers(), ":method", "POST");
    AddHeader(h.mutable_request_headers(), ":path", "/v1/completions");
    AddHeader(h.mutable_request_headers(), "content-type", "application/json");
    h.mutable_protocol_config()->set_request_body_mode(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED);
    pb::ProcessingRequest b;
    b.mutable_request_body()->set_body(body);
    b.mutable_request_body()->set_end_of_stream(true);
    EXPECT_TRUE(stream->Write(h));
    EXPECT_TRUE(stream->Write(b));
    pb::ProcessingResponse r;
    EXPECT_TRUE(stream->Read(&r));
    std::string dest;
    for (const auto& o : r.request_headers().response().header_mutation().set_headers()) {
      if (o.header().key() == "x-gateway-destination-endpoint") dest = o.header().raw_value();
    }
    EXPECT_TRUE(stream->Read(&r));  // the body re-emitted
    dest = dest.substr(0, dest.find(','));
    int served = -1;
    for (int i = 0; i < fleet_->size(); ++i) {
      if (dest == "127.0.0.1:" + std::to_string(fleet_->port(i))) served = i;
    }
    EXPECT_GE(served, 0) << dest;
    if (served < 0) return "";
    auto resp = Fetch("127.0.0.1", fleet_->port(served), "POST", "/v1/completions", body);
    EXPECT_TRUE(resp && resp->status == 200);
    pb::ProcessingRequest rh;
    AddHeader(rh.mutable_response_headers(), ":status", "200");
    AddHeader(rh.mutable_response_headers(), "content-type", "application/json");
    pb::ProcessingRequest rb;
    rb.mutable_response_body()->set_body(resp ? resp->body : std::string());
    rb.mutable_response_body()->set_end_of_stream(true);
    EXPECT_TRUE(stream->Write(rh));
    EXPECT_TRUE(stream->Read(&r));
    EXPECT_TRUE(stream->Write(rb));
    EXPECT_TRUE(stream->Read(&r));
    stream->WritesDone();
    while (stream->Read(&r)) {
    }
    EXPECT_TRUE(stream->Finish().ok());
    return "r" + std::to_string(served);
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Epp> epp_;
  std::unique_ptr<pb::ExternalProcessor::Stub> stub_;
};

TEST_F(EppPreciseRouting, FollowsWhatTheReplicasReportTheyCache) {
  StartEpp();
  WaitAllLive();
  // Replica 3 computes a long prompt for a client that never went through the gateway.
  const std::string p = Prompt("shared-context", 800);  // 50 blocks
  const double before = Blocks(3);
  Direct(3, p);
  ASSERT_TRUE(WaitFor([&] { return Blocks(3) >= before + 49; }));
  // The first request with that prefix through the picker goes there, and its receipt
  // (predicted against the engine's reported cached tokens) agrees.
  EXPECT_EQ(Through(p + " and a question"), "r3");
  // The receipt is counted when the picker has read the response body's end.
  std::string m;
  EXPECT_TRUE(WaitFor([&] { return MetricSum(m = Metrics(), "kvroute_route_receipts_total") == 1; }));
  EXPECT_EQ(MetricSum(m, "kvroute_route_receipts_mispredicted_total"), 0);
  EXPECT_EQ(MetricSum(m, "kvroute_route_receipts_reported_tokens_total"), 800);
  EXPECT_GE(MetricSum(m, "kvroute_tokenize_requests_total"), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_tokenize_failures_total"), 0);

  // Replica 3 evicts those blocks (its slots reused by other prompts: BlockRemoved).
  const double removed_before =
      MetricSum(m, "kvroute_kv_events_events_total", {{"endpoint", "r3"}, {"type", "BlockRemoved"}});
  for (int k = 0; k < 3; ++k) Direct(3, Prompt("filler" + std::to_string(k), 1200));
  const std::vector<uint32_t> ids = engine::Tokenize(p);
  ASSERT_EQ(fleet_->PeekCachedTokens(3, ids), 0);
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(Metrics(), "kvroute_kv_events_events_total",
                     {{"endpoint", "r3"}, {"type", "BlockRemoved"}}) > removed_before;
  }));
  // Replica 1 now holds the prompt: the pick follows it there, not to replica 3.
  const double before1 = Blocks(1);
  Direct(1, p);
  ASSERT_TRUE(WaitFor([&] { return Blocks(1) >= before1 + 49; }));
  EXPECT_EQ(Through(p + " and another question"), "r1");
  EXPECT_TRUE(WaitFor([&] { return MetricSum(m = Metrics(), "kvroute_route_receipts_total") == 2; }));
  EXPECT_EQ(MetricSum(m, "kvroute_route_receipts_mispredicted_total"), 0);
}

// The peers that route on events, by name in the picker: llm-d Router's precise mode and
// Dynamo's default mode follow the engines' reports as kvroute does.
TEST_F(EppPreciseRouting, PeerPoliciesOnEventsRunByName) {
  int replica = 1;
  for (const std::string policy : {"llm-d-precise", "dynamo-kv"}) {
    SCOPED_TRACE(policy);
    StartEpp("", "", policy);
    WaitAllLive();
    const std::string p = Prompt("peer-context-" + policy, 800);
    const double before = Blocks(replica);
    Direct(replica, p);
    ASSERT_TRUE(WaitFor([&] { return Blocks(replica) >= before + 49; }));
    EXPECT_EQ(Through(p + " and a question"), "r" + std::to_string(replica));
    EXPECT_EQ(Through(p + " and another question"), "r" + std::to_string(replica));
    epp_->Stop();
    epp_.reset();
    ++replica;
  }
}

TEST_F(EppPreciseRouting, WithFlowControlTheHeldPickIsPreciseToo) {
  StartEpp("", "flow:\n  enabled: true\n");
  WaitAllLive();
  const std::string p = Prompt("flow-context", 800);
  const double before = Blocks(2);
  Direct(2, p);
  ASSERT_TRUE(WaitFor([&] { return Blocks(2) >= before + 49; }));
  EXPECT_EQ(Through(p + " and a question"), "r2");
  std::string m;
  EXPECT_TRUE(WaitFor([&] { return MetricSum(m = Metrics(), "kvroute_route_receipts_total") == 1; }));
  EXPECT_EQ(MetricSum(m, "kvroute_route_receipts_mispredicted_total"), 0);
}

TEST_F(EppPreciseRouting, ATokenizerThatCannotBeReachedLeavesTheApproximatePick) {
  // Nothing listens on port 1: every tokenize call fails to connect.
  StartEpp(", tokenizer: 127.0.0.1:1");
  WaitAllLive();
  EXPECT_FALSE(Through(Prompt("no-ids", 100)).empty());
  const std::string m = Metrics();
  EXPECT_GE(MetricSum(m, "kvroute_tokenize_requests_total"), 1);
  EXPECT_GE(MetricSum(m, "kvroute_tokenize_failures_total", {{"kind", "connect"}}), 1);
  // No ids: no prediction, so no receipt.
  EXPECT_EQ(MetricSum(m, "kvroute_route_receipts_total"), 0);
}

}  // namespace
}  // namespace kvroute::epp
