#include "simkit/workload/trace.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <simdjson.h>

#include "core/common/lines.h"

namespace kvroute::workload {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

std::vector<std::string_view> SplitCsv(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= line.size(); ++i) {
    if (i == line.size() || line[i] == ',') {
      out.push_back(Trim(line.substr(start, i - start)));
      start = i + 1;
    }
  }
  return out;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

bool ParseInt(std::string_view s, int64_t* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool ParseDouble(std::string_view s, double* out) {
  std::string tmp(s);
  char* end = nullptr;
  *out = std::strtod(tmp.c_str(), &end);
  return !tmp.empty() && end == tmp.c_str() + tmp.size();
}

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
int64_t DaysFromCivil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// "YYYY-MM-DD HH:MM:SS[.fraction]" (or with 'T') to seconds since the epoch.
bool ParseDateTime(std::string_view s, double* out) {
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || (s[10] != ' ' && s[10] != 'T') ||
      s[13] != ':' || s[16] != ':') {
    return false;
  }
  int64_t y, mo, d, h, mi, sec;
  if (!ParseInt(s.substr(0, 4), &y) || !ParseInt(s.substr(5, 2), &mo) ||
      !ParseInt(s.substr(8, 2), &d) || !ParseInt(s.substr(11, 2), &h) ||
      !ParseInt(s.substr(14, 2), &mi) || !ParseInt(s.substr(17, 2), &sec)) {
    return false;
  }
  double frac = 0.0;
  std::string_view rest = s.substr(19);
  if (!rest.empty() && rest.back() == 'Z') rest.remove_suffix(1);
  if (!rest.empty()) {
    if (rest[0] != '.') return false;
    double scale = 0.1;
    for (char c : rest.substr(1)) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return false;
      frac += (c - '0') * scale;
      scale *= 0.1;
    }
  }
  *out = static_cast<double>(DaysFromCivil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec) + frac;
  return true;
}

// Rows by time (stable), times from the earliest row.
void SortAndRebase(std::vector<TraceRow>& rows) {
  std::stable_sort(rows.begin(), rows.end(),
                   [](const TraceRow& a, const TraceRow& b) { return a.time_s < b.time_s; });
  if (!rows.empty()) {
    const double t0 = rows.front().time_s;
    for (TraceRow& r : rows) r.time_s -= t0;
  }
}

// A Mooncake line's integer field `name` >= `min`, or an error message.
std::string ReadCount(simdjson::dom::object obj, const char* name, int64_t min, int64_t* out) {
  simdjson::dom::element v;
  if (obj.at_key(name).get(v)) return std::string(name) + ": missing";
  if (v.get_int64().get(*out) || *out < min) {
    return std::string(name) + ": expected an integer >= " + std::to_string(min);
  }
  return {};
}

// One Mooncake line into `row`; an error message ("field: problem") or empty.
std::string ReadMooncakeLine(simdjson::dom::parser& parser, std::string_view line,
                             int64_t block_size, TraceRow* row) {
  simdjson::dom::element doc;
  if (parser.parse(simdjson::padded_string(line)).get(doc)) return "not a JSON object";
  simdjson::dom::object obj;
  if (doc.get_object().get(obj)) return "not a JSON object";
  simdjson::dom::element ts;
  double ms = 0.0;
  if (obj.at_key("timestamp").get(ts)) return "timestamp: missing";
  if (ts.get_double().get(ms) || !(ms >= 0.0) || !(ms <= 1e15)) {
    return "timestamp: expected milliseconds, 0 to 1e15";
  }
  row->time_s = ms / 1000.0;
  if (std::string e = ReadCount(obj, "input_length", 1, &row->context_tokens); !e.empty()) return e;
  if (std::string e = ReadCount(obj, "output_length", 1, &row->generated_tokens); !e.empty()) {
    return e;
  }
  simdjson::dom::element ids_el;
  simdjson::dom::array ids;
  if (obj.at_key("hash_ids").get(ids_el)) return "hash_ids: missing";
  if (ids_el.get_array().get(ids)) return "hash_ids: expected an array of integers >= 0";
  row->hash_ids.clear();
  row->hash_ids.reserve(ids.size());
  for (simdjson::dom::element id : ids) {
    uint64_t x = 0;
    if (id.get_uint64().get(x)) return "hash_ids: expected an array of integers >= 0";
    row->hash_ids.push_back(x);
  }
  const int64_t blocks = (row->context_tokens + block_size - 1) / block_size;
  if (static_cast<int64_t>(row->hash_ids.size()) != blocks) {
    return "hash_ids: " + std::to_string(row->hash_ids.size()) + " ids for input_length " +
           std::to_string(row->context_tokens) + " at block_size " + std::to_string(block_size) +
           " (expected " + std::to_string(blocks) + ")";
  }
  return {};
}

}  // namespace

TraceParseResult ParseTraceMooncake(std::string_view text, std::string_view source_name,
                                    int64_t block_size) {
  TraceParseResult result;
  if (block_size < 1) {
    result.error = std::string(source_name) + ": block_size must be >= 1";
    return result;
  }
  simdjson::dom::parser parser;
  Lines lines(text);
  std::string_view line;
  int line_no = 0;
  while (lines.Next(line)) {
    ++line_no;
    if (Trim(line).empty()) continue;
    TraceRow row;
    if (std::string e = ReadMooncakeLine(parser, line, block_size, &row); !e.empty()) {
      result.rows.clear();
      result.error = std::string(source_name) + ":" + std::to_string(line_no) + ": " + e;
      return result;
    }
    result.rows.push_back(std::move(row));
  }
  SortAndRebase(result.rows);
  return result;
}

TraceFormat DefaultTraceFormat(std::string_view path) {
  return path.ends_with(".jsonl") ? TraceFormat::kMooncake : TraceFormat::kAzureCsv;
}

std::optional<TraceFormat> TraceFormatNamed(std::string_view name) {
  if (name == "mooncake") return TraceFormat::kMooncake;
  if (name == "azure" || name == "csv") return TraceFormat::kAzureCsv;
  return std::nullopt;
}

std::string_view TraceFormatName(TraceFormat format) {
  return format == TraceFormat::kMooncake ? "mooncake" : "azure";
}

TraceParseResult ParseTrace(TraceFormat format, std::string_view text,
                            std::string_view source_name, int64_t block_size) {
  return format == TraceFormat::kMooncake ? ParseTraceMooncake(text, source_name, block_size)
                                          : ParseTraceCsv(text, source_name);
}

TraceParseResult ParseTraceCsv(std::string_view text, std::string_view source_name) {
  TraceParseResult result;
  auto fail = [&](int line, const std::string& msg) {
    result.rows.clear();
    result.error = std::string(source_name) + ":" + std::to_string(line) + ": " + msg;
    return result;
  };
  int line_no = 0;
  int col_time = -1, col_ctx = -1, col_gen = -1, col_group = -1, col_prefix = -1;
  size_t ncols = 0;
  bool have_header = false;
  Lines lines(text);
  std::string_view line;
  while (lines.Next(line)) {
    ++line_no;
    if (Trim(line).empty() || Trim(line).front() == '#') continue;
    std::vector<std::string_view> cells = SplitCsv(line);
    if (!have_header) {
      for (size_t i = 0; i < cells.size(); ++i) {
        const int c = static_cast<int>(i);
        if (EqualsIgnoreCase(cells[i], "TIMESTAMP")) col_time = c;
        if (EqualsIgnoreCase(cells[i], "ContextTokens")) col_ctx = c;
        if (EqualsIgnoreCase(cells[i], "GeneratedTokens")) col_gen = c;
        if (EqualsIgnoreCase(cells[i], "PrefixGroup")) col_group = c;
        if (EqualsIgnoreCase(cells[i], "PrefixTokens")) col_prefix = c;
      }
      if (col_time < 0 || col_ctx < 0 || col_gen < 0) {
        return fail(line_no, "header must name TIMESTAMP, ContextTokens and GeneratedTokens");
      }
      ncols = cells.size();
      have_header = true;
      continue;
    }
    if (cells.size() != ncols) {
      return fail(line_no, "expected " + std::to_string(ncols) + " columns, got " +
                               std::to_string(cells.size()));
    }
    TraceRow row;
    std::string_view ts = cells[col_time];
    // Seconds within +-1e12 (a date-time is ~1.7e9): an infinite or NaN time, or one whose
    // difference from the earliest row overflows, is not a time.
    const bool parsed = ParseDouble(ts, &row.time_s) || ParseDateTime(ts, &row.time_s);
    if (!parsed || !(std::fabs(row.time_s) <= 1e12)) {
      return fail(line_no,
                  "TIMESTAMP: not seconds or YYYY-MM-DD HH:MM:SS[.f]: '" + std::string(ts) + "'");
    }
    if (!ParseInt(cells[col_ctx], &row.context_tokens) || row.context_tokens < 1) {
      return fail(line_no, "ContextTokens: expected an integer >= 1");
    }
    if (!ParseInt(cells[col_gen], &row.generated_tokens) || row.generated_tokens < 1) {
      return fail(line_no, "GeneratedTokens: expected an integer >= 1");
    }
    if (col_group >= 0 && !cells[col_group].empty() &&
        !ParseInt(cells[col_group], &row.prefix_group)) {
      return fail(line_no, "PrefixGroup: expected an integer");
    }
    if (col_prefix >= 0 && !cells[col_prefix].empty() &&
        (!ParseInt(cells[col_prefix], &row.prefix_tokens) || row.prefix_tokens < 0)) {
      return fail(line_no, "PrefixTokens: expected an integer >= 0");
    }
    result.rows.push_back(row);
  }
  if (!have_header) return fail(line_no, "empty trace (no header)");
  SortAndRebase(result.rows);
  return result;
}

}  // namespace kvroute::workload
