// Flow control in `kvroute epp` over loopback (issue 11, step 4): the picker in-process
// with `flow.enabled` in front of the saturable fleet of support/flow_fixture.h (one
// replica slow enough that a request stays in flight; one big prompt saturates it), and a
// gRPC client playing Envoy. The test plays Envoy's upstream too: after a pick it sends
// the request to the replica itself. Every wait is bounded; TTLs are short real times.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/router_config.h"
#include "core/api/openai.h"
#include "core/metrics/prom_parser.h"
#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"
#include "apps/epp/epp.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "support/flow_fixture.h"
#include "support/openai_body.h"
#include "support/wait.h"

namespace kvroute::epp {
namespace {

using namespace std::chrono_literals;
namespace pb = ::envoy::service::ext_proc::v3;
namespace core_pb = ::envoy::config::core::v3;
namespace mode_pb = ::envoy::extensions::filters::http::ext_proc::v3;
using ExtProcStream = grpc::ClientReaderWriter<pb::ProcessingRequest, pb::ProcessingResponse>;

using kvroute::test_support::BigPrompt;

std::string Body(std::string_view prompt, int max_tokens, bool stream) {
  return kvroute::test_support::CompletionBody(prompt, max_tokens, stream);
}

using kvroute::test_support::WaitFor;

// A FULL_DUPLEX_STREAMED request: headers (with `objective` and `fairness` when set), then
// the body.
std::vector<pb::ProcessingRequest> Request(const std::string& body, const std::string& objective = "",
                                           const std::string& fairness = "") {
  pb::ProcessingRequest h;
  auto add = [&](std::string k, std::string v) {
    core_pb::HeaderValue* hv = h.mutable_request_headers()->mutable_headers()->add_headers();
    hv->set_key(std::move(k));
    hv->set_raw_value(std::move(v));
  };
  add(":method", "POST");
  add(":path", "/v1/completions");
  add("content-type", "application/json");
  if (!objective.empty()) add("x-gateway-inference-objective", objective);
  if (!fairness.empty()) add("x-llm-d-inference-fairness-id", fairness);
  h.mutable_protocol_config()->set_request_body_mode(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED);
  pb::ProcessingRequest b;
  b.mutable_request_body()->set_body(body);
  b.mutable_request_body()->set_end_of_stream(true);
  return {h, b};
}

std::string Destination(const pb::ProcessingResponse& r) {
  if (!r.has_request_headers()) return "";
  for (const auto& o : r.request_headers().response().header_mutation().set_headers()) {
    if (o.header().key() == "x-gateway-destination-endpoint") return o.header().raw_value();
  }
  return "";
}

std::string ImmediateHeader(const pb::ImmediateResponse& ir, std::string_view key) {
  for (const auto& o : ir.headers().set_headers()) {
    if (o.header().key() == key) return o.header().raw_value();
  }
  return "<unset>";
}

// One ext_proc stream held open by the test.
struct Open {
  grpc::ClientContext ctx;
  std::unique_ptr<ExtProcStream> stream;
  bool finished = false;

  // Reads what is left and finishes the call.
  grpc::Status End() {
    finished = true;
    pb::ProcessingResponse r;
    while (stream->Read(&r)) {
    }
    return stream->Finish();
  }
  ~Open() {
    if (finished) return;
    ctx.TryCancel();
    End();
  }
};

class EppFlowTest : public ::testing::Test, public kvroute::test_support::FlowSignals {
 protected:
  void TearDown() override {
    streams_.clear();
    upstreams_.clear();
    if (epp_) epp_->Stop();
    epp_.reset();
    if (fleet_) fleet_->Stop();
    fleet_.reset();
  }

  // `flow` holds the keys under `flow:` besides `enabled`; `extra` more top-level YAML.
  void Start(const std::string& flow, const std::string& extra = "", bool enabled = true) {
    fleet_ = kvroute::test_support::SaturableFleet();
    ASSERT_TRUE(fleet_->Start().ok());
    const std::string yaml = kvroute::test_support::FlowConfigYaml(
        kvroute::test_support::FlowEndpoint(fleet_->port(0)), enabled, flow, extra);
    config::ConfigOr<config::RouterConfig> c = config::ParseRouterConfig(yaml, "epp.yaml");
    ASSERT_TRUE(c.ok()) << c.error.ToString() << "\n" << yaml;
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

  std::string Metrics() override { return epp_->MetricsText(); }

  // Opens a stream and writes `msgs` without half-closing it.
  Open* Send(const std::vector<pb::ProcessingRequest>& msgs) {
    auto o = std::make_unique<Open>();
    o->ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    o->stream = stub_->Process(&o->ctx);
    for (const auto& m : msgs) EXPECT_TRUE(o->stream->Write(m));
    streams_.push_back(std::move(o));
    return streams_.back().get();
  }

  // A request the picker routes at once, then sent to the replica (as Envoy would): it
  // fills most of the KV cache and keeps generating for `max_tokens` (~6 ms each).
  // Returns its ext_proc stream, still open, once the pool counts as saturated.
  Open* Saturate(char c, int max_tokens) {
    const std::string body = Body(BigPrompt(c), max_tokens, true);
    Open* s = Send(Request(body));
    pb::ProcessingResponse r;
    EXPECT_TRUE(s->stream->Read(&r));
    EXPECT_EQ(Destination(r), "127.0.0.1:" + std::to_string(fleet_->port(0)));
    EXPECT_TRUE(s->stream->Read(&r));  // the body re-emitted
    auto up = std::make_unique<http::TestClient>("127.0.0.1", fleet_->port(0), 10000ms);
    EXPECT_TRUE(up->SendRequest("POST", "/v1/completions", body)) << up->error();
    http::ClientResponse head;
    EXPECT_TRUE(up->ReadHead(&head)) << up->error();
    EXPECT_EQ(head.status, 200);
    EXPECT_TRUE(up->ReadChunk().has_value()) << up->error();
    upstreams_.push_back(std::move(up));
    EXPECT_TRUE(WaitSaturated()) << epp_->MetricsText();
    return s;
  }

  // Ends the saturating request: its upstream response read to the end, then the
  // response's end told to the picker on its stream.
  void Finish(Open* s) {
    http::TestClient& up = *upstreams_.back();
    while (up.ReadChunk().has_value()) {
    }
    EXPECT_TRUE(up.ended()) << up.error();
    pb::ProcessingRequest rh;
    core_pb::HeaderValue* hv = rh.mutable_response_headers()->mutable_headers()->add_headers();
    hv->set_key(":status");
    hv->set_raw_value("200");
    rh.mutable_response_headers()->set_end_of_stream(true);
    EXPECT_TRUE(s->stream->Write(rh));
    s->stream->WritesDone();
    EXPECT_TRUE(s->End().ok());
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Epp> epp_;
  std::unique_ptr<pb::ExternalProcessor::Stub> stub_;
  std::vector<std::unique_ptr<Open>> streams_;
  std::vector<std::unique_ptr<http::TestClient>> upstreams_;
};

TEST_F(EppFlowTest, AHeldStreamIsAnsweredWhenCapacityFrees) {
  Start("");
  Open* a = Saturate('a', 100);
  Open* b = Send(Request(Body("hello", 4, false)));
  b->stream->WritesDone();  // a half-close while held: the stream stays open for the answer
  ASSERT_TRUE(WaitFor([&] { return Waiting() == 1; })) << epp_->MetricsText();
  EXPECT_EQ(Metric("kvroute_flow_waiting_requests", {{"priority", "0"}}), 1);
  EXPECT_GT(Metric("kvroute_flow_waiting_bytes", {{"priority", "0"}}), 0);
  EXPECT_EQ(Metric("kvroute_endpoint_inflight"), 1);  // b is not picked while it waits
  Finish(a);
  // The freed replica's next scrape (or a's end) lets b go: picked, then its body.
  pb::ProcessingResponse r;
  ASSERT_TRUE(b->stream->Read(&r));
  EXPECT_EQ(Destination(r), "127.0.0.1:" + std::to_string(fleet_->port(0)));
  ASSERT_TRUE(b->stream->Read(&r));
  EXPECT_TRUE(r.request_body().response().body_mutation().streamed_response().end_of_stream());
  EXPECT_EQ(Waiting(), 0);
  EXPECT_EQ(Metric("kvroute_flow_dispatched_total", {{"cause", "immediate"}}), 1);
  EXPECT_EQ(Metric("kvroute_flow_dispatched_total", {{"cause", "order"}}), 1);
  EXPECT_EQ(Metric("kvroute_flow_wait_seconds_count"), 2);
  EXPECT_TRUE(b->End().ok());
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_inflight") == 0; }));
}

TEST_F(EppFlowTest, PastItsTtlAHeldStreamGetsAnImmediate429WithRetryAfter) {
  Start("  ttl: 300ms\n");
  Saturate('a', 300);  // ~1.8 s
  const auto start = std::chrono::steady_clock::now();
  Open* b = Send(Request(Body("hello", 4, false)));
  pb::ProcessingResponse r;
  ASSERT_TRUE(b->stream->Read(&r));
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.has_immediate_response());
  const pb::ImmediateResponse& ir = r.immediate_response();
  EXPECT_EQ(static_cast<int>(ir.status().code()), 429);
  EXPECT_EQ(ImmediateHeader(ir, "retry-after"), "1");
  EXPECT_EQ(ImmediateHeader(ir, "content-type"), "application/json");
  EXPECT_NE(ir.body().find("\"type\":\"RateLimitError\""), std::string::npos) << ir.body();
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 1500ms);  // the TTL, not the saturating request's end
  EXPECT_TRUE(b->End().ok());
  EXPECT_EQ(Metric("kvroute_flow_expired_total", {{"reason", "ttl"}}), 1);
  EXPECT_EQ(Waiting(), 0);
  EXPECT_EQ(Metric("kvroute_endpoint_inflight"), 1);  // only the saturating one
}

TEST_F(EppFlowTest, SheddableGets429AtOnceWhileSaturated) {
  Start("", "epp:\n  objectives: {batch: -1}\n");
  Saturate('a', 200);
  const auto start = std::chrono::steady_clock::now();
  Open* b = Send(Request(Body("hello", 4, false), "batch"));
  pb::ProcessingResponse r;
  ASSERT_TRUE(b->stream->Read(&r));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 250ms);
  ASSERT_TRUE(r.has_immediate_response());
  EXPECT_EQ(static_cast<int>(r.immediate_response().status().code()), 429);
  EXPECT_EQ(ImmediateHeader(r.immediate_response(), "retry-after"), "1");
  EXPECT_NE(r.immediate_response().body().find("sheddable"), std::string::npos);
  EXPECT_EQ(Metric("kvroute_flow_rejected_total", {{"reason", "sheddable"}}), 1);
  EXPECT_EQ(Waiting(), 0);
}

TEST_F(EppFlowTest, EnvoyCancellingAHeldStreamLeavesNothingWaiting) {
  Start("");
  Saturate('a', 200);
  Open* b = Send(Request(Body("hello", 4, false)));
  ASSERT_TRUE(WaitFor([&] { return Waiting() == 1; })) << epp_->MetricsText();
  b->ctx.TryCancel();
  b->End();
  EXPECT_TRUE(WaitFor([&] { return Waiting() == 0; }));
  EXPECT_EQ(Metric("kvroute_flow_cancelled_total"), 1);
  EXPECT_EQ(Metric("kvroute_flow_waiting_bytes"), 0);
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_epp_streams_open") == 1; }));
  EXPECT_EQ(Metric("kvroute_endpoint_inflight"), 1);  // only the saturating one
}

// flow.enabled false (the default): picked at once even while saturated, sheddable still
// shed as before, no kvroute_flow_* series.
TEST_F(EppFlowTest, FlowOffPicksAtOnceAsBefore) {
  Start("", "epp:\n  objectives: {batch: -1}\n", /*enabled=*/false);
  Saturate('a', 200);
  Open* b = Send(Request(Body("hello", 4, false)));
  pb::ProcessingResponse r;
  ASSERT_TRUE(b->stream->Read(&r));
  EXPECT_EQ(Destination(r), "127.0.0.1:" + std::to_string(fleet_->port(0)));
  Open* c = Send(Request(Body("hello", 4, false), "batch"));
  ASSERT_TRUE(c->stream->Read(&r));
  ASSERT_TRUE(r.has_immediate_response());
  EXPECT_EQ(static_cast<int>(r.immediate_response().status().code()), 429);
  EXPECT_EQ(ImmediateHeader(r.immediate_response(), "retry-after"), "<unset>");
  EXPECT_EQ(epp_->MetricsText().find("kvroute_flow_"), std::string::npos);
}

// Stopping the picker answers a request still waiting in the flow queue with 503 and
// x-llm-d-request-dropped-reason: rejected-shutting-down, rather than cutting it off.
TEST_F(EppFlowTest, StoppingRefusesAHeldStreamWithRejectedShuttingDown) {
  Start("");
  Saturate('a', 200);
  Open* b = Send(Request(Body("hello", 4, false)));
  ASSERT_TRUE(WaitFor([&] { return Waiting() == 1; })) << epp_->MetricsText();
  std::thread stop([&] { epp_->Stop(); });
  pb::ProcessingResponse r;
  const bool read = b->stream->Read(&r);
  stop.join();
  ASSERT_TRUE(read);
  ASSERT_TRUE(r.has_immediate_response());
  const pb::ImmediateResponse& ir = r.immediate_response();
  EXPECT_EQ(static_cast<int>(ir.status().code()), 503);
  EXPECT_EQ(ImmediateHeader(ir, "x-llm-d-request-dropped-reason"), "rejected-shutting-down");
  EXPECT_EQ(ImmediateHeader(ir, "content-type"), "application/json");
  EXPECT_NE(ir.body().find("\"code\":503"), std::string::npos) << ir.body();
  EXPECT_NE(ir.body().find("shutting down"), std::string::npos) << ir.body();
}

// What an llm-d Router dashboard queries (REFERENCE.md section 17), one metric name a line:
// llm-d Router v1.0's names, then the older ones dashboards for the Gateway API Inference
// Extension read.
constexpr std::string_view kDashboardNames = R"(
llm_d_epp_request_total
llm_d_epp_request_error_total
llm_d_epp_request_duration_seconds
llm_d_epp_request_input_tokens
llm_d_epp_request_output_tokens
llm_d_epp_request_cached_tokens
llm_d_epp_request_running
llm_d_epp_request_ttft_seconds
llm_d_epp_request_ntpot_seconds
llm_d_epp_average_kv_cache_utilization
llm_d_epp_average_queue_size
llm_d_epp_average_running_requests
llm_d_epp_std_dev_kv_cache_utilization
llm_d_epp_std_dev_queue_size
llm_d_epp_ready_endpoints
llm_d_epp_per_endpoint_queue_size
llm_d_epp_scheduler_e2e_duration_seconds
llm_d_epp_scheduler_attempts_total
llm_d_epp_plugin_duration_seconds
llm_d_epp_flow_control_queue_size
llm_d_epp_flow_control_request_queue_duration_seconds
llm_d_epp_flow_control_pool_saturation
llm_d_epp_flow_control_requests_total
llm_d_epp_request_predicted_ttft_seconds
llm_d_epp_request_predicted_tpot_seconds
llm_d_epp_request_slo_violation_total
inference_objective_request_total
inference_objective_request_error_total
inference_objective_input_tokens_total
inference_objective_output_tokens_total
inference_pool_average_kv_cache_utilization
inference_pool_average_queue_size
inference_pool_ready_pods
inference_pool_per_pod_queue_size
inference_extension_scheduler_e2e_duration_seconds
inference_extension_plugin_duration_seconds
)";

// The done-test of issue 26 item 5: after traffic through the picker (a request picked and
// answered, one refused), every name a dashboard queries has a sample on /metrics (read
// over loopback), the request series carry llm-d's labels, and promtool finds nothing but
// the lint llm-d's own prefix draws ("llm_d_" reads as the abbreviated unit "d").
TEST_F(EppFlowTest, EveryDashboardNameHasASampleAndPromtoolIsClean) {
  Start("", "epp:\n  objectives: {batch: -1}\n");
  Open* a = Saturate('a', 50);
  Open* shed = Send(Request(Body("hello", 4, false), "batch", "tenant-x"));
  pb::ProcessingResponse r;
  ASSERT_TRUE(shed->stream->Read(&r));
  ASSERT_TRUE(r.has_immediate_response());
  EXPECT_EQ(ImmediateHeader(r.immediate_response(), "x-llm-d-request-dropped-reason"), "rejected-saturated");
  Finish(a);
  std::optional<http::ClientResponse> m = http::Fetch("127.0.0.1", epp_->metrics_port(), "GET", "/metrics");
  ASSERT_TRUE(m.has_value());
  ASSERT_EQ(m->status, 200);
  const std::string& text = m->body;
  std::set<std::string> sampled;
  metrics::ParseReport report;
  for (const auto& smp : metrics::ParseAllSamples(text, &report)) {
    std::string_view n = smp.name;
    for (std::string_view suffix : {"_bucket", "_count", "_sum"}) {
      if (n.size() > suffix.size() && n.substr(n.size() - suffix.size()) == suffix) {
        sampled.insert(std::string(n.substr(0, n.size() - suffix.size())));
      }
    }
    sampled.insert(smp.name);
  }
  EXPECT_TRUE(report.ok());
  std::istringstream names{std::string(kDashboardNames)};
  std::size_t checked = 0;
  for (std::string name; std::getline(names, name);) {
    if (name.empty()) continue;
    ++checked;
    EXPECT_TRUE(sampled.contains(name)) << name << " has no sample";
  }
  EXPECT_EQ(checked, 36u);
  EXPECT_NE(text.find("llm_d_epp_request_error_total{model_name=\"test/model\",target_model_name=\"test/model\","
                      "fairness_id=\"tenant-x\",priority=\"-1\",error_code=\"429\"} 1"),
            std::string::npos)
      << text;

  // Debian's prometheus package (scripts/install-deps.sh) brings promtool.
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "promtool is not installed";
  const std::string in = ::testing::TempDir() + "epp_metrics.txt";
  const std::string findings = ::testing::TempDir() + "epp_promtool.txt";
  std::ofstream(in) << text;
  const int rc = std::system(("promtool check metrics < '" + in + "' > '" + findings + "' 2>&1").c_str());
  std::ifstream f(findings);
  std::string line, others;
  std::size_t n = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    ++n;
    const bool prefix_lint = line.rfind("llm_d_epp_", 0) == 0 &&
                             line.find(" metric names should not contain abbreviated units") != std::string::npos;
    if (!prefix_lint) others += line + "\n";
  }
  EXPECT_EQ(others, "");
  // Exit 3: lint findings only (1 would be a format error).
  EXPECT_EQ(WEXITSTATUS(rc), n ? 3 : 0) << rc;
}

}  // namespace
}  // namespace kvroute::epp
