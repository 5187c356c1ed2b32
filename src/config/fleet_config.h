// Configuration of a simulated fleet (`kvroute sim`): one ReplicaConfig per replica,
// resolved from an engine preset, a fleet YAML file and command-line flags.
//
// Precedence for each knob of a replica (later wins):
//   preset (per-replica `preset`, else --preset, else `defaults.preset`, else
//   llama3-8b-h100)  <  fleet file `defaults:`  <  command-line flags given explicitly
//   <  the replica's own entry under `replicas:`.
//
// Fleet file (examples/fleet.yaml; every key optional; read through config/yaml_reader.h,
// so errors are "file:line: field: message" and unknown keys get a did-you-mean):
//
//   base_port: 18001          # replica i listens on base_port + i unless it sets `port`
//   threads: 2                # event-loop threads shared by the replicas (0: default)
//   defaults:                 # a section: applies to every replica
//     preset: llama3-8b-h100  # engine::PresetNames()
//     model: meta-llama/Llama-3.1-8B-Instruct
//     time_scale: 1.0         # numbers: time_scale, latency_ms, mean_output_tokens
//     max_num_seqs: 256       # integers: kv_blocks, block_size, max_num_seqs,
//                             #   max_batched_tokens, max_model_len, fixed_output_tokens,
//                             #   default_max_tokens
//     old_metric_names: true  # true | false: also enable_prefix_caching, priority_scheduling,
//                             #   enable_prompt_tokens_details (usage.prompt_tokens_details)
//     hash_seed: 0            # non-negative integers: hash_seed, output_seed
//     max_body_bytes: 16MiB   # a byte size (or a plain number of bytes)
//     step: {base_us: 5753, per_prefill_token_us: 17.25, per_decode_seq_us: 6.0,
//            per_context_token_us: 0.05}   # the step-time model, microseconds
//     labels: {region: us-east}           # merged by key across the levels; the
//                             #   llm-d.ai/role label must be prefill, decode or
//                             #   prefill-decode (every replica serves both P/D legs anyway)
//     kv_events_port: 5557    # KV events (docs/KV_EVENTS.md): PUB port, replica i gets
//     kv_events_replay_port: 5657  #   +i when set in defaults or on the command line;
//     kv_events_format: array #   array | map; kv_events_hash: int | bytes;
//     kv_events_topic: ""     #   the topic frame
//     kv_events_connect: tcp://10.0.0.9:5557  # or publish by connecting there (a router's
//                             #   pool.kv_events.bind, centralized mode); topic default
//                             #   kv@<host>@<model>
//     kv_lease: 30s           # P/D (docs/SIM_API.md, "Prefill/decode disaggregation"):
//     kv_bytes_per_token: 128KiB  # how long a prefill leg holds its blocks; KV bytes per
//     kv_transfer_bandwidth: 25GB #   token (default: the preset's model) and bytes per
//     kv_min_pull_tokens: 64  #   second of a pull; fewer missing tokens are recomputed;
//     kv_load_failure_policy: fail  # fail | recompute (a pull that cannot happen)
//     kv_engine_id: p0        # remote_engine_id (default kvroute-sim-<index>-<name>)
//     enable_lora: true       # LoRA (docs/SIM_API.md, "LoRA adapters"), vLLM's flags:
//     max_loras: 2            #   distinct adapters in one batch (default 1);
//     max_cpu_loras: 4        #   adapters cached (default max_loras; else >= max_loras);
//     lora_load_s: 0.05       #   engine seconds per adapter load (>= 0);
//     lora_modules: [sql-lora=/adapters/sql, {name: chat, path: /adapters/chat}]
//                             #   adapters served from the start (replace, not merged)
//     faults:                 # fault schedule (simkit/fault/fault.h, docs/FAULTS.md):
//       - {kind: http_error, at: 10s, duration: 5s, status: 503}   # at: default 0;
//       - {kind: slow, at: 30s, factor: 3}   # no duration: until the run ends
//                             # defaults' faults come first, then the replica's own
//   replicas:                 # one section per replica: the keys of defaults, and
//     - name: h100-a          #   name, host (127.0.0.1), port (0-65535, 0: any free)
//     - {name: small-far, preset: small-kv, kv_blocks: 1024}
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/yaml_reader.h"
#include "core/api/lora.h"
#include "core/common/status.h"
#include "core/engine/engine.h"
#include "core/engine/kv_transfer.h"
#include "simkit/fault/fault.h"

namespace kvroute::config {

// KV-cache events as vLLM publishes them (REFERENCE.md section 5; docs/KV_EVENTS.md).
struct KvPublishConfig {
  std::optional<int> port;         // PUB bound on host:port (0: any free port); absent: off
  std::optional<int> replay_port;  // ROUTER for replay (0: any free); absent: none
  std::string format = "array";    // "array" | "map": how events are encoded
  std::string hash = "int";        // "int" | "bytes": how block hashes are encoded
  std::string topic;               // the topic frame ("" by default, as vLLM)
  // Publish by connecting to this address (vLLM's endpoint without `*`: a router binds it,
  // llm-d's centralized mode) instead of binding `port`; the topic then defaults to
  // kv@<host>@<model>. Empty: bind `port`.
  std::string connect;
};

// vLLM's P/D protocol as the sim serves it (REFERENCE.md section 20; docs/SIM_API.md,
// "Prefill/decode disaggregation"). Every replica serves both legs (NixlConnector's
// kv_both); the settings shape the transfers.
struct PdConfig {
  // Engine seconds a prefill leg's blocks stay held for its decode leg (vLLM's
  // VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s in older releases).
  double lease_s = engine::kDefaultKvLeaseS;
  // Bytes per second of a pull (RDMA at 200 Gb/s: 25 GB/s). The pull takes
  // missing_tokens * engine.kv_bytes_per_token / this, in engine seconds
  // (engine::PlanKvPull).
  double transfer_bandwidth = engine::kDefaultKvTransferBandwidth;
  // A decode leg missing fewer tokens than this (after its own prefix cache) recomputes
  // them locally instead of pulling.
  int min_pull_tokens = engine::kDefaultKvMinPullTokens;
  // What a pull that cannot happen (unknown engine, prefill replica down, lease gone) does:
  // "fail" (vLLM's default: the request fails with a 500) or "recompute" (served locally).
  std::string load_failure_policy = "fail";
  // The replica's remote_engine_id; "" becomes kvroute-sim-<index>-<name> (Fleet).
  std::string engine_id;

  // The transfer rule's inputs for a replica running `engine`.
  engine::KvTransferModel TransferModel(const engine::EngineConfig& engine) const {
    return {engine.kv_bytes_per_token, transfer_bandwidth, min_pull_tokens};
  }
};

struct ReplicaConfig {
  std::string name;  // "replica-<i>" unless set
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port
  std::string preset = "llama3-8b-h100";
  engine::EngineConfig engine;  // engine.model_name is the served model name
  // Wall seconds per engine second: every step of engine duration d takes d * time_scale
  // wall seconds. 0 runs steps back to back without waiting.
  double time_scale = 1.0;
  // One-way network delay (wall ms), as a farther network (another region) would add, on
  // both paths of a generation request: it reaches the engine latency_ms after it
  // arrived, and everything it gets back after admission (stream headers, every chunk,
  // the end, a whole body, an engine rejection) leaves latency_ms after it was produced.
  // So TTFT grows by 2 x latency_ms. Not scaled by time_scale. /metrics, /health,
  // /v1/models, /admin/fault and the early validation errors answer at once.
  double latency_ms = 0.0;
  bool old_metric_names = false;  // emulate vLLM < 0.9.2 metric names (no engine label)
  // vLLM's --enable-prompt-tokens-details: usage carries prompt_tokens_details.cached_tokens
  // (the engine's prefix-cache hit tokens for the request) in non-streaming answers and in
  // a stream's final usage chunk; off, usage has no prompt_tokens_details.
  bool enable_prompt_tokens_details = false;
  // max_tokens for a chat request that sets none (vLLM would use the rest of the context).
  // Completions default to 16, as in vLLM and OpenAI.
  int default_max_tokens = 256;
  std::size_t max_body_bytes = 16u << 20;
  // Free-form labels (e.g. region) exposed as kvroute_sim_replica_info{...} in /metrics.
  std::vector<std::pair<std::string, std::string>> labels;
  // Faults to inject, times in wall seconds after the replica started (not scaled by
  // time_scale). Each entry is valid (fault::Validate).
  std::vector<fault::FaultSpec> faults;
  KvPublishConfig kv_events;
  PdConfig pd;
  // LoRA adapters served from the start (--lora-modules); engine.lora.enabled gates them
  // and the runtime load/unload endpoints. Names are unique and not the model's name.
  std::vector<api::LoraModule> lora_modules;
};

// Optional settings as written in a fleet file section or on the command line.
struct ReplicaOverrides {
  std::optional<std::string> name, host, preset, model;
  std::optional<int> kv_events_port, kv_events_replay_port;
  std::optional<std::string> kv_events_format, kv_events_hash, kv_events_topic, kv_events_connect;
  std::optional<double> kv_lease_s, kv_transfer_bandwidth;
  std::optional<uint64_t> kv_bytes_per_token;
  std::optional<int> kv_min_pull_tokens;
  std::optional<std::string> kv_load_failure_policy, kv_engine_id;
  std::optional<int> port, kv_blocks, block_size, max_num_seqs, max_batched_tokens, max_model_len,
      fixed_output_tokens, default_max_tokens;
  std::optional<double> time_scale, latency_ms, mean_output_tokens, step_base_us,
      step_per_prefill_token_us, step_per_decode_seq_us, step_per_context_token_us;
  std::optional<bool> old_metric_names, enable_prefix_caching, priority_scheduling,
      enable_prompt_tokens_details, enable_lora;
  std::optional<int> max_loras, max_cpu_loras;
  std::optional<double> lora_load_s;
  std::optional<std::vector<api::LoraModule>> lora_modules;  // replaces, when set
  std::optional<uint64_t> hash_seed, output_seed;
  std::optional<uint64_t> max_body_bytes;
  std::vector<std::pair<std::string, std::string>> labels;  // merged by key
  std::vector<fault::FaultSpec> faults;                     // appended

  // Applies the set fields (all but preset) to `r`.
  void ApplyTo(ReplicaConfig& r) const;
};

struct FleetFile {
  ReplicaOverrides defaults;
  std::vector<ReplicaOverrides> replicas;
  std::optional<int> base_port;
  std::optional<int> threads;
};

// Parses a fleet YAML document; `source` names the file in errors. Returns the file or the
// first error ("f.yaml:2: replicas[0].kv_blocks: must be an integer (got 'lots')").
ConfigOr<FleetFile> ParseFleetYaml(std::string_view text, std::string_view source);
// Reads and parses a file.
ConfigOr<FleetFile> LoadFleetFile(const std::string& path);

// Resolves `count` replicas into `*out` (count 0: as many as the file lists, at least 1).
// Replica i gets port base_port + i unless its entry sets one (base_port 0: all 0).
// InvalidArgument for an unknown preset or invalid engine limits ("replica 0: unknown
// preset 'x' (known: ...)", "<name>: max_num_seqs must be >= 1").
Status ResolveFleet(const FleetFile& file, const ReplicaOverrides& cli, int count, int base_port,
                    std::vector<ReplicaConfig>* out);

// Reads one entry of a YAML fault list ({kind: hang, at: 10s, duration: 2s, ...}): the
// fields of fault::FieldNames(), checked with fault::SetField and fault::Validate; errors
// name the file, line and field, unknown keys and kinds get a did-you-mean. Keys in
// `extra` are the caller's (simulate's `replica`): `on_extra(key, value)` reads them.
fault::FaultSpec ReadFaultEntry(
    const ConfigNode& entry, std::span<const std::string_view> extra = {},
    const std::function<void(const std::string&, const ConfigNode&)>& on_extra = {});

// The label that gives a replica its P/D role in llm-d, and its values.
inline constexpr std::string_view kRoleLabel = "llm-d.ai/role";
// "" when `role` is a valid value of kRoleLabel, else the error ("must be prefill, decode
// or prefill-decode (got 'x')"; llm-d's deprecated `both` is named as such).
std::string CheckRoleLabel(std::string_view role);

// Checks the engine limits Engine's constructor asserts and the sim's own ranges.
Status ValidateReplica(const ReplicaConfig& r);

}  // namespace kvroute::config
