#include "core/metrics/prom_writer.h"

#include <charconv>
#include <cmath>

namespace kvroute::metrics {

namespace {

// Python's repr(float): shortest round-trip digits, fixed notation when the decimal
// exponent is in [-4, 16), else d.ddde+XX. to_chars gives the shortest digits; only the
// layout differs.
void AppendPythonRepr(std::string& out, double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string_view mant = sci.substr(0, e_pos);
  int exp = 0;
  std::from_chars(sci.data() + e_pos + (sci[e_pos + 1] == '+' ? 2 : 1), sci.data() + sci.size(),
                  exp);
  char digits[32];
  size_t nd = 0;
  for (char c : mant) {
    if (c != '.') digits[nd++] = c;
  }
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      const size_t int_len = static_cast<size_t>(exp) + 1;
      for (size_t i = 0; i < int_len; ++i) out.push_back(i < nd ? digits[i] : '0');
      out.push_back('.');
      if (nd > int_len) {
        out.append(digits + int_len, nd - int_len);
      } else {
        out.push_back('0');
      }
    } else {
      out.append("0.");
      out.append(static_cast<size_t>(-exp - 1), '0');
      out.append(digits, nd);
    }
    return;
  }
  out.push_back(digits[0]);
  if (nd > 1) {
    out.push_back('.');
    out.append(digits + 1, nd - 1);
  }
  out.push_back('e');
  out.push_back(exp < 0 ? '-' : '+');
  const int a = exp < 0 ? -exp : exp;
  if (a < 10) out.push_back('0');
  out.append(std::to_string(a));
}

}  // namespace

void AppendPromValue(std::string& out, double v) {
  if (std::isnan(v)) {
    out.append("NaN");
    return;
  }
  if (std::isinf(v)) {
    out.append(v > 0 ? "+Inf" : "-Inf");
    return;
  }
  const size_t start = out.size();
  AppendPythonRepr(out, v);
  // prometheus_client's floatToGoString: Go switches to exponents sooner than Python, so
  // a positive repr with more than 6 integer digits becomes d.ddd "e+0" (dot-1). The "0"
  // is literal even for two-digit exponents ("e+010"); we copy the quirk so simulated
  // replicas print exactly what vLLM prints.
  const size_t dot = out.find('.', start);
  if (v > 0 && dot != std::string::npos && dot - start > 6) {
    const std::string s = out.substr(start);
    const size_t d = dot - start;
    std::string mantissa;
    mantissa.push_back(s[0]);
    mantissa.push_back('.');
    mantissa.append(s, 1, d - 1);
    mantissa.append(s, d + 1, std::string::npos);
    while (!mantissa.empty() && (mantissa.back() == '0' || mantissa.back() == '.')) {
      mantissa.pop_back();
    }
    out.resize(start);
    out.append(mantissa);
    out.append("e+0");
    out.append(std::to_string(d - 1));
  }
}

std::string FormatPromValue(double v) {
  std::string s;
  AppendPromValue(s, v);
  return s;
}

void AppendEscapedLabelValue(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '\\': out.append("\\\\"); break;
      case '"': out.append("\\\""); break;
      case '\n': out.append("\\n"); break;
      default: out.push_back(c);
    }
  }
}

void AppendHeader(std::string& out, std::string_view name, std::string_view help,
                  MetricType type) {
  out.append("# HELP ").append(name).push_back(' ');
  for (char c : help) {
    if (c == '\\') {
      out.append("\\\\");
    } else if (c == '\n') {
      out.append("\\n");
    } else {
      out.push_back(c);
    }
  }
  out.append("\n# TYPE ").append(name).push_back(' ');
  out.append(MetricTypeName(type == MetricType::kUnknown ? MetricType::kUntyped : type));
  out.push_back('\n');
}

void AppendSample(std::string& out, std::string_view name, std::span<const Label> labels,
                  double value, Label extra) {
  out.append(name);
  if (!labels.empty() || !extra.name.empty()) {
    out.push_back('{');
    bool first = true;
    auto add = [&](const Label& l) {
      if (!first) out.push_back(',');
      first = false;
      out.append(l.name).append("=\"");
      AppendEscapedLabelValue(out, l.value);
      out.push_back('"');
    };
    for (const Label& l : labels) add(l);
    if (!extra.name.empty()) add(extra);
    out.push_back('}');
  }
  out.push_back(' ');
  AppendPromValue(out, value);
  out.push_back('\n');
}

void AppendGauge(std::string& out, std::string_view name, std::string_view help,
                 std::span<const Label> labels, double value) {
  AppendHeader(out, name, help, MetricType::kGauge);
  AppendSample(out, name, labels, value);
}

void AppendCounter(std::string& out, std::string_view name, std::string_view help,
                   std::span<const Label> labels, double value) {
  AppendHeader(out, name, help, MetricType::kCounter);
  AppendSample(out, name, labels, value);
}

void AppendCounterFamily(std::string& out, std::string_view name, std::string_view help,
                         std::string_view label, std::span<const LabeledValue> samples) {
  AppendHeader(out, name, help, MetricType::kCounter);
  for (const LabeledValue& s : samples) {
    const Label l{label, s.label_value};
    AppendSample(out, name, {&l, 1}, s.value);
  }
}

void AppendHistogramSeries(std::string& out, std::string_view name,
                           std::span<const Label> labels, std::span<const double> upper_bounds,
                           std::span<const uint64_t> bucket_counts, double sum) {
  std::string series(name);
  const size_t base = series.size();
  series.append("_bucket");
  uint64_t cumulative = 0;
  std::string le;
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (i < bucket_counts.size()) cumulative += bucket_counts[i];
    le.clear();
    AppendPromValue(le, upper_bounds[i]);
    AppendSample(out, series, labels, static_cast<double>(cumulative), Label{"le", le});
  }
  for (size_t i = upper_bounds.size(); i < bucket_counts.size(); ++i) cumulative += bucket_counts[i];
  AppendSample(out, series, labels, static_cast<double>(cumulative), Label{"le", "+Inf"});
  series.resize(base);
  series.append("_count");
  AppendSample(out, series, labels, static_cast<double>(cumulative));
  series.resize(base);
  series.append("_sum");
  AppendSample(out, series, labels, sum);
}

}  // namespace kvroute::metrics
