// `kvroute doctor --trace`: what the capture says the fleet got, the fleet's shape from its
// /metrics, the pick, and the whole run against two kvroute sim replicas over loopback.
#include "apps/doctor/trace_compare.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/doctor/trace_run.h"
#include "apps/sim/fleet.h"
#include "support/sim_replica.h"

namespace kvroute::doctor {
namespace {

TEST(ObserveTraceTest, ReadsTheCapturesOutcomeFields) {
  const std::string text =
      R"({"timestamp": 1000, "input_length": 100, "output_length": 5, "hash_ids": [0], "status": 200, "ttft_ms": 20, "cached_tokens": 50})"
      "\n"
      R"({"timestamp": 3000, "input_length": 300, "output_length": 5, "hash_ids": [0], "status": 200, "ttft_ms": 40})"
      "\n\n"
      R"({"timestamp": 2000, "input_length": 100, "output_length": 0, "hash_ids": [1], "status": 503, "cached_tokens": 0})"
      "\n";
  const TraceObserved o = ObserveTrace(text);
  EXPECT_EQ(o.requests, 3);
  ASSERT_TRUE(o.ok.has_value());
  EXPECT_EQ(*o.ok, 2);
  EXPECT_DOUBLE_EQ(o.span_s, 2.0);
  ASSERT_TRUE(o.hit_rate.has_value());
  EXPECT_DOUBLE_EQ(*o.hit_rate, 50.0 / 200.0);  // over the lines that report cached tokens
  EXPECT_DOUBLE_EQ(*o.ttft_p50_s, 0.020);
  EXPECT_DOUBLE_EQ(*o.ttft_p99_s, 0.040);
  // A public trace says nothing of outcomes: unknown, not zero.
  const TraceObserved pub = ObserveTrace(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [5]})");
  EXPECT_EQ(pub.requests, 1);
  EXPECT_FALSE(pub.ok.has_value());
  EXPECT_FALSE(pub.hit_rate.has_value());
  EXPECT_FALSE(pub.ttft_p99_s.has_value());
}

Scrape Sized(std::optional<int64_t> blocks, std::optional<int64_t> block_size) {
  Scrape s;
  s.reachable = true;
  s.any_engine_series = true;
  s.num_gpu_blocks = blocks;
  s.block_size = block_size;
  return s;
}

TEST(ShapeFromScrapesTest, CountsReplicasAndTakesTheSmallestCapacityIn16TokenBlocks) {
  std::vector<ReplicaHistory> h(4);
  h[0].scrapes = {Sized(1000, 16)};
  h[1].scrapes = {Sized(800, 32)};       // 1600 blocks of 16
  h[2].scrapes = {Sized(std::nullopt, 16)};  // says nothing of its capacity
  h[3].scrapes = {FailedScrape("connect: Connection refused", 0)};
  std::string why;
  std::optional<FleetShape> s = ShapeFromScrapes(h, &why);
  ASSERT_TRUE(s.has_value()) << why;
  EXPECT_EQ(s->replicas, 2);
  EXPECT_EQ(s->kv_blocks, 1000);
  EXPECT_EQ(s->note,
            "2 replicas of 1000 KV blocks, from their /metrics (1 more without a KV capacity left out) "
            "(their 32-token blocks counted as 16-token ones)");
  EXPECT_FALSE(ShapeFromScrapes({h[2], h[3]}, &why).has_value());
  EXPECT_EQ(why, "no replica reports its KV capacity (vllm:cache_config_info num_gpu_blocks); give --fleet");
}

report::PolicyReport Policy(std::string name, double goodput, double ttft_p99, double hit) {
  report::PolicyReport r;
  r.policy = std::move(name);
  r.requests = r.succeeded = 10;
  r.goodput_requests_per_s = goodput;
  r.ttft_s.p50 = ttft_p99 / 2;
  r.ttft_s.p99 = ttft_p99;
  r.prefix_hit_rate = hit;
  return r;
}

TEST(RenderTraceComparisonTest, PicksTheMostGoodputThenTheLowestTtftP99) {
  const std::vector<report::PolicyReport> rs = {Policy("a", 9.0, 0.100, 0.5), Policy("b", 10.0, 0.300, 0.6),
                                                Policy("c", 9.96, 0.200, 0.4), Policy("d", 9.97, 0.201, 0.4)};
  EXPECT_EQ(BestPolicy(rs), "c");  // b, c and d within 0.5% of b's goodput; c has the lowest p99
  TraceObserved o;
  o.requests = 10;
  o.ok = 8;
  o.span_s = 2.0;
  o.ttft_p50_s = 0.05;
  o.ttft_p99_s = 1.5;
  EXPECT_EQ(RenderTraceComparison(o, rs, "### t"),
            "### t\n\n"
            "| routing | requests | ok | goodput/s | hit rate | TTFT p50 | TTFT p99 |\n"
            "|---|--:|--:|--:|--:|--:|--:|\n"
            "| the fleet (captured) | 10 | 8 | 4.00 | - | 50 ms | 1.50 s |\n"
            "| a | 10 | 10 | 9.00 | 50.0% | 50 ms | 100 ms |\n"
            "| b | 10 | 10 | 10.00 | 60.0% | 150 ms | 300 ms |\n"
            "| c | 10 | 10 | 9.96 | 40.0% | 100 ms | 200 ms |\n"
            "| d | 10 | 10 | 9.97 | 40.0% | 100 ms | 201 ms |\n"
            "\nWould pick: c (the most goodput on this traffic and fleet, then the lowest TTFT p99; "
            "tied with d; the fleet's row is what it got, measured at the router)\n");
}

TEST(TraceRunTest, ComparesEveryPolicyOnTheLiveFleetsShape) {
  sim::Fleet fleet({test_support::SimReplica({.name = "r0", .kv_blocks = 700}),
                    test_support::SimReplica({.name = "r1", .kv_blocks = 900})},
                   1);
  ASSERT_TRUE(fleet.Start().ok());
  const std::filesystem::path path = std::filesystem::path(::testing::TempDir()) / "kvroute-doctor-trace.jsonl";
  {
    std::ofstream f(path);
    for (int i = 0; i < 40; ++i) {
      // Four groups of requests sharing two 16-token blocks, then one of their own.
      f << "{\"timestamp\": " << i * 50 << ", \"input_length\": 40, \"output_length\": 4, \"hash_ids\": ["
        << (i % 4) * 2 << ", " << (i % 4) * 2 + 1 << ", " << 100 + i << "], \"status\": 200, \"ttft_ms\": 30}\n";
    }
  }
  CollectOptions co;
  co.targets = {{"r0", "127.0.0.1", fleet.port(0)}, {"r1", "127.0.0.1", fleet.port(1)}};
  co.timeout_s = 5;
  TraceRun run;
  run.trace = path.string();
  run.block_size = 16;
  run.policies = "round-robin,kvroute";
  run.quiet = true;
  ::testing::internal::CaptureStdout();
  const int rc = RunTraceCompare(run, &co);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("Fleet: 2 replicas of 700 KV blocks, from their /metrics;"), std::string::npos) << out;
  EXPECT_NE(out.find("| the fleet (captured) | 40 | 40 | 20.51 | - | 30 ms | 30 ms |"), std::string::npos) << out;
  EXPECT_NE(out.find("| round-robin | 40 | 40 |"), std::string::npos) << out;
  EXPECT_NE(out.find("| kvroute | 40 | 40 |"), std::string::npos) << out;
  EXPECT_NE(out.find("Would pick: "), std::string::npos) << out;
  std::filesystem::remove(path);

  // Nothing to read the shape from: says so, exit 1.
  CollectOptions none;
  none.targets = {{"gone", "127.0.0.1", 1}};
  none.timeout_s = 1;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunTraceCompare(run, &none), 1);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("no replica answered with vLLM metrics; give --fleet"),
            std::string::npos);
}

}  // namespace
}  // namespace kvroute::doctor
