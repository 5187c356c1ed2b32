// Prometheus text exposition format (0.0.4) parser, built for a scraper on the hot path:
// it walks the text once and hands each sample to a visitor as views into the text, so
// extracting a few metrics from a scrape allocates nothing (only errors allocate).
// Pure: bytes in, callbacks and a report out. No I/O, no exceptions.
//
// Handles what prometheus_client (vLLM, SGLang) and Go exporters send: # HELP / # TYPE
// comments (other comments ignored), labels with escaped values (\\ \" \n), optional
// trailing comma in label sets, NaN / +Inf / -Inf values, optional integer timestamps,
// blank lines, CRLF line ends, and the _total / _created / _bucket / _sum / _count
// series of counters, histograms and summaries (linked to their # TYPE family).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::metrics {

enum class MetricType : uint8_t {
  kUnknown,  // no # TYPE line for this series
  kCounter,
  kGauge,
  kHistogram,
  kSummary,
  kUntyped,
  kInfo,
  kStateSet,
  kGaugeHistogram,
};

// "counter", "gauge", ... ("unknown" for kUnknown).
std::string_view MetricTypeName(MetricType t);
// The inverse of MetricTypeName for the words a # TYPE line may hold; nullopt otherwise.
std::optional<MetricType> ParseMetricType(std::string_view word);

// Decodes a label value written with \\, \" and \n escapes. `raw` must be well formed
// (as every value the parser hands out is).
std::string UnescapeLabelValue(std::string_view raw);
// True when the decoded form of `raw` equals `decoded`; allocates nothing.
bool LabelValueEquals(std::string_view raw, std::string_view decoded);

// The label set of one sample: the validated text between its braces. Values come out
// raw (still escaped); for the usual values without a backslash that is the value.
// A view: valid as long as the scraped text it points into.
class LabelView {
 public:
  LabelView() = default;
  // `raw` must be a label list the parser accepted (without the braces).
  explicit LabelView(std::string_view raw) : raw_(raw) {}

  std::string_view raw() const { return raw_; }
  bool empty() const { return raw_.find('=') == std::string_view::npos; }

  // The raw value of label `name`, or nullopt when absent. Scans the labels (linear).
  std::optional<std::string_view> Find(std::string_view name) const;
  // True when label `name` is present and its decoded value is `value`.
  bool Equals(std::string_view name, std::string_view value) const;
  // The decoded value of label `name`, or nullopt.
  std::optional<std::string> Get(std::string_view name) const;
  // The value of label `name` parsed as a base-10 integer; nullopt when absent or not
  // an integer (e.g. "None").
  std::optional<int64_t> GetInt(std::string_view name) const;

  // Calls f(std::string_view name, std::string_view raw_value) for each label in order.
  template <typename F>
  void ForEach(F&& f) const {
    size_t pos = 0;
    std::string_view name, value;
    while (Next(pos, name, value)) f(name, value);
  }

  // Iteration primitive behind ForEach: reads the label at `pos` (start at 0), advances
  // `pos`; false at the end.
  bool Next(size_t& pos, std::string_view& name, std::string_view& raw_value) const;

 private:
  std::string_view raw_;
};

// One sample line. Views point into the parsed text.
struct Sample {
  std::string_view name;    // series name as written: "vllm:e2e_request_latency_seconds_bucket"
  std::string_view family;  // its # TYPE family ("vllm:e2e_request_latency_seconds"), else name
  MetricType type = MetricType::kUnknown;  // the family's declared type
  LabelView labels;
  double value = 0;
  bool has_timestamp = false;
  int64_t timestamp_ms = 0;
  int line = 0;  // 1-based
};

// Receives the samples of one parse. Called synchronously from ParsePrometheusText on the
// caller's thread, in text order.
class SampleVisitor {
 public:
  virtual ~SampleVisitor() = default;
  // Asked once per sample line with the series name, before its labels and value are
  // parsed. Returning false skips the rest of the line without validating it: the cheap
  // path for the hundreds of histogram buckets a scraper does not read.
  virtual bool Wants(std::string_view name) { return true; }
  virtual void OnSample(const Sample& sample) = 0;
  // # TYPE and # HELP lines (help text still escaped).
  virtual void OnType(std::string_view family, MetricType type) {}
  virtual void OnHelp(std::string_view family, std::string_view raw_help) {}
};

struct ParseError {
  int line = 0;  // 1-based
  std::string message;
};

struct ParseOptions {
  // After this many bad lines the text is taken not to be an exposition (an HTML error
  // page, a truncated binary) and parsing stops; ParseReport::aborted is set.
  int max_errors = 32;
};

// What a parse saw. A bad line is reported and skipped; the rest is still parsed.
struct ParseReport {
  int lines = 0;    // lines read (including blank and comment lines)
  int samples = 0;  // samples handed to OnSample
  int skipped = 0;  // sample lines the visitor did not want
  bool aborted = false;
  std::vector<ParseError> errors;  // empty on a clean parse: allocates only on errors
  bool ok() const { return errors.empty(); }
};

// Parses `text` and calls `visitor` for each sample it wants. Never throws.
ParseReport ParsePrometheusText(std::string_view text, SampleVisitor& visitor,
                                const ParseOptions& options = {});

// An owning copy of a sample, for tests and tools (not the hot path).
struct OwnedSample {
  std::string name;
  std::string family;
  MetricType type = MetricType::kUnknown;
  std::vector<std::pair<std::string, std::string>> labels;  // decoded, in text order
  double value = 0;
  std::optional<int64_t> timestamp_ms;
  int line = 0;
};

// Parses every sample into owned values. Convenience for tests and tools.
std::vector<OwnedSample> ParseAllSamples(std::string_view text, ParseReport* report = nullptr);

}  // namespace kvroute::metrics
