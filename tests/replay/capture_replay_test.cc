// The capture loop end to end (issue 42): bench sends a workload through kvroute serve
// (with `capture:`) to two kvroute sim replicas over loopback; the capture file is read
// back by the trace reader and replayed by simulate on the same fleet shape under the
// same policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "adapters/http/test_client.h"
#include "apps/bench/load_generator.h"
#include "apps/serve/router.h"
#include "apps/sim/fleet.h"
#include "apps/simulate/simulator.h"
#include "config/router_config.h"
#include "config/scenario_config.h"
#include "simkit/workload/trace.h"
#include "support/sim_replica.h"
#include "support/wait.h"

namespace kvroute {
namespace {

namespace fs = std::filesystem;
using kvroute::test_support::kTestModel;
using kvroute::test_support::SimReplica;
using kvroute::test_support::WaitFor;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The trace's ideal hit rate: leading ids seen before, times block_size, capped at the
// input length, over all input tokens.
double IdealHitRate(const std::vector<workload::TraceRow>& rows, int64_t block_size) {
  std::unordered_set<uint64_t> seen;
  int64_t hit = 0, total = 0;
  for (const workload::TraceRow& r : rows) {
    int64_t lead = 0;
    while (lead < static_cast<int64_t>(r.hash_ids.size()) && seen.count(r.hash_ids[lead])) ++lead;
    hit += std::min(lead * block_size, r.context_tokens);
    total += r.context_tokens;
    seen.insert(r.hash_ids.begin(), r.hash_ids.end());
  }
  return total > 0 ? static_cast<double>(hit) / static_cast<double>(total) : 0.0;
}

TEST(CaptureReplayTest, ACaptureReplaysWithTheSameRequestsSharingAndHitRate) {
  const fs::path dir = fs::path(::testing::TempDir()) / "kvroute-capture-replay";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string capture_path = (dir / "capture.jsonl").string();

  sim::Fleet fleet({SimReplica({.name = "r0", .kv_blocks = 2048}), SimReplica({.name = "r1", .kv_blocks = 2048})}, 1);
  ASSERT_TRUE(fleet.Start().ok());
  const std::string yaml = "pool:\n  scrape_interval: 50ms\n  endpoints:\n"
                           "    - {address: 127.0.0.1:" + std::to_string(fleet.port(0)) + ", name: r0}\n"
                           "    - {address: 127.0.0.1:" + std::to_string(fleet.port(1)) + ", name: r1}\n"
                           "capture: {path: " + capture_path + ", block_size: 16}\n";
  config::ConfigOr<config::RouterConfig> cfg = config::ParseRouterConfig(yaml, "serve.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.error.ToString();
  router::RouterOptions o;
  o.listen = config::HostPort{"127.0.0.1", 0};
  o.log = false;
  auto serve = std::make_unique<router::Router>(std::move(*cfg.value), o);
  ASSERT_TRUE(serve->Start().ok());
  ASSERT_TRUE(WaitFor([&] {
    auto r = http::Fetch("127.0.0.1", serve->port(), "GET", "/readyz");
    return r && r->status == 200;
  }));

  // Six groups of four prompts (a 160-token shared system prompt, a 20-token question).
  bench::BenchConfig c;
  c.target = {"127.0.0.1", serve->port()};
  c.model = kTestModel;
  c.workload.kind = workload::WorkloadKind::kSharedPrefix;
  c.workload.num_groups = 6;
  c.workload.num_prompts_per_group = 4;
  c.workload.system_prompt_len = workload::LengthDist::Fixed(160);
  c.workload.question_len = workload::LengthDist::Fixed(20);
  c.workload.output_len = workload::LengthDist::Fixed(6);
  c.arrivals.kind = workload::ArrivalKind::kPoisson;
  c.arrivals.stages = {{100.0}};
  c.arrivals.num_requests = 120;
  c.fleet = {{"127.0.0.1", fleet.port(0)}, {"127.0.0.1", fleet.port(1)}};
  c.scrape_interval_s = 0.05;
  c.drain_timeout_s = 10.0;
  c.first_byte_timeout_s = 10.0;
  const bench::BenchResult live = bench::RunBench(c);
  ASSERT_EQ(live.error, "");
  ASSERT_EQ(live.summary.succeeded, 120);
  serve.reset();  // stops the router: the capture's buffer is written

  // The same requests: 120 lines, each its request's lengths, every one answered.
  const std::string text = Slurp(capture_path);
  workload::TraceParseResult parsed = workload::ParseTraceMooncake(text, capture_path, 16);
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  ASSERT_EQ(parsed.rows.size(), 120u);
  EXPECT_EQ(static_cast<size_t>(std::count(text.begin(), text.end(), '\n')), 120u);
  for (const workload::TraceRow& row : parsed.rows) {
    EXPECT_EQ(row.context_tokens, 180);
    EXPECT_EQ(row.generated_tokens, 6);
    ASSERT_EQ(row.hash_ids.size(), 12u);  // ceil(180 / 16)
  }
  size_t answered = 0;
  for (size_t at = text.find("\"status\": 200"); at != std::string::npos; at = text.find("\"status\": 200", at + 1)) {
    ++answered;
  }
  EXPECT_EQ(answered, 120u);
  // The same sharing: six distinct ten-block system prompts, and a tail per prompt (the
  // question's blocks; the tenth block holds the system prompt's last tokens only).
  std::unordered_set<uint64_t> first_ids, distinct;
  for (const workload::TraceRow& row : parsed.rows) {
    first_ids.insert(row.hash_ids[0]);
    distinct.insert(row.hash_ids.begin(), row.hash_ids.end());
  }
  EXPECT_EQ(first_ids.size(), 6u);
  EXPECT_EQ(distinct.size(), 6u * 10 + 24u * 2);
  // Every prompt's first sight costs its blocks; repeats of a prompt hit all but the last
  // partial block (the engine would recompute its last token anyway).
  const double ideal = IdealHitRate(parsed.rows, 16);
  EXPECT_GT(ideal, 0.8);

  // Replayed by simulate: the same fleet shape, the same policy (serve's default).
  config::ConfigOr<config::Scenario> scenario = config::ParseScenario(
      "seed: 1\n"
      "workload: {type: trace, format: mooncake, path: " + capture_path + ", block_size: 16}\n"
      "fleet: {replicas: 2, kv_blocks: 2048, max_model_len: 8192}\n",
      "replay.yaml", dir.string());
  ASSERT_TRUE(scenario.ok()) << scenario.error.ToString();
  const simulate::SimulationResult replay = simulate::RunSimulation(*scenario.value, "kvroute", ideal);
  EXPECT_EQ(replay.report.succeeded, 120);
  EXPECT_NEAR(replay.report.prefix_hit_rate, live.summary.prefix_hit_rate, 0.03)
      << "live " << live.summary.prefix_hit_rate << " replay " << replay.report.prefix_hit_rate;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvroute
