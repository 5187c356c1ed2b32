#include "config/scenario_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "support/test_paths.h"

namespace kvroute::config {
namespace {

Scenario MustParse(const std::string& yaml) {
  ConfigOr<Scenario> load = ParseScenario(yaml, "test.yaml", ".");
  EXPECT_TRUE(load.ok()) << load.error.ToString();
  return load.ok() ? *load.value : Scenario{};
}

std::string ErrorOf(const std::string& yaml) {
  ConfigOr<Scenario> load = ParseScenario(yaml, "test.yaml", ".");
  EXPECT_FALSE(load.ok()) << yaml;
  return load.error.ToString();
}

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

TEST(ScenarioTest, ParsesEveryField) {
  Scenario s = MustParse(kSharedPrefix);
  EXPECT_EQ(s.name, "small");
  EXPECT_EQ(s.source, "test.yaml");
  EXPECT_EQ(s.seed, 3u);
  EXPECT_EQ(s.workload.kind, workload::WorkloadKind::kSharedPrefix);
  EXPECT_EQ(s.workload.num_groups, 8);
  EXPECT_EQ(s.workload.system_prompt_len.components[0].min, 2000);
  EXPECT_EQ(s.workload.question_len.components[0].std_dev, 30);
  EXPECT_EQ(s.arrivals.kind, workload::ArrivalKind::kPoisson);
  ASSERT_EQ(s.arrivals.stages.size(), 1u);
  EXPECT_EQ(s.arrivals.stages[0].rate, 24);
  EXPECT_EQ(s.arrivals.num_requests, 300);
  EXPECT_EQ(s.fleet.replicas, 4);
  EXPECT_EQ(s.fleet.EngineConfigFor().num_gpu_blocks, 700);
  EXPECT_EQ(s.fleet.network_delay_s, 0.001);
  EXPECT_EQ(s.slo.ttft_s, 0.5);
  EXPECT_EQ(s.slo.tpot_s, 0.0);
}

TEST(ScenarioTest, MixturesStagesAndAliases) {
  Scenario s = MustParse(R"(
workload:
  type: multi_turn
  endpoint: chat
  output_len:
    mixture:
      - {weight: 0.7, value: 50}
      - {weight: 0.3, min: 1500, max: 2500, mean: 2000, std_dev: 200}
arrivals:
  burstiness: 0.5
  num_requests: 10
  stages:
    - {rate: 6, duration_s: 60}
    - {rate: 12}
policies: [round-robin, kvroute]
)");
  EXPECT_EQ(s.name, "test");  // the file's stem
  EXPECT_EQ(s.workload.kind, workload::WorkloadKind::kMultiTurn);
  EXPECT_EQ(s.workload.endpoint, api::Endpoint::kChatCompletions);
  ASSERT_EQ(s.workload.output_len.components.size(), 2u);
  EXPECT_EQ(s.workload.output_len.components[0].min, 50);
  EXPECT_EQ(s.workload.output_len.components[1].weight, 0.3);
  EXPECT_EQ(s.arrivals.kind, workload::ArrivalKind::kGamma);  // burstiness implies gamma
  ASSERT_EQ(s.arrivals.stages.size(), 2u);
  EXPECT_EQ(s.arrivals.stages[0].duration_s, 60);
  EXPECT_TRUE(std::isinf(s.arrivals.stages[1].duration_s));
  EXPECT_EQ(s.policies, (std::vector<std::string>{"round-robin", "kvroute"}));
}

TEST(ScenarioTest, SweepField) {
  Scenario s = MustParse(
      "workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n"
      "sweep: {rates: [5, 10.5], ttft_p99_bound_s: 1.5}\n");
  EXPECT_EQ(s.sweep_rates, (std::vector<double>{5, 10.5}));
  EXPECT_EQ(s.sweep_ttft_p99_bound_s, 1.5);
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n"
                    "sweep:\n  rates: [10, 5]\n"),
            "test.yaml:4: sweep.rates[1]: rates must ascend");
}

TEST(ScenarioTest, ErrorsNameFileLineAndField) {
  // Unknown keys: did-you-mean for a near miss, the known keys otherwise.
  EXPECT_EQ(ErrorOf("workload:\n  type: shared-prefix\n  num_group: 3\narrivals: {rate: 1, "
                    "num_requests: 1}\n"),
            "test.yaml:3: workload.num_group: unknown key 'num_group' (did you mean "
            "'num_groups'?)");
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\nfleet:\n"
                    "  replicas: 2\n  scrape_intervl_s: 0.1\n"),
            "test.yaml:5: fleet.scrape_intervl_s: unknown key 'scrape_intervl_s' (did you mean "
            "'scrape_interval_s'?)");
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\nslo:\n"
                    "  p99: 1\n"),
            "test.yaml:4: slo.p99: unknown key 'p99' (known: ttft_s, tpot_s, e2e_s)");
  // Bad values.
  EXPECT_EQ(ErrorOf("workload:\n  type: random\n  input_len: {min: 5, max: 1, mean: 3}\n"
                    "arrivals: {rate: 1, num_requests: 1}\n"),
            "test.yaml:3: workload.input_len: min must be <= max");
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals:\n  rate: fast\n  num_requests: 1\n"),
            "test.yaml:3: arrivals.rate: must be a number (got 'fast')");
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals:\n  rate: 1\n  num_requests: 1.5\n"),
            "test.yaml:4: arrivals.num_requests: must be an integer (got '1.5')");
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals: {rate: 1}\n"),
            "test.yaml:2: arrivals: needs num_requests, duration_s or finite stage durations");
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\nfleet:\n"
                    "  engine_preset: a100\n"),
            "test.yaml:4: fleet.engine_preset: unknown preset 'a100' (known: llama3-8b-h100, "
            "small-kv, qwen3-32b-tp2-h100)");
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\nfleet:\n"
                    "  replicas: 0\n"),
            "test.yaml:4: fleet.replicas: must be >= 1 (got 0)");
  EXPECT_EQ(ErrorOf("workload:\n  type: randm\n"),
            "test.yaml:2: workload.type: unknown type 'randm' (did you mean 'random'?)");
  EXPECT_EQ(ErrorOf("workload:\n  type: trace\n  path: /nonexistent.csv\n"),
            "test.yaml:3: workload.path: cannot read /nonexistent.csv: No such file or "
            "directory");
  EXPECT_EQ(ErrorOf("workload:\n  num_groups: 2\n"), "test.yaml:2: workload.type: required");
  EXPECT_EQ(ErrorOf("name: x\nworkload: {type: random}\n"), "test.yaml:1: arrivals: required");
  EXPECT_EQ(ErrorOf("- a\n"), "test.yaml:1: the top level must be a mapping");
  // YAML syntax.
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals: {rate: 1, num_requests: 1\nslo: {}\n"),
            "test.yaml:3: YAML syntax error: end of map flow not found (column 4)");
  // Missing file.
  EXPECT_EQ(LoadScenarioFile("/nonexistent/s.yaml").error.ToString(),
            "/nonexistent/s.yaml: cannot read file: No such file or directory");
}

TEST(ScenarioTest, ExampleScenariosLoad) {
  const std::filesystem::path dir =
      std::filesystem::path(kvroute::test_support::SourceDir()) / "examples" / "scenarios";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ConfigOr<Scenario> load = LoadScenarioFile(entry.path().string());
    EXPECT_TRUE(load.ok()) << load.error.ToString();
    ++n;
  }
  EXPECT_GE(n, 5);
}

TEST(ScenarioConfigTest, FaultsParseAndAreChecked) {
  const std::string base =
      "workload: {type: random, input_len: 10, output_len: 5}\n"
      "arrivals: {rate: 1, num_requests: 2}\n"
      "fleet: {replicas: 3}\n";
  auto ok = ParseScenario(base + "faults:\n  - {replica: 2, kind: crash, at: 30s, duration: 10s}\n"
                                 "  - {replica: 0, kind: slow, factor: 3}\n",
                          "f.yaml", ".");
  ASSERT_TRUE(ok.ok()) << ok.error.ToString();
  ASSERT_EQ(ok.value->faults.size(), 2u);
  EXPECT_EQ(ok.value->faults[0].replica, 2);
  EXPECT_EQ(ok.value->faults[0].spec.kind, fault::FaultKind::kCrash);
  EXPECT_DOUBLE_EQ(ok.value->faults[0].spec.at_s, 30.0);
  EXPECT_DOUBLE_EQ(*ok.value->faults[0].spec.duration_s, 10.0);
  EXPECT_DOUBLE_EQ(ok.value->faults[1].spec.factor, 3.0);
  auto err = [&](const std::string& faults) {
    auto r = ParseScenario(base + faults, "f.yaml", ".");
    EXPECT_FALSE(r.ok());
    return r.error.ToString();
  };
  EXPECT_EQ(err("faults: [{replica: 3, kind: crash}]\n"),
            "f.yaml:4: faults[0].replica: must be <= 2 (got 3)");
  EXPECT_EQ(err("faults: [{kind: crash}]\n"), "f.yaml:4: faults[0].replica: required");
  EXPECT_EQ(err("faults: [{replica: 0, kind: hang}]\n"),
            "f.yaml:4: faults[0].kind: fault kind 'hang' is not modelled by simulate (crash, "
            "slow, restart); use it with `kvroute sim`");
  EXPECT_EQ(err("faults: [{replica: 0, kind: crash, duraton: 1s}]\n"),
            "f.yaml:4: faults[0].duraton: unknown key 'duraton' (did you mean 'duration'?)");
}

TEST(ScenarioConfigTest, FlowAndTenantsParseAndAreChecked) {
  const std::string base = "workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n";
  Scenario none = MustParse(base);
  EXPECT_FALSE(none.flow.enabled);
  EXPECT_TRUE(none.tenants.empty());
  Scenario s = MustParse(base +
                         "flow: {enabled: true, max_requests: 10, ttl: 2s, no_endpoint_ttl: 500ms,\n"
                         "       fairness: global, ordering: earliest_deadline,\n"
                         "       slo_aware: false, slo_admit_fraction: 0.3, slo_release_fraction: 0.2}\n"
                         "tenants:\n"
                         "  - {name: interactive, share: 0.25, priority: 0}\n"
                         "  - {name: batch, share: 0.75, priority: -1}\n");
  EXPECT_TRUE(s.flow.enabled);
  EXPECT_EQ(s.flow.options.max_requests, 10u);
  EXPECT_DOUBLE_EQ(s.flow.options.default_ttl_s, 2.0);
  EXPECT_DOUBLE_EQ(s.flow.options.no_endpoint_ttl_s, 0.5);
  EXPECT_EQ(s.flow.options.fairness, flow::Fairness::kGlobal);
  EXPECT_EQ(s.flow.options.ordering, flow::Ordering::kEarliestDeadline);
  EXPECT_FALSE(s.flow.options.slo_aware);
  EXPECT_DOUBLE_EQ(s.flow.options.slo_admit_fraction, 0.3);
  EXPECT_DOUBLE_EQ(s.flow.options.slo_release_fraction, 0.2);
  EXPECT_TRUE(none.flow.options.slo_aware);
  EXPECT_EQ(ErrorOf(base + "flow: {slo_admit_fraction: -1}\n"),
            "test.yaml:3: flow.slo_admit_fraction: must be in 0..1");
  EXPECT_EQ(ErrorOf(base + "flow: {slo_release_fraction: 1.5}\n"),
            "test.yaml:3: flow.slo_release_fraction: must be in 0..1");
  ASSERT_EQ(s.tenants.size(), 2u);
  EXPECT_EQ(s.tenants[1].name, "batch");
  EXPECT_DOUBLE_EQ(s.tenants[1].share, 0.75);
  EXPECT_EQ(s.tenants[1].priority, -1);
  EXPECT_EQ(ErrorOf(base + "flow: {enabld: true}\n"),
            "test.yaml:3: flow.enabld: unknown key 'enabld' (did you mean 'enabled'?)");
  EXPECT_EQ(ErrorOf(base + "flow: {max_requests: 0}\n"),
            "test.yaml:3: flow.max_requests: must be >= 1 (got 0)");
  EXPECT_EQ(ErrorOf(base + "tenants: [{name: a, share: 0}]\n"),
            "test.yaml:3: tenants[0].share: must be > 0");
  EXPECT_EQ(ErrorOf(base + "tenants: [{name: a}, {name: a}]\n"),
            "test.yaml:3: tenants[1].name: duplicate tenant 'a'");
}

// fleet.groups: replicas by region, each group with every per-fleet knob; the knobs next
// to `groups` are the groups' defaults.
TEST(ScenarioConfigTest, FleetGroupsParse) {
  Scenario s = MustParse(R"(
workload: {type: random, input_len: 10, output_len: 5}
arrivals: {rate: 1, num_requests: 2}
fleet:
  engine_preset: small-kv
  kv_blocks: 900
  scrape_interval_s: 0.1
  groups:
    - {replicas: 3, region: us-east, zone: us-east-1a, network_delay_s: 0.0005}
    - replicas: 2
      region: eu-west
      network_delay_s: 0.035
      engine_preset: llama3-8b-h100
      kv_blocks: 0
      max_num_seqs: 64
      max_num_batched_tokens: 4096
      max_model_len: 16384
router: {region: us-east}
)");
  EXPECT_EQ(s.router_region, "us-east");
  EXPECT_EQ(s.fleet.replicas, 5);
  EXPECT_EQ(s.fleet.scrape_interval_s, 0.1);
  ASSERT_EQ(s.fleet.groups.size(), 2u);
  const FleetGroup& a = s.fleet.groups[0];
  EXPECT_EQ(a.replicas, 3);
  EXPECT_EQ(a.region, "us-east");
  EXPECT_EQ(a.zone, "us-east-1a");
  EXPECT_EQ(a.engine_preset, "small-kv");  // the fleet-level default
  EXPECT_EQ(a.EngineConfigFor().num_gpu_blocks, 900);
  EXPECT_EQ(a.network_delay_s, 0.0005);
  const FleetGroup& b = s.fleet.groups[1];
  EXPECT_EQ(b.replicas, 2);
  EXPECT_EQ(b.region, "eu-west");
  EXPECT_EQ(b.zone, "");
  EXPECT_EQ(b.network_delay_s, 0.035);
  const engine::EngineConfig bc = b.EngineConfigFor();
  EXPECT_EQ(bc.num_gpu_blocks, engine::PresetConfig("llama3-8b-h100")->num_gpu_blocks);
  EXPECT_EQ(bc.max_num_seqs, 64);
  EXPECT_EQ(bc.max_num_batched_tokens, 4096);
  EXPECT_EQ(bc.max_model_len, 16384);
  EXPECT_EQ(s.fleet.Groups().size(), 2u);
  // Faults address replicas across groups (ids run group after group).
  EXPECT_TRUE(ParseScenario("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n"
                            "fleet: {groups: [{replicas: 2}, {replicas: 2}]}\n"
                            "faults: [{replica: 3, kind: crash}]\n",
                            "test.yaml", ".")
                  .ok());
}

TEST(ScenarioConfigTest, FlatFleetIsOneGroup) {
  Scenario s = MustParse(kSharedPrefix);
  EXPECT_TRUE(s.fleet.groups.empty());
  EXPECT_EQ(s.router_region, "");
  const std::vector<FleetGroup> groups = s.fleet.Groups();
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].replicas, 4);
  EXPECT_EQ(groups[0].region, "");
  EXPECT_EQ(groups[0].network_delay_s, 0.001);
  EXPECT_EQ(groups[0].EngineConfigFor().num_gpu_blocks, 700);
  // The flat form takes a region too.
  Scenario r = MustParse("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n"
                         "fleet: {replicas: 2, region: ap-south}\nrouter: {region: ap-south}\n");
  EXPECT_EQ(r.fleet.Groups()[0].region, "ap-south");
  EXPECT_EQ(r.router_region, "ap-south");
}

TEST(ScenarioConfigTest, FleetGroupAndRouterErrorsNameFileLineAndField) {
  const std::string head = "workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n";
  // What follows `head` (the fleet, sometimes faults), and the error it gives.
  const std::pair<std::string, std::string> cases[] = {
      {"fleet:\n  groups:\n    - {replicas: 2, region: a}\n"
       "    - {replicas: 2, region: b, network_delay_s: -1}\n",
       "test.yaml:6: fleet.groups[1].network_delay_s: must be >= 0"},
      {"fleet:\n  groups:\n    - {replicas: 2, regoin: a}\n",
       "test.yaml:5: fleet.groups[0].regoin: unknown key 'regoin' (did you mean 'region'?)"},
      {"fleet:\n  groups:\n    - {region: a}\n", "test.yaml:5: fleet.groups[0].replicas: required"},
      {"fleet:\n  groups:\n    - {replicas: 0, region: a}\n",
       "test.yaml:5: fleet.groups[0].replicas: must be >= 1 (got 0)"},
      {"fleet:\n  groups:\n    - {replicas: 1, engine_preset: h200}\n",
       "test.yaml:5: fleet.groups[0].engine_preset: unknown preset 'h200' (known: "
       "llama3-8b-h100, small-kv, qwen3-32b-tp2-h100)"},
      {"fleet:\n  groups:\n    - {replicas: 1, kv_blocks: 1}\n",
       "test.yaml:5: fleet.groups[0].kv_blocks: must be 0 (the preset's) or >= 2 (got 1)"},
      {"fleet:\n  groups:\n    - {replicas: 1, region: ''}\n",
       "test.yaml:5: fleet.groups[0].region: must not be empty"},
      {"fleet:\n  groups:\n    - 3\n",
       "test.yaml:5: fleet.groups[0]: must be a mapping of replicas, region, "
       "network_delay_s, ..."},
      {"fleet:\n  groups: []\n",
       "test.yaml:4: fleet.groups: must be a non-empty list of replica groups"},
      {"fleet:\n  replicas: 4\n  groups: [{replicas: 2}]\n",
       "test.yaml:4: fleet.replicas: use either replicas or groups"},
      {"fleet:\n  groups: [{replicas: 2, scrape_interval_s: 1}]\n",
       "test.yaml:4: fleet.groups[0].scrape_interval_s: unknown key 'scrape_interval_s' "
       "(known: replicas, region, zone, engine_preset, kv_blocks, max_num_seqs, "
       "max_num_batched_tokens, max_model_len, network_delay_s, role, lora)"},
      {"fleet: {groups: [{replicas: 2}]}\nfaults: [{replica: 2, kind: crash}]\n",
       "test.yaml:4: faults[0].replica: must be <= 1 (got 2)"},
  };
  for (const auto& [rest, error] : cases) EXPECT_EQ(ErrorOf(head + rest), error) << rest;
  const std::string fleet =
      head + "fleet:\n  groups:\n    - {replicas: 2, region: us-east}\n"
             "    - {replicas: 2, region: eu-west}\n";
  EXPECT_EQ(ErrorOf(fleet + "router:\n  region: us-west\n"),
            "test.yaml:8: router.region: no fleet group has region 'us-west' (regions: us-east, "
            "eu-west)");
  EXPECT_EQ(ErrorOf(fleet + "router:\n  zone: a\n"),
            "test.yaml:8: router.zone: unknown key 'zone' (known: region, replicas)");
  EXPECT_EQ(ErrorOf(fleet + "router: {}\n"), "test.yaml:7: router.region: required");
  EXPECT_EQ(ErrorOf(head + "fleet: {replicas: 2}\nrouter: {region: us-east}\n"),
            "test.yaml:4: router.region: no fleet replica has a region (set "
            "fleet.groups[].region)");
}

TEST(ScenarioConfigTest, KvEventsAndRouterReplicasParse) {
  // Defaults: events off, 20 ms, no loss, replay, 10,000 steps; one router replica.
  const Scenario d = MustParse(kSharedPrefix);
  EXPECT_FALSE(d.kv_events.enabled);
  EXPECT_DOUBLE_EQ(d.kv_events.delay_s, 0.020);
  EXPECT_DOUBLE_EQ(d.kv_events.loss, 0.0);
  EXPECT_TRUE(d.kv_events.replay);
  EXPECT_EQ(d.kv_events.buffer_steps, 10000);
  EXPECT_EQ(d.router_replicas, 1);
  const Scenario s = MustParse(std::string(kSharedPrefix) +
                               "kv_events: {enabled: true, delay: 50ms, loss: 0.1, replay: false, "
                               "buffer_steps: 64}\nrouter: {replicas: 3}\n");
  EXPECT_TRUE(s.kv_events.enabled);
  EXPECT_DOUBLE_EQ(s.kv_events.delay_s, 0.050);
  EXPECT_DOUBLE_EQ(s.kv_events.loss, 0.1);
  EXPECT_FALSE(s.kv_events.replay);
  EXPECT_EQ(s.kv_events.buffer_steps, 64);
  EXPECT_EQ(s.router_replicas, 3);
  EXPECT_EQ(s.router_region, "");
  // A zero delay is allowed (events reach the router when the step ends).
  EXPECT_DOUBLE_EQ(MustParse(std::string(kSharedPrefix) + "kv_events: {delay: 0}\n").kv_events.delay_s,
                   0.0);
  // Both router keys together.
  const Scenario both = MustParse(
      "workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n"
      "fleet: {replicas: 2, region: us-east}\nrouter: {region: us-east, replicas: 2}\n");
  EXPECT_EQ(both.router_region, "us-east");
  EXPECT_EQ(both.router_replicas, 2);
}

TEST(ScenarioConfigTest, KvEventsAndRouterReplicasErrorsNameFileLineAndField) {
  const std::string head = "workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n";
  const std::pair<std::string, std::string> cases[] = {
      {"kv_events:\n  loss: 1.5\n", "test.yaml:4: kv_events.loss: must be in [0, 1] (got 1.5)"},
      {"kv_events:\n  loss: -0.1\n",
       "test.yaml:4: kv_events.loss: must be in [0, 1] (got -0.1)"},
      {"kv_events:\n  delay: -5ms\n",
       "test.yaml:4: kv_events.delay: must be a duration >= 0 such as 20ms, 0.05 or 0 (got "
       "'-5ms')"},
      {"kv_events:\n  enabled: yes\n",
       "test.yaml:4: kv_events.enabled: must be true or false (got 'yes')"},
      {"kv_events:\n  buffer_steps: 0\n",
       "test.yaml:4: kv_events.buffer_steps: must be >= 1 (got 0)"},
      {"kv_events:\n  replya: true\n",
       "test.yaml:4: kv_events.replya: unknown key 'replya' (did you mean 'replay'?)"},
      {"kv_events: on\n", "test.yaml:3: kv_events: must be a mapping"},
      {"router:\n  replicas: 0\n", "test.yaml:4: router.replicas: must be >= 1 (got 0)"},
      {"router:\n  replicas: two\n",
       "test.yaml:4: router.replicas: must be an integer (got 'two')"},
      {"router: {replicas: 2}\nflow:\n  enabled: true\n",
       "test.yaml:5: flow.enabled: flow control is not modelled with several router replicas "
       "(router.replicas 2)"},
  };
  for (const auto& [rest, error] : cases) EXPECT_EQ(ErrorOf(head + rest), error) << rest;
}

TEST(ScenarioConfigTest, RolesAndPdParse) {
  // Defaults: no role; the core's decider defaults, a 30 s lease, 25 GB/s, 64 tokens, and
  // the preset's bytes per token.
  const Scenario d = MustParse(kSharedPrefix);
  EXPECT_FALSE(d.HasRoles());
  EXPECT_EQ(d.fleet.Groups()[0].role, "");
  EXPECT_EQ(d.pd.options.non_cached_tokens, routing::PdOptions{}.non_cached_tokens);
  EXPECT_EQ(d.pd.options.prompt_tokens, routing::PdOptions{}.prompt_tokens);
  EXPECT_DOUBLE_EQ(d.pd.kv_lease_s, 30.0);
  EXPECT_DOUBLE_EQ(d.pd.kv_transfer_bandwidth, 25e9);
  EXPECT_EQ(d.pd.kv_min_pull_tokens, 64);
  EXPECT_EQ(d.pd.kv_bytes_per_token, 0);
  const engine::EngineConfig preset = *engine::PresetConfig("qwen3-32b-tp2-h100");
  EXPECT_EQ(d.pd.TransferModel(preset).bytes_per_token, preset.kv_bytes_per_token);
  const Scenario s = MustParse(
      "workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n"
      "fleet:\n  groups:\n    - {replicas: 3, role: prefill}\n"
      "    - {replicas: 4, role: decode}\n    - {replicas: 1, role: prefill-decode}\n"
      "    - {replicas: 1}\n"
      "pd: {non_cached_tokens: 100, prompt_tokens: 0, kv_lease_s: 2.5, "
      "kv_transfer_bandwidth: 10GB, kv_min_pull_tokens: 0, kv_bytes_per_token: 64KiB}\n");
  ASSERT_EQ(s.fleet.Groups().size(), 4u);
  EXPECT_EQ(s.fleet.Groups()[0].role, "prefill");
  EXPECT_EQ(s.fleet.Groups()[1].role, "decode");
  EXPECT_EQ(s.fleet.Groups()[2].role, "prefill-decode");
  EXPECT_EQ(s.fleet.Groups()[3].role, "");
  EXPECT_TRUE(s.HasRoles());
  EXPECT_EQ(s.pd.options.non_cached_tokens, 100);
  EXPECT_EQ(s.pd.options.prompt_tokens, 0);
  EXPECT_DOUBLE_EQ(s.pd.kv_lease_s, 2.5);
  EXPECT_DOUBLE_EQ(s.pd.kv_transfer_bandwidth, 10e9);
  EXPECT_EQ(s.pd.kv_min_pull_tokens, 0);
  EXPECT_EQ(s.pd.kv_bytes_per_token, 65536);
  EXPECT_EQ(s.pd.TransferModel(preset).bytes_per_token, 65536);
  // The flat form takes a role too.
  EXPECT_EQ(MustParse("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n"
                      "fleet: {replicas: 2, role: decode}\n")
                .fleet.Groups()[0]
                .role,
            "decode");
}

TEST(ScenarioConfigTest, RolesAndPdErrorsNameFileLineAndField) {
  const std::string head = "workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\n";
  const std::pair<std::string, std::string> cases[] = {
      {"fleet:\n  groups:\n    - {replicas: 2, role: prefil}\n",
       "test.yaml:5: fleet.groups[0].role: must be prefill, decode or prefill-decode (got "
       "'prefil') (did you mean 'prefill'?)"},
      {"fleet:\n  groups:\n    - {replicas: 2, role: both}\n",
       "test.yaml:5: fleet.groups[0].role: must be prefill, decode or prefill-decode (got "
       "'both') (known: prefill, decode, prefill-decode)"},
      {"fleet:\n  replicas: 2\n  role: ''\n",
       "test.yaml:5: fleet.role: must be prefill, decode or prefill-decode (got '') (known: "
       "prefill, decode, prefill-decode)"},
      {"fleet:\n  groups:\n    - {replicas: 2, role: prefill}\n",
       "test.yaml:4: fleet: every replica has role prefill: some group must be decode-capable "
       "(decode, prefill-decode or no role)"},
      {"pd:\n  kv_lease_s: 0\n", "test.yaml:4: pd.kv_lease_s: must be a number of seconds > 0"},
      {"pd:\n  prompt_tokens: -1\n", "test.yaml:4: pd.prompt_tokens: must be >= 0 (got -1)"},
      {"pd:\n  non_cached_tokens: many\n",
       "test.yaml:4: pd.non_cached_tokens: must be an integer (got 'many')"},
      {"pd:\n  kv_transfer_bandwidth: 0\n",
       "test.yaml:4: pd.kv_transfer_bandwidth: must be > 0"},
      {"pd:\n  kv_min_pull_tokens: -5\n",
       "test.yaml:4: pd.kv_min_pull_tokens: must be >= 0 (got -5)"},
      {"pd:\n  kv_lease: 30\n",
       "test.yaml:4: pd.kv_lease: unknown key 'kv_lease' (did you mean 'kv_lease_s'?)"},
      {"pd: 8\n", "test.yaml:3: pd: must be a mapping"},
  };
  for (const auto& [rest, error] : cases) EXPECT_EQ(ErrorOf(head + rest), error) << rest;
}

}  // namespace
}  // namespace kvroute::config

namespace kvroute::config {
namespace {

TEST(ScenarioLoraTest, GroupsTakeALoraBlockAndTheWorkloadAnAdapterPopulation) {
  Scenario s = MustParse(R"(
workload:
  type: random
  adapters: {count: 16, zipf: 1.1, share: 0.8}
arrivals: {rate: 1, num_requests: 1}
fleet:
  groups:
    - {replicas: 2, lora: {max_loras: 2, max_cpu_loras: 4, load_s: 0.05}}
    - {replicas: 1}
)");
  EXPECT_EQ(s.workload.adapters.count, 16);
  EXPECT_DOUBLE_EQ(s.workload.adapters.zipf, 1.1);
  EXPECT_DOUBLE_EQ(s.workload.adapters.share, 0.8);
  const std::vector<FleetGroup> groups = s.fleet.Groups();
  ASSERT_EQ(groups.size(), 2u);
  const engine::EngineConfig c = groups[0].EngineConfigFor();
  EXPECT_TRUE(c.lora.enabled);
  EXPECT_EQ(c.lora.max_loras, 2);
  EXPECT_EQ(c.lora.max_cpu_loras, 4);
  EXPECT_DOUBLE_EQ(c.lora.load_s, 0.05);
  EXPECT_FALSE(groups[1].EngineConfigFor().lora.enabled);
}

TEST(ScenarioLoraTest, BadLoraSettingsAreNamed) {
  EXPECT_EQ(ErrorOf("workload:\n  type: random\n  adapters: {count: 4, share: 2}\n"
                    "arrivals: {rate: 1, num_requests: 1}\n"),
            "test.yaml:3: workload.adapters.share: must be between 0 and 1");
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\nfleet:\n"
                    "  lora: {max_loras: 4, max_cpu_loras: 2}\n"),
            "test.yaml:4: fleet.lora.max_cpu_loras: must be >= max_loras (4)");
  EXPECT_EQ(ErrorOf("workload: {type: random}\narrivals: {rate: 1, num_requests: 1}\nfleet:\n"
                    "  lora: {max_lora: 4}\n"),
            "test.yaml:4: fleet.lora.max_lora: unknown key 'max_lora' (did you mean "
            "'max_loras'?)");
}

}  // namespace
}  // namespace kvroute::config

namespace kvroute::config {
namespace {

// A Mooncake trace: the format by key or by extension; a malformed line is an error that
// names the scenario's line and field, then the trace file, its line and field.
TEST(ScenarioConfigTest, ReadsMooncakeTracesAndNamesTheirErrors) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/kvroute-mc-good.jsonl";
  const std::string bad = dir + "/kvroute-mc-bad.txt";
  {
    std::ofstream(good) << R"({"timestamp": 0, "input_length": 30, "output_length": 4, "hash_ids": [5, 6]})"
                        << "\n";
    std::ofstream(bad) << R"({"timestamp": 0, "input_length": 30, "output_length": 4, "hash_ids": [5, 6]})"
                       << "\n"
                       << R"({"timestamp": 2, "input_length": 30, "output_length": 4, "hash_ids": [5]})"
                       << "\n";
  }
  const Scenario s = MustParse("workload: {type: trace, path: " + good +
                               ", block_size: 16}\narrivals: {num_requests: 5}\n");
  ASSERT_NE(s.workload.trace, nullptr);
  ASSERT_EQ(s.workload.trace->size(), 1u);
  EXPECT_EQ(s.workload.block_size, 16);
  EXPECT_EQ(s.workload.trace->front().hash_ids, (std::vector<uint64_t>{5, 6}));
  EXPECT_EQ(ErrorOf("workload:\n  type: trace\n  format: mooncake\n  block_size: 16\n  path: " +
                    bad + "\n"),
            "test.yaml:5: workload.path: " + bad +
                ":2: hash_ids: 1 ids for input_length 30 at block_size 16 (expected 2)");
  // The default block size is Mooncake's 512: two ids are too many for 30 tokens.
  EXPECT_EQ(ErrorOf("workload: {type: trace, path: " + good + "}\n"),
            "test.yaml:1: workload.path: " + good +
                ":1: hash_ids: 2 ids for input_length 30 at block_size 512 (expected 1)");
  EXPECT_EQ(ErrorOf("workload: {type: trace, format: mooncak, path: " + good + "}\n"),
            "test.yaml:1: workload.format: unknown format 'mooncak' (did you mean 'mooncake'?)");
  EXPECT_EQ(ErrorOf("workload: {type: trace, block_size: 0, path: " + good + "}\n"),
            "test.yaml:1: workload.block_size: must be >= 1");
}

}  // namespace
}  // namespace kvroute::config
