// Scenario files for `kvroute simulate` and `kvroute bench` (and any driver that wants the
// same workload): a workload, its arrivals, the fleet, the SLOs and the policies to
// compare, in YAML. Read through config/yaml_reader.h: errors are ConfigErrors naming the
// file, the 1-based line and the field ("seed-8x.yaml:12: arrivals.rate: must be a number
// (got 'fast')"); unknown keys get a did-you-mean. Examples: examples/scenarios/.
//
//   name: seed-8x
//   seed: 1
//   workload:            # type: shared-prefix | multi-turn | random | trace
//     type: shared-prefix
//     endpoint: completions          # or chat
//     num_groups: 8
//     num_prompts_per_group: 50
//     system_prompt_len: 4000        # int, {min,max,mean,std_dev}, or
//     question_len: {min: 100, max: 300, mean: 200, std_dev: 50}
//     output_len: {mixture: [{weight: 0.8, value: 50}, {weight: 0.2, mean: 2000, ...}]}
//     # multi-turn: max_turns, think_time_s; random: input_len;
//     # trace: path (relative to this file), time_scale (2: twice as fast), and
//     #   format: azure (CSV: prefix_len) or mooncake (JSON lines with hash_ids;
//     #   block_size: 512 tokens per hash id); default by extension (.jsonl: mooncake).
//     #   arrivals.num_requests and duration_s truncate it (docs/TRACES.md)
//     adapters: {count: 16, zipf: 1.1, share: 0.8}  # LoRA: `share` of the requests name
//                                    #   an adapter adapter-0..count-1, drawn with Zipf
//                                    #   exponent `zipf` (adapter-0 the most popular; 0:
//                                    #   uniform); seeded per request id
//   arrivals:
//     process: poisson               # poisson | gamma | constant
//     burstiness: 1                  # gamma shape
//     rate: 20                       # or stages: [{rate: 10, duration_s: 60}, ...]
//     num_requests: 2000             # and/or duration_s
//     max_concurrency: 0
//   fleet:
//     replicas: 8
//     engine_preset: llama3-8b-h100  # engine::PresetNames()
//     kv_blocks: 8192                # overrides the preset (0: preset's)
//     max_num_seqs: 256              # and max_num_batched_tokens, max_model_len
//     scrape_interval_s: 0.05
//     network_delay_s: 0.0005        # router <-> replica, each way (request, every token)
//     lora: {max_loras: 2, max_cpu_loras: 4, load_s: 0.05}  # serve LoRA adapters
//                                    #   (engine::LoraConfig; absent: adapters are only
//                                    #   prefix-cache keys); a fleet with requests naming
//                                    #   adapters should set it on every group
//     # or several regions: groups of replicas, each with every knob above but
//     # scrape_interval_s (fleet-wide); knobs set next to `groups` are their defaults
//     role: prefill-decode           # P/D role, the endpoint label llm-d.ai/role: prefill |
//                                    #   decode | prefill-decode (absent: no label, decode-
//                                    #   capable); a fleet with prefill needs a decode-capable group
//     # groups:
//     #   - {replicas: 4, region: us-east, network_delay_s: 0.0005}
//     #   - {replicas: 4, region: eu-west, zone: eu-west-1a, network_delay_s: 0.035,
//     #      engine_preset: small-kv, kv_blocks: 2048}
//   router: {region: us-east}        # the simulated router's region (replicas of other
//                                    #   regions are remote; see `+local-only` below)
//   # router: {replicas: 3}          # router replicas (default 1), each a routing core of
//                                    #   its own; see "Router replicas" below
//   kv_events:                       # KV-cache events in virtual time (issue 23)
//     enabled: false                 # engines publish them; the cores index them (precise)
//     delay: 20ms                    # publish -> router delay (>= 0)
//     loss: 0                        # fraction of batches lost in transit, 0..1
//     replay: true                   # a gap is replayed from the publisher's buffer
//     buffer_steps: 10000            # batches the publisher keeps for replay (>= 1)
//   pd:                              # prefill/decode disaggregation (issue 25; see "P/D" below)
//     non_cached_tokens: 256         # the core's decider (scheduling.pd): disaggregate when the
//     prompt_tokens: 256             #   prompt reaches prompt_tokens and its tokens not cached on
//                                    #   the decode replica reach non_cached_tokens
//     kv_lease_s: 30                 # how long a prefill leg's blocks stay held (> 0)
//     kv_transfer_bandwidth: 25GB    # bytes per second of a pull (a byte size or a number)
//     kv_min_pull_tokens: 64         # fewer missing tokens are recomputed by the decode replica
//     kv_bytes_per_token: 128KiB     # KV bytes per token (default: each group's preset's)
//   slo: {ttft_s: 2.0, tpot_s: 0.1}
//   policies: [round-robin, kvroute] # default: every built-in policy; `<name>+local-only`
//                                    #   (`local-only` = kvroute+local-only) runs <name>
//                                    #   on the router's region's replicas only
//   sweep: {rates: [10, 20, 30], ttft_p99_bound_s: 2.0}  # for `simulate --sweep`
//   faults:                          # docs/FAULTS.md; virtual time; kinds crash, slow, restart
//     - {replica: 2, kind: crash, at: 30s, duration: 10s}
//     - {replica: 0, kind: slow, at: 10s, duration: 20s, factor: 3}
//     - {replica: 1, kind: restart, at: 45s}       # duration: downtime before it is back
//   flow:                            # router-side flow control (issue 11; core/flow/flow_queue.h)
//     enabled: false                 # on for every policy; a policy named `<name>+flow`
//                                    #   (say kvroute+flow) runs <name> with it on regardless
//     max_requests: 5000             # waiting requests per priority band; over it: shed
//     ttl: 30s                       # longest wait at the router; then expired (shed)
//     no_endpoint_ttl: 5s            # the same when it arrived with no replica healthy
//     fairness: round_robin          # round_robin | global, across tenants inside a band
//     ordering: fcfs                 # fcfs | earliest_deadline
//     affinity_window: 16            # late binding: the replica that freed (or has the most
//     max_affinity_skips: 8          #   room) takes the waiting request it holds most of
//     sheddable_reserve: 0           # 0..4: sheddable requests also shed unless a replica
//                                    #   has more than this many of its 5 queue slots free
//   tenants:                         # who sends each request: a seeded draw per request id
//     - {name: interactive, share: 0.2, priority: 0}   # priority as in InferenceObjective:
//     - {name: batch, share: 0.8, priority: -1}        #   below 0 is sheddable
//   description: "..."               # free text, ignored
//
// Flow control in simulate follows `kvroute serve`: an arriving request is admitted
// against the saturation detector over the router's view (the last scrape plus the
// scheduler's in-flight accounting: every replica at waiting >= 5 or KV >= 0.8 is
// saturated, none healthy is empty); queued ones are released, picked at that moment,
// after every completion, every scrape and at their expiry. Without `tenants` every
// request is priority 0 and one flow.
//
// Regions: each replica carries its group's `region` (and `zone`) as endpoint labels, as
// `labels: {region: R}` does in `kvroute serve`. All traffic enters at the router, so a
// regional spike is a stage of higher rate (arrivals.stages, say 20 req/s for 60 s,
// then 40 for 30 s, then 20 again) arriving at the router's region. A `+local-only` run
// drops the remote groups (their faults too; the others keep theirs, renumbered).
//
// KV-cache events (`kv_events: {enabled: true}`; `kvroute simulate --kv-events on`): every
// engine records the events vLLM would publish; each engine step that produced some is one
// batch, numbered per replica from 0 (a `restart` fault starts a new engine: numbering
// starts again at 0 and its block hashes change, as vLLM without PYTHONHASHSEED; a
// `crash` keeps the engine and its numbering). Every router replica receives every batch
// `delay` after the step ended, unless it is lost (`loss`, an independent seeded draw per
// batch and router replica). A router replica finds a gap when the next batch of that
// replica arrives: with `replay`, the missing batches still in the publisher's buffer
// (`buffer_steps`, looked up when the gap is found) arrive in order one more `delay`
// later (a repaired gap; batches arriving meanwhile wait behind them); a missing batch
// no longer buffered, or replay off, is an unrepaired gap (the core drops that replica's
// entries and resyncs). A sequence going back is a publisher restart. Replayed batches
// are never lost. Each endpoint carries `kv_events: sim://replica-<i>` and each pick the
// request's token ids.
//
// Router replicas (`router: {replicas: N}`; `--router-replicas N`): N routing cores,
// configured alike (same endpoints and options; seeds scenario seed + k for core k), each
// with its own in-flight view and prefix model. Requests are spread round-robin in send
// order (the k-th request sent goes to core k mod N); every later call of its lifecycle
// (dispatch, tokens, finish, failures, retries) goes to the core that picked it; every
// core gets every scrape and every event batch. Flow control is not modelled with more
// than one replica (an error).
//
// P/D (`role` on fleet groups, `pd:`): when some group is `prefill`, the core picks a
// pair as serve's does (core/routing/pd.h): the decode replica by the policy among the
// decode-capable ones, the decision, and the prefill replica. A disaggregated request's
// prefill leg (max_tokens 1, its blocks held for kv_lease_s) goes to the prefill replica;
// its answer reaches the router a network delay after its step (RoutingCore::
// OnPrefillDone), and the decode leg goes to the decode replica, which pulls the prompt's
// full blocks it lacks (engine::PlanKvPull: missing tokens x kv_bytes_per_token /
// kv_transfer_bandwidth; below kv_min_pull_tokens it recomputes them) and waits for them;
// the prefill replica's hold ends when the pull completes. A prefill leg that fails (its
// replica crashed or restarting) moves to another prefill replica within the retry budget
// (RoutingCore::PickPrefill), else the decode replica prefills locally; a pull from a
// replica that is down, or whose hold expired, is recomputed locally. TTFT runs from the
// send to the decode leg's first token, E2E to its last. The report gains a `pd` block.
//
// Lengths (system_prompt_len, question_len, output_len, input_len) are an integer, a
// {min, max, mean, std_dev} (mean required; min defaults to 1), or a
// {mixture: [{weight, value | min, max, mean, std_dev}, ...]}.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/yaml_reader.h"
#include "core/engine/engine.h"
#include "core/engine/kv_transfer.h"
#include "core/routing/pd.h"
#include "simkit/fault/fault.h"
#include "core/flow/flow_queue.h"
#include "simkit/report/summary.h"
#include "simkit/workload/arrivals.h"
#include "simkit/workload/workload.h"

namespace kvroute::config {

// Replicas that share an engine configuration, a region and a network delay: one entry
// of fleet.groups, or the whole flat `fleet:` form.
struct FleetGroup {
  int replicas = 8;
  std::string region;  // the replicas' endpoint label `region`; empty: none (counts as local)
  std::string zone;    // label `zone`; empty: none
  // Label llm-d.ai/role: "prefill", "decode" or "prefill-decode"; empty: none.
  std::string role;
  std::string engine_preset = "llama3-8b-h100";
  int kv_blocks = 0;               // 0: the preset's
  int max_num_seqs = 0;            // 0: the preset's
  int max_num_batched_tokens = 0;  // 0: the preset's
  int max_model_len = 0;           // 0: the preset's
  // Router <-> replica, each way: a request reaches the replica this much after the pick,
  // and every token (first, streamed, last) reaches the router this much after its step.
  double network_delay_s = 0.0005;
  // `lora:` (enabled when present): max_loras, max_cpu_loras, load_s.
  engine::LoraConfig lora;

  // The engine configuration of every replica (preset + overrides). The preset must exist.
  engine::EngineConfig EngineConfigFor() const;
};

// The simulated fleet. Without `groups` (the flat form), its own FleetGroup fields
// describe every replica. With groups, its FleetGroup fields as written next to
// `groups` are the defaults each group starts from (`replicas` is then not allowed
// there, and holds the groups' total).
struct FleetSpec : FleetGroup {
  double scrape_interval_s = 0.05;
  std::vector<FleetGroup> groups;  // in file order; empty for the flat form

  // The groups the fleet runs: `groups`, or the flat form as one group. Replica ids run
  // group after group (group 0's replicas first).
  std::vector<FleetGroup> Groups() const;
};

// A fault on one replica of the simulated fleet (replica < fleet.replicas).
struct ScenarioFault {
  int replica = 0;
  fault::FaultSpec spec;  // kind crash, slow or restart
};

// Flow control for the simulated router (the `flow:` block). `options` passed flow::Validate.
struct ScenarioFlow {
  bool enabled = false;  // for every policy; `<policy>+flow` turns it on for that one
  flow::FlowOptions options;
};

// One tenant of the `tenants:` list: request ids are split among tenants by share.
struct ScenarioTenant {
  std::string name;
  double share = 1.0;     // > 0; shares are normalised over the list
  int64_t priority = 0;   // flow::FlowRequest::priority (below 0: sheddable)
};

// KV-cache events in the simulation (the `kv_events:` block).
struct ScenarioKvEvents {
  bool enabled = false;
  double delay_s = 0.020;      // publish -> router, >= 0
  double loss = 0.0;           // fraction of batches lost in transit, [0, 1]
  bool replay = true;          // a router that finds a gap replays the missing batches
  int64_t buffer_steps = 10000;  // batches the publisher keeps for replay, >= 1
};

// Prefill/decode disaggregation (the `pd:` block; used when some group has role prefill).
struct ScenarioPd {
  routing::PdOptions options;  // the core's decider thresholds (CoreOptions::pd)
  double kv_lease_s = engine::kDefaultKvLeaseS;
  double kv_transfer_bandwidth = engine::kDefaultKvTransferBandwidth;  // bytes/s
  int kv_min_pull_tokens = engine::kDefaultKvMinPullTokens;
  int64_t kv_bytes_per_token = 0;  // 0: each replica's engine preset's

  // The transfer rule for a replica running `engine`.
  engine::KvTransferModel TransferModel(const engine::EngineConfig& engine) const {
    return {kv_bytes_per_token > 0 ? kv_bytes_per_token : engine.kv_bytes_per_token,
            kv_transfer_bandwidth, kv_min_pull_tokens};
  }
};

struct Scenario {
  std::string name;
  std::string source;  // the file it came from, for messages
  uint64_t seed = 1;
  workload::WorkloadSpec workload;
  workload::ArrivalSpec arrivals;
  FleetSpec fleet;
  report::Slo slo;
  std::vector<std::string> policies;  // empty: every built-in policy
  // Rate sweep defaults (`kvroute simulate --sweep`): constant rates, ascending, and the
  // p99-TTFT bound (0: the TTFT SLO).
  std::vector<double> sweep_rates;
  double sweep_ttft_p99_bound_s = 0.0;
  // Faults injected during the run, in file order (times in virtual seconds).
  std::vector<ScenarioFault> faults;
  ScenarioFlow flow;
  std::vector<ScenarioTenant> tenants;  // empty: one anonymous tenant, priority 0
  // `router: {region: R}`: the simulated router's region (empty: none, region-blind).
  // Replicas whose group has another non-empty region are remote.
  std::string router_region;
  // `router: {replicas: N}`: router replicas, each a routing core of its own (>= 1).
  int router_replicas = 1;
  ScenarioKvEvents kv_events;
  ScenarioPd pd;

  // Whether some fleet group has a P/D role (the report then has its `pd` block).
  bool HasRoles() const;
};

// Parses scenario YAML. `source_name` names the file in errors and becomes
// Scenario::source; relative trace paths are resolved against `base_dir`. Reads the trace
// file when the workload is a trace. Returns the scenario or the first error; never throws.
ConfigOr<Scenario> ParseScenario(std::string_view yaml, std::string_view source_name,
                                 std::string_view base_dir);
// Reads and parses a scenario file (trace paths relative to its directory).
ConfigOr<Scenario> LoadScenarioFile(const std::string& path);

}  // namespace kvroute::config
