// Loopback tests of `kvroute epp`: the picker in-process on port 0, a simulated fleet
// (sim::Fleet) behind it, and a real gRPC client built from the C++ stubs playing Envoy.
// Every wait is bounded.
#include "apps/epp/epp.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <fstream>
#include <optional>
#include <unistd.h>

#include "config/router_config.h"
#include "core/api/openai.h"
#include "core/routing/sessions.h"
#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "adapters/http/test_client.h"
#include "core/metrics/prom_parser.h"
#include "apps/sim/fleet.h"

#include "adapters/k8s/fake_api_server.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/stub_server.h"
#include "support/wait.h"

namespace kvroute::epp {
namespace {

using namespace std::chrono_literals;
namespace pb = ::envoy::service::ext_proc::v3;
namespace core_pb = ::envoy::config::core::v3;
namespace mode_pb = ::envoy::extensions::filters::http::ext_proc::v3;
namespace health_pb = ::grpc::health::v1;

constexpr std::string_view kDest = "x-gateway-destination-endpoint";

using kvroute::test_support::ClosedPort;
using kvroute::test_support::WaitFor;

std::string Completion(std::string_view prompt) {
  return kvroute::test_support::CompletionBody(prompt, 4);
}

std::string LongPrompt(std::size_t n, int salt) {
  std::string p = "a long shared system prompt for the epp loopback tests " + std::to_string(salt) + ": ";
  while (p.size() < n) p += static_cast<char>('a' + (p.size() * 31 + salt) % 26);
  return p;
}

pb::ProcessingRequest Headers(std::string path, mode_pb::ProcessingMode::BodySendMode mode, bool eos = false) {
  pb::ProcessingRequest r;
  auto add = [&](std::string k, std::string v) {
    core_pb::HeaderValue* h = r.mutable_request_headers()->mutable_headers()->add_headers();
    h->set_key(std::move(k));
    h->set_raw_value(std::move(v));
  };
  add(":method", "POST");
  add(":path", std::move(path));
  add("content-type", "application/json");
  r.mutable_request_headers()->set_end_of_stream(eos);
  r.mutable_protocol_config()->set_request_body_mode(mode);
  return r;
}

pb::ProcessingRequest Body(std::string bytes, bool eos) {
  pb::ProcessingRequest r;
  r.mutable_request_body()->set_body(std::move(bytes));
  r.mutable_request_body()->set_end_of_stream(eos);
  return r;
}

std::vector<pb::ProcessingRequest> Request(mode_pb::ProcessingMode::BodySendMode mode, const std::string& body,
                                           std::size_t chunk = 1 << 30) {
  std::vector<pb::ProcessingRequest> msgs{Headers("/v1/completions", mode)};
  for (std::size_t at = 0; at < body.size(); at += chunk) {
    msgs.push_back(Body(body.substr(at, chunk), at + chunk >= body.size()));
  }
  return msgs;
}

std::string SetHeader(const pb::CommonResponse& c, std::string_view key) {
  for (const auto& o : c.header_mutation().set_headers()) {
    if (o.header().key() == key) return o.header().raw_value();
  }
  return "";
}

std::string LbValue(const pb::ProcessingResponse& r) {
  auto ns = r.dynamic_metadata().fields().find("envoy.lb");
  if (ns == r.dynamic_metadata().fields().end()) return "";
  auto it = ns->second.struct_value().fields().find(std::string(kDest));
  return it == ns->second.struct_value().fields().end() ? "" : it->second.string_value();
}

struct Outcome {
  grpc::Status status;
  std::vector<pb::ProcessingResponse> responses;
};

class EppTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (epp_) epp_->Stop();
    epp_.reset();
    if (fleet_) fleet_->Stop();
    fleet_.reset();
  }

  void StartFleet(int n) {
    std::vector<sim::ReplicaConfig> rs(
        n, kvroute::test_support::SimReplica({.kv_blocks = 4096, .max_model_len = 131072}));
    for (int i = 0; i < n; ++i) rs[i].name = "r" + std::to_string(i);
    fleet_ = std::make_unique<sim::Fleet>(std::move(rs), 2);
    ASSERT_TRUE(fleet_->Start().ok());
    for (int i = 0; i < n; ++i) addresses_.insert("127.0.0.1:" + std::to_string(fleet_->port(i)));
  }

  void StartEpp(const std::vector<uint16_t>& ports, const std::string& extra = "") {
    std::string yaml = "pool:\n  scrape_interval: 50ms\n  endpoints:\n";
    for (uint16_t p : ports) yaml += "    - 127.0.0.1:" + std::to_string(p) + "\n";
    StartEppWith(yaml + extra);
  }

  // The picker on loopback port 0 with the configuration `yaml`, and a stub to it.
  void StartEppWith(const std::string& yaml) {
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "epp.yaml");
    ASSERT_TRUE(r.ok()) << r.error.ToString();
    EppOptions o;
    o.host = "127.0.0.1";
    o.grpc_port = 0;
    o.health_port = 0;
    o.metrics_port = 0;
    o.log = false;
    epp_ = std::make_unique<Epp>(std::move(*r.value), o);
    ASSERT_TRUE(epp_->Start().ok());
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(epp_->grpc_port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = pb::ExternalProcessor::NewStub(channel_);
  }

  void StartAll(int n, const std::string& extra = "") {
    StartFleet(n);
    std::vector<uint16_t> ports;
    for (int i = 0; i < n; ++i) ports.push_back(fleet_->port(i));
    StartEpp(ports, extra);
    ASSERT_TRUE(WaitFor([&] { return epp_->Ready(); }));
    // Every endpoint scraped, so picks see the whole pool (fallbacks included).
    ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_metrics_fresh") == n; }));
  }

  // Plays Envoy for one stream: writes every message, half-closes, reads every answer.
  Outcome Run(const std::vector<pb::ProcessingRequest>& msgs) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auto stream = stub_->Process(&ctx);
    Outcome o;
    for (const auto& m : msgs) {
      if (!stream->Write(m)) break;
    }
    stream->WritesDone();
    pb::ProcessingResponse r;
    while (stream->Read(&r)) o.responses.push_back(r);
    o.status = stream->Finish();
    return o;
  }

  // The pick in `o` (from a headers or body response), checked: header and envoy.lb
  // equal, every address one of the fleet's.
  std::string Pick(const Outcome& o) {
    EXPECT_TRUE(o.status.ok()) << o.status.error_message();
    for (const auto& r : o.responses) {
      const pb::CommonResponse* c = nullptr;
      if (r.has_request_headers() && r.request_headers().has_response()) c = &r.request_headers().response();
      if (r.has_request_body() && r.request_body().response().has_header_mutation()) c = &r.request_body().response();
      if (c == nullptr) continue;
      const std::string dest = SetHeader(*c, kDest);
      if (dest.empty()) continue;
      EXPECT_EQ(LbValue(r), dest);
      EXPECT_TRUE(c->clear_route_cache());
      std::size_t at = 0;
      while (at <= dest.size()) {
        std::size_t comma = dest.find(',', at);
        std::string part = dest.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        EXPECT_TRUE(addresses_.count(part)) << part;
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
      return dest;
    }
    ADD_FAILURE() << "no pick in " << o.responses.size() << " responses";
    return "";
  }

  static std::string Reemitted(const Outcome& o) {
    std::string body;
    for (const auto& r : o.responses) {
      if (!r.has_request_body()) continue;
      const auto& m = r.request_body().response().body_mutation();
      if (m.has_streamed_response()) {
        EXPECT_LE(m.streamed_response().body().size(), 62000u);
        body += m.streamed_response().body();
      }
    }
    return body;
  }

  // The status of the immediate response that ends `o` (BUFFERED and STREAMED answer
  // the headers first), -1 when there is none.
  static int Immediate(const Outcome& o) {
    if (o.responses.empty() || !o.responses.back().has_immediate_response()) return -1;
    for (std::size_t i = 0; i + 1 < o.responses.size(); ++i) {
      EXPECT_FALSE(o.responses[i].has_immediate_response());
      EXPECT_TRUE(o.responses[i].has_request_headers());
    }
    const auto& ir = o.responses.back().immediate_response();
    EXPECT_NE(ir.body().find("\"error\":{"), std::string::npos) << ir.body();
    return static_cast<int>(ir.status().code());
  }

  // grpc.health.v1 Check of `service` on the health port: the status, or minus the
  // gRPC error code.
  int Health(const std::string& service) {
    if (!health_) {
      health_ = health_pb::Health::NewStub(grpc::CreateChannel(
          "127.0.0.1:" + std::to_string(epp_->health_port()), grpc::InsecureChannelCredentials()));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 2s);
    health_pb::HealthCheckRequest req;
    req.set_service(service);
    health_pb::HealthCheckResponse resp;
    grpc::Status st = health_->Check(&ctx, req, &resp);
    return st.ok() ? static_cast<int>(resp.status()) : -static_cast<int>(st.error_code());
  }

  double Metric(std::string_view name) {
    double sum = 0;
    for (const auto& s : metrics::ParseAllSamples(epp_->MetricsText())) {
      if (s.name == name) sum += s.value;
    }
    return sum;
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Epp> epp_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::ExternalProcessor::Stub> stub_;
  std::unique_ptr<health_pb::Health::Stub> health_;
  std::set<std::string> addresses_;
};

TEST_F(EppTest, FullDuplexStreamedPickAndBodyReemitted) {
  StartAll(3);
  for (int i = 0; i < 4; ++i) {
    const std::string body = Completion("hello " + std::to_string(i));
    Outcome o = Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, body, 10));
    ASSERT_GE(o.responses.size(), 2u);
    ASSERT_TRUE(o.responses[0].has_request_headers());
    EXPECT_EQ(SetHeader(o.responses[0].request_headers().response(), "Content-Length"), std::to_string(body.size()));
    Pick(o);
    EXPECT_EQ(Reemitted(o), body);
    EXPECT_TRUE(o.responses.back().request_body().response().body_mutation().streamed_response().end_of_stream());
  }
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_inflight") == 0; }));
}

TEST_F(EppTest, BufferedPickInTheBodyResponse) {
  StartAll(3);
  Outcome o = Run(Request(mode_pb::ProcessingMode::BUFFERED, Completion("buffered")));
  ASSERT_EQ(o.responses.size(), 2u);
  EXPECT_TRUE(o.responses[0].has_request_headers());
  EXPECT_FALSE(o.responses[0].request_headers().has_response());
  ASSERT_TRUE(o.responses[1].has_request_body());
  Pick(o);
}

TEST_F(EppTest, StreamedChunksAnsweredAndPickOnTheLast) {
  StartAll(3);
  const std::string body = Completion(LongPrompt(3000, 1));
  Outcome o = Run(Request(mode_pb::ProcessingMode::STREAMED, body, 500));
  const std::size_t chunks = (body.size() + 499) / 500;
  ASSERT_EQ(o.responses.size(), 1 + chunks);
  for (std::size_t i = 1; i < chunks; ++i) {
    EXPECT_TRUE(o.responses[i].has_request_body());
    EXPECT_FALSE(o.responses[i].request_body().has_response());
  }
  Pick(o);
  EXPECT_TRUE(o.responses.back().request_body().response().has_header_mutation());
}

TEST_F(EppTest, SamePrefixSameEndpoint) {
  StartAll(4);
  const std::string prefix = LongPrompt(6000, 7);
  std::string first;
  for (int i = 0; i < 6; ++i) {
    Outcome o = Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED,
                            Completion(prefix + " q" + std::to_string(i)), 4096));
    std::string dest = Pick(o);
    std::string winner = dest.substr(0, dest.find(','));
    if (i == 0) first = winner;
    EXPECT_EQ(winner, first) << i;
  }
}

TEST_F(EppTest, A220KBPromptIsAnswered) {
  StartAll(3);
  const std::string body = Completion(LongPrompt(220 * 1024, 3));
  auto t0 = std::chrono::steady_clock::now();
  Outcome o = Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, body, 16384));
  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Pick(o);
  EXPECT_EQ(Reemitted(o), body);
  EXPECT_EQ(o.responses.size(), 1 + (body.size() + 61999) / 62000);
  std::printf("220 KB prompt: %zu messages back in %.1f ms over loopback\n", o.responses.size(), ms);
}

TEST_F(EppTest, MalformedBodyIsImmediate400) {
  StartAll(2);
  Outcome o = Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, "{\"model\":"));
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(Immediate(o), 400);
  o = Run(Request(mode_pb::ProcessingMode::BUFFERED, "[1,2"));
  EXPECT_EQ(Immediate(o), 400);
}

// Latency objectives (issue 24): read from the request headers, removed from what Envoy
// forwards to the engine; a bad value is an immediate 400 naming the header.
TEST_F(EppTest, SloHeadersAreConsumedAndRemoved) {
  StartAll(2);
  std::vector<pb::ProcessingRequest> msgs =
      Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("slo"));
  auto add = [&](std::vector<pb::ProcessingRequest>& m, std::string k, std::string v) {
    auto* h = m[0].mutable_request_headers()->mutable_headers()->add_headers();
    h->set_key(std::move(k));
    h->set_raw_value(std::move(v));
  };
  add(msgs, "x-llm-d-slo-ttft-ms", "500");
  add(msgs, "x-slo-tpot-ms", "50");
  Outcome o = Run(msgs);
  Pick(o);
  ASSERT_TRUE(o.responses[0].has_request_headers());
  const auto& removed = o.responses[0].request_headers().response().header_mutation().remove_headers();
  EXPECT_EQ(std::vector<std::string>(removed.begin(), removed.end()),
            (std::vector<std::string>{"x-llm-d-slo-ttft-ms", "x-slo-tpot-ms"}));
  std::vector<pb::ProcessingRequest> bad =
      Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("slo"));
  add(bad, "x-llm-d-slo-tpot-ms", "fast");
  EXPECT_EQ(Immediate(Run(bad)), 400);
}

TEST_F(EppTest, EveryEndpointDownIsImmediate503) {
  StartEpp({ClosedPort(), ClosedPort()});
  int code = -1;
  EXPECT_TRUE(WaitFor([&] {
    code = Immediate(Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("x"))));
    return code == 503;
  })) << code;
  EXPECT_EQ(Metric("kvroute_endpoint_inflight"), 0);
}

TEST_F(EppTest, SubsetHintIsHonoured) {
  StartAll(3);
  const std::string only = "127.0.0.1:" + std::to_string(fleet_->port(1));
  for (int i = 0; i < 5; ++i) {
    auto msgs = Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("subset " + std::to_string(i)));
    auto& lb = (*msgs[0].mutable_metadata_context()->mutable_filter_metadata())["envoy.lb"];
    (*lb.mutable_fields())["x-gateway-destination-endpoint-subset"].mutable_list_value()->add_values()->set_string_value(only);
    EXPECT_EQ(Pick(Run(msgs)), only);
  }
  auto msgs = Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("none"));
  auto& lb = (*msgs[0].mutable_metadata_context()->mutable_filter_metadata())["envoy.lb"];
  (*lb.mutable_fields())["x-gateway-destination-endpoint-subset"].mutable_list_value()->add_values()->set_string_value("10.9.9.9:1");
  EXPECT_EQ(Immediate(Run(msgs)), 503);
}

TEST_F(EppTest, CancelledStreamLeavesNoInflight) {
  StartAll(2);
  {
    grpc::ClientContext ctx;
    auto stream = stub_->Process(&ctx);
    for (const auto& m : Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("cancel me"))) {
      ASSERT_TRUE(stream->Write(m));
    }
    pb::ProcessingResponse r;
    ASSERT_TRUE(stream->Read(&r));  // the pick: the request is in flight now
    EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_inflight") == 1; }));
    ctx.TryCancel();
    while (stream->Read(&r)) {
    }
    stream->Finish();
  }
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_inflight") == 0; }));
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_epp_streams_open") == 0; }));
}

TEST_F(EppTest, StreamTimeoutEndsAHangingStream) {
  StartAll(2, "epp: {stream_timeout: 300ms}\n");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  auto stream = stub_->Process(&ctx);
  ASSERT_TRUE(stream->Write(Headers("/v1/completions", mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED)));
  ASSERT_TRUE(stream->Write(Body(Completion("x").substr(0, 5), false)));  // the body never ends
  auto t0 = std::chrono::steady_clock::now();
  pb::ProcessingResponse r;
  EXPECT_FALSE(stream->Read(&r));
  grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_EQ(Metric("kvroute_epp_stream_timeouts_total"), 1);
  EXPECT_EQ(Metric("kvroute_endpoint_inflight"), 0);
}

TEST_F(EppTest, ConcurrentStreamsAreNotSerialised) {
  StartAll(3);
  constexpr int kStreams = 64;
  struct Open {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<pb::ProcessingRequest, pb::ProcessingResponse>> stream;
  };
  std::vector<std::unique_ptr<Open>> open;
  // Every stream is opened and has its headers and half its body in before any finishes.
  std::vector<std::string> bodies;
  for (int i = 0; i < kStreams; ++i) {
    auto o = std::make_unique<Open>();
    o->ctx.set_deadline(std::chrono::system_clock::now() + 20s);
    o->stream = stub_->Process(&o->ctx);
    bodies.push_back(Completion("concurrent " + std::to_string(i)));
    ASSERT_TRUE(o->stream->Write(Headers("/v1/completions", mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED)));
    ASSERT_TRUE(o->stream->Write(Body(bodies.back().substr(0, 10), false)));
    open.push_back(std::move(o));
  }
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_epp_streams_open") == kStreams; }));
  std::atomic<int> picked{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kStreams; i += 4) {
        auto& o = *open[i];
        o.stream->Write(Body(bodies[i].substr(10), true));
        o.stream->WritesDone();
        pb::ProcessingResponse r;
        bool ok = o.stream->Read(&r) && r.has_request_headers() &&
                  !SetHeader(r.request_headers().response(), kDest).empty();
        while (o.stream->Read(&r)) {
        }
        if (o.stream->Finish().ok() && ok) ++picked;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(picked.load(), kStreams);
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_inflight") == 0; }));
}

TEST_F(EppTest, HealthServingForReadinessOnceMetricsAreIn) {
  StartFleet(2);
  StartEpp({fleet_->port(0), fleet_->port(1)});
  auto check = [&](const std::string& service) { return Health(service); };
  EXPECT_EQ(check("liveness"), health_pb::HealthCheckResponse::SERVING);
  EXPECT_TRUE(WaitFor([&] { return check("readiness") == health_pb::HealthCheckResponse::SERVING; }));
  EXPECT_EQ(check("envoy.service.ext_proc.v3.ExternalProcessor"), health_pb::HealthCheckResponse::SERVING);
  EXPECT_EQ(check("no.such.Service"), -static_cast<int>(grpc::StatusCode::NOT_FOUND));
  // The health port does not serve ext_proc, nor the ext_proc port health.
  auto on_grpc = health_pb::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 2s);
  health_pb::HealthCheckRequest req;
  health_pb::HealthCheckResponse resp;
  EXPECT_EQ(on_grpc->Check(&ctx, req, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // Every endpoint gone: not ready any more.
  fleet_->Stop();
  EXPECT_TRUE(WaitFor([&] { return check("readiness") == health_pb::HealthCheckResponse::NOT_SERVING; }, 10000ms));
  EXPECT_EQ(check("liveness"), health_pb::HealthCheckResponse::SERVING);
}

TEST_F(EppTest, MetricsPortServesReferenceNames) {
  StartAll(2);
  Pick(Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("m"))));
  auto resp = http::Fetch("127.0.0.1", epp_->metrics_port(), "GET", "/metrics");
  ASSERT_TRUE(resp);
  EXPECT_EQ(resp->status, 200);
  for (const char* name : {"inference_objective_request_total", "inference_pool_average_kv_cache_utilization",
                           "inference_pool_average_queue_size", "inference_pool_ready_pods",
                           "inference_extension_scheduler_e2e_duration_seconds_bucket",
                           "kvroute_requests_total", "kvroute_endpoint_inflight", "kvroute_epp_streams_total"}) {
    EXPECT_NE(resp->body.find(name), std::string::npos) << name;
  }
  EXPECT_NE(resp->body.find("inference_pool_ready_pods{name=\"kvroute\"} 2"), std::string::npos);
  auto h = http::Fetch("127.0.0.1", epp_->metrics_port(), "GET", "/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST_F(EppTest, ReloadAppliesNewSettingsToNewStreams) {
  StartAll(3);
  std::string dest = Pick(Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("a"))));
  EXPECT_EQ(std::count(dest.begin(), dest.end(), ','), 2);
  std::string yaml = "pool:\n  scrape_interval: 50ms\n  endpoints:\n";
  for (int i = 0; i < 3; ++i) yaml += "    - 127.0.0.1:" + std::to_string(fleet_->port(i)) + "\n";
  yaml += "epp: {fallbacks: 0}\n";
  config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "epp.yaml");
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(epp_->Apply(std::move(*r.value)).ok());
  dest = Pick(Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("b"))));
  EXPECT_EQ(dest.find(','), std::string::npos) << dest;
}

// Kubernetes discovery end to end, in process (issue 9's "done when"): FakeApiServer
// stands in for the Kubernetes API server (no cluster runs here) and serves an
// InferencePool whose targetPorts are four simulated replicas' ports on one pod IP.
class EppKubernetesTest : public EppTest {
 protected:
  static constexpr const char* kPods = "/api/v1/namespaces/ns/pods";
  static constexpr const char* kPools = "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools";
  static constexpr const char* kObjectives = "/apis/llm-d.ai/v1alpha2/namespaces/ns/inferenceobjectives";

  void SetUp() override {
    api_.InstallCrd(kPools);
    api_.InstallCrd(kObjectives);
    kubeconfig_ = ::testing::TempDir() + "kvroute-epp-kubeconfig-" + std::to_string(::getpid()) + ".yaml";
    std::ofstream(kubeconfig_) << api_.KubeconfigYaml("ns");
  }
  void TearDown() override {
    EppTest::TearDown();
    std::remove(kubeconfig_.c_str());
  }

  void StartEppOnPool(const std::string& extra = "") {
    std::string yaml = "pool:\n  scrape_interval: 50ms\n  discovery:\n    kubernetes:\n"
                       "      inference_pool: pool\n      kubeconfig: " + kubeconfig_ + "\n" + extra;
    StartEppWith(yaml);
  }

  std::size_t Endpoints() {
    std::size_t n = 0;
    for (const auto& ep : epp_->core().table()->by_id) n += ep != nullptr;
    return n;
  }

  k8s::testing::FakeApiServer api_;
  std::string kubeconfig_;
};

TEST_F(EppKubernetesTest, FourTargetPortsOnOnePodThenDeletedThenBack) {
  StartFleet(4);
  std::vector<int> ports;
  for (int i = 0; i < 4; ++i) ports.push_back(fleet_->port(i));
  const std::map<std::string, std::string> app = {{"app", "vllm-llama"}};
  api_.Put(kPools, k8s::testing::FakeApiServer::PoolV1Json("pool", app, ports));
  api_.Put(kPods, k8s::testing::FakeApiServer::PodJson("vllm-0", "127.0.0.1", true, app));
  StartEppOnPool();
  ASSERT_TRUE(WaitFor([&] { return epp_->Ready(); }, 10000ms));
  EXPECT_EQ(Endpoints(), 4u);
  // The health service follows readiness on its own refresh.
  EXPECT_TRUE(WaitFor([&] { return Health("readiness") == health_pb::HealthCheckResponse::SERVING; }, 10000ms));
  std::set<std::string> winners;
  for (int i = 0; i < 24; ++i) {
    std::string dest = Pick(Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED,
                                        Completion(LongPrompt(2000, i)))));
    winners.insert(dest.substr(0, dest.find(',')));
  }
  EXPECT_GE(winners.size(), 2u);  // picks spread over the pool's endpoints (all checked in Pick)
  EXPECT_EQ(Metric("kvroute_k8s_endpoints"), 4);
  EXPECT_EQ(Metric("inference_pool_ready_pods"), 4);

  // The pod deleted: no pick goes there, readiness turns NOT_SERVING.
  api_.Delete(kPods, "vllm-0");
  ASSERT_TRUE(WaitFor([&] { return Endpoints() == 0; }, 10000ms));
  EXPECT_EQ(Immediate(Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("gone")))), 503);
  EXPECT_TRUE(WaitFor([&] { return Health("readiness") == health_pb::HealthCheckResponse::NOT_SERVING; }, 10000ms));
  EXPECT_FALSE(epp_->Ready());

  // A new pod brings it back.
  api_.Put(kPods, k8s::testing::FakeApiServer::PodJson("vllm-1", "127.0.0.1", true, app));
  ASSERT_TRUE(WaitFor([&] { return epp_->Ready(); }, 10000ms));
  EXPECT_EQ(Endpoints(), 4u);
  EXPECT_TRUE(WaitFor([&] { return Health("readiness") == health_pb::HealthCheckResponse::SERVING; }, 10000ms));
  Pick(Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("back"))));
}

TEST_F(EppKubernetesTest, PoolMissingIsNotReadyWithTheReason) {
  StartFleet(1);
  StartEppOnPool();
  auto ready = [&] { return http::Fetch("127.0.0.1", epp_->metrics_port(), "GET", "/readyz"); };
  ASSERT_TRUE(WaitFor([&] {
    auto r = ready();
    return r && r->status == 503 && r->body == "InferencePool ns/pool not found\n";
  }, 10000ms));
  EXPECT_TRUE(WaitFor([&] { return Health("readiness") == health_pb::HealthCheckResponse::NOT_SERVING; }, 10000ms));
  EXPECT_EQ(Metric("kvroute_k8s_pool_found"), 0);
  const std::map<std::string, std::string> app = {{"app", "vllm-llama"}};
  api_.Put(kPods, k8s::testing::FakeApiServer::PodJson("vllm-0", "127.0.0.1", true, app));
  api_.Put(kPools, k8s::testing::FakeApiServer::PoolV1Json("pool", app, {fleet_->port(0)}));
  ASSERT_TRUE(WaitFor([&] { return epp_->Ready(); }, 10000ms));
  auto r = ready();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(EppKubernetesTest, InferenceObjectivesSetPriorities) {
  StartFleet(1);
  const std::map<std::string, std::string> app = {{"app", "vllm-llama"}};
  api_.Put(kPools, k8s::testing::FakeApiServer::PoolV1Json("pool", app, {fleet_->port(0)}));
  api_.Put(kPods, k8s::testing::FakeApiServer::PodJson("vllm-0", "127.0.0.1", true, app));
  StartEppOnPool("epp: {objectives: {batch: 0, chat: 3}}\n");
  ASSERT_TRUE(WaitFor([&] { return epp_->Ready(); }, 10000ms));
  auto priority = [&](const std::string& name) -> std::optional<int64_t> {
    auto s = epp_->settings();
    auto it = s->objectives.find(name);
    if (it == s->objectives.end()) return std::nullopt;
    return it->second;
  };
  EXPECT_EQ(priority("chat"), 3);
  api_.Put(kObjectives, k8s::testing::FakeApiServer::ObjectiveJson("llm-d.ai/v1alpha2", "batch", "pool", -1));
  api_.Put(kObjectives, k8s::testing::FakeApiServer::ObjectiveJson("llm-d.ai/v1alpha2", "other-pool", "x", 7));
  // The cluster's objective wins over the file's; another pool's is ignored.
  EXPECT_TRUE(WaitFor([&] { return priority("batch") == -1; }, 10000ms));
  EXPECT_EQ(priority("chat"), 3);
  EXPECT_EQ(priority("other-pool"), std::nullopt);
  api_.Delete(kObjectives, "batch");
  EXPECT_TRUE(WaitFor([&] { return priority("batch") == 0; }, 10000ms));
}

TEST(EppKubernetesFlags, FlagsWinOverTheFileAndAreChecked) {
  config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(
      "pool:\n  discovery:\n    kubernetes: {inference_pool: a, namespace: x, group: inference.networking.x-k8s.io}\n",
      "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  config::KubernetesDiscoveryConfig flags;
  flags.group.clear();  // as epp_main: only a given flag overrides
  flags.inference_pool = "b";
  config::RouterConfig c = *r.value;
  EXPECT_EQ(ApplyKubernetesFlags(flags, c).ToString(), "OK");
  EXPECT_EQ(c.pool.kubernetes.inference_pool, "b");
  EXPECT_EQ(c.pool.kubernetes.namespace_name, "");  // another pool: not the file's namespace
  EXPECT_EQ(c.pool.kubernetes.group, "inference.networking.x-k8s.io");
  flags.namespace_name = "ns";
  flags.kubeconfig = flags.kubeconfig_path = "/k";
  c = *r.value;
  EXPECT_EQ(ApplyKubernetesFlags(flags, c).ToString(), "OK");
  EXPECT_EQ(c.pool.kubernetes.namespace_name, "ns");
  EXPECT_EQ(c.pool.kubernetes.kubeconfig_path, "/k");

  flags.inference_pool = "Bad_Name";
  c = *r.value;
  EXPECT_EQ(ApplyKubernetesFlags(flags, c).message(),
            "--pool-name: 'Bad_Name' is not a Kubernetes object name (lower-case letters, digits, '-' and '.')");
  flags.inference_pool = "p";
  flags.namespace_name = "a.b";
  c = *r.value;
  EXPECT_EQ(ApplyKubernetesFlags(flags, c).message(),
            "--pool-namespace: 'a.b' is not a Kubernetes namespace name");

  config::ConfigOr<config::RouterConfig> with_endpoints =
      config::ParseRouterConfig("pool:\n  endpoints: [127.0.0.1:1]\n", "t.yaml");
  ASSERT_TRUE(with_endpoints.ok());
  flags.namespace_name = "ns";
  EXPECT_EQ(ApplyKubernetesFlags(flags, *with_endpoints.value).message(),
            "--pool-name replaces the configuration's pool.endpoints; remove them (or the flag)");
}

bool HasLabel(const metrics::OwnedSample& s, std::string_view name, std::string_view value) {
  for (const auto& [k, v] : s.labels) {
    if (k == name && v == value) return true;
  }
  return false;
}

// Locality in the picker (issue 10): endpoints labelled with a region, the picker in
// us-east. Below saturation every pick is the local replica; /metrics counts it.
TEST_F(EppTest, LocalityKeepsPicksInTheRegion) {
  StartFleet(2);
  const std::string east = "127.0.0.1:" + std::to_string(fleet_->port(0));
  StartEppWith("pool:\n  scrape_interval: 50ms\n  endpoints:\n"
               "    - {address: " + east + ", labels: {region: us-east}}\n"
               "    - {address: 127.0.0.1:" + std::to_string(fleet_->port(1)) +
               ", labels: {region: eu-west}}\n"
               "epp: {fallbacks: 0}\nlocality: {region: us-east, rtt: {eu-west: 70ms}}\n");
  ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_metrics_fresh") == 2; }));
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Pick(Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion(LongPrompt(300, i))))),
              east);
  }
  double local = 0, rtt = 0;
  const std::string text = epp_->MetricsText();
  for (const auto& s : metrics::ParseAllSamples(text)) {
    if (s.name == "kvroute_locality_picks_total" && HasLabel(s, "decision", "local")) local += s.value;
    if (s.name == "kvroute_locality_rtt_seconds" && HasLabel(s, "source", "configured")) rtt += s.value;
  }
  EXPECT_EQ(local, 8);
  EXPECT_DOUBLE_EQ(rtt, 0.07);
}

// A pod's topology.kubernetes.io/region label is its endpoint's region: the only pod is
// in eu-west, the picker in us-east, so every pick is a remote one (no_local) and is
// counted under eu-west.
TEST_F(EppKubernetesTest, PodTopologyLabelIsTheEndpointsRegion) {
  StartFleet(1);
  const std::map<std::string, std::string> app = {{"app", "vllm-llama"}};
  std::map<std::string, std::string> labels = app;
  labels["topology.kubernetes.io/region"] = "eu-west";
  api_.Put(kPools, k8s::testing::FakeApiServer::PoolV1Json("pool", app, {fleet_->port(0)}));
  api_.Put(kPods, k8s::testing::FakeApiServer::PodJson("vllm-0", "127.0.0.1", true, labels));
  StartEppOnPool("locality: {region: us-east, measure_rtt: false}\n");
  ASSERT_TRUE(WaitFor([&] { return epp_->Ready(); }, 10000ms));
  EXPECT_FALSE(Pick(Run(Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, Completion("hello")))).empty());
  double no_local = 0;
  const std::string text = epp_->MetricsText();
  for (const auto& s : metrics::ParseAllSamples(text)) {
    if (s.name == "kvroute_locality_picks_total" && HasLabel(s, "decision", "no_local")) no_local += s.value;
  }
  EXPECT_EQ(no_local, 1);
}

// epp refuses the keys only serve honours, naming file, line and key (an operator who puts
// API keys in the picker's config must not believe the picker is protected); the keys it
// does honour in the same sections (timeouts.connect, limits.max_body_bytes) load.
TEST(EppConfig, ServeOnlyKeysAreRefusedWithFileLineAndKey) {
  using config::ConfigReader;
  const std::string ok = "timeouts: {connect: 1s}\nlimits: {max_body_bytes: 1048576}\nretries: {budget_ratio: 0.5}\n";
  EXPECT_TRUE(config::ParseRouterConfig(ok, "t.yaml", ConfigReader::kEpp).ok());
  const std::pair<std::string, std::string> refused[] = {
      {"pool: {}\nauth:\n  api_keys_file: keys.txt\n", "t.yaml:2: auth: only `kvroute serve` honours"},
      {"listen: 0.0.0.0:1\n", "t.yaml:1: listen: only"},
      {"x: 1\n", "t.yaml:1: x: unknown key"},
      {"timeouts:\n  connect: 1s\n  idle: 5s\n", "t.yaml:3: timeouts.idle: only"},
      {"retries: {max_attempts: 3}\n", "t.yaml:1: retries.max_attempts: only"},
      {"listen_tls: {address: 0.0.0.0:1, cert: c, key: k}\n", "t.yaml:1: listen_tls: only"},
  };
  for (const auto& [yaml, error] : refused) {
    SCOPED_TRACE(yaml);
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "t.yaml", ConfigReader::kEpp);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error.ToString().rfind(error, 0), 0u) << r.error.ToString();
    // serve reads the same text (the unknown key aside).
    if (yaml != "x: 1\n") {
      EXPECT_TRUE(config::ParseRouterConfig(yaml, "t.yaml").ok()) << yaml;
    }
  }
}

// Sessions through the picker (issue 26, item 3): the request's x-session-id binds it to
// the endpoint that served it; the response headers carry x-session-token (base64 of the
// served endpoint's address), and a request sending one back goes there.
class EppSessionsTest : public EppTest {
 protected:
  // One request with `headers`, then the response headers as Envoy sends them (status 200,
  // end of stream). Returns the winner (the first address of the pick) and the token
  // written on the response.
  std::pair<std::string, std::string> Session(const std::vector<std::pair<std::string, std::string>>& headers,
                                              int i) {
    auto msgs = Request(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED,
                        Completion("turn " + std::to_string(i)));
    for (const auto& [k, v] : headers) {
      auto* h = msgs[0].mutable_request_headers()->mutable_headers()->add_headers();
      h->set_key(k);
      h->set_raw_value(v);
    }
    pb::ProcessingRequest rh;
    auto* st = rh.mutable_response_headers()->mutable_headers()->add_headers();
    st->set_key(":status");
    st->set_raw_value("200");
    rh.mutable_response_headers()->set_end_of_stream(true);
    msgs.push_back(rh);
    Outcome o = Run(msgs);
    const std::string dest = Pick(o);
    std::string token;
    for (const auto& r : o.responses) {
      if (r.has_response_headers()) token = SetHeader(r.response_headers().response(), "x-session-token");
    }
    return {dest.substr(0, dest.find(',')), token};
  }
};

TEST_F(EppSessionsTest, OneSessionStaysThenMovesOnceAndTheTokenIsFollowed) {
  StartAll(3, "scheduling: {policy: round-robin}\n");
  std::map<std::string, int> before;
  for (int i = 0; i < 20; ++i) {
    auto [winner, token] = Session({{"x-session-id", "conversation-9"}}, i);
    ++before[winner];
    EXPECT_EQ(token, routing::EncodeSessionToken(winner));
  }
  ASSERT_EQ(before.size(), 1u);
  const std::string first = before.begin()->first;
  int out = -1;
  for (int i = 0; i < 3; ++i) {
    if ("127.0.0.1:" + std::to_string(fleet_->port(i)) == first) out = i;
  }
  ASSERT_GE(out, 0);
  auto crash = http::Fetch("127.0.0.1", fleet_->port(out), "POST", "/admin/fault",
                           R"({"kind":"crash","duration":"60s"})");
  ASSERT_TRUE(crash && crash->status == 200);
  ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_metrics_fresh") == 2; }));
  std::map<std::string, int> after;
  for (int i = 0; i < 20; ++i) ++after[Session({{"x-session-id", "conversation-9"}}, 20 + i).first];
  ASSERT_EQ(after.size(), 1u);
  EXPECT_NE(after.begin()->first, first);
  EXPECT_EQ(after.begin()->second, 20);
  EXPECT_EQ(Metric("kvroute_session_picks_total"), 40);  // new, bound, moved_gone
  EXPECT_EQ(Metric("kvroute_sessions"), 1);

  // The token of another live replica routes there.
  std::string other;
  for (int i = 0; i < 3; ++i) {
    const std::string a = "127.0.0.1:" + std::to_string(fleet_->port(i));
    if (i != out && a != after.begin()->first) other = a;
  }
  for (int i = 0; i < 4; ++i) {
    auto [winner, token] = Session({{"x-session-token", routing::EncodeSessionToken(other)}}, 40 + i);
    EXPECT_EQ(winner, other);
    EXPECT_EQ(token, routing::EncodeSessionToken(other));
  }
  // A garbage token is ignored: the request is picked as usual.
  EXPECT_FALSE(Session({{"x-session-token", "!!"}}, 50).first.empty());
  const std::string m = epp_->MetricsText();
  EXPECT_NE(m.find("kvroute_session_picks_total{outcome=\"moved_gone\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("kvroute_session_picks_total{outcome=\"token\"} 4"), std::string::npos);
  EXPECT_NE(m.find("kvroute_session_picks_total{outcome=\"bound\"} 38"), std::string::npos);
}

}  // namespace
}  // namespace kvroute::epp
