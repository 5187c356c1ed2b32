#include <gtest/gtest.h>

#include <map>
#include <unordered_set>

#include "config/scenario_config.h"
#include "core/metrics/engine_metrics.h"
#include "core/sched/dynamo_cost.h"
#include "apps/simulate/simulator.h"
#include "testdata.h"
#include "support/test_paths.h"

namespace kvroute::simulate {
namespace {

using config::Scenario;
using testing::MustParse;

// A small shared-prefix fleet: 4 replicas, 8 groups of 2k-token system prompts, a KV
// cache that holds only a few of them per replica.
const char* kSharedPrefix = R"(
name: small
seed: 3
workload:
  type: shared-prefix
  num_groups: 8
  num_prompts_per_group: 8
  system_prompt_len: 2000
  question_len: {min: 50, max: 150, mean: 100, std_dev: 30}
  output_len: {min: 20, max: 120, mean: 60, std_dev: 30}
arrivals:
  process: poisson
  rate: 24
  num_requests: 300
fleet:
  replicas: 4
  engine_preset: llama3-8b-h100
  kv_blocks: 700
  scrape_interval_s: 0.05
  network_delay_s: 0.001
slo: {ttft_s: 0.5}
)";

TEST(OracleTest, SharedPrefixExact) {
  // 2 groups x 1 prompt, 160 + 16 tokens: each prompt is sent twice (one shuffled cycle
  // each); a first sighting hits nothing, a second everything up to the cap
  // floor(175/16)*16 = 160.
  Scenario s = MustParse(R"(
workload: {type: shared-prefix, num_groups: 2, num_prompts_per_group: 1,
           system_prompt_len: 160, question_len: 16, output_len: 4}
arrivals: {process: constant, rate: 1, num_requests: 4}
)");
  EXPECT_DOUBLE_EQ(ComputeOracleHitRate(s), 320.0 / (4 * 176));
}

TEST(SimulateTest, ConservesRequestsAndTokensAndIsDeterministic) {
  Scenario s = MustParse(kSharedPrefix);
  SimulationResult a = RunSimulation(s, "round-robin", -1);
  SimulationResult b = RunSimulation(s, "round-robin", -1);
  ASSERT_EQ(a.error, "");
  ASSERT_EQ(a.records.size(), 300u);
  EXPECT_EQ(a.report.succeeded, 300);
  // Outputs run to max_tokens: the total equals the workload's.
  workload::RequestGenerator gen(s.workload, s.arrivals, s.seed);
  workload::RequestSpec spec;
  std::map<uint64_t, int64_t> want_out;
  while (gen.Next(&spec)) want_out[spec.id] = spec.max_tokens;
  for (const auto& r : a.records) {
    EXPECT_EQ(r.output_tokens, want_out[r.id]) << r.id;
    EXPECT_GT(r.ttft_s, 2 * s.fleet.network_delay_s);  // there and back at least
    EXPECT_LE(r.ttft_s, r.e2e_s);
    EXPECT_GE(r.endpoint, 0);
    EXPECT_LT(r.endpoint, 4);
  }
  // Round-robin: equal shares.
  std::map<int32_t, int> per_endpoint;
  for (const auto& r : a.records) per_endpoint[r.endpoint]++;
  for (const auto& [e, n] : per_endpoint) EXPECT_EQ(n, 75);
  EXPECT_EQ(a.report.ttft_s.p99, b.report.ttft_s.p99);
  EXPECT_EQ(a.report.output_tokens_per_s, b.report.output_tokens_per_s);
  EXPECT_EQ(a.report.prefix_hit_rate, b.report.prefix_hit_rate);
  EXPECT_EQ(a.events, b.events);
}

TEST(SimulateTest, KvrouteBeatsRoundRobinOnSharedPrefixes) {
  Scenario s = MustParse(kSharedPrefix);
  const double oracle = ComputeOracleHitRate(s);
  SimulationResult rr = RunSimulation(s, "round-robin", oracle);
  SimulationResult kv = RunSimulation(s, "kvroute", oracle);
  ASSERT_EQ(kv.error, "");
  EXPECT_GT(kv.report.prefix_hit_rate, rr.report.prefix_hit_rate + 0.1)
      << kv.report.prefix_hit_rate << " vs " << rr.report.prefix_hit_rate;
  EXPECT_LE(kv.report.request_cached_fraction, oracle + 1e-12);
  EXPECT_LE(rr.report.request_cached_fraction, oracle + 1e-12);
  EXPECT_GE(kv.report.output_tokens_per_s, rr.report.output_tokens_per_s * 0.99);
  EXPECT_LT(kv.report.ttft_s.p50, rr.report.ttft_s.p50);
}

// The 2026 peers in virtual time: llm-d-precise and dynamo-kv are defined by the engines'
// KV-cache events, so they run with events even when the scenario leaves them off (and
// report them); llm-d-sticky runs without. All three keep the prefix groups together.
TEST(SimulateTest, PeersOnEventsRunWithEventsOthersWithout) {
  Scenario s = MustParse(kSharedPrefix);
  ASSERT_FALSE(s.kv_events.enabled);
  const double oracle = ComputeOracleHitRate(s);
  SimulationResult rr = RunSimulation(s, "round-robin", oracle);
  for (const char* policy : {"llm-d-sticky", "llm-d-precise", "dynamo-kv"}) {
    SCOPED_TRACE(policy);
    SimulationResult r = RunSimulation(s, policy, oracle);
    ASSERT_EQ(r.error, "");
    EXPECT_EQ(r.report.policy, policy);
    EXPECT_EQ(r.report.succeeded, 300);
    const bool events = std::string(policy) != "llm-d-sticky";
    EXPECT_EQ(r.report.kv_events_enabled, events);
    if (events) {
      EXPECT_GT(r.report.kv_batches, 0);
      EXPECT_GE(r.report.receipts, r.report.receipt_picks * 9 / 10);  // live after the first batches
    }
    EXPECT_GT(r.report.prefix_hit_rate, rr.report.prefix_hit_rate + 0.1)
        << r.report.prefix_hit_rate << " vs " << rr.report.prefix_hit_rate;
  }
}

// The routing core's latency model trains in virtual time from the engines' first tokens
// and token cadence, and the report scores its predictions (issue 24, step 1).
TEST(SimulateTest, ReportsTheLatencyModelsTrainingAndError) {
  Scenario s = MustParse(kSharedPrefix);
  SimulationResult r = RunSimulation(s, "kvroute", -1);
  ASSERT_EQ(r.error, "");
  const auto& rep = r.report;
  // Every request dispatched after the first scrape is a TTFT sample; nearly all of them
  // produce two tokens or more (TPOT).
  EXPECT_GE(rep.latency_ttft_samples, rep.succeeded * 9 / 10);
  EXPECT_LE(rep.latency_ttft_samples, rep.succeeded);
  EXPECT_GE(rep.latency_tpot_samples, rep.succeeded * 8 / 10);
  EXPECT_GT(rep.latency_ttft_scored, rep.latency_ttft_samples - 40);
  EXPECT_GE(rep.latency_ttft_mape, 0.0);
  EXPECT_LT(rep.latency_ttft_mape, 1.0);
  EXPECT_GE(rep.latency_tpot_mape, 0.0);
  EXPECT_LT(rep.latency_tpot_mape, 1.0);
}

// kvroute-slo (issue 24) runs on the routing core simulate shares with serve and epp: with
// no objective it never consults the latency model and every pick is kvroute's; with one,
// it runs the same workload to the end.
TEST(SimulateTest, KvrouteSloIsKvrouteWithoutAnObjective) {
  std::string yaml = kSharedPrefix;
  yaml.replace(yaml.find("slo: {ttft_s: 0.5}"), 18, "");
  Scenario none = MustParse(yaml);
  const SimulationResult a = RunSimulation(none, "kvroute", -1);
  const SimulationResult b = RunSimulation(none, "kvroute-slo", -1);
  ASSERT_EQ(a.error, "");
  ASSERT_EQ(b.error, "");
  EXPECT_EQ(a.report.succeeded, 300);
  EXPECT_EQ(b.report.succeeded, a.report.succeeded);
  EXPECT_EQ(b.report.ttft_s.p99, a.report.ttft_s.p99);
  EXPECT_EQ(b.report.prefix_hit_rate, a.report.prefix_hit_rate);
  EXPECT_EQ(b.report.span_s, a.report.span_s);
  Scenario with = MustParse(kSharedPrefix);
  const SimulationResult c = RunSimulation(with, "kvroute-slo", -1);
  ASSERT_EQ(c.error, "");
  EXPECT_EQ(c.report.succeeded, 300);
  EXPECT_GT(c.report.latency_ttft_scored, 200);
}

// The simulator tells the scheduler, through the routing core (RoutingCore::OnTokens),
// each request's output as it grows: one OnTokens per generated token (one per engine
// step), cumulative, before the request finishes.
struct TokenCounts {
  std::map<sched::RequestHandle, int64_t> last;
  int64_t calls = 0;
  int64_t finished_tokens = 0;
  std::vector<int64_t> active_blocks_at_end;  // per endpoint, when the core drops the scheduler
};
struct TokenCounter : sched::DynamoCostScheduler {
  TokenCounter(const Config& c, const sched::SchedulerOptions& o, TokenCounts* counts)
      : DynamoCostScheduler(c, o), counts(counts) {}
  ~TokenCounter() override {
    for (uint32_t id = 0; id < 4; ++id) counts->active_blocks_at_end.push_back(ActiveBlocks(id));
  }
  void OnTokens(sched::RequestHandle h, int64_t generated, double now_s) override {
    int64_t& last = counts->last[h];
    EXPECT_EQ(generated, last + 1) << "handle " << h;
    last = generated;
    ++counts->calls;
    DynamoCostScheduler::OnTokens(h, generated, now_s);
  }
  void OnFinished(sched::RequestHandle h, double now_s) override {
    auto it = counts->last.find(h);
    if (it != counts->last.end()) {
      counts->finished_tokens += it->second;
      counts->last.erase(it);
    }
    DynamoCostScheduler::OnFinished(h, now_s);
  }
  TokenCounts* counts;
};

TEST(SimulateTest, ReportsGeneratedTokensToTheScheduler) {
  Scenario s = MustParse(kSharedPrefix);
  sched::DynamoCostScheduler::Config config;
  config.track_output_blocks = true;
  TokenCounts counter;
  routing::CoreOptions options = SimulationCoreOptions(s, "dynamo-cost-output-blocks");
  options.scheduler_factory = [&](const sched::SchedulerOptions& o) {
    return std::make_unique<TokenCounter>(config, o, &counter);
  };
  SimulationResult r = RunSimulationWith(s, options, "dynamo-cost-output-blocks", -1);
  ASSERT_EQ(r.report.succeeded, 300);
  int64_t out = 0;
  for (const auto& rec : r.records) out += rec.output_tokens;
  EXPECT_EQ(counter.calls, out);
  EXPECT_EQ(counter.finished_tokens, out);
  EXPECT_TRUE(counter.last.empty());
  EXPECT_EQ(counter.active_blocks_at_end, (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(SimulateTest, FollowUpTurnsWaitForThePreviousTurnAndThinkTime) {
  Scenario s = MustParse(R"(
workload: {type: multi-turn, num_groups: 2, num_prompts_per_group: 3, system_prompt_len: 200,
           question_len: 20, output_len: 30, max_turns: 4, think_time_s: 0.5}
arrivals: {process: constant, rate: 50, num_requests: 48}
fleet: {replicas: 2, network_delay_s: 0.002}
)");
  SimulationResult r = RunSimulation(s, "kvroute", ComputeOracleHitRate(s));
  ASSERT_EQ(r.records.size(), 48u);
  std::map<uint64_t, report::RequestRecord> by_id;
  for (const auto& rec : r.records) by_id[rec.id] = rec;
  workload::RequestGenerator gen(s.workload, s.arrivals, s.seed);
  workload::RequestSpec spec;
  int follow_ups = 0;
  while (gen.Next(&spec)) {
    const auto& rec = by_id.at(spec.id);
    EXPECT_GE(rec.send_s, spec.arrival_s);
    if (spec.after_request >= 0) {
      const auto& prev = by_id.at(static_cast<uint64_t>(spec.after_request));
      EXPECT_GE(rec.send_s, prev.send_s + prev.e2e_s + 0.5 - 1e-9) << spec.id;
      // The previous prompt and answer are cached on the replica that served them.
      if (rec.endpoint == prev.endpoint) {
        EXPECT_GE(rec.cached_tokens, (prev.prompt_tokens + prev.output_tokens) / 16 * 16 - 16);
      }
      ++follow_ups;
    }
  }
  EXPECT_GT(follow_ups, 24);
  EXPECT_GT(r.report.request_cached_fraction, 0.5);
}

TEST(SimulateTest, MaxConcurrencyHoldsRequestsBack) {
  Scenario s = MustParse(R"(
workload: {type: random, input_len: 100, output_len: 50}
arrivals: {process: constant, rate: 1000, num_requests: 40, max_concurrency: 3}
fleet: {replicas: 2}
)");
  SimulationResult r = RunSimulation(s, "round-robin", -1);
  ASSERT_EQ(r.records.size(), 40u);
  // At every send time at most 3 requests are in flight (sent, not finished).
  for (const auto& a : r.records) {
    int live = 0;
    for (const auto& b : r.records) {
      if (b.send_s <= a.send_s && b.send_s + b.e2e_s > a.send_s) ++live;
    }
    EXPECT_LE(live, 3);
  }
}

}  // namespace
}  // namespace kvroute::simulate

namespace kvroute::simulate {
namespace {

// The oracle is an upper bound for every policy, also on a trace whose shared prefixes
// have varying lengths (short rows share a shorter prefix of the same text).
TEST(SimulateTest, OracleBoundsTheAchievedHitRateOnTheExampleTrace) {
  config::ConfigOr<Scenario> load = config::LoadScenarioFile(
      kvroute::test_support::SourceDir() + "/examples/scenarios/azure-trace.yaml");
  ASSERT_TRUE(load.ok()) << load.error.ToString();
  const double oracle = ComputeOracleHitRate(*load.value);
  EXPECT_GT(oracle, 0.2);
  for (const char* policy : {"round-robin", "gie-default", "kvroute"}) {
    SimulationResult r = RunSimulation(*load.value, policy, oracle);
    EXPECT_EQ(r.report.succeeded, 240) << policy;
    EXPECT_LE(r.report.request_cached_fraction, oracle + 1e-12) << policy;
    EXPECT_GT(r.report.request_cached_fraction, 0.0) << policy;
  }
}

}  // namespace
}  // namespace kvroute::simulate

namespace kvroute::simulate {
namespace {

// LoRA: 2 replicas that run one adapter per batch, 3 adapters named by every request.
// Mooncake's synthetic trace replayed on one replica whose cache holds everything: the
// engine's prefix hit rate equals the trace's ideal (a request's leading ids seen before,
// times 512, capped at its length, over all prompt tokens), computed here from the rows.
TEST(SimulateTest, MooncakeTraceHitsItsIdealRateWithUnboundedCache) {
  const std::string dir = kvroute::test_support::SourceDir() + "/examples/traces";
  config::ConfigOr<Scenario> load = config::ParseScenario(R"(
seed: 1
workload: {type: trace, format: mooncake, path: mooncake-synthetic.jsonl, block_size: 512,
           time_scale: 0.25}
fleet: {replicas: 1, kv_blocks: 4000000, max_model_len: 262144}
)",
                                                          "mooncake.yaml", dir);
  ASSERT_TRUE(load.ok()) << load.error.ToString();
  const std::vector<workload::TraceRow>& rows = *load.value->workload.trace;
  ASSERT_EQ(rows.size(), 3993u);
  std::unordered_set<uint64_t> seen;
  int64_t ideal = 0, total = 0;
  for (const workload::TraceRow& row : rows) {
    int64_t lead = 0;
    while (lead < static_cast<int64_t>(row.hash_ids.size()) && seen.count(row.hash_ids[lead])) {
      ++lead;
    }
    ideal += std::min(lead * 512, row.context_tokens);
    total += row.context_tokens;
    seen.insert(row.hash_ids.begin(), row.hash_ids.end());
  }
  const double ideal_rate = static_cast<double>(ideal) / static_cast<double>(total);
  EXPECT_NEAR(ideal_rate, 0.651, 0.0005);  // examples/traces/README.md
  const SimulationResult r = RunSimulation(*load.value, "round-robin", ideal_rate);
  EXPECT_EQ(r.report.succeeded, 3993);
  EXPECT_NEAR(r.report.request_cached_fraction, ideal_rate, 0.01);
}

const char* kLora = R"(
seed: 5
workload:
  type: random
  input_len: 200
  output_len: 40
  adapters: {count: 3, zipf: 1.0, share: 1.0}
arrivals: {process: poisson, rate: 40, num_requests: 200}
fleet:
  replicas: 2
  lora: {max_loras: 1, max_cpu_loras: 2, load_s: 0.05}
)";

TEST(SimulateLoraTest, ScrapesCarryTheEnginesAdaptersAndPicksNameThem) {
  Scenario s = MustParse(kLora);
  int lora_scrapes = 0, with_running = 0, with_waiting = 0;
  std::map<std::string, int> models;
  const uint64_t keys[] = {metrics::AdapterKey("adapter-0"), metrics::AdapterKey("adapter-1"),
                           metrics::AdapterKey("adapter-2")};
  auto known = [&](uint64_t k) { return k == keys[0] || k == keys[1] || k == keys[2]; };
  const uint64_t base_key = metrics::AdapterKey("meta-llama/Llama-3.1-8B-Instruct");
  const SimulationResult r = RunSimulationWith(
      s, SimulationCoreOptions(s, "round-robin"), "round-robin", -1, {}, [&](const CoreCall& c) {
        if (c.kind == CoreCall::Kind::kPick) ++models[c.model];
        if (c.kind != CoreCall::Kind::kScrape || !c.scrape.ok) return;
        const metrics::EngineMetrics& m = c.scrape.metrics;
        ASSERT_TRUE(m.Has(metrics::EngineMetrics::kLora));
        // The served base model, as the model_name label of a live scrape gives it.
        EXPECT_EQ(m.base_model_key, base_key);
        ++lora_scrapes;
        EXPECT_EQ(m.max_lora, 1);
        EXPECT_LE(m.n_running_loras, 1);  // the batch rule: one adapter runs at a time
        EXPECT_FALSE(m.lora_truncated);
        for (int i = 0; i < m.n_running_loras; ++i) EXPECT_TRUE(known(m.running_loras[i]));
        for (int i = 0; i < m.n_waiting_loras; ++i) EXPECT_TRUE(known(m.waiting_loras[i]));
        with_running += m.n_running_loras > 0;
        with_waiting += m.n_waiting_loras > 0;
      });
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.report.succeeded, 200);
  EXPECT_GT(lora_scrapes, 0);
  EXPECT_GT(with_running, 0);
  EXPECT_GT(with_waiting, 0);
  EXPECT_EQ(models.size(), 3u);  // every request names an adapter
  EXPECT_GT(models["adapter-0"], models["adapter-2"]);
  EXPECT_TRUE(r.report.lora_reported);
  EXPECT_GE(r.report.lora_loads, 3);
  EXPECT_DOUBLE_EQ(r.report.lora_adapters_per_replica, 3.0);  // round-robin spreads them
}

}  // namespace
}  // namespace kvroute::simulate

namespace kvroute::simulate {
namespace {

// The example LoRA scenario names kvroute with and without adapter affinity beside the
// peers, and both run by name. On its skew, keeping adapters together loads fewer of them
// and serves fewer adapters per replica than the same policy without the scorer
// (docs/BENCHMARKS.md, "LoRA adapters in simulate"; 1,000 of its requests here).
TEST(SimulateLoraTest, ExampleSkewComparesAdapterAffinityWithoutIt) {
  config::ConfigOr<Scenario> load = config::LoadScenarioFile(kvroute::test_support::SourceDir() +
                                                             "/examples/scenarios/lora-skew.yaml");
  ASSERT_TRUE(load.ok()) << load.error.ToString();
  Scenario& s = *load.value;
  const std::vector<std::string> want = {"round-robin",  "least-request",      "gie-default",
                                         "llm-d-sticky", "llm-d-precise",      "sglang-cache-aware",
                                         "dynamo-kv",    "kvroute-lora-blind", "kvroute"};
  EXPECT_EQ(s.policies, want);
  s.arrivals.num_requests = 1000;
  const SimulationResult blind = RunSimulation(s, "kvroute-lora-blind", -1);
  const SimulationResult affine = RunSimulation(s, "kvroute", -1);
  ASSERT_EQ(blind.error, "");
  ASSERT_EQ(affine.error, "");
  EXPECT_EQ(blind.report.succeeded, 1000);
  EXPECT_EQ(affine.report.succeeded, 1000);
  ASSERT_TRUE(blind.report.lora_reported);
  ASSERT_TRUE(affine.report.lora_reported);
  EXPECT_LT(affine.report.lora_loads, blind.report.lora_loads);
  EXPECT_LT(affine.report.lora_adapters_per_replica, blind.report.lora_adapters_per_replica);
  // 8 caches of 4 and 8 adapters: every load past the 48 they hold evicts one.
  EXPECT_EQ(affine.report.lora_evictions, affine.report.lora_loads - 48);
  EXPECT_EQ(blind.report.lora_evictions, blind.report.lora_loads - 48);
}

}  // namespace
}  // namespace kvroute::simulate
