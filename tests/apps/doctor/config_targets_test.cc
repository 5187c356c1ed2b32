// The targets of `kvroute doctor --config`: Kubernetes discovery listed once against
// FakeApiServer (real TLS on loopback; no cluster runs here), then the diagnosis of the
// pods it found (sim replicas on 127.0.0.1).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "adapters/k8s/fake_api_server.h"
#include "apps/doctor/doctor_main.h"
#include "support/sim_replica.h"

namespace kvroute::doctor {
namespace {

namespace fs = std::filesystem;
using k8s::testing::FakeApiServer;
using kvroute::test_support::SimReplica;

class ConfigTargetsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvroute-doctor-k8s-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A config following InferencePool `pool` in namespace ns through api's kubeconfig.
  std::string Config(const FakeApiServer& api) {
    std::ofstream(dir_ / "kubeconfig") << api.KubeconfigYaml("ns");
    const fs::path path = dir_ / "epp.yaml";
    std::ofstream(path) << "pool:\n  discovery:\n    kubernetes:\n      inference_pool: pool\n"
                           "      kubeconfig: kubeconfig\n";
    return path.string();
  }

  fs::path dir_;
  const std::string pods_ = "/api/v1/namespaces/ns/pods";
  const std::string pools_ = "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools";
  const std::map<std::string, std::string> app_ = {{"app", "vllm"}};
};

TEST_F(ConfigTargetsTest, KubernetesPodsAreTheTargetsAndAreDiagnosed) {
  std::vector<sim::ReplicaConfig> rs(2, SimReplica());
  sim::Fleet fleet(std::move(rs), 1);
  ASSERT_TRUE(fleet.Start().ok());
  FakeApiServer api;
  api.InstallCrd(pools_);
  api.Put(pools_, FakeApiServer::PoolV1Json("pool", app_, {fleet.port(0), fleet.port(1)}));
  api.Put(pods_, FakeApiServer::PodJson("vllm-0", "127.0.0.1", true, app_));
  api.Put(pods_, FakeApiServer::PodJson("vllm-1", "127.0.0.2", false, app_));  // not Ready
  const std::string cfg = Config(api);

  std::vector<Target> targets;
  ASSERT_EQ(TargetsFromConfig(cfg, 10, targets).ToString(), "OK");
  // One Ready pod, two target ports: two endpoints on 127.0.0.1.
  ASSERT_EQ(targets.size(), 2u);
  std::set<uint16_t> ports;
  for (const Target& t : targets) {
    EXPECT_EQ(t.host, "127.0.0.1");
    EXPECT_FALSE(t.name.empty());
    ports.insert(t.port);
  }
  EXPECT_EQ(ports, (std::set<uint16_t>{fleet.port(0), fleet.port(1)}));

  CollectOptions o;
  o.targets = targets;
  o.window_s = 0;
  const Report r = Diagnose(Collect(o), DoctorOptions{});
  EXPECT_EQ(r.ExitCode(), 0);
  EXPECT_EQ(r.fleet.reachable, 2);
}

TEST_F(ConfigTargetsTest, MissingPoolIsAnErrorNotAnEmptyFleet) {
  FakeApiServer api;
  api.InstallCrd(pools_);
  std::vector<Target> targets;
  const std::string e = TargetsFromConfig(Config(api), 2, targets).message();
  EXPECT_NE(e.find("kubernetes"), std::string::npos) << e;
  EXPECT_NE(e.find("pool"), std::string::npos) << e;
  EXPECT_TRUE(targets.empty());
}

TEST_F(ConfigTargetsTest, UnreadableKubeconfigNamesTheFile) {
  const fs::path path = dir_ / "epp.yaml";
  std::ofstream(path) << "pool:\n  discovery:\n    kubernetes:\n      inference_pool: pool\n"
                         "      kubeconfig: missing-kubeconfig\n";
  std::vector<Target> targets;
  const std::string e = TargetsFromConfig(path.string(), 2, targets).message();
  EXPECT_NE(e.find("missing-kubeconfig"), std::string::npos) << e;
}

}  // namespace
}  // namespace kvroute::doctor

namespace kvroute::doctor {
namespace {

// Each target's KV-event address as the router derives it: the endpoint's own kv_events,
// else tcp://<its host>:<pool.kv_events.port>; the centralized bind leaves them empty.
TEST_F(ConfigTargetsTest, KvEventsAddressesFollowTheRouter) {
  const fs::path path = dir_ / "serve.yaml";
  std::ofstream(path) << "pool:\n  endpoints:\n"
                         "    - {address: 10.0.0.7:8000, kv_events: tcp://10.0.0.9:6000}\n"
                         "    - 10.0.0.8:8000\n"
                         "    - '[fd00::1]:8000'\n"
                         "  kv_events: {port: 5557, block_size: 32}\n";
  std::vector<Target> targets;
  ConfigKvEvents kv;
  ASSERT_EQ(TargetsFromConfig(path.string(), 10, targets, &kv).ToString(), "OK");
  ASSERT_EQ(targets.size(), 3u);
  EXPECT_EQ(targets[0].kv_events, "tcp://10.0.0.9:6000");
  EXPECT_EQ(targets[1].kv_events, "tcp://10.0.0.8:5557");
  EXPECT_EQ(targets[2].kv_events, "tcp://[fd00::1]:5557");
  EXPECT_EQ(kv.block_size, 32);
  EXPECT_EQ(kv.bind, "");

  std::ofstream(path) << "pool:\n  endpoints: [10.0.0.7:8000]\n";
  ASSERT_EQ(TargetsFromConfig(path.string(), 10, targets, &kv).ToString(), "OK");
  EXPECT_EQ(targets[0].kv_events, "");
  EXPECT_EQ(kv.block_size, 0);  // no events: the router's block size does not apply

  std::ofstream(path) << "pool:\n  endpoints: [10.0.0.7:8000]\n"
                         "  kv_events: {bind: 'tcp://*:5557'}\n";
  ASSERT_EQ(TargetsFromConfig(path.string(), 10, targets, &kv).ToString(), "OK");
  EXPECT_EQ(targets[0].kv_events, "");
  EXPECT_EQ(kv.bind, "tcp://*:5557");

  // --kv-events-port and --kv-events with --endpoints.
  ASSERT_TRUE(ParseEndpointList("10.0.0.7:8000,10.0.0.8:8000", targets).ok());
  ApplyKvEventsPort(5557, targets);
  EXPECT_EQ(targets[0].kv_events, "tcp://10.0.0.7:5557");
  EXPECT_EQ(targets[1].kv_events, "tcp://10.0.0.8:5557");
  ASSERT_TRUE(ParseEndpointList("10.0.0.7:8000,10.0.0.8:8000", targets).ok());
  ASSERT_EQ(ApplyKvEventsList(" , tcp://10.0.0.8:5558", targets).ToString(), "OK");
  EXPECT_EQ(targets[0].kv_events, "");
  EXPECT_EQ(targets[1].kv_events, "tcp://10.0.0.8:5558");
  EXPECT_FALSE(ApplyKvEventsList("tcp://10.0.0.8:5558", targets).ok());
  EXPECT_FALSE(ApplyKvEventsList("tcp://a:1,http://b:2", targets).ok());
}

}  // namespace
}  // namespace kvroute::doctor
