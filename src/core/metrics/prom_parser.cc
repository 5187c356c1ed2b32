#include "core/metrics/prom_parser.h"

#include <charconv>
#include <cmath>
#include <cstring>

namespace kvroute::metrics {

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t'; }
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }
bool IsLabelStart(char c) { return IsNameStart(c) && c != ':'; }
bool IsLabelChar(char c) { return IsNameChar(c) && c != ':'; }

size_t SkipSpaces(std::string_view s, size_t i) {
  while (i < s.size() && IsSpace(s[i])) ++i;
  return i;
}

// Prometheus values: Go float syntax plus NaN / +Inf / -Inf in any case. from_chars does
// the heavy lifting (shortest path, no locale); it rejects a leading '+', so strip it.
bool ParseValue(std::string_view tok, double& out) {
  if (tok.empty()) return false;
  const char* first = tok.data();
  const char* last = tok.data() + tok.size();
  if (*first == '+') {
    ++first;
    if (first == last || *first == '-' || *first == '+') return false;
  }
  auto [ptr, ec] = std::from_chars(first, last, out);
  if (ec == std::errc::result_out_of_range && ptr == last) {
    // from_chars leaves `out` unset on overflow/underflow; Go's ParseFloat (what
    // Prometheus uses) saturates to +-Inf, and tiny magnitudes become 0.
    const std::string_view num(first, static_cast<size_t>(last - first));
    const size_t e = num.find_first_of("eE");
    const bool tiny = e != std::string_view::npos && e + 1 < num.size() && num[e + 1] == '-';
    const bool negative = num[0] == '-';
    out = tiny ? (negative ? -0.0 : 0.0) : (negative ? -HUGE_VAL : HUGE_VAL);
    return true;
  }
  return ec == std::errc() && ptr == last;
}

bool ParseTimestamp(std::string_view tok, int64_t& out) {
  auto [ptr, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), out);
  return ec == std::errc() && ptr == tok.data() + tok.size();
}

// Scans a label value starting just after its opening quote. Returns the index of the
// closing quote, or npos with `error` set.
size_t ScanLabelValue(std::string_view line, size_t i, const char*& error) {
  while (i < line.size()) {
    // Most values have no escapes: jump straight to the next quote or backslash.
    const char* p = static_cast<const char*>(
        std::memchr(line.data() + i, '"', line.size() - i));
    const char* b = static_cast<const char*>(
        std::memchr(line.data() + i, '\\', (p ? p - line.data() : line.size()) - i));
    if (b == nullptr) {
      if (p == nullptr) break;
      return static_cast<size_t>(p - line.data());
    }
    i = static_cast<size_t>(b - line.data()) + 1;
    if (i >= line.size()) break;
    const char e = line[i];
    if (e != '\\' && e != '"' && e != 'n') {
      error = "invalid escape in label value (only \\\\, \\\" and \\n are allowed)";
      return std::string_view::npos;
    }
    ++i;
  }
  error = "unterminated label value";
  return std::string_view::npos;
}

// Which series names belong to a family of each type, per the exposition format (and
// prometheus_client, which also writes _created).
bool SuffixBelongs(MetricType type, std::string_view suffix) {
  switch (type) {
    case MetricType::kCounter:
      return suffix == "_total" || suffix == "_created";
    case MetricType::kHistogram:
    case MetricType::kGaugeHistogram:
      return suffix == "_bucket" || suffix == "_sum" || suffix == "_count" ||
             suffix == "_created" || suffix == "_gsum" || suffix == "_gcount";
    case MetricType::kSummary:
      return suffix == "_sum" || suffix == "_count" || suffix == "_created";
    case MetricType::kInfo:
      return suffix == "_info";
    default:
      return false;
  }
}

class Parser {
 public:
  Parser(std::string_view text, SampleVisitor& visitor, const ParseOptions& options)
      : text_(text), visitor_(visitor), options_(options) {}

  ParseReport Run() {
    size_t pos = 0;
    while (pos < text_.size() && !report_.aborted) {
      const char* nl =
          static_cast<const char*>(std::memchr(text_.data() + pos, '\n', text_.size() - pos));
      const size_t eol = nl ? static_cast<size_t>(nl - text_.data()) : text_.size();
      std::string_view line = text_.substr(pos, eol - pos);
      pos = eol + 1;
      ++report_.lines;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      const size_t i = SkipSpaces(line, 0);
      if (i == line.size()) continue;
      if (line[i] == '#') {
        Comment(line, i + 1);
      } else {
        SampleLine(line, i);
      }
    }
    return std::move(report_);
  }

 private:
  void Error(std::string message) {
    report_.errors.push_back({report_.lines, std::move(message)});
    if (static_cast<int>(report_.errors.size()) >= options_.max_errors) report_.aborted = true;
  }

  void Comment(std::string_view line, size_t i) {
    i = SkipSpaces(line, i);
    const size_t kw_start = i;
    while (i < line.size() && !IsSpace(line[i])) ++i;
    const std::string_view kw = line.substr(kw_start, i - kw_start);
    const bool help = kw == "HELP";
    if (!help && kw != "TYPE") return;  // any other comment is free text
    i = SkipSpaces(line, i);
    const size_t name_start = i;
    while (i < line.size() && IsNameChar(line[i])) ++i;
    const std::string_view name = line.substr(name_start, i - name_start);
    if (name.empty() || !IsNameStart(name[0]) || (i < line.size() && !IsSpace(line[i]))) {
      Error(std::string("invalid metric name in # ") + std::string(kw) + " line");
      return;
    }
    i = SkipSpaces(line, i);
    std::string_view rest = line.substr(i);
    if (help) {
      visitor_.OnHelp(name, rest);
      return;
    }
    while (!rest.empty() && IsSpace(rest.back())) rest.remove_suffix(1);
    const std::optional<MetricType> t = ParseMetricType(rest);
    if (!t) {
      Error("unknown metric type '" + std::string(rest) + "' for " + std::string(name));
      family_ = {};
      family_type_ = MetricType::kUnknown;
      return;
    }
    family_ = name;
    family_type_ = *t;
    visitor_.OnType(name, *t);
  }

  void SampleLine(std::string_view line, size_t i) {
    const size_t name_start = i;
    if (!IsNameStart(line[i])) {
      Error("invalid metric name");
      return;
    }
    while (i < line.size() && IsNameChar(line[i])) ++i;
    Sample s;
    s.name = line.substr(name_start, i - name_start);
    if (!visitor_.Wants(s.name)) {
      ++report_.skipped;
      return;
    }
    i = SkipSpaces(line, i);
    if (i < line.size() && line[i] == '{') {
      const size_t open = i;
      const char* error = nullptr;
      i = ScanLabels(line, i + 1, error);
      if (error != nullptr) {
        Error(std::string(error) + " in " + std::string(s.name));
        return;
      }
      s.labels = LabelView(line.substr(open + 1, i - open - 1));
      ++i;  // past '}'
      i = SkipSpaces(line, i);
    } else if (i < line.size() && !IsSpace(line[i - 1])) {
      Error("invalid character '" + std::string(1, line[i]) + "' in metric name " +
            std::string(s.name));
      return;
    }
    const size_t value_start = i;
    while (i < line.size() && !IsSpace(line[i])) ++i;
    const std::string_view value_tok = line.substr(value_start, i - value_start);
    if (value_tok.empty()) {
      Error("missing value for " + std::string(s.name));
      return;
    }
    if (!ParseValue(value_tok, s.value)) {
      Error("invalid value '" + std::string(value_tok) + "' for " + std::string(s.name));
      return;
    }
    i = SkipSpaces(line, i);
    if (i < line.size()) {
      const size_t ts_start = i;
      while (i < line.size() && !IsSpace(line[i])) ++i;
      const std::string_view ts_tok = line.substr(ts_start, i - ts_start);
      if (!ParseTimestamp(ts_tok, s.timestamp_ms)) {
        Error("invalid timestamp '" + std::string(ts_tok) + "' for " + std::string(s.name));
        return;
      }
      s.has_timestamp = true;
      i = SkipSpaces(line, i);
      if (i < line.size()) {
        Error("unexpected text after timestamp for " + std::string(s.name));
        return;
      }
    }
    s.line = report_.lines;
    s.family = s.name;
    if (!family_.empty() && s.name.starts_with(family_)) {
      const std::string_view suffix = s.name.substr(family_.size());
      if (suffix.empty() || SuffixBelongs(family_type_, suffix)) {
        s.family = family_;
        s.type = family_type_;
      }
    }
    ++report_.samples;
    visitor_.OnSample(s);
  }

  // Validates `name="value", ...}` from `i`; returns the index of the closing brace.
  size_t ScanLabels(std::string_view line, size_t i, const char*& error) {
    while (true) {
      i = SkipSpaces(line, i);
      if (i >= line.size()) {
        error = "unterminated label set";
        return i;
      }
      if (line[i] == '}') return i;
      if (!IsLabelStart(line[i])) {
        error = "invalid label name";
        return i;
      }
      while (i < line.size() && IsLabelChar(line[i])) ++i;
      i = SkipSpaces(line, i);
      if (i >= line.size() || line[i] != '=') {
        error = "expected '=' after label name";
        return i;
      }
      i = SkipSpaces(line, i + 1);
      if (i >= line.size() || line[i] != '"') {
        error = "expected '\"' to open label value";
        return i;
      }
      i = ScanLabelValue(line, i + 1, error);
      if (error != nullptr) return i;
      i = SkipSpaces(line, i + 1);
      if (i < line.size() && line[i] == ',') {
        ++i;
      } else if (i >= line.size() || line[i] != '}') {
        error = "expected ',' or '}' after label value";
        return i;
      }
    }
  }

  std::string_view text_;
  SampleVisitor& visitor_;
  const ParseOptions& options_;
  ParseReport report_;
  std::string_view family_;  // the latest # TYPE family
  MetricType family_type_ = MetricType::kUnknown;
};

}  // namespace

std::string_view MetricTypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
    case MetricType::kSummary: return "summary";
    case MetricType::kUntyped: return "untyped";
    case MetricType::kInfo: return "info";
    case MetricType::kStateSet: return "stateset";
    case MetricType::kGaugeHistogram: return "gaugehistogram";
    case MetricType::kUnknown: break;
  }
  return "unknown";
}

std::optional<MetricType> ParseMetricType(std::string_view w) {
  if (w == "counter") return MetricType::kCounter;
  if (w == "gauge") return MetricType::kGauge;
  if (w == "histogram") return MetricType::kHistogram;
  if (w == "summary") return MetricType::kSummary;
  if (w == "untyped") return MetricType::kUntyped;
  if (w == "unknown") return MetricType::kUntyped;  // OpenMetrics spelling
  if (w == "info") return MetricType::kInfo;
  if (w == "stateset") return MetricType::kStateSet;
  if (w == "gaugehistogram") return MetricType::kGaugeHistogram;
  return std::nullopt;
}

std::string UnescapeLabelValue(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c == '\\' && i + 1 < raw.size()) {
      c = raw[++i];
      if (c == 'n') c = '\n';
    }
    out.push_back(c);
  }
  return out;
}

bool LabelValueEquals(std::string_view raw, std::string_view decoded) {
  if (raw.find('\\') == std::string_view::npos) return raw == decoded;
  size_t j = 0;
  for (size_t i = 0; i < raw.size(); ++i, ++j) {
    char c = raw[i];
    if (c == '\\' && i + 1 < raw.size()) {
      c = raw[++i];
      if (c == 'n') c = '\n';
    }
    if (j >= decoded.size() || decoded[j] != c) return false;
  }
  return j == decoded.size();
}

bool LabelView::Next(size_t& pos, std::string_view& name, std::string_view& raw_value) const {
  // raw_ was validated by the parser, so this walk needs no error handling.
  size_t i = pos;
  while (i < raw_.size() && (IsSpace(raw_[i]) || raw_[i] == ',')) ++i;
  if (i >= raw_.size()) {
    pos = i;
    return false;
  }
  const size_t name_start = i;
  while (i < raw_.size() && IsLabelChar(raw_[i])) ++i;
  name = raw_.substr(name_start, i - name_start);
  while (i < raw_.size() && raw_[i] != '"') ++i;
  const size_t value_start = ++i;
  while (i < raw_.size() && raw_[i] != '"') i += raw_[i] == '\\' ? 2 : 1;
  raw_value = raw_.substr(value_start, i - value_start);
  pos = i + 1;
  return true;
}

std::optional<std::string_view> LabelView::Find(std::string_view name) const {
  size_t pos = 0;
  std::string_view n, v;
  while (Next(pos, n, v)) {
    if (n == name) return v;
  }
  return std::nullopt;
}

bool LabelView::Equals(std::string_view name, std::string_view value) const {
  const auto v = Find(name);
  return v && LabelValueEquals(*v, value);
}

std::optional<std::string> LabelView::Get(std::string_view name) const {
  const auto v = Find(name);
  if (!v) return std::nullopt;
  return UnescapeLabelValue(*v);
}

std::optional<int64_t> LabelView::GetInt(std::string_view name) const {
  const auto v = Find(name);
  if (!v) return std::nullopt;
  int64_t x = 0;
  auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
  if (ec != std::errc() || ptr != v->data() + v->size()) return std::nullopt;
  return x;
}

ParseReport ParsePrometheusText(std::string_view text, SampleVisitor& visitor,
                                const ParseOptions& options) {
  return Parser(text, visitor, options).Run();
}

std::vector<OwnedSample> ParseAllSamples(std::string_view text, ParseReport* report) {
  struct Collector : SampleVisitor {
    std::vector<OwnedSample> out;
    void OnSample(const Sample& s) override {
      OwnedSample o;
      o.name = std::string(s.name);
      o.family = std::string(s.family);
      o.type = s.type;
      s.labels.ForEach([&](std::string_view n, std::string_view v) {
        o.labels.emplace_back(std::string(n), UnescapeLabelValue(v));
      });
      o.value = s.value;
      if (s.has_timestamp) o.timestamp_ms = s.timestamp_ms;
      o.line = s.line;
      out.push_back(std::move(o));
    }
  } collector;
  ParseReport r = ParsePrometheusText(text, collector);
  if (report != nullptr) *report = std::move(r);
  return std::move(collector.out);
}

}  // namespace kvroute::metrics
