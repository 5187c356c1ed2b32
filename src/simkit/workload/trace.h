// Request traces in the Azure LLM inference schema:
//   TIMESTAMP,ContextTokens,GeneratedTokens[,PrefixGroup[,PrefixTokens]]
// TIMESTAMP is either seconds (a number) or a date-time "YYYY-MM-DD HH:MM:SS[.fraction]"
// as in the published Azure traces. PrefixGroup (kvroute's extension, optional): rows
// with the same non-negative group share a prompt prefix; PrefixTokens (optional) is its
// length for that row. Columns are found by header name (case-insensitive), so extra
// columns are ignored. Pure: the caller reads the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::workload {

struct TraceRow {
  double time_s = 0.0;  // seconds since the earliest row
  int64_t context_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t prefix_group = -1;   // -1: shares nothing
  int64_t prefix_tokens = -1;  // -1: use the workload's prefix_len
};

struct TraceParseResult {
  std::vector<TraceRow> rows;  // sorted by time (stable)
  std::string error;           // "<source>:<line>: <problem>" when parsing failed
  bool ok() const { return error.empty(); }
};

TraceParseResult ParseTraceCsv(std::string_view text, std::string_view source_name);

}  // namespace kvroute::workload
