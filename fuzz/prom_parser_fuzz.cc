// Fuzz target: a scrape body as an engine's /metrics could send it, through the real
// Prometheus text parser (every entry point a scraper or tool uses) and the router's
// EngineMetrics extraction for vLLM and SGLang names.
//
// Invariants checked (beyond "no crash, no sanitizer report"):
//   - every sample, label and error the parser hands out points into the input, with a
//     line number within the lines it read; report counts match the callbacks;
//   - label values decode and compare equal to their decoded form;
//   - ExtractEngineMetrics never marks a field both present and invalid, and every
//     present value is finite, non-negative and in range (KV usage in [0, 1], counts
//     at most kMaxPlausibleCount per sample times the samples read); LoRA lists within
//     their capacity, filled only when kLora is present, max_lora in range.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <string_view>

#include "core/metrics/engine_metrics.h"
#include "core/metrics/prom_parser.h"

namespace {

using namespace kvroute::metrics;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

bool Inside(std::string_view part, std::string_view whole) {
  if (part.empty()) return true;
  return part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size();
}

class CheckingVisitor : public SampleVisitor {
 public:
  CheckingVisitor(std::string_view text, uint8_t skip_mask) : text_(text), skip_mask_(skip_mask) {}

  bool Wants(std::string_view name) override {
    Check(!name.empty() && Inside(name, text_), "Wants: name outside the text");
    ++asked_;
    // Skip some names (by a hash of the name) to exercise the cheap skip path.
    return ((name.size() + static_cast<uint8_t>(name[0])) & skip_mask_) == 0;
  }

  void OnSample(const Sample& s) override {
    ++samples_;
    Check(!s.name.empty() && Inside(s.name, text_), "sample name outside the text");
    Check((!s.family.empty() && Inside(s.family, text_)) || s.family == s.name,
          "sample family outside the text");
    Check(Inside(s.labels.raw(), text_), "labels outside the text");
    Check(s.line >= 1, "sample line < 1");
    max_line_ = std::max(max_line_, s.line);
    size_t labels = 0;
    s.labels.ForEach([&](std::string_view name, std::string_view raw) {
      ++labels;
      Check(!name.empty() && Inside(name, text_) && Inside(raw, text_), "label outside the text");
      const std::string decoded = UnescapeLabelValue(raw);
      Check(decoded.size() <= raw.size(), "decoded label value longer than raw");
      Check(LabelValueEquals(raw, decoded), "label value differs from its decoding");
      const auto found = s.labels.Find(name);
      Check(found.has_value(), "Find misses a label ForEach saw");
      const auto got = s.labels.Get(name);
      Check(got.has_value() && *got == UnescapeLabelValue(*found), "Get != decoded Find");
      Check(s.labels.Equals(name, *got), "Equals false for its own value");
      (void)s.labels.GetInt(name);
    });
    Check(s.labels.empty() == (labels == 0), "LabelView::empty disagrees with ForEach");
  }

  void OnType(std::string_view family, MetricType type) override {
    Check(Inside(family, text_), "type family outside the text");
    Check(ParseMetricType(MetricTypeName(type)).value_or(MetricType::kUnknown) == type ||
              type == MetricType::kUnknown,
          "MetricTypeName does not round-trip");
  }

  void OnHelp(std::string_view family, std::string_view raw_help) override {
    Check(Inside(family, text_) && Inside(raw_help, text_), "help outside the text");
  }

  int samples_ = 0;
  int asked_ = 0;
  int max_line_ = 0;

 private:
  std::string_view text_;
  uint8_t skip_mask_;
};

void CheckMetrics(const EngineMetrics& m, const ParseReport& r) {
  Check((m.present & m.invalid) == 0, "a field both present and invalid");
  const double max_sum = EngineMetrics::kMaxPlausibleCount * std::max(1, r.samples);
  auto count = [&](EngineMetrics::Field f, double v, const char* what) {
    if (!m.Has(f)) return;
    if (!(std::isfinite(v) && v >= 0 && v <= max_sum)) {
      std::fprintf(stderr, "%s = %g\n", what, v);
      Check(false, "a present count is NaN, infinite, negative or implausible");
    }
  };
  count(EngineMetrics::kRunning, m.running, "running");
  count(EngineMetrics::kWaiting, m.waiting, "waiting");
  count(EngineMetrics::kPrefixQueries, m.prefix_queries, "prefix_queries");
  count(EngineMetrics::kPrefixHits, m.prefix_hits, "prefix_hits");
  count(EngineMetrics::kPreemptions, m.preemptions, "preemptions");
  if (m.Has(EngineMetrics::kKvUsage)) {
    if (!(m.kv_usage >= 0 && m.kv_usage <= 1)) std::fprintf(stderr, "kv_usage = %.17g\n", m.kv_usage);
    Check(m.kv_usage >= 0 && m.kv_usage <= 1, "present kv_usage outside [0, 1]");
    Check(m.engines >= 1, "kv_usage present without an engine");
  }
  Check(m.Has(EngineMetrics::kBlockSize) == (m.block_size > 0), "block_size vs its bit");
  Check(m.Has(EngineMetrics::kNumGpuBlocks) == (m.num_gpu_blocks > 0), "num_gpu_blocks vs its bit");
  Check(m.engines >= 0, "negative engine count");
  Check(m.n_running_loras <= EngineMetrics::kMaxLoraListed &&
            m.n_waiting_loras <= EngineMetrics::kMaxLoraListed,
        "more adapters listed than the lists hold");
  if (m.Has(EngineMetrics::kLora)) {
    Check(m.max_lora >= 0 && m.max_lora <= EngineMetrics::kMaxPlausibleCount,
          "present max_lora negative or implausible");
    for (size_t i = 0; i < m.n_running_loras; ++i) Check(m.running_loras[i] != 0, "adapter key 0");
    for (size_t i = 0; i < m.n_waiting_loras; ++i) Check(m.waiting_loras[i] != 0, "adapter key 0");
  } else {
    Check(m.n_running_loras == 0 && m.n_waiting_loras == 0 && m.max_lora == 0 &&
              !m.lora_truncated,
          "LoRA lists filled without the kLora bit");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // Variants picked by the input's size, not all of them per input: libFuzzer's compare
  // tracing makes each parse of a 12 KB scrape cost about a millisecond.
  {
    const uint8_t mask = size & 1;
    CheckingVisitor v(text, mask);
    ParseOptions options;
    options.max_errors = mask == 0 ? 32 : 1;
    const ParseReport r = ParsePrometheusText(text, v, options);
    Check(r.samples == v.samples_, "report.samples != OnSample calls");
    // A wanted line can still be bad (then it is an error, not a sample).
    Check(r.samples + r.skipped <= v.asked_, "samples + skipped > Wants calls");
    Check(r.samples + r.skipped + static_cast<int>(r.errors.size()) >= v.asked_ || r.aborted,
          "a wanted line neither sampled nor reported");
    Check(v.max_line_ <= r.lines, "sample line beyond the lines read");
    Check(r.ok() == r.errors.empty(), "ok() != errors.empty()");
    Check(static_cast<int>(r.errors.size()) <= options.max_errors, "more errors than max_errors");
    if (r.aborted) Check(!r.errors.empty(), "aborted without an error");
    for (const ParseError& e : r.errors) {
      Check(e.line >= 1 && e.line <= r.lines, "error line out of range");
      Check(!e.message.empty(), "error without a message");
    }
  }

  ParseReport all_report;
  const auto all = ParseAllSamples(text, &all_report);
  Check(static_cast<int>(all.size()) == all_report.samples, "ParseAllSamples count");
  for (const OwnedSample& s : all) {
    Check(!s.name.empty() && s.line >= 1, "owned sample without a name or line");
  }

  static const MetricNames kVllm = MetricNames::For(EngineType::kVllm);
  static const MetricNames kSglang = MetricNames::For(EngineType::kSglang);
  const std::string_view model = (size & 2) ? "meta-llama/Llama-3.1-8B-Instruct" : "";
  for (const MetricNames* names : {&kVllm, &kSglang}) {
    EngineMetrics m;
    m.present = ~0u;  // `out` is overwritten: stale bits must not survive
    const ParseReport r = ExtractEngineMetrics(text, *names, model, m);
    CheckMetrics(m, r);
  }
  return 0;
}
