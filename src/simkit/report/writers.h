// Report writers: JSON (schema in docs/REPORT_SCHEMA.md), a Markdown table, and two
// hand-written SVG charts for the demo. Pure: strings out; the caller writes files.
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "simkit/report/summary.h"

namespace kvroute::report {

struct ReportMeta {
  std::string tool = "kvroute simulate";
  std::string scenario;
  uint64_t seed = 0;
  Slo slo;
  // Free-form facts about the run (fleet size, request count...), written as strings.
  std::vector<std::pair<std::string, std::string>> info;
};

// The whole report as one JSON object (2-space indented, trailing newline).
// Non-finite numbers are written as null.
std::string ReportJson(const ReportMeta& meta, std::span<const PolicyReport> policies);

// A Markdown table, one row per policy (trailing newline).
std::string ReportMarkdown(const ReportMeta& meta, std::span<const PolicyReport> policies);

// TTFT CDF, one line per policy, log-scaled time axis. A complete SVG document.
std::string TtftCdfSvg(std::span<const PolicyReport> policies);

// KV-cache usage per replica over time: one panel per policy, one line per recorded
// replica. A complete SVG document.
std::string KvUsageSvg(std::span<const PolicyReport> policies);

}  // namespace kvroute::report
