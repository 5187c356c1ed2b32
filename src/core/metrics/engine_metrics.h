// Router-side extraction: the handful of numbers a picker needs, read from one scrape of
// an engine's /metrics. Pure (text in, struct out) and allocation-free on a clean scrape,
// so the scraper can run it every 50 ms per endpoint.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/metrics/prom_parser.h"

namespace kvroute::metrics {

enum class EngineType { kVllm, kSglang };

// "vllm" / "sglang".
std::string_view EngineTypeName(EngineType t);
std::optional<EngineType> ParseEngineType(std::string_view name);

// Which series and labels carry each number. An empty name means "not exported by this
// engine": that field stays absent. The *_old names are read only when a scrape has no
// series under the current name (vLLM renamed gpu_cache_usage_perc and the gpu_prefix_*
// counters around v0.9-v0.10 and exported both for a while).
struct MetricNames {
  std::string running;          // gauge, summed over engines
  std::string waiting;          // gauge, summed over engines
  std::string kv_usage;         // gauge in [0, 1]
  std::string kv_usage_old;
  std::string prefix_queries;   // counter, tokens looked up
  std::string prefix_queries_old;
  std::string prefix_hits;      // counter, tokens found
  std::string prefix_hits_old;
  std::string preemptions;      // counter
  std::string cache_info;       // info-style gauge whose labels carry capacity
  std::string block_size_label;
  std::string num_blocks_label;
  std::string engine_label;     // data-parallel engine index; empty when not labelled
  std::string model_label;      // served model name
  std::string lora_info;        // info-style gauge: value = when written, labels = adapters
  std::string max_lora_label;   // integer: adapters one batch may hold
  std::string running_loras_label;  // comma-joined adapter names with running requests
  std::string waiting_loras_label;  // comma-joined adapter names with waiting requests
  std::string swapped;          // gauge, summed over engines (vLLM V0: KV swapped to CPU)

  // vLLM: vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
  // (old vllm:gpu_cache_usage_perc), vllm:prefix_cache_{queries,hits}_total (old
  // vllm:gpu_prefix_cache_*), vllm:num_preemptions_total, vllm:cache_config_info
  // {block_size, num_gpu_blocks}, vllm:lora_requests_info {max_lora,
  // running_lora_adapters, waiting_lora_adapters}, labels engine and model_name.
  // SGLang: sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage,
  // sglang:cache_config_info {page_size, num_pages}, label model_name; no prefix
  // counters, preemptions or LoRA series.
  static MetricNames For(EngineType type);

  // Overrides one field by its config key: the member names above ("running",
  // "kv_usage_old", "num_blocks_label", "lora_info", ...). Returns false for an unknown key.
  bool Set(std::string_view key, std::string value);
  // Every key Set takes, in the members' order: the one list the config loader suggests
  // from and `kvroute serve --help` prints. Adding a field means one line in its table.
  static std::span<const std::string_view> Keys();
};

// One endpoint's state as of one scrape. Numbers are summed over the endpoint's engines
// (data-parallel ranks) except kv_usage, which is their capacity-weighted mean.
struct EngineMetrics {
  enum Field : uint32_t {
    kRunning = 1u << 0,
    kWaiting = 1u << 1,
    kKvUsage = 1u << 2,
    kPrefixQueries = 1u << 3,
    kPrefixHits = 1u << 4,
    kPreemptions = 1u << 5,
    kBlockSize = 1u << 6,
    kNumGpuBlocks = 1u << 7,
    kLora = 1u << 8,  // the LoRA fields below (vllm:lora_requests_info)
    kSwapped = 1u << 9,  // swapped
  };

  double running = 0;
  double waiting = 0;
  double kv_usage = 0;        // 0..1; weighted by num_gpu_blocks when every engine's is known
  double prefix_queries = 0;  // counters: the router takes rates between scrapes
  double prefix_hits = 0;
  double preemptions = 0;
  double swapped = 0;         // requests whose KV cache was swapped to CPU (vLLM V0)
  int64_t block_size = 0;      // tokens per block (first engine's), 0 when unknown
  int64_t num_gpu_blocks = 0;  // summed over engines, 0 when unknown
  int engines = 0;             // KV-usage series aggregated (one per engine)
  // LoRA adapters (issue 26), from the newest series of vllm:lora_requests_info: the most
  // adapters one batch may hold, and the adapters with running and with waiting requests,
  // as AdapterKey(name) (fixed capacity: no allocation per scrape; adapters past
  // kMaxLoraListed are dropped and `lora_truncated` set). Meaningful when Has(kLora).
  static constexpr std::size_t kMaxLoraListed = 16;
  int64_t max_lora = 0;
  uint8_t n_running_loras = 0;
  uint8_t n_waiting_loras = 0;
  bool lora_truncated = false;
  std::array<uint64_t, kMaxLoraListed> running_loras{};
  std::array<uint64_t, kMaxLoraListed> waiting_loras{};
  // AdapterKey of the served (base) model's name, from the model label of the engine's
  // load series (running, waiting, KV usage; the first one carrying it); 0 = unknown.
  // Tells a request for an adapter from one for the base model.
  uint64_t base_model_key = 0;
  uint32_t present = 0;        // Field bits for what the scrape contained, usable
  // Field bits for series the scrape contained but that cannot be used: a sample that is
  // NaN, +/-Inf, negative, above kMaxPlausibleCount (counts), or outside [0, 1] (KV
  // usage), in any engine; for block_size and num_gpu_blocks, a cache_config_info label
  // that is an integer but negative or above kMaxPlausibleCount ("None" is just unknown).
  // One bad engine makes the whole field invalid (the endpoint's aggregate is unknown,
  // not the sum of the rest). An invalid field is not `present`.
  uint32_t invalid = 0;

  // Larger queue/running/counter values than this are garbage, not load.
  static constexpr double kMaxPlausibleCount = 1e9;

  bool Has(Field f) const { return (present & f) != 0; }
  bool Invalid(Field f) const { return (invalid & f) != 0; }
};

// Whether the engine's waiting requests wait for an adapter slot rather than for compute
// (issue 43): its lora_requests_info is usable and complete, every one of max_lora slots
// runs an adapter, and some adapter waits that is not running (its requests cannot join the
// batch until a slot frees, whatever room the batch has). Its queue then says nothing about
// saturation. False without LoRA information.
bool AdapterBound(const EngineMetrics& m);

// An adapter name's key in EngineMetrics' LoRA lists: FNV-1a 64 of the name, never 0.
constexpr uint64_t AdapterKey(std::string_view name) {
  uint64_t h = 14695981039346656037ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

// Reads `text` (one scrape) into `out` using `names`. When `model_name` is not empty,
// series whose model label differs are ignored (series without the label are kept:
// cache_config_info and lora_requests_info have none in vLLM). A garbage sample (see
// EngineMetrics::invalid) marks its field invalid instead of present. LoRA: of the
// lora_info series (one per label combination ever seen), the one with the largest value
// (a timestamp) is the current one; NaN, Inf and negative values are skipped (all of
// them garbage: kLora invalid), and so is kLora when that series' max_lora is not an
// integer in [0, kMaxPlausibleCount]. Adapter lists are split on commas, entries trimmed
// of spaces and tabs, empty ones skipped. `out` is overwritten.
// Returns the parse report (bad lines are skipped, see ParsePrometheusText).
ParseReport ExtractEngineMetrics(std::string_view text, const MetricNames& names,
                                 std::string_view model_name, EngineMetrics& out);

}  // namespace kvroute::metrics
