// `kvroute sim`: its flags (SimOptions, AddFlags), then Run in steps: read the fleet file,
// turn the flags given into overrides, resolve the replicas, start them, print where each
// listens, serve until a signal.
#include "apps/sim/sim_main.h"

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "config/fleet_config.h"
#include "core/api/lora.h"
#include "apps/sim/fleet.h"

namespace kvroute::sim {

namespace {

constexpr char kDescription[] =
    "Run N simulated vLLM replicas in one process. Replica i listens on port P+i and serves\n"
    "POST /v1/completions, POST /v1/chat/completions, POST /v1/responses (streamed or not),\n"
    "POST /v1/embeddings, GET /v1/models,\n"
    "POST /tokenize and POST /detokenize (vLLM's; docs/SIM_API.md),\n"
    "with --enable-lora POST /v1/load_lora_adapter and /v1/unload_lora_adapter,\n"
    "GET /health and GET /metrics (vLLM's Prometheus names). Each replica has its own\n"
    "engine (paged KV cache with prefix caching, V1 scheduler, fitted step-time model).\n"
    "Precedence: preset < fleet file defaults < flags given here < fleet file replica entry.\n"
    "Faults (docs/FAULTS.md): a `faults:` schedule per replica in the fleet file, or at run\n"
    "time POST/GET/DELETE /admin/fault on a replica's port, e.g.\n"
    "  curl -d '{\"kind\":\"hang\",\"duration\":\"5s\"}' localhost:8000/admin/fault";

// The command line as given. The replica settings are overrides: each applies only when
// its flag was given (Given), above the fleet file's defaults and below its replica
// entries.
struct SimOptions {
  int replicas = 0;
  int port = 8000;
  int threads = 0;
  std::string config_path;
  std::string host = "127.0.0.1", preset, model;
  int kv_blocks = 0, max_num_seqs = 0, max_batched_tokens = 0, max_model_len = 0;
  int default_max_tokens = 0, fixed_output_tokens = 0;
  double time_scale = 1.0, latency_ms = 0.0, mean_output_tokens = 0.0;
  bool old_names = false;
  bool prompt_tokens_details = false;
  // KV-cache events (docs/KV_EVENTS.md), as vLLM's --kv-events-config publishes them.
  int kv_port = 0, kv_replay_port = 0;
  std::string kv_format = "array", kv_hash = "int", kv_topic;
  std::string kv_connect;
  // P/D (docs/SIM_API.md, "Prefill/decode disaggregation"): every replica serves both legs.
  std::string kv_lease, kv_bytes, kv_bandwidth, kv_policy;
  int kv_min_pull = 0;
  // LoRA adapters (docs/SIM_API.md, "LoRA adapters"), as vLLM's flags.
  bool enable_lora = false;
  int max_loras = 1, max_cpu_loras = 0, max_lora_rank = 16;
  double lora_load_s = 0.05;
  std::vector<std::string> lora_modules;

  // The long names ("--host") of the flags given, set after parsing.
  std::set<std::string, std::less<>> given;
  bool Given(std::string_view flag) const { return given.contains(flag); }
};

// --replicas and --port, the engine and API settings, and --config.
void AddReplicaFlags(CLI::App& app, SimOptions& o) {
  app.add_option("--replicas,-n", o.replicas,
                 "Number of replicas (default: the fleet file's count, else 1)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--port,-p", o.port, "Port of replica 0; replica i uses port+i (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--host", o.host, "Address to listen on")->capture_default_str();
  app.add_option("--preset", o.preset,
                 "Engine preset: llama3-8b-h100 (26304 blocks of 16 tokens, "
                 "H100 step model) or small-kv (2048 blocks)");
  app.add_option("--kv-blocks", o.kv_blocks,
                 "KV-cache blocks (num_gpu_blocks; block 0 is reserved)")
      ->check(CLI::Range(2, 1 << 30));
  app.add_option("--max-num-seqs", o.max_num_seqs, "Running batch limit")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-batched-tokens", o.max_batched_tokens,
                 "Token budget per engine step (chunked prefill)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--max-model-len", o.max_model_len,
                 "Context limit: prompt + max_tokens above it -> 400")
      ->check(CLI::Range(2, 1 << 30));
  app.add_option("--time-scale", o.time_scale,
                 "Wall seconds per engine second (1: real time, 0.01: 100x "
                 "faster, 0: no waiting)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--model", o.model,
                 "Served model name (default meta-llama/Llama-3.1-8B-Instruct); "
                 "requests for another model get 404");
  app.add_flag("--old-metric-names", o.old_names,
               "Emulate vLLM < 0.9.2 metrics: vllm:gpu_cache_usage_perc, "
               "vllm:gpu_prefix_cache_*, no engine label");
  app.add_flag(
      "--enable-prompt-tokens-details", o.prompt_tokens_details,
      "As vLLM's flag: usage carries prompt_tokens_details.cached_tokens (prefix-cache hit "
      "tokens), also in a stream's final usage chunk; without it, no prompt_tokens_details");
  app.add_option("--latency-ms", o.latency_ms,
                 "One-way network latency of generation requests, both ways: "
                 "before a request reaches the engine and on everything "
                 "it gets back (TTFT + 2x)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--default-max-tokens", o.default_max_tokens,
                 "max_tokens for chat requests that set none (default 256)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--fixed-output-tokens", o.fixed_output_tokens,
                 "Every request stops (finish_reason stop) after this many "
                 "tokens unless max_tokens is smaller (0: off)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--mean-output-tokens", o.mean_output_tokens,
                 "Output lengths drawn from an exponential with this mean (0: "
                 "run to max_tokens)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--config,-c", o.config_path,
                 "Fleet YAML file: per-replica preset, kv_blocks, model, max_num_seqs, labels, "
                 "latency_ms, faults, ... (see examples/fleet.yaml, examples/fleet-faults.yaml)")
      ->check(CLI::ExistingFile);
}

// KV-cache events (docs/KV_EVENTS.md), as vLLM's --kv-events-config publishes them.
void AddKvEventFlags(CLI::App& app, SimOptions& o) {
  app.add_option("--kv-events-port", o.kv_port,
                 "Publish KV-cache events: replica i binds a ZMQ PUB socket on "
                 "port P+i (0: any free port)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--kv-events-replay-port", o.kv_replay_port,
                 "ROUTER socket for replay on port R+i (keeps the last 10000 "
                 "batches)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--kv-events-format", o.kv_format,
                 "Event encoding: array (vLLM <= 0.24) or map (newer)")
      ->check(CLI::IsMember({"array", "map"}));
  app.add_option("--kv-events-hash", o.kv_hash,
                 "Block hashes as int (uint64) or bytes (32-byte digest)")
      ->check(CLI::IsMember({"int", "bytes"}));
  app.add_option("--kv-events-topic", o.kv_topic,
                 "Topic frame of every message (default: empty)");
  app.add_option("--kv-events-connect", o.kv_connect,
                 "Publish by connecting to tcp://HOST:PORT (a router's "
                 "pool.kv_events.bind) instead of binding a port; topic "
                 "default kv@<host>@<model>");
}

// P/D (docs/SIM_API.md, "Prefill/decode disaggregation"): every replica serves both legs.
void AddPdFlags(CLI::App& app, SimOptions& o) {
  app.add_option("--kv-lease", o.kv_lease,
                 "P/D: how long a prefill leg holds its blocks for the "
                 "decode leg, engine time (default 30s)");
  app.add_option("--kv-bytes-per-token", o.kv_bytes,
                 "P/D: KV bytes per token of a pull (default: the preset's "
                 "model, 128KiB for Llama-3.1-8B bf16)");
  app.add_option("--kv-transfer-bandwidth", o.kv_bandwidth,
                 "P/D: bytes per second of a pull (default 25GB, RDMA at "
                 "200 Gb/s)");
  app.add_option("--kv-min-pull-tokens", o.kv_min_pull,
                 "P/D: a decode leg missing fewer prompt tokens recomputes "
                 "them instead of pulling (default 64)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--kv-load-failure-policy", o.kv_policy,
                 "P/D: a pull that cannot happen fails the request (fail, "
                 "500) or is recomputed locally (recompute); default fail")
      ->check(CLI::IsMember({"fail", "recompute"}));
}

// LoRA adapters (docs/SIM_API.md, "LoRA adapters"), as vLLM's flags.
void AddLoraFlags(CLI::App& app, SimOptions& o) {
  app.add_flag("--enable-lora", o.enable_lora,
               "Serve LoRA adapters: requests name one as their model, "
               "POST /v1/load_lora_adapter and /v1/unload_lora_adapter, "
               "vllm:lora_requests_info");
  app.add_option("--max-loras", o.max_loras,
                 "Distinct adapters in one batch; requests of others wait "
                 "(default 1)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--max-cpu-loras", o.max_cpu_loras,
                 "Adapters kept loaded (LRU); default --max-loras")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-lora-rank", o.max_lora_rank,
                 "Accepted for vLLM compatibility; the load cost does not depend on it")
      ->check(CLI::Range(1, 1024));
  app.add_option("--lora-load-s", o.lora_load_s,
                 "Engine seconds a step takes longer per adapter it loads "
                 "(default 0.05)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lora-modules", o.lora_modules,
                 "Adapters served from the start: name=path or "
                 "'{\"name\":..,\"path\":..}' (several allowed)");
}

// Every flag of `kvroute sim`, bound to `o`, in the order --help lists them.
void AddFlags(CLI::App& app, SimOptions& o) {
  AddReplicaFlags(app, o);
  AddKvEventFlags(app, o);
  AddPdFlags(app, o);
  AddLoraFlags(app, o);
  app.add_option("--threads", o.threads,
                 "Event-loop threads shared by the replicas (default: one per replica, at most "
                 "the CPU count)")
      ->check(CLI::Range(1, 256));
}

// The long names of the flags given on the command line (CLI::Option::count).
std::set<std::string, std::less<>> GivenFlags(const CLI::App& app) {
  std::set<std::string, std::less<>> given;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() > 0) given.insert(opt->get_name());
  }
  return given;
}

// The overrides of the flags given (cli's fields for the rest stay unset), or
// InvalidArgument naming the flag whose value is not valid (the first, in this order).
Status ReplicaOverridesOf(const SimOptions& o, config::ReplicaOverrides* cli) {
  if (o.Given("--host")) cli->host = o.host;
  if (o.Given("--preset")) cli->preset = o.preset;
  if (o.Given("--kv-blocks")) cli->kv_blocks = o.kv_blocks;
  if (o.Given("--max-num-seqs")) cli->max_num_seqs = o.max_num_seqs;
  if (o.Given("--max-batched-tokens")) cli->max_batched_tokens = o.max_batched_tokens;
  if (o.Given("--max-model-len")) cli->max_model_len = o.max_model_len;
  if (o.Given("--time-scale")) cli->time_scale = o.time_scale;
  if (o.Given("--model")) cli->model = o.model;
  if (o.Given("--old-metric-names")) cli->old_metric_names = o.old_names;
  if (o.Given("--enable-prompt-tokens-details")) {
    cli->enable_prompt_tokens_details = o.prompt_tokens_details;
  }
  if (o.Given("--latency-ms")) cli->latency_ms = o.latency_ms;
  if (o.Given("--default-max-tokens")) cli->default_max_tokens = o.default_max_tokens;
  if (o.Given("--fixed-output-tokens")) cli->fixed_output_tokens = o.fixed_output_tokens;
  if (o.Given("--mean-output-tokens")) cli->mean_output_tokens = o.mean_output_tokens;
  if (o.Given("--kv-events-port")) cli->kv_events_port = o.kv_port;
  if (o.Given("--kv-events-replay-port")) cli->kv_events_replay_port = o.kv_replay_port;
  if (o.Given("--kv-events-format")) cli->kv_events_format = o.kv_format;
  if (o.Given("--kv-events-hash")) cli->kv_events_hash = o.kv_hash;
  if (o.Given("--kv-events-topic")) cli->kv_events_topic = o.kv_topic;
  if (o.Given("--kv-events-connect")) cli->kv_events_connect = o.kv_connect;
  if (o.Given("--kv-lease")) {
    std::optional<double> d = config::ParseDuration(o.kv_lease);
    if (!d || *d <= 0) {
      return Status::InvalidArgument("--kv-lease: must be a duration such as 30s (got '" +
                                     o.kv_lease + "')");
    }
    cli->kv_lease_s = *d;
  }
  for (auto [flag, text, field] :
       {std::tuple{"--kv-bytes-per-token", &o.kv_bytes, &cli->kv_bytes_per_token},
        std::tuple{"--kv-transfer-bandwidth", &o.kv_bandwidth,
                   static_cast<std::optional<uint64_t>*>(nullptr)}}) {
    if (!o.Given(flag)) continue;
    std::optional<uint64_t> b = config::ParseByteSize(*text);
    if (!b || *b == 0) {
      return Status::InvalidArgument(std::string(flag) +
                                     ": must be a size such as 128KiB or 25GB (got '" + *text +
                                     "')");
    }
    if (field) {
      *field = *b;
    } else {
      cli->kv_transfer_bandwidth = static_cast<double>(*b);
    }
  }
  if (o.Given("--kv-min-pull-tokens")) cli->kv_min_pull_tokens = o.kv_min_pull;
  if (o.Given("--enable-lora")) cli->enable_lora = o.enable_lora;
  if (o.Given("--max-loras")) cli->max_loras = o.max_loras;
  if (o.Given("--max-cpu-loras")) cli->max_cpu_loras = o.max_cpu_loras;
  if (o.Given("--lora-load-s")) cli->lora_load_s = o.lora_load_s;
  if (o.Given("--lora-modules")) {
    cli->lora_modules.emplace();
    for (const std::string& spec : o.lora_modules) {
      std::string error;
      std::optional<api::LoraModule> m = api::ParseLoraModule(spec, &error);
      if (!m) return Status::InvalidArgument("--lora-modules: " + error);
      cli->lora_modules->push_back(std::move(*m));
    }
  }
  if (o.Given("--kv-load-failure-policy")) cli->kv_load_failure_policy = o.kv_policy;
  return Status::Ok();
}

// One line per replica and feature: where it listens and what it runs.
void PrintFleet(const Fleet& fleet) {
  for (int i = 0; i < fleet.size(); ++i) {
    const ReplicaConfig& c = fleet.config(i);
    std::printf("%s http://%s:%u model=%s preset=%s kv_blocks=%d max_num_seqs=%d "
                "max_batched_tokens=%d time_scale=%g%s\n",
                c.name.c_str(), c.host.c_str(), fleet.port(i), c.engine.model_name.c_str(),
                c.preset.c_str(), c.engine.num_gpu_blocks, c.engine.max_num_seqs,
                c.engine.max_num_batched_tokens, c.time_scale,
                c.old_metric_names ? " old-metric-names" : "");
    std::printf("%s pd engine_id=%s lease=%gs kv_bytes_per_token=%lld bandwidth=%gB/s "
                "min_pull_tokens=%d kv_load_failure_policy=%s\n",
                c.name.c_str(), fleet.engine_id(i).c_str(), c.pd.lease_s,
                static_cast<long long>(c.engine.kv_bytes_per_token), c.pd.transfer_bandwidth,
                c.pd.min_pull_tokens, c.pd.load_failure_policy.c_str());
    if (c.engine.lora.enabled) {
      std::printf("%s lora max_loras=%d max_cpu_loras=%d load_s=%g adapters=%zu\n",
                  c.name.c_str(), c.engine.lora.max_loras, c.engine.lora.cache_capacity(),
                  c.engine.lora.load_s, c.lora_modules.size());
    }
    if (!fleet.kv_events_endpoint(i).empty()) {
      std::printf("%s kv-events %s%s%s format=%s hash=%s\n", c.name.c_str(),
                  fleet.kv_events_endpoint(i).c_str(),
                  fleet.kv_events_replay_endpoint(i).empty() ? "" : " replay ",
                  fleet.kv_events_replay_endpoint(i).c_str(), c.kv_events.format.c_str(),
                  c.kv_events.hash.c_str());
    }
  }
  std::fflush(stdout);
}

// Serves until SIGINT or SIGTERM, then stops `fleet` (with the signals still caught).
void StopOnSignal(Fleet& fleet) {
  boost::asio::io_context signals_ctx;
  boost::asio::signal_set signals(signals_ctx, SIGINT, SIGTERM);
  signals.async_wait([](const boost::system::error_code&, int) {});
  signals_ctx.run();
  fleet.Stop();
}

int Run(const SimOptions& o) {
  config::FleetFile file;
  if (!o.config_path.empty()) {
    config::ConfigOr<config::FleetFile> loaded = config::LoadFleetFile(o.config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "kvroute sim: %s\n", loaded.error.ToString().c_str());
      return 2;
    }
    file = std::move(*loaded.value);
  }
  config::ReplicaOverrides cli;
  if (Status s = ReplicaOverridesOf(o, &cli); !s.ok()) {
    std::fprintf(stderr, "kvroute sim: %s\n", s.message().c_str());
    return 2;
  }
  int base_port = o.port;
  if (!o.Given("--port") && file.base_port) base_port = *file.base_port;
  int threads = o.threads;
  if (threads == 0 && file.threads) threads = *file.threads;

  std::vector<ReplicaConfig> configs;
  if (Status s = config::ResolveFleet(file, cli, o.replicas, base_port, &configs); !s.ok()) {
    std::fprintf(stderr, "kvroute sim: %s\n", s.message().c_str());
    return 2;
  }

  Fleet fleet(configs, threads);
  if (Status st = fleet.Start(); !st.ok()) {
    const std::string& err = st.message();
    std::fprintf(stderr, "kvroute sim: %s\n", err.c_str());
    return 1;
  }
  PrintFleet(fleet);
  StopOnSignal(fleet);
  return 0;
}

}  // namespace

int SimMain(int argc, char** argv) {
  CLI::App app{kDescription, "kvroute sim"};
  SimOptions options;
  AddFlags(app, options);
  CLI11_PARSE(app, argc, argv);
  options.given = GivenFlags(app);
  return Run(options);
}

}  // namespace kvroute::sim
