#include "apps/sim/sim_main.h"

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <optional>
#include <tuple>

#include "config/fleet_config.h"
#include "core/api/lora.h"
#include "apps/sim/fleet.h"

namespace kvroute::sim {

int SimMain(int argc, char** argv) {
  CLI::App app{
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
      "  curl -d '{\"kind\":\"hang\",\"duration\":\"5s\"}' localhost:8000/admin/fault",
      "kvroute sim"};
  int replicas = 0;
  int port = 8000;
  int threads = 0;
  std::string config_path;
  config::ReplicaOverrides cli;
  std::string host = "127.0.0.1", preset, model;
  int kv_blocks = 0, max_num_seqs = 0, max_batched_tokens = 0, max_model_len = 0;
  int default_max_tokens = 0, fixed_output_tokens = 0;
  double time_scale = 1.0, latency_ms = 0.0, mean_output_tokens = 0.0;
  bool old_names = false;
  bool prompt_tokens_details = false;

  app.add_option("--replicas,-n", replicas,
                 "Number of replicas (default: the fleet file's count, else 1)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--port,-p", port, "Port of replica 0; replica i uses port+i (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  auto* o_host = app.add_option("--host", host, "Address to listen on")->capture_default_str();
  auto* o_preset = app.add_option("--preset", preset,
                                  "Engine preset: llama3-8b-h100 (26304 blocks of 16 tokens, "
                                  "H100 step model) or small-kv (2048 blocks)");
  auto* o_blocks = app.add_option("--kv-blocks", kv_blocks,
                                  "KV-cache blocks (num_gpu_blocks; block 0 is reserved)")
                       ->check(CLI::Range(2, 1 << 30));
  auto* o_seqs = app.add_option("--max-num-seqs", max_num_seqs, "Running batch limit")
                     ->check(CLI::Range(1, 1 << 20));
  auto* o_tokens = app.add_option("--max-batched-tokens", max_batched_tokens,
                                  "Token budget per engine step (chunked prefill)")
                       ->check(CLI::Range(1, 1 << 24));
  auto* o_len = app.add_option("--max-model-len", max_model_len,
                               "Context limit: prompt + max_tokens above it -> 400")
                    ->check(CLI::Range(2, 1 << 30));
  auto* o_scale = app.add_option("--time-scale", time_scale,
                                 "Wall seconds per engine second (1: real time, 0.01: 100x "
                                 "faster, 0: no waiting)")
                      ->check(CLI::NonNegativeNumber)
                      ->capture_default_str();
  auto* o_model = app.add_option("--model", model,
                                 "Served model name (default meta-llama/Llama-3.1-8B-Instruct); "
                                 "requests for another model get 404");
  auto* o_old = app.add_flag("--old-metric-names", old_names,
                             "Emulate vLLM < 0.9.2 metrics: vllm:gpu_cache_usage_perc, "
                             "vllm:gpu_prefix_cache_*, no engine label");
  auto* o_details = app.add_flag(
      "--enable-prompt-tokens-details", prompt_tokens_details,
      "As vLLM's flag: usage carries prompt_tokens_details.cached_tokens (prefix-cache hit "
      "tokens), also in a stream's final usage chunk; without it, no prompt_tokens_details");
  auto* o_latency = app.add_option("--latency-ms", latency_ms,
                                   "One-way network latency of generation requests, both ways: "
                                   "before a request reaches the engine and on everything "
                                   "it gets back (TTFT + 2x)")
                        ->check(CLI::NonNegativeNumber);
  auto* o_default_max = app.add_option("--default-max-tokens", default_max_tokens,
                                       "max_tokens for chat requests that set none (default 256)")
                            ->check(CLI::Range(1, 1 << 30));
  auto* o_fixed = app.add_option("--fixed-output-tokens", fixed_output_tokens,
                                 "Every request stops (finish_reason stop) after this many "
                                 "tokens unless max_tokens is smaller (0: off)")
                      ->check(CLI::Range(0, 1 << 30));
  auto* o_mean = app.add_option("--mean-output-tokens", mean_output_tokens,
                                "Output lengths drawn from an exponential with this mean (0: "
                                "run to max_tokens)")
                     ->check(CLI::NonNegativeNumber);
  app.add_option("--config,-c", config_path,
                 "Fleet YAML file: per-replica preset, kv_blocks, model, max_num_seqs, labels, "
                 "latency_ms, faults, ... (see examples/fleet.yaml, examples/fleet-faults.yaml)")
      ->check(CLI::ExistingFile);
  // KV-cache events (docs/KV_EVENTS.md), as vLLM's --kv-events-config publishes them.
  int kv_port = 0, kv_replay_port = 0;
  std::string kv_format = "array", kv_hash = "int", kv_topic;
  auto* o_kv_port = app.add_option("--kv-events-port", kv_port,
                                   "Publish KV-cache events: replica i binds a ZMQ PUB socket on "
                                   "port P+i (0: any free port)")
                        ->check(CLI::Range(0, 65535));
  auto* o_kv_replay = app.add_option("--kv-events-replay-port", kv_replay_port,
                                     "ROUTER socket for replay on port R+i (keeps the last 10000 "
                                     "batches)")
                          ->check(CLI::Range(0, 65535));
  auto* o_kv_format = app.add_option("--kv-events-format", kv_format,
                                     "Event encoding: array (vLLM <= 0.24) or map (newer)")
                          ->check(CLI::IsMember({"array", "map"}));
  auto* o_kv_hash = app.add_option("--kv-events-hash", kv_hash,
                                   "Block hashes as int (uint64) or bytes (32-byte digest)")
                        ->check(CLI::IsMember({"int", "bytes"}));
  auto* o_kv_topic = app.add_option("--kv-events-topic", kv_topic,
                                    "Topic frame of every message (default: empty)");
  std::string kv_connect;
  auto* o_kv_connect = app.add_option("--kv-events-connect", kv_connect,
                                      "Publish by connecting to tcp://HOST:PORT (a router's "
                                      "pool.kv_events.bind) instead of binding a port; topic "
                                      "default kv@<host>@<model>");
  // P/D (docs/SIM_API.md, "Prefill/decode disaggregation"): every replica serves both legs.
  std::string kv_lease, kv_bytes, kv_bandwidth, kv_policy;
  int kv_min_pull = 0;
  auto* o_kv_lease = app.add_option("--kv-lease", kv_lease,
                                    "P/D: how long a prefill leg holds its blocks for the "
                                    "decode leg, engine time (default 30s)");
  auto* o_kv_bytes = app.add_option("--kv-bytes-per-token", kv_bytes,
                                    "P/D: KV bytes per token of a pull (default: the preset's "
                                    "model, 128KiB for Llama-3.1-8B bf16)");
  auto* o_kv_bw = app.add_option("--kv-transfer-bandwidth", kv_bandwidth,
                                 "P/D: bytes per second of a pull (default 25GB, RDMA at "
                                 "200 Gb/s)");
  auto* o_kv_min = app.add_option("--kv-min-pull-tokens", kv_min_pull,
                                  "P/D: a decode leg missing fewer prompt tokens recomputes "
                                  "them instead of pulling (default 64)")
                       ->check(CLI::Range(0, 1 << 30));
  auto* o_kv_policy = app.add_option("--kv-load-failure-policy", kv_policy,
                                     "P/D: a pull that cannot happen fails the request (fail, "
                                     "500) or is recomputed locally (recompute); default fail")
                          ->check(CLI::IsMember({"fail", "recompute"}));
  // LoRA adapters (docs/SIM_API.md, "LoRA adapters"), as vLLM's flags.
  bool enable_lora = false;
  int max_loras = 1, max_cpu_loras = 0, max_lora_rank = 16;
  double lora_load_s = 0.05;
  std::vector<std::string> lora_modules;
  auto* o_lora = app.add_flag("--enable-lora", enable_lora,
                              "Serve LoRA adapters: requests name one as their model, "
                              "POST /v1/load_lora_adapter and /v1/unload_lora_adapter, "
                              "vllm:lora_requests_info");
  auto* o_max_loras = app.add_option("--max-loras", max_loras,
                                     "Distinct adapters in one batch; requests of others wait "
                                     "(default 1)")
                          ->check(CLI::Range(1, 1024));
  auto* o_max_cpu = app.add_option("--max-cpu-loras", max_cpu_loras,
                                   "Adapters kept loaded (LRU); default --max-loras")
                        ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-lora-rank", max_lora_rank,
                 "Accepted for vLLM compatibility; the load cost does not depend on it")
      ->check(CLI::Range(1, 1024));
  auto* o_lora_load = app.add_option("--lora-load-s", lora_load_s,
                                     "Engine seconds a step takes longer per adapter it loads "
                                     "(default 0.05)")
                          ->check(CLI::NonNegativeNumber);
  auto* o_lora_modules = app.add_option("--lora-modules", lora_modules,
                                        "Adapters served from the start: name=path or "
                                        "'{\"name\":..,\"path\":..}' (several allowed)");
  app.add_option("--threads", threads,
                 "Event-loop threads shared by the replicas (default: one per replica, at most "
                 "the CPU count)")
      ->check(CLI::Range(1, 256));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  config::FleetFile file;
  if (!config_path.empty()) {
    config::ConfigOr<config::FleetFile> loaded = config::LoadFleetFile(config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "kvroute sim: %s\n", loaded.error.ToString().c_str());
      return 2;
    }
    file = std::move(*loaded.value);
  }
  if (o_host->count()) cli.host = host;
  if (o_preset->count()) cli.preset = preset;
  if (o_blocks->count()) cli.kv_blocks = kv_blocks;
  if (o_seqs->count()) cli.max_num_seqs = max_num_seqs;
  if (o_tokens->count()) cli.max_batched_tokens = max_batched_tokens;
  if (o_len->count()) cli.max_model_len = max_model_len;
  if (o_scale->count()) cli.time_scale = time_scale;
  if (o_model->count()) cli.model = model;
  if (o_old->count()) cli.old_metric_names = old_names;
  if (o_details->count()) cli.enable_prompt_tokens_details = prompt_tokens_details;
  if (o_latency->count()) cli.latency_ms = latency_ms;
  if (o_default_max->count()) cli.default_max_tokens = default_max_tokens;
  if (o_fixed->count()) cli.fixed_output_tokens = fixed_output_tokens;
  if (o_mean->count()) cli.mean_output_tokens = mean_output_tokens;
  if (o_kv_port->count()) cli.kv_events_port = kv_port;
  if (o_kv_replay->count()) cli.kv_events_replay_port = kv_replay_port;
  if (o_kv_format->count()) cli.kv_events_format = kv_format;
  if (o_kv_hash->count()) cli.kv_events_hash = kv_hash;
  if (o_kv_topic->count()) cli.kv_events_topic = kv_topic;
  if (o_kv_connect->count()) cli.kv_events_connect = kv_connect;
  if (o_kv_lease->count()) {
    std::optional<double> d = config::ParseDuration(kv_lease);
    if (!d || *d <= 0) {
      std::fprintf(stderr, "kvroute sim: --kv-lease: must be a duration such as 30s (got '%s')\n",
                   kv_lease.c_str());
      return 2;
    }
    cli.kv_lease_s = *d;
  }
  for (auto [opt, text, field, name] :
       {std::tuple{o_kv_bytes, &kv_bytes, &cli.kv_bytes_per_token, "--kv-bytes-per-token"},
        std::tuple{o_kv_bw, &kv_bandwidth, static_cast<std::optional<uint64_t>*>(nullptr),
                   "--kv-transfer-bandwidth"}}) {
    if (!opt->count()) continue;
    std::optional<uint64_t> b = config::ParseByteSize(*text);
    if (!b || *b == 0) {
      std::fprintf(stderr, "kvroute sim: %s: must be a size such as 128KiB or 25GB (got '%s')\n",
                   name, text->c_str());
      return 2;
    }
    if (field) {
      *field = *b;
    } else {
      cli.kv_transfer_bandwidth = static_cast<double>(*b);
    }
  }
  if (o_kv_min->count()) cli.kv_min_pull_tokens = kv_min_pull;
  if (o_lora->count()) cli.enable_lora = enable_lora;
  if (o_max_loras->count()) cli.max_loras = max_loras;
  if (o_max_cpu->count()) cli.max_cpu_loras = max_cpu_loras;
  if (o_lora_load->count()) cli.lora_load_s = lora_load_s;
  if (o_lora_modules->count()) {
    cli.lora_modules.emplace();
    for (const std::string& spec : lora_modules) {
      std::string error;
      std::optional<api::LoraModule> m = api::ParseLoraModule(spec, &error);
      if (!m) {
        std::fprintf(stderr, "kvroute sim: --lora-modules: %s\n", error.c_str());
        return 2;
      }
      cli.lora_modules->push_back(std::move(*m));
    }
  }
  if (o_kv_policy->count()) cli.kv_load_failure_policy = kv_policy;
  int base_port = port;
  if (!app.get_option("--port")->count() && file.base_port) base_port = *file.base_port;
  if (threads == 0 && file.threads) threads = *file.threads;

  std::vector<ReplicaConfig> configs;
  if (Status s = config::ResolveFleet(file, cli, replicas, base_port, &configs); !s.ok()) {
    std::fprintf(stderr, "kvroute sim: %s\n", s.message().c_str());
    return 2;
  }

  Fleet fleet(configs, threads);
  if (Status st = fleet.Start(); !st.ok()) {
    const std::string err = st.message();
    std::fprintf(stderr, "kvroute sim: %s\n", err.c_str());
    return 1;
  }
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

  boost::asio::io_context signals_ctx;
  boost::asio::signal_set signals(signals_ctx, SIGINT, SIGTERM);
  signals.async_wait([](const boost::system::error_code&, int) {});
  signals_ctx.run();
  fleet.Stop();
  return 0;
}

}  // namespace kvroute::sim
