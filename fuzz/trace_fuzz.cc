// Fuzz target: a request trace, the same bytes read both ways: as Mooncake JSON lines
// (ParseTraceMooncake, block sizes 512 and 16) and as an Azure CSV (ParseTraceCsv), then
// replayed through the workload generator. What `kvroute simulate` and `kvroute bench
// --trace` read from files the operator names.
//
// Invariants: a parse either loads rows or fails with "<source>:<line>: <problem>" (or
// "<source>: ..." for a bad block size) and no rows; loaded rows are in time order from
// 0, with finite times, context and generated tokens >= 1, and, in Mooncake's format,
// exactly ceil(input_length / block_size) hash ids; the generator yields one request per
// row whose segments add up to the row's context tokens, none empty and none longer than
// the block size.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "simkit/workload/trace.h"
#include "simkit/workload/workload.h"

namespace {

using kvroute::fuzz::Check;
using namespace kvroute::workload;

void CheckResult(const TraceParseResult& r, std::string_view source, int64_t block_size) {
  if (!r.ok()) {
    Check(r.rows.empty(), "rows kept after an error");
    Check(r.error.rfind(std::string(source) + ":", 0) == 0, "error does not name the source");
    Check(r.error.size() > source.size() + 2, "error without a message");
    return;
  }
  double prev = 0.0;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const TraceRow& row = r.rows[i];
    Check(std::isfinite(row.time_s) && row.time_s >= 0.0, "time not finite or negative");
    Check(i > 0 || row.time_s == 0.0, "first row not at 0");
    Check(row.time_s >= prev, "rows out of time order");
    prev = row.time_s;
    Check(row.context_tokens >= 1 && row.generated_tokens >= 1, "token counts below 1");
    if (block_size > 0) {
      Check(static_cast<int64_t>(row.hash_ids.size()) ==
                (row.context_tokens + block_size - 1) / block_size,
            "hash id count does not match input_length");
    }
  }
  if (r.rows.empty()) return;
  // Replay (at most 64 rows, prompts capped so a huge length costs no time).
  auto rows = std::make_shared<std::vector<TraceRow>>();
  for (const TraceRow& row : r.rows) {
    if (rows->size() == 64) break;
    if (row.context_tokens > (int64_t{1} << 20)) continue;
    rows->push_back(row);
  }
  if (rows->empty()) return;
  WorkloadSpec w;
  w.kind = WorkloadKind::kTrace;
  w.trace = rows;
  w.prefix_len = 32;
  w.block_size = block_size > 0 ? block_size : 512;
  Check(w.Validate().ok(), "a parsed trace does not validate");
  RequestGenerator gen(w, ArrivalSpec{}, 1);
  RequestSpec spec;
  size_t n = 0;
  while (gen.Next(&spec)) {
    Check(n < rows->size(), "more requests than rows");
    int64_t sum = 0;
    for (const Segment& s : spec.segments) {
      Check(s.tokens >= 1, "empty segment");
      if (block_size > 0) Check(s.tokens <= block_size, "segment longer than a block");
      sum += s.tokens;
    }
    Check(sum == (*rows)[n].context_tokens && spec.prompt_tokens == sum,
          "segments do not add up to the context");
    ++n;
  }
  Check(n == rows->size(), "fewer requests than rows");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  CheckResult(ParseTraceMooncake(text, "t.jsonl", 512), "t.jsonl", 512);
  CheckResult(ParseTraceMooncake(text, "t16.jsonl", 16), "t16.jsonl", 16);
  CheckResult(ParseTraceCsv(text, "t.csv"), "t.csv", 0);
  return 0;
}
