#include "config/fleet_config.h"

#include <gtest/gtest.h>

#include "support/test_paths.h"

namespace kvroute::config {
namespace {

FleetFile MustParse(std::string_view text) {
  ConfigOr<FleetFile> r = ParseFleetYaml(text, "t.yaml");
  EXPECT_TRUE(r.ok()) << r.error.ToString();
  return r.ok() ? *r.value : FleetFile{};
}

std::string ErrorOf(std::string_view text) {
  ConfigOr<FleetFile> r = ParseFleetYaml(text, "f.yaml");
  EXPECT_FALSE(r.ok()) << text;
  return r.error.ToString();
}

TEST(FleetConfigTest, ExampleFileParsesAndResolves) {
  ConfigOr<FleetFile> file =
      LoadFleetFile(kvroute::test_support::SourceDir() + "/examples/fleet.yaml");
  ASSERT_TRUE(file.ok()) << file.error.ToString();
  ASSERT_EQ(file.value->replicas.size(), 4u);
  EXPECT_EQ(file.value->base_port, 18001);
  EXPECT_EQ(file.value->threads, 2);
  std::vector<ReplicaConfig> out;
  ASSERT_TRUE(ResolveFleet(*file.value, {}, 0, *file.value->base_port, &out).ok());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].name, "h100-a");
  EXPECT_EQ(out[0].port, 18001);
  EXPECT_EQ(out[3].port, 18004);
  EXPECT_EQ(out[0].engine.num_gpu_blocks, 26304);
  EXPECT_EQ(out[0].engine.model_name, "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_EQ(out[2].preset, "small-kv");
  EXPECT_EQ(out[2].engine.num_gpu_blocks, 1024);
  EXPECT_EQ(out[2].engine.max_num_seqs, 64);
  EXPECT_EQ(out[2].latency_ms, 20.0);
  EXPECT_TRUE(out[3].old_metric_names);
  EXPECT_TRUE(out[3].engine.enable_prefix_caching);
  EXPECT_EQ(out[3].engine.mean_output_tokens, 200.0);
  EXPECT_EQ(out[3].engine.step.base_us, 5753);
  EXPECT_EQ(out[3].engine.step.per_prefill_token_us, 17.25);
  EXPECT_EQ(out[3].engine.step.per_context_token_us, 0.05);
  using Labels = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(out[1].labels, (Labels{{"region", "us-east"}, {"zone", "b"}}));
  EXPECT_EQ(out[2].labels, (Labels{{"region", "eu-west"}}));
}

TEST(FleetConfigTest, PromptTokensDetailsIsOffUnlessAskedFor) {
  FleetFile file = MustParse(
      "defaults:\n  enable_prompt_tokens_details: true\n"
      "replicas:\n  - {}\n  - enable_prompt_tokens_details: false\n");
  std::vector<ReplicaConfig> out;
  ASSERT_TRUE(ResolveFleet(file, {}, 3, 0, &out).ok());
  EXPECT_TRUE(out[0].enable_prompt_tokens_details);
  EXPECT_FALSE(out[1].enable_prompt_tokens_details);
  EXPECT_TRUE(out[2].enable_prompt_tokens_details);
  ASSERT_TRUE(ResolveFleet(FleetFile{}, {}, 1, 0, &out).ok());
  EXPECT_FALSE(out[0].enable_prompt_tokens_details) << "vLLM's default";
  ReplicaOverrides cli;
  cli.enable_prompt_tokens_details = true;
  ASSERT_TRUE(ResolveFleet(FleetFile{}, cli, 1, 0, &out).ok());
  EXPECT_TRUE(out[0].enable_prompt_tokens_details);
  EXPECT_EQ(ErrorOf("defaults:\n  enable_prompt_tokens_details: 1x\n"),
            "f.yaml:2: defaults.enable_prompt_tokens_details: must be true or false (got '1x')");
}

TEST(FleetConfigTest, PrecedenceIsPresetDefaultsCliReplica) {
  FleetFile file = MustParse(
      "defaults:\n  kv_blocks: 100\n  max_num_seqs: 7\n  time_scale: 2\n"
      "replicas:\n  - max_num_seqs: 9\n  - preset: small-kv\n");
  ReplicaOverrides cli;
  cli.max_num_seqs = 8;
  cli.time_scale = 0.5;
  std::vector<ReplicaConfig> out;
  ASSERT_TRUE(ResolveFleet(file, cli, 3, 9000, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].engine.max_num_seqs, 9);  // replica entry beats the flag
  EXPECT_EQ(out[1].engine.max_num_seqs, 8);  // flag beats defaults
  EXPECT_EQ(out[2].engine.max_num_seqs, 8);
  EXPECT_EQ(out[0].time_scale, 0.5);
  EXPECT_EQ(out[1].engine.num_gpu_blocks, 100);  // defaults beat the preset
  EXPECT_EQ(out[1].preset, "small-kv");
  EXPECT_EQ(out[2].port, 9002);
}

TEST(FleetConfigTest, KvEventsPortsAreBasePlusIndexUnlessTheReplicaSetsThem) {
  FleetFile file = MustParse(
      "defaults:\n  kv_events_port: 5557\n  kv_events_replay_port: 5657\n"
      "  kv_events_format: map\n  kv_events_hash: bytes\n  kv_events_topic: kv@x\n"
      "replicas:\n  - {}\n  - {}\n  - {kv_events_port: 7000}\n");
  std::vector<ReplicaConfig> out;
  ASSERT_TRUE(ResolveFleet(file, {}, 3, 9000, &out).ok());
  EXPECT_EQ(out[0].kv_events.port, 5557);
  EXPECT_EQ(out[1].kv_events.port, 5558);
  EXPECT_EQ(out[1].kv_events.replay_port, 5658);
  EXPECT_EQ(out[2].kv_events.port, 7000);  // its own entry, as written
  EXPECT_EQ(out[2].kv_events.format, "map");
  EXPECT_EQ(out[2].kv_events.hash, "bytes");
  EXPECT_EQ(out[2].kv_events.topic, "kv@x");
  ReplicaOverrides cli;
  cli.kv_events_port = 0;  // any free port stays 0 for every replica
  ASSERT_TRUE(ResolveFleet(FleetFile{}, cli, 2, 9000, &out).ok());
  EXPECT_EQ(out[1].kv_events.port, 0);
  EXPECT_FALSE(out[1].kv_events.replay_port.has_value());
  auto bad = ParseFleetYaml("defaults:\n  kv_events_format: json\n", "f.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error.ToString(), "f.yaml:2: defaults.kv_events_format: must be array or map");
  FleetFile central = MustParse("defaults:\n  kv_events_connect: tcp://10.0.0.9:5557\n");
  ASSERT_TRUE(ResolveFleet(central, {}, 2, 9000, &out).ok());
  EXPECT_EQ(out[1].kv_events.connect, "tcp://10.0.0.9:5557");
  EXPECT_FALSE(out[1].kv_events.port.has_value());
  auto bad_connect = ParseFleetYaml("defaults:\n  kv_events_connect: 10.0.0.9:5557\n", "f.yaml");
  ASSERT_FALSE(bad_connect.ok());
  EXPECT_EQ(bad_connect.error.ToString(),
            "f.yaml:2: defaults.kv_events_connect: must be a tcp://HOST:PORT address");
  FleetFile replay_only = MustParse("defaults:\n  kv_events_replay_port: 5657\n");
  EXPECT_EQ(ResolveFleet(replay_only, {}, 1, 0, &out).message(),
            "replica-0: kv_events_replay_port needs kv_events_port");
}

TEST(FleetConfigTest, ScalarForms) {
  FleetFile file = MustParse(
      "threads: 0\ndefaults:\n  max_body_bytes: 1MiB\n  hash_seed: 18446744073709551615\n"
      "  priority_scheduling: false\nreplicas:\n  - {port: 7000, max_body_bytes: 4096}\n");
  EXPECT_EQ(file.threads, 0);
  EXPECT_EQ(file.defaults.max_body_bytes, 1u << 20);
  EXPECT_EQ(file.defaults.hash_seed, UINT64_MAX);
  EXPECT_EQ(file.defaults.priority_scheduling, false);
  EXPECT_EQ(file.replicas[0].port, 7000);
  EXPECT_EQ(file.replicas[0].max_body_bytes, 4096u);
  EXPECT_TRUE(MustParse("").replicas.empty());
  EXPECT_TRUE(MustParse("# only a comment\n").replicas.empty());
}

TEST(FleetConfigTest, ErrorsNameFileLineAndField) {
  // Bad values.
  EXPECT_EQ(ErrorOf("replicas:\n  - kv_blocks: lots\n"),
            "f.yaml:2: replicas[0].kv_blocks: must be an integer (got 'lots')");
  EXPECT_EQ(ErrorOf("base_port: 18001\nreplicas:\n  - name: a\n  - name: b\n    port: 70000\n"),
            "f.yaml:5: replicas[1].port: must be <= 65535 (got 70000)");
  EXPECT_EQ(ErrorOf("defaults:\n  old_metric_names: maybe\n"),
            "f.yaml:2: defaults.old_metric_names: must be true or false (got 'maybe')");
  EXPECT_EQ(ErrorOf("defaults:\n  step:\n    base_us: fast\n"),
            "f.yaml:3: defaults.step.base_us: must be a number (got 'fast')");
  EXPECT_EQ(ErrorOf("defaults:\n  labels: [a, b]\n"),
            "f.yaml:2: defaults.labels: must be a mapping of label names to values");
  EXPECT_EQ(ErrorOf("replicas: 3\n"), "f.yaml:1: replicas: must be a list of replicas");
  EXPECT_EQ(ErrorOf("replicas:\n  - small-kv\n"), "f.yaml:2: replicas[0]: must be a mapping");
  EXPECT_EQ(ErrorOf("- a\n"), "f.yaml:1: the top level must be a mapping");
  // Unknown keys: a near miss gets a did-you-mean, anything else the list of keys.
  EXPECT_EQ(ErrorOf("defaults:\n  preset: small-kv\n  kv_block: 9\n"),
            "f.yaml:3: defaults.kv_block: unknown key 'kv_block' (did you mean 'kv_blocks'?)");
  EXPECT_EQ(ErrorOf("replicas:\n  - step: {base_us: 1, per_decode_us: 2}\n"),
            "f.yaml:2: replicas[0].step.per_decode_us: unknown key 'per_decode_us' (did you mean "
            "'per_decode_seq_us'?)");
  EXPECT_EQ(ErrorOf("base_port: 1\nthread: 2\n"),
            "f.yaml:2: thread: unknown key 'thread' (did you mean 'threads'?)");
  EXPECT_EQ(ErrorOf("defaults:\n  colour: red\n"),
            "f.yaml:2: defaults.colour: unknown key 'colour' (known: name, host, port, preset, "
            "model, kv_blocks, block_size, max_num_seqs, max_batched_tokens, max_model_len, "
            "fixed_output_tokens, mean_output_tokens, default_max_tokens, time_scale, "
            "latency_ms, old_metric_names, enable_prefix_caching, priority_scheduling, "
            "enable_prompt_tokens_details, hash_seed, output_seed, max_body_bytes, step, labels, faults, kv_events_port, "
            "kv_events_replay_port, kv_events_format, kv_events_hash, kv_events_topic, "
            "kv_events_connect, kv_lease, kv_bytes_per_token, kv_transfer_bandwidth, "
            "kv_min_pull_tokens, kv_load_failure_policy, kv_engine_id, enable_lora, max_loras, "
            "max_cpu_loras, lora_load_s, lora_modules)");
  EXPECT_EQ(ErrorOf("defaults:\n  kv_blocks: 1\n  kv_blocks: 2\n"),
            "f.yaml:3: defaults.kv_blocks: duplicate key 'kv_blocks'");
  // YAML syntax.
  EXPECT_EQ(ErrorOf("defaults:\n  labels: {region: eu\nreplicas: []\n"),
            "f.yaml:3: YAML syntax error: end of map flow not found (column 9)");
  // Missing file.
  EXPECT_EQ(LoadFleetFile("/nonexistent/fleet.yaml").error.ToString(),
            "/nonexistent/fleet.yaml: cannot read file: No such file or directory");
}

TEST(FleetConfigTest, FaultSchedules) {
  FleetFile f = MustParse(
      "defaults:\n"
      "  faults: [{kind: metrics_nan, at: 1s}]\n"
      "replicas:\n"
      "  - faults:\n"
      "      - {kind: http_error, at: 10s, duration: 5s, status: 500, fraction: 0.5}\n"
      "      - {kind: delay, delay: 250ms}\n"
      "      - {kind: stall, after_chunks: 3, duration: 0.2}\n"
      "  - {}\n");
  std::vector<ReplicaConfig> out;
  ASSERT_TRUE(ResolveFleet(f, {}, 0, 0, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  // The defaults' faults first, then the replica's own.
  ASSERT_EQ(out[0].faults.size(), 4u);
  EXPECT_EQ(out[0].faults[0].kind, fault::FaultKind::kMetricsNan);
  EXPECT_DOUBLE_EQ(out[0].faults[0].at_s, 1.0);
  EXPECT_FALSE(out[0].faults[0].duration_s.has_value());
  const fault::FaultSpec& e = out[0].faults[1];
  EXPECT_EQ(e.kind, fault::FaultKind::kHttpError);
  EXPECT_DOUBLE_EQ(e.at_s, 10.0);
  EXPECT_DOUBLE_EQ(*e.duration_s, 5.0);
  EXPECT_EQ(e.status, 500);
  EXPECT_DOUBLE_EQ(e.fraction, 0.5);
  EXPECT_DOUBLE_EQ(out[0].faults[2].delay_s, 0.25);
  EXPECT_EQ(out[0].faults[3].after_chunks, 3);
  EXPECT_DOUBLE_EQ(*out[0].faults[3].duration_s, 0.2);
  ASSERT_EQ(out[1].faults.size(), 1u);
}

TEST(FleetConfigTest, FaultsExampleParses) {
  ConfigOr<FleetFile> file =
      LoadFleetFile(kvroute::test_support::SourceDir() + "/examples/fleet-faults.yaml");
  ASSERT_TRUE(file.ok()) << file.error.ToString();
  std::vector<ReplicaConfig> out;
  ASSERT_TRUE(ResolveFleet(*file.value, {}, 0, 0, &out).ok());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].faults.size(), 4u);  // the default's metrics_slow and its own three
  EXPECT_EQ(out[0].faults[3].kind, fault::FaultKind::kCrash);
}

TEST(FleetConfigTest, FaultErrorsNameFileLineAndField) {
  EXPECT_EQ(ErrorOf("defaults:\n  faults: [{kind: hangg}]\n"),
            "f.yaml:2: defaults.faults[0].kind: unknown fault kind 'hangg' (did you mean "
            "'hang'?)");
  EXPECT_EQ(ErrorOf("replicas:\n  - faults:\n      - kind: hang\n        durration: 1s\n"),
            "f.yaml:4: replicas[0].faults[0].durration: unknown key 'durration' (did you mean "
            "'duration'?)");
  EXPECT_EQ(ErrorOf("defaults:\n  faults:\n    - {kind: hang, duration: soon}\n"),
            "f.yaml:3: defaults.faults[0].duration: must be a duration > 0 such as 5s or 250ms "
            "(got 'soon')");
  EXPECT_EQ(ErrorOf("defaults:\n  faults:\n    - {kind: hang, status: 500}\n"),
            "f.yaml:3: defaults.faults[0].status: does not apply to fault kind 'hang'");
  EXPECT_EQ(ErrorOf("defaults:\n  faults:\n    - {kind: slow, at: 2s}\n"),
            "f.yaml:3: defaults.faults[0].factor: required for fault kind 'slow'");
  EXPECT_EQ(ErrorOf("defaults:\n  faults:\n    - {at: 2s}\n"),
            "f.yaml:3: defaults.faults[0].kind: required");
  EXPECT_EQ(ErrorOf("defaults:\n  faults: hang\n"),
            "f.yaml:2: defaults.faults: must be a list of faults");
}

TEST(FleetConfigTest, ResolveErrors) {
  std::vector<ReplicaConfig> out;
  Status s = ResolveFleet(MustParse("defaults:\n  preset: nope\n"), {}, 1, 0, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "replica 0: unknown preset 'nope' (known: llama3-8b-h100, small-kv, qwen3-32b-tp2-h100)");
  s = ResolveFleet(MustParse("defaults:\n  preset: smal-kv\n"), {}, 1, 0, &out);
  EXPECT_EQ(s.message(), "replica 0: unknown preset 'smal-kv' (did you mean 'small-kv'?)");
  s = ResolveFleet(MustParse("replicas:\n  - max_num_seqs: 0\n"), {}, 1, 0, &out);
  EXPECT_EQ(s.message(), "replica-0: max_num_seqs must be >= 1");
}

}  // namespace
}  // namespace kvroute::config

namespace kvroute::config {
namespace {

// Found by the fleet_config fuzz target (CI, make fuzz): `name: !!str` (an explicit empty
// string) resolved to a replica without a name.
TEST(FleetConfigFuzzRegression, EmptyReplicaNameIsAnError) {
  EXPECT_EQ(ErrorOf("replicas:\n  - name: a\n  - name: !!str\n    labels: {zone: b}\n"),
            "f.yaml:3: replicas[1].name: must not be empty");
  EXPECT_EQ(ErrorOf("replicas:\n  - name: \"\"\n"), "f.yaml:2: replicas[0].name: must not be empty");
}

// P/D: the llm-d role label and the transfer settings.
TEST(FleetConfigTest, PdRoleLabelAndSettings) {
  using Labels = std::vector<std::pair<std::string, std::string>>;
  ConfigOr<FleetFile> file = ParseFleetYaml(
      "defaults:\n"
      "  kv_lease: 2s\n"
      "  kv_transfer_bandwidth: 10GB\n"
      "replicas:\n"
      "  - {name: p, labels: {llm-d.ai/role: prefill}, kv_engine_id: pe}\n"
      "  - name: d\n"
      "    labels: {llm-d.ai/role: decode}\n"
      "    kv_load_failure_policy: recompute\n"
      "    kv_min_pull_tokens: 0\n"
      "    kv_bytes_per_token: 64KiB\n"
      "  - {name: pd, labels: {llm-d.ai/role: prefill-decode}}\n"
      "  - {name: plain, preset: qwen3-32b-tp2-h100}\n",
      "f.yaml");
  ASSERT_TRUE(file.ok()) << file.error.ToString();
  std::vector<ReplicaConfig> out;
  ASSERT_TRUE(ResolveFleet(*file.value, {}, 0, 0, &out).ok());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].labels, (Labels{{"llm-d.ai/role", "prefill"}}));
  EXPECT_EQ(out[1].labels, (Labels{{"llm-d.ai/role", "decode"}}));
  EXPECT_EQ(out[2].labels, (Labels{{"llm-d.ai/role", "prefill-decode"}}));
  EXPECT_TRUE(out[3].labels.empty());
  EXPECT_EQ(out[0].pd.engine_id, "pe");
  EXPECT_EQ(out[1].pd.engine_id, "");
  for (const ReplicaConfig& r : out) {
    EXPECT_DOUBLE_EQ(r.pd.lease_s, 2.0);
    EXPECT_DOUBLE_EQ(r.pd.transfer_bandwidth, 10e9);
  }
  EXPECT_EQ(out[0].pd.load_failure_policy, "fail");
  EXPECT_EQ(out[1].pd.load_failure_policy, "recompute");
  EXPECT_EQ(out[0].pd.min_pull_tokens, 64);
  EXPECT_EQ(out[1].pd.min_pull_tokens, 0);
  EXPECT_EQ(out[0].engine.kv_bytes_per_token, 131072);  // the preset's Llama-3.1-8B
  EXPECT_EQ(out[1].engine.kv_bytes_per_token, 65536);
  EXPECT_EQ(out[3].engine.kv_bytes_per_token, 262144);  // Qwen3-32B
  EXPECT_EQ(out[3].engine.tensor_parallel_size, 2);

  // Defaults without a file.
  ASSERT_TRUE(ResolveFleet(FleetFile{}, {}, 1, 0, &out).ok());
  EXPECT_DOUBLE_EQ(out[0].pd.lease_s, 30.0);
  EXPECT_DOUBLE_EQ(out[0].pd.transfer_bandwidth, 25e9);
  EXPECT_EQ(out[0].pd.min_pull_tokens, 64);
  EXPECT_EQ(out[0].pd.load_failure_policy, "fail");
}

TEST(FleetConfigTest, PdExampleFileParsesAndResolves) {
  ConfigOr<FleetFile> file =
      LoadFleetFile(kvroute::test_support::SourceDir() + "/examples/fleet-pd.yaml");
  ASSERT_TRUE(file.ok()) << file.error.ToString();
  std::vector<ReplicaConfig> out;
  ASSERT_TRUE(ResolveFleet(*file.value, {}, 0, 18001, &out).ok());
  ASSERT_EQ(out.size(), 4u);
  const char* roles[] = {"prefill", "prefill", "decode", "decode"};
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(out[i].labels.size(), 1u);
    EXPECT_EQ(out[i].labels[0].first, "llm-d.ai/role");
    EXPECT_EQ(out[i].labels[0].second, roles[i]);
    EXPECT_EQ(out[i].pd.load_failure_policy, "fail");
    EXPECT_TRUE(out[i].enable_prompt_tokens_details);
  }
}

TEST(FleetConfigTest, PdErrorsNameFileLineAndField) {
  EXPECT_EQ(ErrorOf("replicas:\n  - name: a\n    labels: {llm-d.ai/role: prefil}\n"),
            "f.yaml:3: replicas[0].labels.llm-d.ai/role: must be prefill, decode or "
            "prefill-decode (got 'prefil')");
  EXPECT_EQ(ErrorOf("defaults:\n  labels:\n    llm-d.ai/role: both\n"),
            "f.yaml:3: defaults.labels.llm-d.ai/role: 'both' is deprecated in llm-d; use "
            "prefill-decode");
  EXPECT_EQ(ErrorOf("defaults:\n  kv_load_failure_policy: retry\n"),
            "f.yaml:2: defaults.kv_load_failure_policy: must be fail or recompute (got 'retry')");
  EXPECT_EQ(ErrorOf("defaults:\n  kv_lease: forever\n"),
            "f.yaml:2: defaults.kv_lease: must be a duration such as 50ms, 2s or 0.5 (seconds) "
            "(got 'forever')");
  EXPECT_EQ(ErrorOf("defaults:\n  kv_transfer_bandwidth: 0\n"),
            "f.yaml:2: defaults.kv_transfer_bandwidth: must be > 0");
  EXPECT_EQ(ErrorOf("defaults:\n  kv_min_pull_tokens: -1\n"),
            "f.yaml:2: defaults.kv_min_pull_tokens: must be >= 0 (got -1)");
  // A role set on the command line is checked when the fleet resolves.
  ReplicaOverrides cli;
  cli.labels = {{"llm-d.ai/role", "decoder"}};
  std::vector<ReplicaConfig> out;
  Status s = ResolveFleet(FleetFile{}, cli, 1, 0, &out);
  EXPECT_EQ(s.message(),
            "replica-0: llm-d.ai/role must be prefill, decode or prefill-decode (got 'decoder')");
}

}  // namespace
}  // namespace kvroute::config

namespace kvroute::config {
namespace {

TEST(FleetConfigLoraTest, LoraKeysResolveIntoTheEngineAndModules) {
  FleetFile file = MustParse(
      "defaults:\n  enable_lora: true\n  max_loras: 2\n  max_cpu_loras: 4\n  lora_load_s: 0.1\n"
      "  lora_modules: [sql-lora=/adapters/sql, {name: chat, path: /adapters/chat}]\n"
      "replicas:\n  - {name: a}\n  - {name: b, max_loras: 3, lora_modules: []}\n");
  std::vector<ReplicaConfig> out;
  ASSERT_TRUE(ResolveFleet(file, {}, 0, 0, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].engine.lora.enabled);
  EXPECT_EQ(out[0].engine.lora.max_loras, 2);
  EXPECT_EQ(out[0].engine.lora.max_cpu_loras, 4);
  EXPECT_DOUBLE_EQ(out[0].engine.lora.load_s, 0.1);
  ASSERT_EQ(out[0].lora_modules.size(), 2u);
  EXPECT_EQ(out[0].lora_modules[0].name, "sql-lora");
  EXPECT_EQ(out[0].lora_modules[0].path, "/adapters/sql");
  EXPECT_EQ(out[0].lora_modules[1].name, "chat");
  EXPECT_EQ(out[0].lora_modules[1].path, "/adapters/chat");
  EXPECT_EQ(out[1].engine.lora.max_loras, 3);
  EXPECT_TRUE(out[1].lora_modules.empty());  // a replica's own list replaces the defaults'
}

TEST(FleetConfigLoraTest, BadLoraSettingsAreNamed) {
  EXPECT_EQ(ErrorOf("defaults:\n  lora_modules: [nopath]\n"),
            "f.yaml:2: defaults.lora_modules[0]: must be name=path or a JSON object with name "
            "and path (got 'nopath')");
  EXPECT_EQ(ErrorOf("defaults:\n  max_loras: 0\n"),
            "f.yaml:2: defaults.max_loras: must be >= 1 (got 0)");
  EXPECT_EQ(ErrorOf("defaults:\n  lora_load_s: -1\n"),
            "f.yaml:2: defaults.lora_load_s: must be >= 0 (seconds)");
  std::vector<ReplicaConfig> out;
  Status s = ResolveFleet(MustParse("defaults: {enable_lora: true, max_loras: 4, max_cpu_loras: 2}\n"),
                          {}, 1, 0, &out);
  EXPECT_EQ(s.message(), "replica-0: max_cpu_loras (2) must be >= max_loras (4)");
  s = ResolveFleet(MustParse("defaults: {lora_modules: [a=/p]}\n"), {}, 1, 0, &out);
  EXPECT_EQ(s.message(), "replica-0: lora_modules need enable_lora");
  s = ResolveFleet(MustParse("defaults: {enable_lora: true, lora_modules: [a=/p, a=/q]}\n"), {}, 1,
                   0, &out);
  EXPECT_EQ(s.message(), "replica-0: lora_modules: 'a' twice");
}

TEST(FleetConfigLoraTest, LoraModuleSpecs) {
  std::string error;
  std::optional<api::LoraModule> m = api::ParseLoraModule("a=b=c", &error);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->name, "a");
  EXPECT_EQ(m->path, "b=c");
  m = api::ParseLoraModule(R"({"name":"x","path":"/p","base_model_name":"m"})", &error);
  ASSERT_TRUE(m.has_value()) << error;
  EXPECT_EQ(m->base_model_name, "m");
  EXPECT_FALSE(api::ParseLoraModule("=p", &error).has_value());
  EXPECT_FALSE(api::ParseLoraModule(R"({"name":"x"})", &error).has_value());
  EXPECT_EQ(error, "path is required");
  EXPECT_FALSE(api::ParseLoraModule(R"({"name":"x","path":3})", &error).has_value());
  EXPECT_EQ(error, "path must be a string");
}

}  // namespace
}  // namespace kvroute::config
