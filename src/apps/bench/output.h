// Writing a load run's results: the files of docs/REPORT_SCHEMA.md into a directory, and
// the bench-only facts (error causes, scrapes) as report info.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "apps/bench/load_generator.h"
#include "simkit/report/writers.h"

namespace kvroute::bench {

// Creates `dir` (and parents) and writes report.json, report.md, ttft_cdf.svg and
// kv_usage.svg. Returns the paths written, or sets `*error` and returns what was written
// before the failure.
std::vector<std::string> WriteReportFiles(const std::string& dir, const report::ReportMeta& meta,
                                          std::span<const report::PolicyReport> policies,
                                          std::string* error);

// Adds to `meta->info` what a live run knows beyond the PolicyReport: model, target,
// detailed error causes ("errors.connect_refused" = "3"), requests not sent, scrape counts.
void AddRunInfo(const BenchResult& result, const std::string& prefix, report::ReportMeta* meta);

}  // namespace kvroute::bench
