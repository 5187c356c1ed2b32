// Request traces, in two formats.
//
// The Azure LLM inference schema (CSV):
//   TIMESTAMP,ContextTokens,GeneratedTokens[,PrefixGroup[,PrefixTokens]]
// TIMESTAMP is either seconds (a number) or a date-time "YYYY-MM-DD HH:MM:SS[.fraction]"
// as in the published Azure traces. PrefixGroup (kvroute's extension, optional): rows
// with the same non-negative group share a prompt prefix; PrefixTokens (optional) is its
// length for that row. Columns are found by header name (case-insensitive), so extra
// columns are ignored.
//
// Mooncake's (JSON lines, the FAST'25 release's traces and what serve's capture writes):
//   {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [id, ...]}
// One id per block of `block_size` prompt tokens, in prompt order, the last block partial
// (so there are exactly ceil(n / block_size) ids); equal ids at the same leading
// positions are the same prompt text. Other fields are ignored. A blank line is skipped;
// any other line that is not such an object is an error.
//
// Pure: the caller reads the file.
#pragma once

#include <cstdint>
#include <optional>
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
  // Mooncake: the prompt's block ids (empty in the CSV format).
  std::vector<uint64_t> hash_ids;
};

struct TraceParseResult {
  std::vector<TraceRow> rows;  // sorted by time (stable)
  std::string error;           // "<source>:<line>: <problem>" when parsing failed
  bool ok() const { return error.empty(); }
};

TraceParseResult ParseTraceCsv(std::string_view text, std::string_view source_name);

// `block_size` (>= 1): prompt tokens per hash id.
TraceParseResult ParseTraceMooncake(std::string_view text, std::string_view source_name,
                                    int64_t block_size);

enum class TraceFormat { kAzureCsv, kMooncake };

// A trace's format when none is named: by the file's extension (.jsonl: Mooncake's JSON
// lines), else Azure's CSV.
TraceFormat DefaultTraceFormat(std::string_view path);
// "mooncake", "azure" or "csv"; nullopt for any other name.
std::optional<TraceFormat> TraceFormatNamed(std::string_view name);
// The name TraceFormatNamed reads back ("mooncake", "azure").
std::string_view TraceFormatName(TraceFormat format);

TraceParseResult ParseTrace(TraceFormat format, std::string_view text,
                            std::string_view source_name, int64_t block_size);

}  // namespace kvroute::workload
