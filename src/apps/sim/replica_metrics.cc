// Replica's /metrics exposition (vLLM's names and format, then the simulator's own
// series), written section by section in the order a scrape sees them.
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "apps/sim/replica.h"
#include "core/engine/scrape_signals.h"
#include "core/metrics/engine_metrics.h"
#include "core/metrics/prom_writer.h"

namespace kvroute::sim {

using metrics::Label;
using metrics::MetricType;

namespace {

// vLLM's engine gauges and counters (old: vLLM < 0.9.2's names), through
// vllm:request_success_total; metrics_nan and metrics_missing act on the load gauges.
void AppendEngineSeries(std::string& out, const std::vector<Label>& labels,
                        const engine::EngineStats& s, const engine::EngineConfig& config, bool old,
                        const fault::FaultSet& faults) {
  // The router's signals, from the one translation simulate uses too.
  const metrics::EngineMetrics m = engine::ScrapeSignals(s, config);
  // metrics_nan / metrics_missing: the three load gauges a router reads.
  const bool nan = faults.active(fault::FaultKind::kMetricsNan);
  const bool missing = faults.active(fault::FaultKind::kMetricsMissing);
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  const double running = nan ? kNan : m.running;
  const double waiting = nan ? kNan : m.waiting;
  const double kv_usage = nan ? kNan : m.kv_usage;

  if (!missing) {
    metrics::AppendGauge(out, "vllm:num_requests_running",
                         old ? "Number of requests currently running on GPU."
                             : "Number of requests in model execution batches.",
                         labels, running);
  }
  if (old) {
    metrics::AppendGauge(out, "vllm:num_requests_swapped", "Number of requests swapped to CPU.",
                         labels, 0.0);
  }
  if (!missing) {
    metrics::AppendGauge(out, "vllm:num_requests_waiting",
                         "Number of requests waiting to be processed.", labels, waiting);
  }
  if (old) {
    if (!missing) {
      metrics::AppendGauge(out, "vllm:gpu_cache_usage_perc",
                           "GPU KV-cache usage. 1 means 100 percent usage.", labels, kv_usage);
    }
    metrics::AppendGauge(out, "vllm:cpu_cache_usage_perc",
                         "CPU KV-cache usage. 1 means 100 percent usage.", labels, 0.0);
    metrics::AppendCounter(out, "vllm:gpu_prefix_cache_queries_total",
                           "GPU prefix cache queries, in terms of number of queried tokens.",
                           labels, m.prefix_queries);
    metrics::AppendCounter(out, "vllm:gpu_prefix_cache_hits_total",
                           "GPU prefix cache hits, in terms of number of cached tokens.", labels,
                           m.prefix_hits);
  } else {
    if (!missing) {
      metrics::AppendGauge(out, "vllm:kv_cache_usage_perc",
                           "KV-cache usage. 1 means 100 percent usage.", labels, kv_usage);
    }
    metrics::AppendCounter(out, "vllm:prefix_cache_queries_total",
                           "Prefix cache queries, in terms of number of queried tokens.", labels,
                           m.prefix_queries);
    metrics::AppendCounter(out, "vllm:prefix_cache_hits_total",
                           "Prefix cache hits, in terms of number of cached tokens.", labels,
                           m.prefix_hits);
  }
  metrics::AppendCounter(out, "vllm:num_preemptions_total",
                         "Cumulative number of preemption from the engine.", labels,
                         m.preemptions);
  metrics::AppendCounter(out, "vllm:prompt_tokens_total", "Number of prefill tokens processed.",
                         labels, static_cast<double>(s.prompt_tokens));
  metrics::AppendCounter(out, "vllm:generation_tokens_total",
                         "Number of generation tokens processed.", labels,
                         static_cast<double>(s.generation_tokens));
  metrics::AppendHeader(out, "vllm:request_success_total",
                        "Count of successfully processed requests.", MetricType::kCounter);
  metrics::AppendSample(out, "vllm:request_success_total", labels,
                        static_cast<double>(s.finished_stop), {"finished_reason", "stop"});
  metrics::AppendSample(out, "vllm:request_success_total", labels,
                        static_cast<double>(s.finished_length), {"finished_reason", "length"});
  metrics::AppendSample(out, "vllm:request_success_total", labels,
                        static_cast<double>(s.finished_abort), {"finished_reason", "abort"});
}

// vllm:cache_config_info (old: vLLM < 0.9.2's labels).
void AppendCacheConfigInfo(std::string& out, const engine::EngineConfig& c, bool old) {
  const std::string block_size = std::to_string(c.block_size);
  const std::string num_blocks = std::to_string(c.num_gpu_blocks);
  const char* prefix = c.enable_prefix_caching ? "True" : "False";
  std::vector<Label> info;
  if (old) {
    info = {{"block_size", block_size},      {"cache_dtype", "auto"},
            {"enable_prefix_caching", prefix}, {"gpu_memory_utilization", "0.9"},
            {"num_cpu_blocks", "2048"},      {"num_gpu_blocks", num_blocks},
            {"sliding_window", "None"},      {"swap_space_bytes", "4294967296"}};
  } else {
    info = {{"block_size", block_size},
            {"cache_dtype", "auto"},
            {"calculate_kv_scales", "False"},
            {"cpu_offload_gb", "0"},
            {"enable_prefix_caching", prefix},
            {"engine", "0"},
            {"gpu_memory_utilization", "0.9"},
            {"is_attention_free", "False"},
            {"num_cpu_blocks", "None"},
            {"num_gpu_blocks", num_blocks},
            {"num_gpu_blocks_override", "None"},
            {"prefix_caching_hash_algo", "xxhash"},
            {"sliding_window", "None"},
            {"swap_space", "4"},
            {"swap_space_bytes", "4294967296"}};
  }
  metrics::AppendGauge(out, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                       info, 1.0);
}

// The simulator's own series: kvroute_sim_replica_info and kvroute_sim_fault_active.
void AppendSimSeries(std::string& out, const ReplicaConfig& config,
                     const fault::FaultSet& faults) {
  // Not a vLLM series: the simulator's identity and the fleet file's labels, so a
  // dashboard can tell replicas apart.
  // A fleet label's key becomes a valid Prometheus label name: every character outside
  // [a-zA-Z0-9_] turns into '_' (llm-d.ai/role -> llm_d_ai_role), a leading digit gets '_'.
  std::vector<Label> ident = {{"replica", config.name}, {"preset", config.preset}};
  std::vector<std::string> names;
  names.reserve(config.labels.size());
  for (const auto& [k, v] : config.labels) {
    std::string& n = names.emplace_back(k);
    for (char& ch : n) {
      const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '_';
      if (!ok) ch = '_';
    }
    if (n.empty() || (n[0] >= '0' && n[0] <= '9')) n.insert(n.begin(), '_');
  }
  for (std::size_t i = 0; i < names.size(); ++i) ident.push_back({names[i], config.labels[i].second});
  metrics::AppendGauge(out, "kvroute_sim_replica_info", "Simulated replica identity and labels.",
                       ident, 1.0);
  metrics::AppendHeader(out, "kvroute_sim_fault_active",
                        "Injected faults in force (1) or not (0), by kind (docs/FAULTS.md).",
                        MetricType::kGauge);
  const std::vector<Label> replica_label = {{"replica", config.name}};
  for (int k = 0; k < fault::kNumFaultKinds; ++k) {
    const auto kind = static_cast<fault::FaultKind>(k);
    metrics::AppendSample(out, "kvroute_sim_fault_active", replica_label,
                          faults.active(kind) ? 1.0 : 0.0,
                          {"kind", fault::FaultKindName(kind)});
  }
}

}  // namespace

std::string Replica::MetricsText() const {
  const engine::EngineStats s = engine_.Stats();
  const engine::EngineConfig& c = config_.engine;
  const bool old = config_.old_metric_names;
  std::string out;
  out.reserve(16384);
  std::vector<Label> labels;
  if (!old) labels.push_back({"engine", "0"});
  labels.push_back({"model_name", c.model_name});
  AppendEngineSeries(out, labels, s, c, old, faults_);

  auto histogram = [&](std::string_view name, std::string_view help, const Histogram& h) {
    metrics::AppendHeader(out, name, help, MetricType::kHistogram);
    metrics::AppendHistogramSeries(out, name, labels, h.bounds, h.counts, h.sum);
  };
  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            ttft_);
  if (old) {
    histogram("vllm:time_per_output_token_seconds",
              "Histogram of time per output token in seconds.", itl_);
  } else {
    histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              itl_);
  }
  histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            e2e_);
  histogram("vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.", queue_);
  histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_len_);
  histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
            output_len_);

  AppendLoraInfo(out);
  AppendCacheConfigInfo(out, c, old);

  AppendSimSeries(out, config_, faults_);
  AppendPdMetrics(out, s);
  return out;
}

void Replica::AppendLoraInfo(std::string& out) const {
  const engine::EngineConfig& c = config_.engine;
  if (c.lora.enabled) {
    // As vLLM writes it: one series per label combination ever set, valued with the Unix
    // time it was last set; a reader takes the largest value (the current state).
    metrics::AppendHeader(out, "vllm:lora_requests_info", "Running stats on lora requests.",
                          MetricType::kGauge);
    const std::string max_lora = std::to_string(c.lora.max_loras);
    for (const LoraSeries& series : lora_series_) {
      const Label l[] = {{"max_lora", max_lora},
                         {"running_lora_adapters", series.running},
                         {"waiting_lora_adapters", series.waiting}};
      metrics::AppendSample(out, "vllm:lora_requests_info", l, series.unix_s);
    }
  }
}

// P/D (docs/SIM_API.md, "Prefill/decode disaggregation").
void Replica::AppendPdMetrics(std::string& out, const engine::EngineStats& s) const {
  const std::vector<Label> replica_label = {{"replica", config_.name}};
  metrics::AppendCounter(out, "kvroute_sim_pd_prefill_requests_total",
                         "Prefill legs answered with kv_transfer_params.", replica_label,
                         static_cast<double>(pd_.prefill_legs));
  metrics::AppendHeader(out, "kvroute_sim_pd_decode_requests_total",
                        "Decode legs by how their prompt KV was settled: pulled, local "
                        "(too little missing to pull), recomputed or failed (after a failed "
                        "pull, by kv_load_failure_policy).",
                        MetricType::kCounter);
  const std::pair<const char*, uint64_t> paths[] = {{"pulled", pd_.decode_pulled},
                                                    {"local", pd_.decode_local},
                                                    {"recomputed", pd_.decode_recomputed},
                                                    {"failed", pd_.decode_failed}};
  for (const auto& [path, n] : paths) {
    metrics::AppendSample(out, "kvroute_sim_pd_decode_requests_total", replica_label,
                          static_cast<double>(n), {"path", path});
  }
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_pulls_total",
                         "KV pulls from a prefill replica.", replica_label,
                         static_cast<double>(pd_.decode_pulled));
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_pulled_tokens_total",
                         "Prompt tokens whose KV was pulled (missing from the local cache).",
                         replica_label, static_cast<double>(pd_.pulled_tokens));
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_transfer_seconds_total",
                         "Engine seconds of KV pulls (tokens x bytes per token / bandwidth).",
                         replica_label, pd_.transfer_seconds);
  metrics::AppendHeader(out, "kvroute_sim_pd_kv_transfer_failures_total",
                        "KV pulls that could not happen, by reason.", MetricType::kCounter);
  for (KvClaimOutcome o : {KvClaimOutcome::kUnknownEngine, KvClaimOutcome::kPrefillDown,
                           KvClaimOutcome::kLeaseExpired}) {
    metrics::AppendSample(out, "kvroute_sim_pd_kv_transfer_failures_total", replica_label,
                          static_cast<double>(pd_.failures[static_cast<int>(o)]),
                          {"reason", KvClaimOutcomeName(o)});
  }
  metrics::AppendGauge(out, "kvroute_sim_pd_kv_leases",
                       "Finished prefill legs whose blocks are held for a decode leg.",
                       replica_label, static_cast<double>(s.kv_holds));
  metrics::AppendGauge(out, "kvroute_sim_pd_kv_held_blocks",
                       "KV blocks held for decode legs (counted in KV-cache usage).",
                       replica_label, static_cast<double>(s.kv_held_blocks));
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_leases_released_total",
                         "Holds released by a decode leg's claim (since the engine started).",
                         replica_label, static_cast<double>(s.kv_holds_released));
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_leases_expired_total",
                         "Holds dropped at the end of their lease (since the engine started).",
                         replica_label, static_cast<double>(s.kv_holds_expired));
  metrics::AppendGauge(out, "kvroute_sim_pd_waiting_for_remote_kvs",
                       "Decode legs waiting for their pulled KV (WAITING_FOR_REMOTE_KVS; also "
                       "counted as waiting requests).",
                       replica_label, static_cast<double>(s.waiting_for_remote_kvs));
}

}  // namespace kvroute::sim
