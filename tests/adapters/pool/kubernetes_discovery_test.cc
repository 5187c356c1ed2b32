// Kubernetes discovery (pool/kubernetes_discovery.h) against FakeApiServer
// (tests/adapters/k8s/fake_api_server.h), a stand-in for the Kubernetes API server's list and
// watch protocol over real TLS on loopback: no cluster runs here. Each test scripts the
// objects and events (pods added, NotReady, deleted, IP changed; watches ended, 410,
// bookmarks; a wrong token; the server down at start; the pool missing, then created; the
// selector changed; two target ports; InferenceObjectives) and checks the endpoint sets
// and priorities the discovery delivers.
//
// Waiting: events cross threads and sockets, so each check waits for the expected value
// with a generous deadline (a bound, not a timing assertion); backoff is shortened.
#include "adapters/pool/kubernetes_discovery.h"

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "adapters/k8s/fake_api_server.h"

namespace kvroute::pool {
namespace {

using k8s::testing::FakeApiServer;
using k8s::testing::FakeApiServerOptions;

const std::string kPods = "/api/v1/namespaces/ns/pods";
const std::string kPoolsV1 = "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools";
const std::string kPoolsV1Alpha2 = "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/ns/inferencepools";
const std::string kObjLlmD = "/apis/llm-d.ai/v1alpha2/namespaces/ns/inferenceobjectives";
const std::string kObjXK8s = "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/ns/inferenceobjectives";

const std::map<std::string, std::string> kApp = {{"app", "vllm-llama"}};

// The discovery on its own io thread, recording what it delivers.
class Harness {
 public:
  Harness(FakeApiServer& server, KubernetesDiscoveryOptions o, std::string token = "test-token")
      : work_(ctx_.get_executor()) {
    k8s::ClusterAccess access;
    access.server = "https://127.0.0.1:" + std::to_string(server.port());
    access.host = "127.0.0.1";
    access.port = server.port();
    access.ca_pem = server.pki().cert_pem();
    access.token = k8s::TokenSource::Fixed(std::move(token));
    access.namespace_name = "ns";
    access.source = "test";
    Init(std::move(access), std::move(o));
  }
  // For a server that is not up yet: the port it will listen on.
  Harness(uint16_t port, std::string ca_pem, KubernetesDiscoveryOptions o) : work_(ctx_.get_executor()) {
    k8s::ClusterAccess access;
    access.server = "https://127.0.0.1:" + std::to_string(port);
    access.host = "127.0.0.1";
    access.port = port;
    access.ca_pem = std::move(ca_pem);
    access.token = k8s::TokenSource::Fixed("test-token");
    access.namespace_name = "ns";
    Init(std::move(access), std::move(o));
  }
  ~Harness() {
    discovery_->Stop();
    work_.reset();
    ctx_.stop();
    thread_.join();
  }

  static KubernetesDiscoveryOptions Options(const std::string& group = "inference.networking.k8s.io") {
    KubernetesDiscoveryOptions o;
    o.pool_name = "pool";
    o.namespace_name = "ns";
    o.group = group;
    o.backoff.initial = std::chrono::milliseconds(20);
    o.backoff.max = std::chrono::milliseconds(200);
    o.missing_retry = std::chrono::milliseconds(100);
    return o;
  }

  // Waits until the latest endpoint set, as "name=address" strings, equals `want`.
  ::testing::AssertionResult WaitEndpoints(const std::vector<std::string>& want) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool ok = cv_.wait_for(lock, std::chrono::seconds(10), [&] { return delivered_ && Names() == want; });
    if (ok) return ::testing::AssertionSuccess();
    std::string got;
    for (const std::string& s : Names()) got += s + " ";
    return ::testing::AssertionFailure() << "endpoints: [" << got << "]";
  }
  ::testing::AssertionResult WaitPriorities(const Priorities& want) {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, std::chrono::seconds(10), [&] { return priorities_ == want; })) {
      return ::testing::AssertionSuccess();
    }
    std::string got;
    for (const auto& [k, v] : priorities_) got += k + "=" + std::to_string(v) + " ";
    return ::testing::AssertionFailure() << "priorities: [" << got << "]";
  }
  // Waits until some log line contains `text`.
  ::testing::AssertionResult WaitLog(const std::string& text) {
    std::unique_lock<std::mutex> lock(mu_);
    auto has = [&] {
      for (const std::string& l : logs_) {
        if (l.find(text) != std::string::npos) return true;
      }
      return false;
    };
    if (cv_.wait_for(lock, std::chrono::seconds(10), has)) return ::testing::AssertionSuccess();
    std::string all;
    for (const std::string& l : logs_) all += "\n  " + l;
    return ::testing::AssertionFailure() << "no log line with '" << text << "' in:" << all;
  }
  // Waits for `pred` on the metrics text.
  ::testing::AssertionResult WaitMetric(const std::string& line) {
    for (int i = 0; i < 1000; ++i) {
      std::string m;
      discovery_->AppendMetrics(m);
      if (m.find(line) != std::string::npos) return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::string m;
    discovery_->AppendMetrics(m);
    return ::testing::AssertionFailure() << "no '" << line << "' in:\n" << m;
  }

  std::vector<routing::EndpointSpec> endpoints() {
    std::lock_guard<std::mutex> lock(mu_);
    return endpoints_;
  }
  int deliveries() {
    std::lock_guard<std::mutex> lock(mu_);
    return deliveries_;
  }
  std::vector<std::string> logs() {
    std::lock_guard<std::mutex> lock(mu_);
    return logs_;
  }
  KubernetesDiscovery& discovery() { return *discovery_; }

 private:
  void Init(k8s::ClusterAccess access, KubernetesDiscoveryOptions o) {
    KubernetesDiscovery::Callbacks cb;
    cb.on_endpoints = [this](std::vector<routing::EndpointSpec> eps) {
      std::lock_guard<std::mutex> lock(mu_);
      endpoints_ = std::move(eps);
      delivered_ = true;
      ++deliveries_;
      cv_.notify_all();
    };
    cb.on_objectives = [this](Priorities p) {
      std::lock_guard<std::mutex> lock(mu_);
      priorities_ = std::move(p);
      cv_.notify_all();
    };
    cb.log = [this](std::string_view l) {
      std::lock_guard<std::mutex> lock(mu_);
      logs_.emplace_back(l);
      cv_.notify_all();
    };
    discovery_ = std::make_unique<KubernetesDiscovery>(ctx_, std::move(access), std::move(o), std::move(cb));
    thread_ = std::thread([this] { ctx_.run(); });
    discovery_->Start();
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const routing::EndpointSpec& e : endpoints_) out.push_back(e.name + "=" + e.address);
    return out;
  }

  boost::asio::io_context ctx_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
  std::unique_ptr<KubernetesDiscovery> discovery_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool delivered_ = false;
  int deliveries_ = 0;
  std::vector<routing::EndpointSpec> endpoints_;
  Priorities priorities_;
  std::vector<std::string> logs_;
};

class KubernetesDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.InstallCrd(kPoolsV1);
    server_.InstallCrd(kPoolsV1Alpha2);
    server_.InstallCrd(kObjLlmD);
    server_.InstallCrd(kObjXK8s);
  }
  FakeApiServer server_;
};

TEST_F(KubernetesDiscoveryTest, ReadyPodsOfThePoolBecomeEndpointsWithTheirLabels) {
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true,
                                            {{"app", "vllm-llama"}, {"topology.kubernetes.io/region", "eu-west"}}));
  server_.Put(kPods, FakeApiServer::PodJson("b", "10.0.0.2", false, kApp));         // not Ready
  server_.Put(kPods, FakeApiServer::PodJson("c", "10.0.0.3", true, {{"app", "other"}}));  // not selected
  server_.Put(kPods, FakeApiServer::PodJson("d", "10.0.0.4", true, kApp, true));    // being deleted
  server_.Put(kPods, FakeApiServer::PodJson("e", "", true, kApp));                  // no IP yet
  Harness h(server_, Harness::Options());
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
  std::vector<routing::EndpointSpec> eps = h.endpoints();
  EXPECT_EQ(eps[0].host, "10.0.0.1");
  EXPECT_EQ(eps[0].port, 8000);
  std::map<std::string, std::string> labels(eps[0].labels.begin(), eps[0].labels.end());
  EXPECT_EQ(labels["topology.kubernetes.io/region"], "eu-west");
  EXPECT_EQ(labels["app"], "vllm-llama");
  EXPECT_EQ(h.discovery().status(), "");
  // The pods were listed with the pool's selector, percent-encoded.
  bool listed = false;
  for (const std::string& t : server_.targets()) {
    listed |= t == kPods + "?labelSelector=app%3Dvllm-llama";
  }
  EXPECT_TRUE(listed);
  EXPECT_TRUE(h.WaitMetric("kvroute_k8s_endpoints{namespace=\"ns\",inference_pool=\"pool\"} 1"));
  EXPECT_TRUE(h.WaitMetric("kvroute_k8s_pool_found{namespace=\"ns\",inference_pool=\"pool\"} 1"));
}

TEST_F(KubernetesDiscoveryTest, PodsAddedNotReadyDeletedAndIpChangedFollowTheWatch) {
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  Harness h(server_, Harness::Options());
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
  server_.Put(kPods, FakeApiServer::PodJson("b", "10.0.0.2", true, kApp));  // added
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000", "b=10.0.0.2:8000"}));
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", false, kApp));  // NotReady
  ASSERT_TRUE(h.WaitEndpoints({"b=10.0.0.2:8000"}));
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));  // Ready again
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000", "b=10.0.0.2:8000"}));
  server_.Put(kPods, FakeApiServer::PodJson("b", "10.0.0.2", true, kApp, true));  // terminating
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
  server_.Delete(kPods, "b");
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.9", true, kApp));  // IP changed
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.9:8000"}));
  server_.Delete(kPods, "a");
  ASSERT_TRUE(h.WaitEndpoints({}));
  // A pod relabelled out of the selector leaves (the server sends DELETED to the watch).
  server_.Put(kPods, FakeApiServer::PodJson("c", "10.0.0.3", true, kApp));
  ASSERT_TRUE(h.WaitEndpoints({"c=10.0.0.3:8000"}));
  server_.Put(kPods, FakeApiServer::PodJson("c", "10.0.0.3", true, {{"app", "elsewhere"}}));
  ASSERT_TRUE(h.WaitEndpoints({}));
}

TEST_F(KubernetesDiscoveryTest, TwoTargetPortsGiveTwoEndpointsPerPod) {
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000, 8001}));
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  server_.Put(kPods, FakeApiServer::PodJson("b", "10.0.0.2", true, kApp));
  Harness h(server_, Harness::Options());
  ASSERT_TRUE(h.WaitEndpoints({"a:8000=10.0.0.1:8000", "a:8001=10.0.0.1:8001", "b:8000=10.0.0.2:8000",
                               "b:8001=10.0.0.2:8001"}));
  // A changed port list applies without a restart.
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {9000}));
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:9000", "b=10.0.0.2:9000"}));
  EXPECT_TRUE(h.WaitLog("InferencePool ns/pool changed: selector {app=vllm-llama}, target ports 9000"));
}

TEST_F(KubernetesDiscoveryTest, SelectorChangeRelistsThePods) {
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  server_.Put(kPods, FakeApiServer::PodJson("b", "10.0.0.2", true, {{"app", "vllm-qwen"}}));
  Harness h(server_, Harness::Options());
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", {{"app", "vllm-qwen"}}, {8000}));
  ASSERT_TRUE(h.WaitEndpoints({"b=10.0.0.2:8000"}));
  bool relisted = false;
  for (const std::string& t : server_.targets()) relisted |= t == kPods + "?labelSelector=app%3Dvllm-qwen";
  EXPECT_TRUE(relisted);
  // The new selector's watch follows: a new qwen pod arrives, a llama pod does not.
  server_.Put(kPods, FakeApiServer::PodJson("c", "10.0.0.3", true, {{"app", "vllm-qwen"}}));
  server_.Put(kPods, FakeApiServer::PodJson("d", "10.0.0.4", true, kApp));
  ASSERT_TRUE(h.WaitEndpoints({"b=10.0.0.2:8000", "c=10.0.0.3:8000"}));
}

TEST_F(KubernetesDiscoveryTest, WatchEndedByTheServerResumesFromTheLastVersion) {
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  Harness h(server_, Harness::Options());
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
  const int rv = server_.Put(kPods, FakeApiServer::PodJson("b", "10.0.0.2", true, kApp));
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000", "b=10.0.0.2:8000"}));
  server_.DropWatches();
  // An event while no watch is open: the resumed watch replays it.
  server_.Put(kPods, FakeApiServer::PodJson("c", "10.0.0.3", true, kApp));
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000", "b=10.0.0.2:8000", "c=10.0.0.3:8000"}));
  // The pods watch resumed from b's version (or later), without a relist.
  int lists = 0;
  bool resumed = false;
  for (const std::string& t : server_.targets()) {
    if (t.rfind(kPods + "?labelSelector=", 0) == 0 && t.find("watch=1") == std::string::npos) ++lists;
    if (t.rfind(kPods, 0) == 0 && t.find("watch=1&resourceVersion=" + std::to_string(rv)) != std::string::npos) {
      resumed = true;
    }
  }
  EXPECT_EQ(lists, 1);
  EXPECT_TRUE(resumed);
}

TEST_F(KubernetesDiscoveryTest, GoneRelistsAndABookmarkAdvancesTheVersion) {
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  Harness h(server_, Harness::Options());
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
  ASSERT_TRUE(h.WaitMetric("kvroute_k8s_lists_total{resource=\"pods\",group=\"\"} 1"));
  // A bookmark to the open watches (pool, pods, two objective groups): counted, nothing
  // else moves. Bookmarks are not stored, so wait until every watch is open.
  for (int i = 0; i < 1000 && server_.open_watches() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(server_.open_watches(), 4);
  server_.Put(kPods, FakeApiServer::PodJson("x", "10.0.0.8", true, {{"app", "unrelated"}}));
  server_.Bookmark();
  EXPECT_TRUE(h.WaitMetric("kvroute_k8s_watch_events_total{resource=\"pods\",group=\"\",type=\"BOOKMARK\"} 1"));
  // History compacted: the open watches get 410 and relist.
  server_.Put(kPods, FakeApiServer::PodJson("b", "10.0.0.2", true, kApp));
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000", "b=10.0.0.2:8000"}));
  server_.Compact();
  EXPECT_TRUE(h.WaitMetric("kvroute_k8s_lists_total{resource=\"pods\",group=\"\"} 2"));
  EXPECT_TRUE(h.WaitMetric("kvroute_k8s_relists_total{resource=\"pods\",group=\"\"} 1"));
  EXPECT_TRUE(h.WaitLog("watch pods in ns: resourceVersion expired (410 Gone): listing again"));
  // After the relist the watch goes on from the new list.
  server_.Delete(kPods, "a");
  ASSERT_TRUE(h.WaitEndpoints({"b=10.0.0.2:8000"}));
}

TEST_F(KubernetesDiscoveryTest, PoolMissingThenCreatedThenDeleted) {
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  Harness h(server_, Harness::Options());
  ASSERT_TRUE(h.WaitLog("InferencePool ns/pool not found (group inference.networking.k8s.io/v1): no endpoints"));
  ASSERT_TRUE(h.WaitEndpoints({}));
  EXPECT_EQ(h.discovery().status(), "InferencePool ns/pool not found");
  EXPECT_TRUE(h.WaitMetric("kvroute_k8s_pool_found{namespace=\"ns\",inference_pool=\"pool\"} 0"));
  // Created: arrives on the pool's watch; its pods are listed.
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
  EXPECT_TRUE(h.WaitLog("InferencePool ns/pool created: selector {app=vllm-llama}, target ports 8000"));
  EXPECT_EQ(h.discovery().status(), "");
  // Another pool in the namespace changes nothing.
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("other", {{"app", "x"}}, {7000}));
  // Deleted: no endpoints at once.
  server_.Delete(kPoolsV1, "pool");
  ASSERT_TRUE(h.WaitEndpoints({}));
  EXPECT_EQ(h.discovery().status(), "InferencePool ns/pool was deleted");
  // And back.
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
}

TEST_F(KubernetesDiscoveryTest, TheSeedsV1Alpha2Pool) {
  server_.Put(kPoolsV1Alpha2, FakeApiServer::PoolV1Alpha2Json("pool", kApp, 8000));
  server_.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  Harness h(server_, Harness::Options("inference.networking.x-k8s.io"));
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
  bool listed = false;
  for (const std::string& t : server_.targets()) {
    listed |= t == kPoolsV1Alpha2 + "?fieldSelector=metadata.name%3Dpool";
  }
  EXPECT_TRUE(listed);
}

TEST_F(KubernetesDiscoveryTest, WrongTokenIsAClearErrorThatBacksOff) {
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  Harness h(server_, Harness::Options(), "wrong-token");
  ASSERT_TRUE(h.WaitLog("list InferencePool ns/pool: "));
  ASSERT_TRUE(h.WaitLog("HTTP 401"));
  EXPECT_TRUE(h.WaitLog("(check the token or client certificate, and that RBAC grants get, list and watch)"));
  EXPECT_TRUE(h.WaitMetric(
      "kvroute_k8s_failures_total{resource=\"inferencepools\",group=\"inference.networking.k8s.io\","
      "phase=\"list\",kind=\"unauthorized\"} "));
  EXPECT_TRUE(h.endpoints().empty());
  // Backoff: over a while, attempts grow apart (initial 20 ms, capped at 200 ms), so
  // there is no tight loop: at most a few dozen requests per resource in a second.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  int pool_lists = 0;
  for (const std::string& t : server_.targets()) pool_lists += t.rfind(kPoolsV1, 0) == 0;
  EXPECT_GE(pool_lists, 3);
  EXPECT_LE(pool_lists, 20);
}

TEST(KubernetesDiscoveryDown, ApiServerDownAtStartThenUp) {
  // The client knows the CA and the address before any server listens there.
  auto pki = std::make_shared<k8s::testing::TestPki>();
  uint16_t port = 0;
  {
    FakeApiServer probe;  // a free port, closed again
    port = probe.port();
  }
  Harness h(port, pki->cert_pem(), Harness::Options());
  ASSERT_TRUE(h.WaitLog("list InferencePool ns/pool: "));
  ASSERT_TRUE(h.WaitMetric("phase=\"list\",kind=\"connect\"} "));
  EXPECT_EQ(h.deliveries(), 0);
  FakeApiServerOptions o;
  o.port = port;
  o.pki = pki;
  FakeApiServer server(o);
  server.InstallCrd(kPoolsV1);
  server.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  server.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
}

TEST_F(KubernetesDiscoveryTest, InferenceObjectivesOfBothGroupsForThisPool) {
  server_.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  server_.Put(kObjXK8s, FakeApiServer::ObjectiveJson("inference.networking.x-k8s.io/v1alpha2", "batch", "pool", -1));
  server_.Put(kObjXK8s, FakeApiServer::ObjectiveJson("inference.networking.x-k8s.io/v1alpha2", "chat", "pool", 2));
  server_.Put(kObjLlmD, FakeApiServer::ObjectiveJson("llm-d.ai/v1alpha2", "chat", "pool", 5));
  server_.Put(kObjLlmD, FakeApiServer::ObjectiveJson("llm-d.ai/v1alpha2", "theirs", "another-pool", 9));
  Harness h(server_, Harness::Options());
  // llm-d.ai wins over the older group for the same name; another pool's is ignored.
  ASSERT_TRUE(h.WaitPriorities({{"batch", -1}, {"chat", 5}}));
  server_.Put(kObjLlmD, FakeApiServer::ObjectiveJson("llm-d.ai/v1alpha2", "interactive", "pool", 10));
  ASSERT_TRUE(h.WaitPriorities({{"batch", -1}, {"chat", 5}, {"interactive", 10}}));
  server_.Delete(kObjLlmD, "chat");
  ASSERT_TRUE(h.WaitPriorities({{"batch", -1}, {"chat", 2}, {"interactive", 10}}));
  EXPECT_TRUE(h.WaitMetric("kvroute_k8s_objectives{namespace=\"ns\",inference_pool=\"pool\"} 3"));
}

TEST(KubernetesDiscoveryCrds, ObjectiveCrdsNotInstalledAreNoObjectivesAndLoggedOnce) {
  FakeApiServer server;
  server.InstallCrd(kPoolsV1);
  server.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  server.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  Harness h(server, Harness::Options());
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
  ASSERT_TRUE(h.WaitLog("list InferenceObjectives (llm-d.ai) in ns: "));
  // Retried every missing_retry (100 ms here) but said once.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int said = 0;
  for (const std::string& l : h.logs()) said += l.find("InferenceObjectives (llm-d.ai)") != std::string::npos;
  EXPECT_EQ(said, 1);
  // Installed later: picked up on the next retry.
  server.InstallCrd(kObjLlmD);
  server.Put(kObjLlmD, FakeApiServer::ObjectiveJson("llm-d.ai/v1alpha2", "batch", "pool", -2));
  ASSERT_TRUE(h.WaitPriorities({{"batch", -2}}));
}

TEST(KubernetesDiscoveryCrds, PoolCrdNotInstalledSaysSo) {
  FakeApiServer server;
  Harness h(server, Harness::Options());
  ASSERT_TRUE(h.WaitEndpoints({}));
  ASSERT_TRUE(h.WaitLog("(the resource is not installed)"));
  EXPECT_EQ(h.discovery().status(),
            "the InferencePool resource (inference.networking.k8s.io/v1) is not served by the API server: "
            "is its CRD installed?");
  server.InstallCrd(kPoolsV1);
  server.Put(kPoolsV1, FakeApiServer::PoolV1Json("pool", kApp, {8000}));
  server.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", true, kApp));
  ASSERT_TRUE(h.WaitEndpoints({"a=10.0.0.1:8000"}));
}

}  // namespace
}  // namespace kvroute::pool
