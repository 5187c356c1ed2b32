// The load generator against real loopback servers: an in-process simulated fleet on
// port 0, a port nothing listens on, and a server that always refuses.
#include "apps/bench/load_generator.h"

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_set>
#include <numeric>
#include <string>
#include <vector>

#include "apps/sim/fleet.h"
#include "support/sim_replica.h"
#include "support/stub_server.h"
#include "support/test_paths.h"

namespace kvroute::bench {
namespace {

using kvroute::test_support::ClosedPort;
using kvroute::test_support::kTestModel;
using kvroute::test_support::LoopbackServer;

// Steps back to back: fast and still ordered. Usage reports cached tokens (the bench reads
// them), as vLLM with --enable-prompt-tokens-details.
sim::ReplicaConfig SmallReplica() {
  sim::ReplicaConfig r =
      kvroute::test_support::SimReplica({.kv_blocks = 1024, .max_model_len = 4096});
  r.enable_prompt_tokens_details = true;
  return r;
}

BenchConfig SharedPrefixConfig(uint16_t port, int64_t n) {
  BenchConfig c;
  c.target = {"127.0.0.1", port};
  c.model = kTestModel;
  c.workload.kind = workload::WorkloadKind::kSharedPrefix;
  c.workload.num_groups = 2;
  c.workload.num_prompts_per_group = 4;
  c.workload.system_prompt_len = workload::LengthDist::Fixed(160);
  c.workload.question_len = workload::LengthDist::Fixed(20);
  c.workload.output_len = workload::LengthDist::Fixed(6);
  c.arrivals.kind = workload::ArrivalKind::kConstant;
  c.arrivals.stages = {{200.0}};
  c.arrivals.num_requests = n;
  c.scrape_interval_s = 0.02;
  c.drain_timeout_s = 10.0;
  c.first_byte_timeout_s = 10.0;
  return c;
}

class BenchFleetTest : public ::testing::Test {
 protected:
  void StartFleet(int n) {
    std::vector<sim::ReplicaConfig> rs(n, SmallReplica());
    fleet_ = std::make_unique<sim::Fleet>(std::move(rs), 1);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  HostPort Addr(int i) const { return {"127.0.0.1", fleet_->port(i)}; }
  std::unique_ptr<sim::Fleet> fleet_;
};

TEST_F(BenchFleetTest, SendsExactlyTheRequestsWithTheirTokens) {
  StartFleet(1);
  BenchConfig c = SharedPrefixConfig(fleet_->port(0), 24);
  c.fleet = {Addr(0)};
  BenchResult r = RunBench(c);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.model, kTestModel);
  ASSERT_EQ(r.records.size(), 24u);
  EXPECT_EQ(r.summary.requests, 24);
  EXPECT_EQ(r.summary.succeeded, 24);
  EXPECT_TRUE(r.error_details.empty());
  EXPECT_EQ(r.not_sent, 0);

  // Each record matches the request the workload generated under the same seed.
  workload::RequestGenerator gen(c.workload, c.arrivals, c.seed);
  std::vector<workload::RequestSpec> specs;
  workload::RequestSpec s;
  while (gen.Next(&s)) specs.push_back(s);
  ASSERT_EQ(specs.size(), 24u);
  int64_t cached = 0;
  for (size_t i = 0; i < r.records.size(); ++i) {
    const report::RequestRecord& rec = r.records[i];
    EXPECT_EQ(rec.id, specs[i].id);
    EXPECT_TRUE(rec.ok()) << i;
    EXPECT_EQ(rec.output_tokens, 6) << i;
    EXPECT_EQ(rec.prompt_tokens, 180) << i;
    EXPECT_GE(rec.ttft_s, 0.0);
    EXPECT_GE(rec.e2e_s, rec.ttft_s);
    EXPECT_GE(rec.send_s + 1e-3, specs[i].arrival_s);  // never early
    cached += rec.cached_tokens;
  }
  // Two 160-token system prompts shared by 24 requests: most prompt tokens hit.
  EXPECT_GT(cached, 0);

  // The hit rate comes from /metrics deltas and equals the engine's own counters; every
  // request was looked up once (no preemption in a 1024-block cache), so the per-request
  // cached tokens add up to the engine's hits.
  std::optional<engine::EngineStats> st = fleet_->Stats(0);
  ASSERT_TRUE(st.has_value());
  ASSERT_EQ(r.replicas.size(), 1u);
  EXPECT_TRUE(r.replicas[0].ok_before);
  EXPECT_TRUE(r.replicas[0].ok_after);
  EXPECT_EQ(r.replicas[0].before.prefix_queries, 0.0);
  EXPECT_EQ(r.totals.prefix_queries_tokens, st->prefix_queries_tokens);
  EXPECT_EQ(r.totals.prefix_hits_tokens, st->prefix_hits_tokens);
  EXPECT_EQ(r.totals.prefix_queries_tokens, 24 * 180);
  EXPECT_EQ(st->preemptions, 0);
  EXPECT_EQ(cached, st->prefix_hits_tokens);
  EXPECT_DOUBLE_EQ(r.summary.prefix_hit_rate,
                   static_cast<double>(st->prefix_hits_tokens) / st->prefix_queries_tokens);
  EXPECT_DOUBLE_EQ(HitRateFromScrapes(r.replicas), r.summary.prefix_hit_rate);
  EXPECT_GT(r.fleet->samples(), 0);
  EXPECT_GT(r.gaps.count(), 0);
}

TEST_F(BenchFleetTest, HitRateIsTheDeltaOverTheRun) {
  // A warm fleet: the first run's hits must not count in the second run's rate.
  StartFleet(1);
  BenchConfig c = SharedPrefixConfig(fleet_->port(0), 8);
  c.fleet = {Addr(0)};
  BenchResult first = RunBench(c);
  ASSERT_EQ(first.summary.succeeded, 8);
  std::optional<engine::EngineStats> mid = fleet_->Stats(0);
  ASSERT_TRUE(mid.has_value());
  BenchResult second = RunBench(c);  // the same prompts again: all prefixes cached now
  ASSERT_EQ(second.summary.succeeded, 8);
  std::optional<engine::EngineStats> end = fleet_->Stats(0);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(second.replicas[0].before.prefix_queries, mid->prefix_queries_tokens);
  EXPECT_EQ(second.totals.prefix_queries_tokens,
            end->prefix_queries_tokens - mid->prefix_queries_tokens);
  EXPECT_EQ(second.totals.prefix_hits_tokens, end->prefix_hits_tokens - mid->prefix_hits_tokens);
  EXPECT_GT(second.summary.prefix_hit_rate, first.summary.prefix_hit_rate);
}

TEST_F(BenchFleetTest, MultiTurnSendsEachTurnAfterThePreviousFinished) {
  StartFleet(1);
  BenchConfig c = SharedPrefixConfig(fleet_->port(0), 18);
  c.workload.kind = workload::WorkloadKind::kMultiTurn;
  c.workload.endpoint = api::Endpoint::kChatCompletions;
  c.workload.num_groups = 1;
  c.workload.num_prompts_per_group = 3;
  c.workload.max_turns = 3;
  c.workload.think_time_s = 0.01;
  c.arrivals.stages = {{500.0}};
  BenchResult r = RunBench(c);
  ASSERT_EQ(r.records.size(), 18u);
  EXPECT_EQ(r.summary.succeeded, 18);

  workload::RequestGenerator gen(c.workload, c.arrivals, c.seed);
  std::map<uint64_t, const report::RequestRecord*> by_id;
  for (const auto& rec : r.records) by_id[rec.id] = &rec;
  workload::RequestSpec s;
  int dependent = 0;
  while (gen.Next(&s)) {
    ASSERT_TRUE(by_id.count(s.id));
    if (s.after_request < 0) continue;
    ++dependent;
    const report::RequestRecord* prev = by_id.at(static_cast<uint64_t>(s.after_request));
    const report::RequestRecord* cur = by_id.at(s.id);
    EXPECT_GE(cur->send_s, prev->send_s + prev->e2e_s + s.think_time_s - 1e-3) << s.id;
    // The later turn quotes the earlier answer: its prompt is longer.
    EXPECT_GT(cur->prompt_tokens, prev->prompt_tokens) << s.id;
    EXPECT_GT(cur->cached_tokens, 0) << s.id;
  }
  EXPECT_GE(dependent, 6);  // conversations are picked at random; most have follow-ups
}

// The first `n` rows of examples/traces/mooncake-synthetic.jsonl.
std::vector<workload::TraceRow> MooncakeRows(size_t n) {
  const std::string path =
      kvroute::test_support::SourceDir() + "/examples/traces/mooncake-synthetic.jsonl";
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  workload::TraceParseResult parsed = workload::ParseTraceMooncake(ss.str(), path, 512);
  EXPECT_TRUE(parsed.ok()) << parsed.error;
  if (parsed.rows.size() > n) parsed.rows.resize(n);
  return parsed.rows;
}

TEST_F(BenchFleetTest, ReplaysAMooncakeTraceWithExactPromptsAndItsIdealHitRate) {
  // One replica whose cache holds everything: every hash id seen before is a hit, so the
  // engine's hit rate is the trace's ideal one, computed here from the ids alone.
  sim::ReplicaConfig big =
      kvroute::test_support::SimReplica({.kv_blocks = 4000000, .max_model_len = 262144});
  fleet_ = std::make_unique<sim::Fleet>(std::vector<sim::ReplicaConfig>{big}, 1);
  ASSERT_TRUE(fleet_->Start().ok());
  const std::vector<workload::TraceRow> rows = MooncakeRows(120);
  ASSERT_EQ(rows.size(), 120u);
  BenchConfig c = SharedPrefixConfig(fleet_->port(0), 120);
  c.fleet = {Addr(0)};
  c.workload.kind = workload::WorkloadKind::kTrace;
  c.workload.block_size = 512;
  c.workload.trace = std::make_shared<const std::vector<workload::TraceRow>>(rows);
  c.workload.time_scale = 50;  // ~35 s of trace in ~0.7 s
  BenchResult r = RunBench(c);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.records.size(), 120u);
  EXPECT_EQ(r.summary.succeeded, 120);

  std::unordered_set<uint64_t> seen;
  int64_t ideal = 0, total = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const workload::TraceRow& row = rows[i];
    // The text sent for each hash id tokenizes to exactly block_size tokens on the sim.
    EXPECT_EQ(r.records[i].prompt_tokens, row.context_tokens) << i;
    EXPECT_EQ(r.records[i].output_tokens, row.generated_tokens) << i;
    size_t lead = 0;
    while (lead < row.hash_ids.size() && seen.count(row.hash_ids[lead])) ++lead;
    ideal += std::min(static_cast<int64_t>(lead) * 512, row.context_tokens);
    total += row.context_tokens;
    seen.insert(row.hash_ids.begin(), row.hash_ids.end());
  }
  EXPECT_EQ(r.totals.prefix_queries_tokens, total);
  // The engine recomputes a fully cached prompt's last block (vLLM keeps one token to
  // compute), so it may miss up to one 16-token block per fully repeated request.
  EXPECT_LE(r.totals.prefix_hits_tokens, ideal);
  EXPECT_GE(r.totals.prefix_hits_tokens, ideal - 16 * 120);
  EXPECT_GT(ideal, 0);
  // This replica does not report cached tokens in usage (vLLM's default): unknown, not 0.
  EXPECT_EQ(r.records[0].cached_tokens, -1);
  EXPECT_EQ(r.summary.request_cached_fraction, -1.0);
  EXPECT_EQ(r.summary.oracle_ratio, -1.0);
}

TEST_F(BenchFleetTest, MaxConcurrencyHoldsRequestsBack) {
  StartFleet(1);
  BenchConfig c = SharedPrefixConfig(fleet_->port(0), 10);
  c.arrivals.max_concurrency = 1;
  c.arrivals.stages = {{1000.0}};
  BenchResult r = RunBench(c);
  ASSERT_EQ(r.summary.succeeded, 10);
  std::vector<report::RequestRecord> recs = r.records;
  std::sort(recs.begin(), recs.end(),
            [](const auto& a, const auto& b) { return a.send_s < b.send_s; });
  for (size_t i = 1; i < recs.size(); ++i) {
    EXPECT_GE(recs[i].send_s, recs[i - 1].send_s + recs[i - 1].e2e_s - 1e-6) << i;
  }
}

TEST(BenchErrorsTest, CountsConnectionRefusedWhenTheTargetIsDown) {
  const uint16_t port = ClosedPort();
  BenchConfig c = SharedPrefixConfig(port, 5);
  c.fleet = {{"127.0.0.1", port}};
  BenchResult r = RunBench(c);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.records.size(), 5u);
  EXPECT_EQ(r.summary.succeeded, 0);
  EXPECT_EQ(r.summary.errors_by_kind.at("upstream"), 5);
  EXPECT_EQ(r.error_details.at("connect_refused"), 5);
  EXPECT_EQ(r.error_details.size(), 1u);
  EXPECT_FALSE(r.replicas[0].ok_before);
  EXPECT_GT(r.replicas[0].scrapes_failed, 0);
  EXPECT_EQ(r.summary.prefix_hit_rate, 0.0);
  EXPECT_EQ(HitRateFromScrapes(r.replicas), -1.0);
}

TEST(BenchErrorsTest, CountsHttpErrorsByKind) {
  // A server that sheds every other request (429) and has no endpoint for the rest (503).
  int n = 0;
  LoopbackServer server([&n](std::shared_ptr<http::Exchange> ex) {
    ex->RespondError((n++ % 2) ? 429 : 503, "no");
  });
  ASSERT_EQ(server.listen_status().ToString(), "OK");
  BenchConfig c = SharedPrefixConfig(server.port(), 6);
  BenchResult r = RunBench(c);
  server.Stop();
  ASSERT_EQ(r.records.size(), 6u);
  EXPECT_EQ(r.summary.errors_by_kind.at("shed"), 3);
  EXPECT_EQ(r.summary.errors_by_kind.at("no_endpoint"), 3);
  EXPECT_EQ(r.error_details.at("http_429"), 3);
  EXPECT_EQ(r.error_details.at("http_503"), 3);
}

TEST(BenchHeadersTest, SendsTheExtraHeadersOnEveryRequest) {
  // A server that records what it is sent and sheds everything: the headers, not the
  // answers, are under test. No model given, so GET /v1/models goes first.
  std::mutex mu;
  std::vector<std::string> seen;  // "target objective tenant", one per request
  LoopbackServer server([&](std::shared_ptr<http::Exchange> ex) {
    const http::Request& req = ex->request();
    {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(std::string(req.target()) + " " +
                     std::string(req["x-gateway-inference-objective"]) + " " +
                     std::string(req["X-Tenant"]));
    }
    ex->RespondError(429, "shed");
  });
  ASSERT_EQ(server.listen_status().ToString(), "OK");
  BenchConfig c = SharedPrefixConfig(server.port(), 4);
  c.model.clear();
  c.headers = {{"x-gateway-inference-objective", "interactive"}, {"x-tenant", "a b"}};
  BenchResult r = RunBench(c);
  server.Stop();
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.error_details.at("http_429"), 4);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[0], "/v1/models interactive a b");
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_EQ(seen[i], "/v1/completions interactive a b");
}

TEST(BenchErrorsTest, RejectsAnUnusableConfig) {
  BenchConfig c = SharedPrefixConfig(1, 5);
  c.arrivals.num_requests = 0;  // no limit at all
  BenchResult r = RunBench(c);
  EXPECT_NE(r.error, "");
  EXPECT_TRUE(r.records.empty());
}

}  // namespace
}  // namespace kvroute::bench
