// File discovery through a real Pool: real files in a temporary directory, the pool's
// PollTimer on a real io_context (10 ms polls), the core's table checked after each
// change. No HTTP is served; the scraper's connects to the made-up endpoints just fail.
// Every wait is bounded.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "config/router_config.h"
#include "core/metrics/prom_parser.h"
#include "adapters/pool/pool.h"
#include "support/wait.h"

namespace kvroute::pool {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

using kvroute::test_support::WaitFor;

class PoolDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvroute-discovery-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    thread_ = std::thread([this] { ctx_.run(); });
    pool_ = std::make_unique<Pool>(ctx_, [this](std::string_view l) {
      std::lock_guard<std::mutex> lock(mu_);
      logs_.emplace_back(l);
    });
  }
  void TearDown() override {
    pool_.reset();
    work_.reset();
    ctx_.stop();
    thread_.join();
    fs::remove_all(dir_);
  }

  // Writes `text` to a temporary name and renames it over `name` (what editors and
  // deploy tools do).
  void WriteAtomically(const std::string& name, const std::string& text) {
    const fs::path tmp = fs::path(dir_) / (name + ".tmp");
    std::ofstream(tmp) << text;
    fs::rename(tmp, fs::path(dir_) / name);
  }
  config::RouterConfig Config(const std::string& file = "eps.yaml") {
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(
        "pool:\n  endpoints_file: " + file + "\n  endpoints_file_poll: 10ms\n"
        "  scrape_interval: 1s\n  staleness: 2s\n",
        dir_ + "/router.yaml");
    EXPECT_TRUE(r.ok()) << r.error.ToString();
    return *r.value;
  }
  // Address -> id of the core's current table.
  std::map<std::string, uint32_t> Table() {
    std::map<std::string, uint32_t> out;
    for (const auto& ep : pool_->core().table()->by_id) {
      if (ep) out[ep->spec.address] = ep->id;
    }
    return out;
  }
  std::string Metrics() {
    std::string out;
    pool_->AppendMetrics(out);
    return out;
  }
  // "name value" holds in the pool's exposition.
  bool MetricIs(const std::string& line) {
    const std::size_t space = line.find(' ');
    const std::string name = line.substr(0, space);
    const double want = std::stod(line.substr(space + 1));
    for (const metrics::OwnedSample& s : metrics::ParseAllSamples(Metrics())) {
      if (s.name == name) return s.value == want;
    }
    return false;
  }
  std::vector<std::string> Logs() {
    std::lock_guard<std::mutex> lock(mu_);
    return logs_;
  }

  std::string dir_;
  boost::asio::io_context ctx_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_{
      boost::asio::make_work_guard(ctx_)};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> logs_;
  std::unique_ptr<Pool> pool_;
};

TEST_F(PoolDiscoveryTest, RenamedFileIsAppliedKeepingIdsAndABrokenOneKeepsTheLastGoodSet) {
  WriteAtomically("eps.yaml", "- 127.0.0.1:1\n- {address: 127.0.0.1:2, name: b}\n");
  ASSERT_TRUE(pool_->Apply(Config()).ok());
  const auto first = Table();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_TRUE(MetricIs("kvroute_discovery_endpoints 2"));
  EXPECT_TRUE(MetricIs("kvroute_discovery_file_valid 1"));

  WriteAtomically("eps.yaml", "- 127.0.0.1:1\n- {address: 127.0.0.1:2, name: b}\n- 127.0.0.1:3\n");
  ASSERT_TRUE(WaitFor([&] { return Table().size() == 3; }));
  auto now = Table();
  EXPECT_EQ(now.at("127.0.0.1:1"), first.at("127.0.0.1:1"));
  EXPECT_EQ(now.at("127.0.0.1:2"), first.at("127.0.0.1:2"));
  EXPECT_TRUE(MetricIs("kvroute_discovery_reloads_total 1"));
  EXPECT_TRUE(MetricIs("kvroute_discovery_endpoints 3"));

  WriteAtomically("eps.yaml", "- 127.0.0.1:1\n- 127.0.0.1:nope\n");
  ASSERT_TRUE(WaitFor([&] { return MetricIs("kvroute_discovery_errors_total 1"); }));
  EXPECT_TRUE(MetricIs("kvroute_discovery_file_valid 0"));
  EXPECT_EQ(Table(), now);
  // Logged once, with file:line, however many polls see it.
  std::this_thread::sleep_for(50ms);  // several polls (not a timing assertion)
  int error_lines = 0;
  for (const std::string& l : Logs()) {
    if (l.find("rejected") != std::string::npos) {
      ++error_lines;
      EXPECT_NE(l.find(dir_ + "/eps.yaml:2: endpoints[1]: bad address"), std::string::npos) << l;
    }
  }
  EXPECT_EQ(error_lines, 1);
  EXPECT_TRUE(MetricIs("kvroute_discovery_errors_total 1"));

  // Removing one: the others keep their ids.
  WriteAtomically("eps.yaml", "- 127.0.0.1:3\n- 127.0.0.1:1\n");
  ASSERT_TRUE(WaitFor([&] { return Table().size() == 2; }));
  EXPECT_EQ(Table().at("127.0.0.1:1"), first.at("127.0.0.1:1"));
  EXPECT_EQ(Table().at("127.0.0.1:3"), now.at("127.0.0.1:3"));
  EXPECT_TRUE(MetricIs("kvroute_discovery_file_valid 1"));
  EXPECT_TRUE(MetricIs("kvroute_discovery_reloads_total 2"));
}

TEST_F(PoolDiscoveryTest, ConfigMapSymlinkSwapIsFollowed) {
  // The kubelet's layout: eps.yaml -> ..data/eps.yaml, ..data -> ..v1; an update writes
  // ..v2 and renames a new ..data symlink over the old one.
  const fs::path d(dir_);
  fs::create_directory(d / "..v1");
  std::ofstream(d / "..v1" / "eps.yaml") << "- 127.0.0.1:1\n";
  fs::create_directory_symlink("..v1", d / "..data");
  fs::create_symlink("..data/eps.yaml", d / "eps.yaml");
  ASSERT_TRUE(pool_->Apply(Config()).ok());
  ASSERT_EQ(Table().size(), 1u);

  fs::create_directory(d / "..v2");
  std::ofstream(d / "..v2" / "eps.yaml") << "- 127.0.0.1:1\n- 127.0.0.1:2\n";
  fs::create_directory_symlink("..v2", d / "..data_tmp");
  fs::rename(d / "..data_tmp", d / "..data");
  fs::remove_all(d / "..v1");
  ASSERT_TRUE(WaitFor([&] { return Table().size() == 2; }));
}

TEST_F(PoolDiscoveryTest, EmptyListIsLegalAndMissingFileFailsApply) {
  Status st = pool_->Apply(Config("missing.yaml"));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir_ + "/missing.yaml: cannot read file"), std::string::npos)
      << st.message();
  EXPECT_EQ(Metrics(), "");  // never configured

  WriteAtomically("eps.yaml", "[]\n");
  ASSERT_TRUE(pool_->Apply(Config()).ok());
  EXPECT_TRUE(Table().empty());
  WriteAtomically("eps.yaml", "- 127.0.0.1:7\n");
  ASSERT_TRUE(WaitFor([&] { return Table().size() == 1; }));
}

TEST_F(PoolDiscoveryTest, ApplyRereadsTheFileAndStaticEndpointsEndTheWatch) {
  WriteAtomically("eps.yaml", "- 127.0.0.1:1\n");
  ASSERT_TRUE(pool_->Apply(Config()).ok());
  // A broken file fails Apply (a SIGHUP reload is rejected) and keeps the running set.
  WriteAtomically("eps.yaml", "- 127.0.0.1:1\n- 127.0.0.1:1\n");
  Status st = pool_->Apply(Config());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("eps.yaml:2: endpoints[1]: duplicate endpoint address"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(Table().size(), 1u);

  config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(
      "pool:\n  endpoints: [127.0.0.1:1, 127.0.0.1:9]\n", dir_ + "/router.yaml");
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(pool_->Apply(*r.value).ok());
  EXPECT_EQ(Table().size(), 2u);
  EXPECT_EQ(Metrics(), "");
  WriteAtomically("eps.yaml", "- 127.0.0.1:5\n");
  std::this_thread::sleep_for(50ms);  // several poll intervals: nothing may change
  EXPECT_EQ(Table().size(), 2u);
}

}  // namespace
}  // namespace kvroute::pool

namespace kvroute::pool {
namespace {

// Issue 10: an endpoints file's `labels: {region: R}` (or the Kubernetes topology label)
// reaches the core's endpoint as its region, and a relabelled file moves the endpoint;
// the locality counters on /metrics follow the table's regions.
TEST_F(PoolDiscoveryTest, EndpointsFileLabelsAreRegions) {
  WriteAtomically("eps.yaml",
                  "- {address: 10.0.0.1:8000, labels: {region: us-east}}\n"
                  "- {address: 10.0.0.2:8000, labels: {topology.kubernetes.io/region: eu-west}}\n"
                  "- 10.0.0.3:8000\n");
  config::RouterConfig cfg = Config();
  cfg.locality.region = "us-east";
  ASSERT_TRUE(pool_->Apply(cfg).ok());
  auto regions = [&] {
    std::map<std::string, std::string> out;
    for (const auto& ep : pool_->core().table()->by_id) {
      if (ep) out[ep->spec.address] = std::string(sched::RegionOf(ep->spec.labels));
    }
    return out;
  };
  EXPECT_EQ(regions(), (std::map<std::string, std::string>{
                           {"10.0.0.1:8000", "us-east"}, {"10.0.0.2:8000", "eu-west"}, {"10.0.0.3:8000", ""}}));
  std::string m;
  pool_->core().AppendMetrics(m, pool_->Now());
  EXPECT_NE(m.find("kvroute_locality_requests_total{region=\"eu-west\"} 0.0"), std::string::npos) << m;

  WriteAtomically("eps.yaml", "- {address: 10.0.0.2:8000, labels: {region: ap-south}}\n");
  ASSERT_TRUE(WaitFor([&] { return regions() == std::map<std::string, std::string>{{"10.0.0.2:8000", "ap-south"}}; }));
}

}  // namespace
}  // namespace kvroute::pool
