// The targets of `kvroute doctor --config`: Kubernetes discovery listed once against
// FakeApiServer (real TLS on loopback; no cluster runs here), then the diagnosis of the
// pods it found (sim replicas on 127.0.0.1).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "../k8s/fake_api_server.h"
#include "doctor/doctor_main.h"
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
