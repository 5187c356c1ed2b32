// `kvroute doctor` as a process (the built binary) against in-process replicas on port 0:
// exit codes, the JSON report, --config sources, --scenario-out through `kvroute
// simulate`, --watch without a terminal, and every usage error. Windows are short and
// assertions are on what was read, never on how fast.
#include <gtest/gtest.h>
#include <simdjson.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "metrics/metric_sum.h"
#include "config/router_config.h"
#include "core/engine/tokenizer.h"
#include "adapters/http/test_client.h"
#include "apps/serve/router.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/stub_server.h"
#include "support/test_paths.h"
#include "support/wait.h"

namespace kvroute::doctor {
namespace {

namespace fs = std::filesystem;
using kvroute::test_support::ClosedPort;
using kvroute::test_support::kTestModel;
using kvroute::test_support::SimReplica;
using kvroute::test_support::StubUpstream;

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Outcome {
  int rc = -1;
  std::string out, err;
};

std::string Binary() {
  return kvroute::test_support::KvrouteBinary();
}

class DoctorCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(Binary())) GTEST_SKIP() << "kvroute binary not built: " << Binary();
    dir_ = fs::temp_directory_path() /
           ("kvroute-doctor-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fleet_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  void StartFleet(int n) {
    std::vector<sim::ReplicaConfig> rs(n, SimReplica());
    fleet_ = std::make_unique<sim::Fleet>(std::move(rs), 1);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  std::string Sim(int i) const { return "127.0.0.1:" + std::to_string(fleet_->port(i)); }

  // Runs `kvroute <args>` (a shell command line), at most 60 s.
  Outcome Kvroute(const std::string& args, const std::string& prefix = "timeout 60") {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd =
        prefix + " " + Binary() + " " + args + " >" + out.string() + " 2>" + err.string();
    const int status = std::system(cmd.c_str());
    Outcome r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadFile(out);
    r.err = ReadFile(err);
    return r;
  }

  fs::path dir_;
  std::unique_ptr<sim::Fleet> fleet_;
};

std::string Why(const Outcome& r) { return "stdout:\n" + r.out + "\nstderr:\n" + r.err; }

TEST_F(DoctorCliTest, NothingReachableExitsTwo) {
  const std::string a = "127.0.0.1:" + std::to_string(ClosedPort());
  const std::string b = "127.0.0.1:" + std::to_string(ClosedPort());
  const Outcome r = Kvroute("doctor --endpoints " + a + "," + b + " --window 0 -q");
  EXPECT_EQ(r.rc, 2) << Why(r);
  EXPECT_NE(r.out.find("unreachable"), std::string::npos) << Why(r);
  EXPECT_NE(r.out.find(a), std::string::npos) << Why(r);
}

TEST_F(DoctorCliTest, HealthyIdleFleetExitsZero) {
  StartFleet(2);
  const Outcome r =
      Kvroute("doctor --endpoints " + Sim(0) + "," + Sim(1) + " --window 0.4s --interval 0.2s");
  EXPECT_EQ(r.rc, 0) << Why(r);
  EXPECT_NE(r.out.find("healthy"), std::string::npos) << Why(r);
  EXPECT_NE(r.err.find("scraping 2 replicas"), std::string::npos) << Why(r);  // progress, not a TTY
}

// An HTML page and a vLLM exposition with NaN values next to a good replica: findings
// (exit 1), no crash, and the good replica still diagnosed.
TEST_F(DoctorCliTest, GarbageEndpointsAreFindings) {
  StartFleet(1);
  StubUpstream html(StubUpstream::Mode::kOk,
                    "<!doctype html><html><head><title>502 Bad Gateway</title></head></html>\n",
                    "text/html");
  StubUpstream nan(
      StubUpstream::Mode::kOk,
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n"
      "# TYPE vllm:num_requests_waiting gauge\n"
      "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0\n"
      "# TYPE vllm:kv_cache_usage_perc gauge\n"
      "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} NaN\n",
      "text/plain; version=0.0.4");
  const std::string h = "127.0.0.1:" + std::to_string(html.port());
  const std::string n = "127.0.0.1:" + std::to_string(nan.port());
  const Outcome r = Kvroute("doctor --endpoints " + Sim(0) + "," + h + "," + n +
                            " --window 0.4s --interval 0.2s --json -q");
  EXPECT_EQ(r.rc, 1) << Why(r);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(r.out).get(doc), simdjson::SUCCESS) << Why(r);
  std::map<std::string, std::vector<std::string>> rules;
  for (simdjson::dom::element f : doc["findings"].get_array()) {
    std::string_view rule = f["rule"].get_string();
    for (simdjson::dom::element name : f["replicas"].get_array()) {
      rules[std::string(rule)].emplace_back(std::string_view(name.get_string()));
    }
  }
  EXPECT_EQ(rules["not-vllm"], std::vector<std::string>{h}) << r.out;
  // The HTML page is a garbage line too (not an exposition); the good replica is neither.
  const std::vector<std::string>& garbage = rules["garbage-metrics"];
  EXPECT_NE(std::find(garbage.begin(), garbage.end(), n), garbage.end()) << r.out;
  EXPECT_EQ(std::find(garbage.begin(), garbage.end(), Sim(0)), garbage.end()) << r.out;
  EXPECT_EQ(rules.count("unreachable"), 0u) << r.out;
}

TEST_F(DoctorCliTest, JsonReportHasTheSchemaFields) {
  StartFleet(2);
  const std::string closed = "127.0.0.1:" + std::to_string(ClosedPort());
  const Outcome r = Kvroute("doctor --endpoints " + Sim(0) + "," + Sim(1) + "," + closed +
                            " --window 0.6s --interval 0.2s --json -q");
  EXPECT_EQ(r.rc, 1) << Why(r);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(r.out).get(doc), simdjson::SUCCESS) << Why(r);
  EXPECT_EQ(std::string_view(doc["schema"].get_string()), "kvroute-doctor/1");
  EXPECT_EQ(int64_t(doc["exit_code"].get_int64()), 1);
  EXPECT_TRUE(bool(doc["readable"].get_bool()));
  EXPECT_FALSE(bool(doc["healthy"].get_bool()));
  // From the first read (after the first round began at 0) to the last (after 0.6).
  double actual = doc["window"]["actual_s"].get_double();
  EXPECT_GT(actual, 0.2);
  EXPECT_EQ(double(doc["window"]["intended_s"].get_double()), 0.6);
  simdjson::dom::array replicas = doc["replicas"].get_array();
  ASSERT_EQ(replicas.size(), 3u);
  int i = 0;
  for (simdjson::dom::element rep : replicas) {
    const std::string name(std::string_view(rep["name"].get_string()));
    EXPECT_EQ(std::string_view(rep["address"].get_string()), name);
    const bool up = rep["reachable"].get_bool();
    EXPECT_EQ(up, i < 2) << name;
    EXPECT_EQ(int64_t(rep["scrapes"].get_int64()), 4) << name;  // 0, 0.2, 0.4, 0.6
    if (up) {
      EXPECT_EQ(name, Sim(i));
      EXPECT_EQ(double(rep["kv"]["mean"].get_double()), 0.0);
      EXPECT_EQ(int64_t(rep["num_gpu_blocks"].get_int64()), 512);
      EXPECT_TRUE(bool(rep["prefix_caching"].get_bool()));
    } else {
      EXPECT_EQ(name, closed);
      EXPECT_NE(std::string_view(rep["error"].get_string()).find("refused"),
                std::string_view::npos);
    }
    ++i;
  }
  simdjson::dom::object fleet = doc["fleet"].get_object();
  EXPECT_EQ(int64_t(fleet["replicas"].get_int64()), 3);
  EXPECT_EQ(int64_t(fleet["reachable"].get_int64()), 2);
  EXPECT_EQ(double(fleet["kv"]["spread"].get_double()), 0.0);
  simdjson::dom::array findings = doc["findings"].get_array();
  ASSERT_EQ(findings.size(), 1u) << r.out;
  simdjson::dom::element f = findings.at(0);
  EXPECT_EQ(std::string_view(f["rule"].get_string()), "unreachable");
  EXPECT_FALSE(bool(f["routing"].get_bool()));
  for (const char* key : {"severity", "summary", "condition", "remedy"}) {
    EXPECT_FALSE(std::string_view(f[key].get_string()).empty()) << key;
  }
}

TEST_F(DoctorCliTest, ConfigPoolEndpoints) {
  StartFleet(2);
  const fs::path cfg = dir_ / "serve.yaml";
  std::ofstream(cfg) << "listen: 127.0.0.1:8080\npool:\n  endpoints:\n    - address: " << Sim(0)
                     << "\n      name: first\n    - " << Sim(1)
                     << "\nscheduling: {policy: round-robin}\n";
  const Outcome r = Kvroute("doctor --config " + cfg.string() + " --window 0 --json -q");
  EXPECT_EQ(r.rc, 0) << Why(r);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(r.out).get(doc), simdjson::SUCCESS) << Why(r);
  simdjson::dom::array replicas = doc["replicas"].get_array();
  ASSERT_EQ(replicas.size(), 2u);
  EXPECT_EQ(std::string_view(replicas.at(0)["name"].get_string()), "first");
  EXPECT_EQ(std::string_view(replicas.at(0)["address"].get_string()), Sim(0));
  EXPECT_EQ(std::string_view(replicas.at(1)["name"].get_string()), Sim(1));
}

TEST_F(DoctorCliTest, ConfigPoolEndpointsFile) {
  StartFleet(2);
  fs::create_directories(dir_ / "conf");
  std::ofstream(dir_ / "conf" / "eps.yaml")
      << "- {address: " << Sim(0) << ", name: a}\n- address: " << Sim(1) << "\n  name: b\n";
  // Relative to the config file's directory, as serve reads it.
  std::ofstream(dir_ / "conf" / "serve.yaml") << "pool:\n  endpoints_file: eps.yaml\n";
  const Outcome r =
      Kvroute("doctor --config " + (dir_ / "conf" / "serve.yaml").string() + " --window 0 -q");
  EXPECT_EQ(r.rc, 0) << Why(r);
  EXPECT_NE(r.out.find("a "), std::string::npos) << Why(r);
  EXPECT_NE(r.out.find("b "), std::string::npos) << Why(r);
  EXPECT_NE(r.out.find("2 replicas, 2 reachable"), std::string::npos) << Why(r);
}

// KV-cache events end to end: two sim replicas under traffic, one publishing its events and
// one configured with events (a closed port) that publishes nothing. From the config, doctor
// listens to both while it scrapes: kv-events-silent names the silent one only. With a
// router block size the publisher's blocks of 16 do not divide, kv-events-block-size names
// the publisher. With --endpoints, --kv-events-port or --kv-events reads the publisher
// alone: healthy.
TEST_F(DoctorCliTest, KvEventsSilentAndBlockSize) {
  std::vector<sim::ReplicaConfig> rs = {SimReplica({.name = "pub"}), SimReplica({.name = "mute"})};
  rs[0].kv_events.port = 0;  // any free port
  fleet_ = std::make_unique<sim::Fleet>(std::move(rs), 1);
  ASSERT_TRUE(fleet_->Start().ok());
  const std::string events = fleet_->kv_events_endpoint(0);
  ASSERT_FALSE(events.empty());
  const std::string mute_events = "tcp://127.0.0.1:" + std::to_string(ClosedPort());

  // Distinct 40-token prompts (2 full blocks each, nothing cached) to both replicas, all
  // through each doctor run.
  std::atomic<bool> stop{false};
  std::thread traffic([&] {
    for (int n = 0; !stop.load(); ++n) {
      for (int i = 0; i < 2; ++i) {
        std::string prompt = "doctor-" + std::to_string(n) + "-" + std::to_string(i) + "-";
        prompt.resize(40 * engine::kBytesPerToken, 'x');
        http::Fetch("127.0.0.1", fleet_->port(i), "POST", "/v1/completions",
                    kvroute::test_support::CompletionBody(prompt, 1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
  });
  struct Stop {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Stop() {
      stop.store(true);
      t.join();
    }
  } join{stop, traffic};

  auto config = [&](int router_block_size) {
    const fs::path cfg = dir_ / ("serve-" + std::to_string(router_block_size) + ".yaml");
    std::ofstream(cfg) << "pool:\n  endpoints:\n    - address: " << Sim(0)
                       << "\n      name: pub\n      kv_events: " << events
                       << "\n    - address: " << Sim(1) << "\n      name: mute\n      kv_events: "
                       << mute_events << "\n  kv_events: {block_size: " << router_block_size
                       << "}\nscheduling: {policy: kvroute}\n";
    return cfg.string();
  };
  // rule -> replicas, and the publisher's kv_events object.
  auto findings = [](const Outcome& r, std::map<std::string, std::vector<std::string>>& rules,
                     int64_t& pub_batches) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    ASSERT_EQ(parser.parse(r.out).get(doc), simdjson::SUCCESS) << Why(r);
    for (simdjson::dom::element f : doc["findings"].get_array()) {
      std::vector<std::string>& names = rules[std::string(std::string_view(f["rule"].get_string()))];
      for (simdjson::dom::element n : f["replicas"].get_array()) {
        names.emplace_back(std::string_view(n.get_string()));
      }
    }
    simdjson::dom::element pub = doc["replicas"].at(0)["kv_events"];
    pub_batches = pub["batches"].get_int64();
    if (pub_batches > 0) {
      EXPECT_EQ(int64_t(pub["block_sizes"].at(0).get_int64()), 16) << r.out;
    }
  };

  Outcome r = Kvroute("doctor --config " + config(16) + " --window 1.5s --interval 0.25s --json -q");
  EXPECT_EQ(r.rc, 1) << Why(r);
  std::map<std::string, std::vector<std::string>> rules;
  int64_t batches = 0;
  findings(r, rules, batches);
  EXPECT_EQ(rules.size(), 1u) << r.out;
  EXPECT_EQ(rules["kv-events-silent"], std::vector<std::string>{"mute"}) << r.out;
  EXPECT_GT(batches, 0) << r.out;
  EXPECT_NE(r.out.find(mute_events), std::string::npos) << r.out;

  r = Kvroute("doctor --config " + config(48) + " --window 1s --interval 0.25s --json -q");
  EXPECT_EQ(r.rc, 1) << Why(r);
  rules.clear();
  findings(r, rules, batches);
  EXPECT_EQ(rules["kv-events-silent"], std::vector<std::string>{"mute"}) << r.out;
  EXPECT_EQ(rules["kv-events-block-size"], std::vector<std::string>{"pub"}) << r.out;

  const std::string port = events.substr(events.rfind(':') + 1);
  r = Kvroute("doctor --endpoints " + Sim(0) + " --kv-events-port " + port +
              " --window 1s --interval 0.25s --json -q");
  EXPECT_EQ(r.rc, 0) << Why(r);
  rules.clear();
  findings(r, rules, batches);
  EXPECT_TRUE(rules.empty()) << r.out;
  EXPECT_GT(batches, 0) << r.out;

  // --kv-events names each replica's publisher; an empty entry probes nothing there.
  r = Kvroute("doctor --endpoints " + Sim(0) + "," + Sim(1) + " --kv-events " + events +
              ", --window 1s --interval 0.25s --json -q");
  EXPECT_EQ(r.rc, 0) << Why(r);
  rules.clear();
  findings(r, rules, batches);
  EXPECT_TRUE(rules.empty()) << r.out;
  EXPECT_GT(batches, 0) << r.out;
  EXPECT_NE(r.out.find("\"kv_events\": null"), std::string::npos) << r.out;
}

TEST_F(DoctorCliTest, ConfigErrorsNameFileLineAndField) {
  const fs::path cfg = dir_ / "bad.yaml";
  std::ofstream(cfg) << "pool:\n  endpoints:\n    - 127.0.0.1:18001\n    - address: nope\n";
  Outcome r = Kvroute("doctor --config " + cfg.string());
  EXPECT_EQ(r.rc, 2) << Why(r);
  EXPECT_NE(r.err.find(cfg.string() + ":4"), std::string::npos) << Why(r);
  EXPECT_NE(r.err.find("pool.endpoints[1].address"), std::string::npos) << Why(r);

  std::ofstream(dir_ / "typo.yaml") << "pool:\n  endpoint: [127.0.0.1:18001]\n";
  r = Kvroute("doctor --config " + (dir_ / "typo.yaml").string());
  EXPECT_EQ(r.rc, 2) << Why(r);
  EXPECT_NE(r.err.find("typo.yaml:2"), std::string::npos) << Why(r);
  EXPECT_NE(r.err.find("did you mean"), std::string::npos) << Why(r);

  std::ofstream(dir_ / "eps-missing.yaml") << "pool:\n  endpoints_file: nowhere.yaml\n";
  r = Kvroute("doctor --config " + (dir_ / "eps-missing.yaml").string());
  EXPECT_EQ(r.rc, 2) << Why(r);
  EXPECT_NE(r.err.find("nowhere.yaml"), std::string::npos) << Why(r);

  r = Kvroute("doctor --config " + (dir_ / "absent.yaml").string());
  EXPECT_EQ(r.rc, 2) << Why(r);
  EXPECT_NE(r.err.find("absent.yaml"), std::string::npos) << Why(r);
}

TEST_F(DoctorCliTest, UsageErrorsExitTwoWithAMessage) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"doctor", "--endpoints HOST:PORT"},
      {"doctor --endpoints 127.0.0.1:1 --config x.yaml", "not both"},
      {"doctor --endpoints 127.0.0.1:1 --window soon", "--window 'soon'"},
      {"doctor --endpoints 127.0.0.1:1 --window -3s", "--window '-3s'"},
      {"doctor --endpoints 127.0.0.1:1 --interval 0", "--interval '0': must be > 0"},
      {"doctor --endpoints 127.0.0.1:1 --timeout 0s", "--timeout '0s': must be > 0"},
      {"doctor --endpoints 127.0.0.1:1,localhost", "entry 2 'localhost'"},
      {"doctor --endpoints 127.0.0.1:99999", "entry 1"},
      {"doctor --endpoints ,", "no HOST:PORT"},
      {"doctor --endpoints 127.0.0.1:1 --watch --json", "--watch and --json"},
      {"doctor --endpoints 127.0.0.1:1 --watch --scenario-out x.yaml", "--watch writes no files"},
      {"doctor --endpoints 127.0.0.1:1 --frobnicate", "frobnicate"},
      {"doctor --config x.yaml --kv-events-port 5557", "--kv-events-port goes with --endpoints"},
      {"doctor --endpoints 127.0.0.1:1 --kv-events-port 70000", "--kv-events-port"},
      {"doctor --config x.yaml --kv-events tcp://127.0.0.1:5557", "--kv-events goes with"},
      {"doctor --endpoints 127.0.0.1:1,127.0.0.1:2 --kv-events tcp://127.0.0.1:5557",
       "--kv-events: 1 entries for 2 --endpoints"},
      {"doctor --endpoints 127.0.0.1:1,127.0.0.1:2 --kv-events ,udp://x:1",
       "--kv-events entry 2 'udp://x:1'"},
      {"doctor --endpoints 127.0.0.1:1 --kv-events tcp://a:1 --kv-events-port 5", "not both"},
  };
  for (const Case& c : cases) {
    const Outcome r = Kvroute(c.args);
    EXPECT_EQ(r.rc, 2) << c.args << "\n" << Why(r);
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << Why(r);
    EXPECT_TRUE(r.out.empty()) << c.args << "\n" << Why(r);
  }
}

// --router (issue 24): a real `kvroute serve` in front of the sim fleet, streamed requests
// with a TTFT objective through it, then doctor reads the router's /metrics: the figures are
// the router's own counters (one scrape: totals), and a 1 us objective is missed by all.
TEST_F(DoctorCliTest, RouterLatencyModelAndObjectives) {
  StartFleet(2);
  std::string yaml = "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n  endpoints:\n";
  for (int i = 0; i < 2; ++i) yaml += "    - {address: " + Sim(i) + "}\n";
  yaml += "scheduling:\n  policy: kvroute\n  slo: {ttft: 1us}\n";
  config::ConfigOr<config::RouterConfig> cfg = config::ParseRouterConfig(yaml, "test.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.error.ToString();
  router::RouterOptions ro;
  ro.listen = config::HostPort{"127.0.0.1", 0};
  ro.log = false;
  router::Router router(std::move(*cfg.value), ro);
  ASSERT_TRUE(router.Start().ok());
  ASSERT_TRUE(test_support::WaitFor([&] {
    auto r = http::Fetch("127.0.0.1", router.port(), "GET", "/readyz");
    return r && r->status == 200;
  }));
  constexpr int kRequests = 60;  // >= 50: the slo-missed rule's minimum
  for (int i = 0; i < kRequests; ++i) {
    auto r = http::Fetch("127.0.0.1", router.port(), "POST", "/v1/completions",
                         test_support::CompletionBody("doctor router " + std::to_string(i), 3, true));
    ASSERT_TRUE(r && r->status == 200);
  }
  std::string m;
  ASSERT_TRUE(test_support::WaitFor([&] {
    auto r = http::Fetch("127.0.0.1", router.port(), "GET", "/metrics");
    m = r ? r->body : "";
    return metrics::testing::MetricSum(m, "kvroute_slo_requests_total", {{"type", "ttft"}}) ==
           kRequests;
  })) << m;
  const double scored =
      metrics::testing::MetricSum(m, "kvroute_latency_predictions_scored_total", {{"kind", "ttft"}});
  EXPECT_GT(scored, 0) << m;  // the model predicts after its first 16 samples
  EXPECT_LT(scored, 50) << m;  // below latency-model-inaccurate's minimum
  const std::string at = "127.0.0.1:" + std::to_string(router.port());
  const Outcome r = Kvroute("doctor --endpoints " + Sim(0) + "," + Sim(1) + " --router " + at +
                            " --window 0 --json -q");
  EXPECT_EQ(r.rc, 1) << Why(r);  // slo-missed
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(r.out).get(doc), simdjson::SUCCESS) << Why(r);
  simdjson::dom::element x = doc["router"];
  EXPECT_EQ(std::string_view(x["address"].get_string()), at);
  EXPECT_TRUE(bool(x["kvroute"].get_bool()));
  EXPECT_FALSE(bool(x["flow_control"].get_bool()));
  EXPECT_EQ(double(x["ttft"]["predictions"].get_double()), scored);
  EXPECT_EQ(double(x["ttft"]["slo_requests"].get_double()), kRequests);
  EXPECT_EQ(double(x["ttft"]["slo_violations"].get_double()), kRequests);
  EXPECT_EQ(double(x["ttft"]["attainment"].get_double()), 0.0);
  EXPECT_EQ(doc["replicas"].get_array().size(), 2u);  // the router is not a replica
  std::vector<std::string> rules;
  for (simdjson::dom::element f : doc["findings"].get_array()) {
    rules.emplace_back(std::string_view(f["rule"].get_string()));
  }
  EXPECT_EQ(rules, std::vector<std::string>{"slo-missed"}) << r.out;
  // A replica's address as --router: not a kvroute router.
  const Outcome wrong = Kvroute("doctor --endpoints " + Sim(0) + " --router " + Sim(1) +
                                " --window 0 -q");
  EXPECT_EQ(wrong.rc, 1) << Why(wrong);
  EXPECT_NE(wrong.out.find("FINDING router-unreadable"), std::string::npos) << Why(wrong);
  router.Stop();
}

TEST_F(DoctorCliTest, HelpDocumentsEveryFlagAndTheExitCodes) {
  const Outcome r = Kvroute("doctor --help");
  EXPECT_EQ(r.rc, 0) << Why(r);
  for (const char* s : {"--endpoints", "--config", "--window", "--interval", "--timeout", "--json",
                        "--watch", "--scenario-out", "--json-out", "endpoints_file", "kubernetes",
                        "prefix-reuse-lost", "lopsided-kv", "queue-imbalance", "not-vllm",
                        "--kv-events-port", "kv-events-silent", "kv-events-stale",
                        "kv-events-block-size", "--router", "latency-model-inaccurate",
                        "slo-missed", "router-unreadable",
                        "Exit status: 0 healthy, 1 findings, 2 nothing readable"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
  // The kvroute command list names doctor.
  const Outcome top = Kvroute("--help");
  EXPECT_NE(top.out.find("doctor"), std::string::npos) << Why(top);
}

// Traffic during the window: the scenario it writes loads and runs in `kvroute simulate`.
TEST_F(DoctorCliTest, ScenarioOutRunsInSimulate) {
  StartFleet(2);
  std::atomic<bool> done{false};
  std::atomic<int> sent{0};
  // Requests to both replicas until the doctor has finished (not a fixed count: however
  // slowly the machine runs, requests land inside the window).
  std::thread traffic([&] {
    for (int k = 0; !done.load(); ++k) {
      const std::string body = std::string("{\"model\":\"") + std::string(kTestModel) +
                               "\",\"prompt\":\"You are a careful assistant. Question " +
                               std::to_string(k % 5) +
                               "\",\"max_tokens\":" + std::to_string(4 + k % 8) + "}";
      auto r = http::Fetch("127.0.0.1", fleet_->port(k % 2), "POST", "/v1/completions", body);
      if (r && r->status == 200) ++sent;
    }
  });
  const fs::path scenario = dir_ / "observed.yaml";
  const Outcome r = Kvroute("doctor --endpoints " + Sim(0) + "," + Sim(1) +
                            " --window 1s --interval 0.25s -q --scenario-out " + scenario.string());
  done.store(true);
  traffic.join();
  EXPECT_GT(sent.load(), 0);
  ASSERT_TRUE(r.rc == 0 || r.rc == 1) << Why(r);
  ASSERT_TRUE(fs::exists(scenario)) << Why(r);
  const std::string yaml = ReadFile(scenario);
  EXPECT_NE(yaml.find("replicas: 2"), std::string::npos) << yaml;
  const Outcome sim = Kvroute("simulate --scenario " + scenario.string() +
                              " --requests 60 --policies round-robin,kvroute --quiet --out " +
                              (dir_ / "sim-out").string());
  EXPECT_EQ(sim.rc, 0) << yaml << "\n" << Why(sim);
  EXPECT_TRUE(fs::exists(dir_ / "sim-out" / "report.json")) << Why(sim);
}

TEST_F(DoctorCliTest, ScenarioOutWithoutTrafficIsAnError) {
  StartFleet(1);
  const fs::path scenario = dir_ / "none.yaml";
  const Outcome r =
      Kvroute("doctor --endpoints " + Sim(0) + " --window 0.2s --interval 0.1s -q --scenario-out " +
              scenario.string());
  EXPECT_EQ(r.rc, 2) << Why(r);
  EXPECT_NE(r.err.find("--scenario-out"), std::string::npos) << Why(r);
  EXPECT_FALSE(fs::exists(scenario));
  EXPECT_NE(r.out.find("healthy"), std::string::npos) << Why(r);  // the report still printed
}

// Not a terminal: one plain frame per refresh, no ANSI codes; Ctrl-C ends it with the
// last frame's status.
TEST_F(DoctorCliTest, WatchPrintsFramesUntilInterrupted) {
  StartFleet(1);
  const Outcome r = Kvroute("doctor --endpoints " + Sim(0) + " --watch --window 1s --interval 0.1s",
                            "timeout --preserve-status -s INT 5");
  EXPECT_EQ(r.rc, 0) << Why(r);
  size_t frames = 0;
  for (size_t p = 0; (p = r.out.find("kvroute doctor --watch", p)) != std::string::npos; ++p)
    ++frames;
  EXPECT_GE(frames, 2u) << Why(r);
  EXPECT_EQ(r.out.find('\033'), std::string::npos) << Why(r);
  EXPECT_NE(r.out.find(Sim(0)), std::string::npos) << Why(r);
}

}  // namespace
}  // namespace kvroute::doctor
