// `kvroute serve` with file discovery (pool.endpoints_file) over loopback: a real router
// in front of a real simulated fleet, the endpoints file rewritten under it. Every wait
// is bounded; no sleep is a timing assertion.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "config/router_config.h"
#include "core/api/openai.h"
#include "adapters/http/test_client.h"
#include "core/metrics/prom_parser.h"
#include "apps/serve/router.h"
#include "apps/sim/fleet.h"
#include "adapters/k8s/fake_api_server.h"
#include "metrics/metric_sum.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/wait.h"

namespace kvroute::router {
namespace {

using namespace std::chrono_literals;
using http::ClientResponse;
using http::Fetch;
using http::TestClient;
namespace fs = std::filesystem;

// ~6 ms per token: a 300-token stream stays in flight ~2 s.
sim::ReplicaConfig Replica(int i) {
  return kvroute::test_support::SimReplica({.name = "r" + std::to_string(i), .time_scale = 1.0});
}

using kvroute::test_support::CompletionBody;

using metrics::testing::MetricSum;

using kvroute::test_support::WaitFor;

// A streamed completion held open by the test.
struct Stream {
  std::unique_ptr<TestClient> client;
  std::string endpoint;
};

class DiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvroute-serve-discovery-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fleet_ = std::make_unique<sim::Fleet>(std::vector<sim::ReplicaConfig>{Replica(0), Replica(1),
                                                                          Replica(2)},
                                          2);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    fleet_.reset();
    fs::remove_all(dir_);
  }

  // The endpoints file naming replicas `which` (written elsewhere, renamed into place).
  void WriteEndpoints(const std::vector<int>& which) {
    std::string text;
    for (int i : which) {
      text += "- {address: 127.0.0.1:" + std::to_string(fleet_->port(i)) + ", name: r" +
              std::to_string(i) + "}\n";
    }
    WriteFile(text);
  }
  void WriteFile(const std::string& text) {
    std::ofstream(dir_ + "/eps.tmp") << text;
    fs::rename(dir_ + "/eps.tmp", dir_ + "/eps.yaml");
  }

  void StartRouter(const std::string& poll) {
    const std::string path = dir_ + "/router.yaml";
    std::ofstream(path) << "threads: 2\npool:\n  endpoints_file: eps.yaml\n"
                           "  endpoints_file_poll: " + poll + "\n"
                           "  scrape_interval: 20ms\n  staleness: 1s\n"
                           "scheduling:\n  policy: round-robin\n";
    config::ConfigOr<config::RouterConfig> r = config::LoadRouterConfig(path);
    ASSERT_TRUE(r.ok()) << r.error.ToString();
    RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = false;
    o.config_path = path;
    router_ = std::make_unique<Router>(std::move(*r.value), o);
    Status st = router_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  std::string Metrics() {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? r->body : std::string();
  }
  double Metric(std::string_view name, const std::map<std::string, std::string>& want = {}) {
    return MetricSum(Metrics(), name, want);
  }
  void WaitFresh(int n) {
    ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_metrics_fresh") == n; }))
        << Metrics();
  }

  // The endpoints `n` short requests went to (round-robin spreads them).
  std::multiset<std::string> Spread(int n) {
    std::multiset<std::string> out;
    for (int i = 0; i < n; ++i) {
      auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions",
                     CompletionBody("hello " + std::to_string(i), 1));
      EXPECT_TRUE(r.has_value());
      if (!r) continue;
      EXPECT_EQ(r->status, 200) << r->body;
      out.insert(r->Header("x-kvroute-endpoint"));
    }
    return out;
  }

  Stream Open() {
    Stream s;
    s.client = std::make_unique<TestClient>("127.0.0.1", router_->port());
    EXPECT_TRUE(s.client->Connect());
    EXPECT_TRUE(s.client->SendRequest("POST", "/v1/completions",
                                      CompletionBody("a long story", 300, true)));
    ClientResponse head;
    EXPECT_TRUE(s.client->ReadHead(&head)) << s.client->error();
    EXPECT_EQ(head.status, 200);
    s.endpoint = head.Header("x-kvroute-endpoint");
    EXPECT_TRUE(s.client->ReadChunk().has_value()) << s.client->error();  // started
    return s;
  }
  // Reads `s` to its end; true when it ended with data: [DONE].
  static bool Finish(Stream& s) {
    std::string last;
    while (auto c = s.client->ReadChunk()) {
      if (!c->data.empty()) last = c->data;
    }
    return s.client->ended() && last.find("data: [DONE]") != std::string::npos;
  }

  std::string dir_;
  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Router> router_;
};

TEST_F(DiscoveryTest, RewrittenFileReachesTrafficBrokenOneIsKeptRemovedEndpointDrains) {
  WriteEndpoints({0, 1});
  StartRouter("20ms");
  WaitFresh(2);
  EXPECT_EQ(Metric("kvroute_discovery_endpoints"), 2);
  Stream before = Open();
  ASSERT_TRUE(before.endpoint == "r0" || before.endpoint == "r1") << before.endpoint;

  // Two -> three (atomic rename): the third gets traffic, the open stream goes on.
  WriteEndpoints({0, 1, 2});
  ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_discovery_endpoints") == 3; }));
  WaitFresh(3);
  EXPECT_EQ(Metric("kvroute_discovery_reloads_total"), 1);
  EXPECT_GE(Spread(6).count("r2"), 1u);
  // The stream from before the change is still counted in flight on its endpoint.
  EXPECT_EQ(Metric("kvroute_endpoint_inflight", {{"endpoint", before.endpoint}}), 1);
  EXPECT_TRUE(Finish(before));

  // Broken: the last good set stays, the error is counted once.
  WriteFile("- 127.0.0.1:" + std::to_string(fleet_->port(0)) + "\n- 127.0.0.1:\n");
  ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_discovery_errors_total") == 1; }));
  EXPECT_EQ(Metric("kvroute_discovery_file_valid"), 0);
  EXPECT_EQ(Metric("kvroute_discovery_endpoints"), 3);
  EXPECT_EQ(Spread(6), (std::multiset<std::string>{"r0", "r0", "r1", "r1", "r2", "r2"}));
  EXPECT_EQ(Metric("kvroute_discovery_errors_total"), 1);

  // Removing the endpoint of an open stream: no new picks, the stream finishes.
  Stream victim = Open();
  std::vector<int> rest;
  for (int i = 0; i < 3; ++i) {
    if ("r" + std::to_string(i) != victim.endpoint) rest.push_back(i);
  }
  ASSERT_EQ(rest.size(), 2u) << victim.endpoint;
  WriteEndpoints(rest);
  ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_discovery_endpoints") == 2; }));
  EXPECT_EQ(Metric("kvroute_discovery_file_valid"), 1);
  EXPECT_EQ(Spread(6).count(victim.endpoint), 0u);
  const int victim_index = victim.endpoint.back() - '0';
  EXPECT_EQ(fleet_->LiveRequests(victim_index), 1);
  EXPECT_TRUE(Finish(victim));
  EXPECT_TRUE(WaitFor([&] { return fleet_->LiveRequests(victim_index) == 0; }));
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_inflight") == 0; }));
}

TEST_F(DiscoveryTest, EmptyFileAnswers503AndReloadRereadsTheFile) {
  WriteFile("[]\n");
  StartRouter("1h");  // only Reload (SIGHUP) reads the file again
  auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", CompletionBody("hi", 1));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503) << r->body;

  WriteEndpoints({1});
  ASSERT_TRUE(router_->Reload().ok());
  WaitFresh(1);
  EXPECT_EQ(Spread(2), (std::multiset<std::string>{"r1", "r1"}));

  // A broken endpoints file fails the reload with its file:line; the running set stays.
  WriteFile("- 127.0.0.1:1\n- 127.0.0.1:1\n");
  Status st = router_->Reload();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir_ + "/eps.yaml:2: endpoints[1]: duplicate endpoint address"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(Spread(2), (std::multiset<std::string>{"r1", "r1"}));
}

// `kvroute serve` on Kubernetes discovery: FakeApiServer stands in for the Kubernetes API
// server (no cluster runs here); one pod whose IP is 127.0.0.1 and an InferencePool whose
// target ports are the three replicas'.
TEST_F(DiscoveryTest, KubernetesPodDeletedStopsPicksAndItsOpenStreamFinishes) {
  k8s::testing::FakeApiServer api;
  const std::string pods = "/api/v1/namespaces/ns/pods";
  const std::string pools = "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools";
  api.InstallCrd(pools);
  const std::map<std::string, std::string> app = {{"app", "vllm"}};
  api.Put(pools, k8s::testing::FakeApiServer::PoolV1Json(
                     "pool", app, {fleet_->port(0), fleet_->port(1), fleet_->port(2)}));
  api.Put(pods, k8s::testing::FakeApiServer::PodJson("vllm-0", "127.0.0.1", true, app));
  std::ofstream(dir_ + "/kubeconfig") << api.KubeconfigYaml("ns");
  const std::string path = dir_ + "/router.yaml";
  std::ofstream(path) << "threads: 2\npool:\n  discovery:\n    kubernetes:\n"
                         "      inference_pool: pool\n      kubeconfig: kubeconfig\n"
                         "  scrape_interval: 20ms\n  staleness: 1s\n"
                         "scheduling:\n  policy: round-robin\n";
  config::ConfigOr<config::RouterConfig> r = config::LoadRouterConfig(path);
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  RouterOptions o;
  o.listen = config::HostPort{"127.0.0.1", 0};
  o.log = false;
  o.config_path = path;
  router_ = std::make_unique<Router>(std::move(*r.value), o);
  ASSERT_TRUE(router_->Start().ok());
  WaitFresh(3);
  EXPECT_EQ(Metric("kvroute_k8s_endpoints"), 3);
  const std::string p0 = "vllm-0:" + std::to_string(fleet_->port(0));
  EXPECT_EQ(Spread(3).count(p0), 1u);  // round-robin over the pod's three ports

  Stream open = Open();
  ASSERT_EQ(open.endpoint.rfind("vllm-0:", 0), 0u) << open.endpoint;
  api.Delete(pods, "vllm-0");
  ASSERT_TRUE(WaitFor([&] { return Metric("kvroute_k8s_endpoints") == 0; }));
  auto gone = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions", CompletionBody("x", 1));
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->status, 503) << gone->body;
  auto ready = Fetch("127.0.0.1", router_->port(), "GET", "/readyz");
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 503);
  EXPECT_TRUE(Finish(open));  // the stream from before the delete runs to [DONE]
  EXPECT_TRUE(WaitFor([&] { return Metric("kvroute_endpoint_inflight") == 0; }));

  api.Put(pods, k8s::testing::FakeApiServer::PodJson("vllm-1", "127.0.0.1", true, app));
  WaitFresh(3);
  EXPECT_EQ(Spread(3).count("vllm-1:" + std::to_string(fleet_->port(0))), 1u);
}

}  // namespace
}  // namespace kvroute::router
