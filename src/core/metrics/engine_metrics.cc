#include "core/metrics/engine_metrics.h"

#include <array>
#include <cmath>
#include <utility>

namespace kvroute::metrics {

std::string_view EngineTypeName(EngineType t) {
  return t == EngineType::kSglang ? "sglang" : "vllm";
}

std::optional<EngineType> ParseEngineType(std::string_view name) {
  if (name == "vllm") return EngineType::kVllm;
  if (name == "sglang") return EngineType::kSglang;
  return std::nullopt;
}

MetricNames MetricNames::For(EngineType type) {
  MetricNames n;
  if (type == EngineType::kSglang) {
    n.running = "sglang:num_running_reqs";
    n.waiting = "sglang:num_queue_reqs";
    n.kv_usage = "sglang:token_usage";
    n.cache_info = "sglang:cache_config_info";
    n.block_size_label = "page_size";
    n.num_blocks_label = "num_pages";
    n.model_label = "model_name";
    return n;
  }
  n.running = "vllm:num_requests_running";
  n.waiting = "vllm:num_requests_waiting";
  n.kv_usage = "vllm:kv_cache_usage_perc";
  n.kv_usage_old = "vllm:gpu_cache_usage_perc";
  n.prefix_queries = "vllm:prefix_cache_queries_total";
  n.prefix_queries_old = "vllm:gpu_prefix_cache_queries_total";
  n.prefix_hits = "vllm:prefix_cache_hits_total";
  n.prefix_hits_old = "vllm:gpu_prefix_cache_hits_total";
  n.preemptions = "vllm:num_preemptions_total";
  n.cache_info = "vllm:cache_config_info";
  n.block_size_label = "block_size";
  n.num_blocks_label = "num_gpu_blocks";
  n.engine_label = "engine";
  n.model_label = "model_name";
  n.lora_info = "vllm:lora_requests_info";
  n.max_lora_label = "max_lora";
  n.running_loras_label = "running_lora_adapters";
  n.waiting_loras_label = "waiting_lora_adapters";
  n.swapped = "vllm:num_requests_swapped";
  return n;
}

namespace {

// Every metric-name key and the member it sets: the one list config, --help and Set use.
struct NameKey {
  std::string_view key;
  std::string MetricNames::*field;
};
constexpr NameKey kNameKeys[] = {
    {"running", &MetricNames::running},
    {"waiting", &MetricNames::waiting},
    {"kv_usage", &MetricNames::kv_usage},
    {"kv_usage_old", &MetricNames::kv_usage_old},
    {"prefix_queries", &MetricNames::prefix_queries},
    {"prefix_queries_old", &MetricNames::prefix_queries_old},
    {"prefix_hits", &MetricNames::prefix_hits},
    {"prefix_hits_old", &MetricNames::prefix_hits_old},
    {"preemptions", &MetricNames::preemptions},
    {"cache_info", &MetricNames::cache_info},
    {"block_size_label", &MetricNames::block_size_label},
    {"num_blocks_label", &MetricNames::num_blocks_label},
    {"engine_label", &MetricNames::engine_label},
    {"model_label", &MetricNames::model_label},
    {"lora_info", &MetricNames::lora_info},
    {"max_lora_label", &MetricNames::max_lora_label},
    {"running_loras_label", &MetricNames::running_loras_label},
    {"waiting_loras_label", &MetricNames::waiting_loras_label},
    {"swapped", &MetricNames::swapped},
};

}  // namespace

std::span<const std::string_view> MetricNames::Keys() {
  static const auto keys = [] {
    std::array<std::string_view, std::size(kNameKeys)> k{};
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = kNameKeys[i].key;
    return k;
  }();
  return keys;
}

bool MetricNames::Set(std::string_view key, std::string value) {
  for (const NameKey& k : kNameKeys) {
    if (k.key == key) {
      this->*k.field = std::move(value);
      return true;
    }
  }
  return false;
}

namespace {

enum Slot : uint8_t {
  kRunningSlot,
  kWaitingSlot,
  kUsageSlot,
  kUsageOldSlot,
  kQueriesSlot,
  kQueriesOldSlot,
  kHitsSlot,
  kHitsOldSlot,
  kPreemptionsSlot,
  kSwappedSlot,
  kCacheInfoSlot,
  kLoraSlot,
  kNumSlots,
};

// Per-engine entries live in fixed arrays so a scrape allocates nothing; 64 covers any
// data-parallel size we expect. Beyond it, usage falls back to an unweighted mean.
constexpr size_t kMaxEngines = 64;

struct UsageEntry {
  std::string_view engine;  // raw engine label value ("" when unlabelled)
  double usage;
};

struct CacheInfoEntry {
  std::string_view engine;
  int64_t block_size;  // 0 unknown
  int64_t blocks;      // 0 unknown
  bool bad_block_size = false;  // a number, but negative or implausibly large
  bool bad_blocks = false;
};

// A capacity label is garbage outside [0, kMaxPlausibleCount]: summing such values over
// engines would overflow int64_t (found by fuzz/prom_parser_fuzz).
bool PlausibleCapacity(int64_t v) {
  return v >= 0 && static_cast<double>(v) <= EngineMetrics::kMaxPlausibleCount;
}

// AdapterKey of the decoded form of a raw (still escaped) label value, without decoding
// into a buffer: the same FNV-1a steps over the same bytes.
uint64_t RawAdapterKey(std::string_view raw) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c == '\\' && i + 1 < raw.size()) {
      c = raw[++i];
      if (c == 'n') c = '\n';
    }
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

// Splits a comma-joined adapter list into `keys`; returns how many were stored and sets
// `truncated` when more than keys.size() non-empty names were listed.
uint8_t SplitAdapters(std::string_view raw, std::array<uint64_t, EngineMetrics::kMaxLoraListed>& keys,
                      bool& truncated) {
  size_t n = 0;
  size_t start = 0;
  while (start <= raw.size()) {
    size_t end = raw.find(',', start);
    if (end == std::string_view::npos) end = raw.size();
    std::string_view name = raw.substr(start, end - start);
    while (!name.empty() && (name.front() == ' ' || name.front() == '\t')) name.remove_prefix(1);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.remove_suffix(1);
    if (!name.empty()) {
      if (n < keys.size()) {
        keys[n++] = RawAdapterKey(name);
      } else {
        truncated = true;
      }
    }
    start = end + 1;
  }
  return static_cast<uint8_t>(n);
}

class Extractor : public SampleVisitor {
 public:
  Extractor(const MetricNames& names, std::string_view model) : names_(names), model_(model) {
    const std::string* by_slot[kNumSlots] = {
        &names.running,     &names.waiting,        &names.kv_usage,    &names.kv_usage_old,
        &names.prefix_queries, &names.prefix_queries_old, &names.prefix_hits,
        &names.prefix_hits_old, &names.preemptions, &names.swapped, &names.cache_info,
        &names.lora_info,
    };
    for (int s = 0; s < kNumSlots; ++s) {
      if (!by_slot[s]->empty()) table_[n_++] = {*by_slot[s], static_cast<Slot>(s)};
    }
  }

  bool Wants(std::string_view name) override {
    for (size_t i = 0; i < n_; ++i) {
      if (table_[i].first == name) {
        current_ = table_[i].second;
        return true;
      }
    }
    return false;
  }

  void OnSample(const Sample& s) override {
    std::optional<std::string_view> model;
    if (!names_.model_label.empty()) model = s.labels.Find(names_.model_label);
    if (model && !model_.empty() && !LabelValueEquals(*model, model_)) return;
    if (current_ == kCacheInfoSlot) {
      AddCacheInfo(s);
      return;
    }
    if (current_ == kLoraSlot) {
      AddLora(s);
      return;
    }
    if (model && !base_model_ && (current_ == kRunningSlot || current_ == kWaitingSlot ||
                                  current_ == kUsageSlot || current_ == kUsageOldSlot)) {
      base_model_ = model;
    }
    seen_[current_] = true;
    if (!Plausible(current_, s.value)) {
      bad_[current_] = true;
      return;
    }
    switch (current_) {
      case kUsageSlot:
      case kUsageOldSlot:
        AddUsage(current_ == kUsageOldSlot, EngineKey(s), s.value);
        break;
      default:
        sums_[current_] += s.value;
    }
  }

  void Finish(EngineMetrics& out) const {
    out = EngineMetrics{};
    if (base_model_ && !base_model_->empty()) out.base_model_key = RawAdapterKey(*base_model_);
    FinishLora(out);
    auto take = [&](Slot slot, Slot old_slot, double& dst, EngineMetrics::Field f) {
      const Slot use = seen_[slot] ? slot : old_slot;
      if (!seen_[use]) return;
      if (bad_[use]) {
        out.invalid |= f;
        return;
      }
      dst = sums_[use];
      out.present |= f;
    };
    take(kRunningSlot, kRunningSlot, out.running, EngineMetrics::kRunning);
    take(kWaitingSlot, kWaitingSlot, out.waiting, EngineMetrics::kWaiting);
    take(kQueriesSlot, kQueriesOldSlot, out.prefix_queries, EngineMetrics::kPrefixQueries);
    take(kHitsSlot, kHitsOldSlot, out.prefix_hits, EngineMetrics::kPrefixHits);
    take(kPreemptionsSlot, kPreemptionsSlot, out.preemptions, EngineMetrics::kPreemptions);
    take(kSwappedSlot, kSwappedSlot, out.swapped, EngineMetrics::kSwapped);

    bool bad_block_size = false;
    bool bad_blocks = false;
    for (size_t i = 0; i < n_info_; ++i) {
      bad_block_size |= info_[i].bad_block_size;
      bad_blocks |= info_[i].bad_blocks;
      if (info_[i].block_size > 0 && out.block_size == 0) {
        out.block_size = info_[i].block_size;
        out.present |= EngineMetrics::kBlockSize;
      }
      if (info_[i].blocks > 0) {
        out.num_gpu_blocks += info_[i].blocks;
        out.present |= EngineMetrics::kNumGpuBlocks;
      }
    }
    // As for samples: one engine's garbage makes the endpoint's figure unknown.
    if (bad_block_size) {
      out.block_size = 0;
      out.present &= ~EngineMetrics::kBlockSize;
      out.invalid |= EngineMetrics::kBlockSize;
    }
    if (bad_blocks) {
      out.num_gpu_blocks = 0;
      out.present &= ~EngineMetrics::kNumGpuBlocks;
      out.invalid |= EngineMetrics::kNumGpuBlocks;
    }

    const int u = seen_[kUsageSlot] ? 0 : 1;  // current name wins when both are exported
    if (bad_[u == 0 ? kUsageSlot : kUsageOldSlot]) {
      out.invalid |= EngineMetrics::kKvUsage;
      return;
    }
    const Usage& usage = usage_[u];
    if (usage.count == 0) return;
    out.present |= EngineMetrics::kKvUsage;
    out.engines = usage.count;
    double weighted = 0;
    double weight = 0;
    bool all_known = usage.count <= static_cast<int>(kMaxEngines);
    for (size_t i = 0; all_known && i < usage.n; ++i) {
      const int64_t blocks = BlocksFor(usage.entries[i].engine);
      if (blocks <= 0) all_known = false;
      weighted += usage.entries[i].usage * static_cast<double>(blocks);
      weight += static_cast<double>(blocks);
    }
    out.kv_usage = all_known && weight > 0 ? weighted / weight : usage.sum / usage.count;
  }

 private:
  struct Usage {
    std::array<UsageEntry, kMaxEngines> entries;
    size_t n = 0;
    int count = 0;
    double sum = 0;
  };

  static bool Plausible(Slot slot, double v) {
    if (!std::isfinite(v) || v < 0) return false;
    if (slot == kUsageSlot || slot == kUsageOldSlot) return v <= 1.0;
    return v <= EngineMetrics::kMaxPlausibleCount;
  }

  std::string_view EngineKey(const Sample& s) const {
    if (names_.engine_label.empty()) return {};
    return s.labels.Find(names_.engine_label).value_or(std::string_view());
  }

  void AddUsage(bool old, std::string_view engine, double v) {
    Usage& u = usage_[old ? 1 : 0];
    if (u.n < kMaxEngines) u.entries[u.n++] = {engine, v};
    ++u.count;
    u.sum += v;
  }

  // Keeps the newest (largest finite value) lora_info series; garbage values only count.
  void AddLora(const Sample& s) {
    seen_[kLoraSlot] = true;
    if (!std::isfinite(s.value) || s.value < 0) return;
    if (!lora_best_ || s.value > lora_best_value_) {
      lora_best_ = s.labels;
      lora_best_value_ = s.value;
    }
  }

  void FinishLora(EngineMetrics& out) const {
    if (!seen_[kLoraSlot]) return;
    std::optional<int64_t> max_lora;
    if (lora_best_ && !names_.max_lora_label.empty()) {
      max_lora = lora_best_->GetInt(names_.max_lora_label);
    }
    if (!max_lora || !PlausibleCapacity(*max_lora)) {
      out.invalid |= EngineMetrics::kLora;
      return;
    }
    out.max_lora = *max_lora;
    auto list = [&](const std::string& label) {
      return label.empty() ? std::string_view() : lora_best_->Find(label).value_or(std::string_view());
    };
    out.n_running_loras =
        SplitAdapters(list(names_.running_loras_label), out.running_loras, out.lora_truncated);
    out.n_waiting_loras =
        SplitAdapters(list(names_.waiting_loras_label), out.waiting_loras, out.lora_truncated);
    out.present |= EngineMetrics::kLora;
  }

  void AddCacheInfo(const Sample& s) {
    if (n_info_ >= kMaxEngines) return;
    CacheInfoEntry e{EngineKey(s), 0, 0};
    if (!names_.block_size_label.empty()) {
      e.block_size = s.labels.GetInt(names_.block_size_label).value_or(0);
      if (!PlausibleCapacity(e.block_size)) {
        e.block_size = 0;
        e.bad_block_size = true;
      }
    }
    if (!names_.num_blocks_label.empty()) {
      e.blocks = s.labels.GetInt(names_.num_blocks_label).value_or(0);
      if (!PlausibleCapacity(e.blocks)) {
        e.blocks = 0;
        e.bad_blocks = true;
      }
    }
    info_[n_info_++] = e;
  }

  // An engine's capacity: its own cache_config_info, else an unlabelled one (older vLLM).
  int64_t BlocksFor(std::string_view engine) const {
    int64_t fallback = 0;
    for (size_t i = 0; i < n_info_; ++i) {
      if (info_[i].engine == engine) return info_[i].blocks;
      if (info_[i].engine.empty()) fallback = info_[i].blocks;
    }
    return fallback;
  }

  const MetricNames& names_;
  std::string_view model_;
  std::array<std::pair<std::string_view, Slot>, kNumSlots> table_{};
  size_t n_ = 0;
  Slot current_ = kRunningSlot;
  std::array<double, kNumSlots> sums_{};
  std::array<bool, kNumSlots> seen_{};
  std::array<bool, kNumSlots> bad_{};  // a sample of the slot was garbage
  Usage usage_[2];
  std::array<CacheInfoEntry, kMaxEngines> info_{};
  size_t n_info_ = 0;
  std::optional<LabelView> lora_best_;  // the newest usable lora_info series
  double lora_best_value_ = 0;
  std::optional<std::string_view> base_model_;  // raw model label of a load series
};

}  // namespace

ParseReport ExtractEngineMetrics(std::string_view text, const MetricNames& names,
                                 std::string_view model_name, EngineMetrics& out) {
  Extractor x(names, model_name);
  ParseReport report = ParsePrometheusText(text, x);
  x.Finish(out);
  return report;
}

bool AdapterBound(const EngineMetrics& m) {
  if (!m.Has(EngineMetrics::kLora) || m.lora_truncated || m.max_lora <= 0) return false;
  if (m.n_running_loras < m.max_lora || m.n_waiting_loras == 0) return false;
  for (uint8_t w = 0; w < m.n_waiting_loras; ++w) {
    bool running = false;
    for (uint8_t r = 0; r < m.n_running_loras; ++r) running |= m.running_loras[r] == m.waiting_loras[w];
    if (!running) return true;
  }
  return false;
}

}  // namespace kvroute::metrics
