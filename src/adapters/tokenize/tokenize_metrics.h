// kvroute_tokenize_* on a front end's /metrics (`kvroute serve` and `kvroute epp` alike):
// the calls, failures by kind and latency of the front end's tokenizers, summed.
#pragma once

#include <string>

#include "adapters/tokenize/tokenizer.h"

namespace kvroute::tokenize {

// Adds `s` to `sum`.
void AddSnapshot(TokenizerStats::Snapshot& sum, const TokenizerStats::Snapshot& s);
// Appends kvroute_tokenize_requests_total, kvroute_tokenize_failures_total{kind} and
// kvroute_tokenize_duration_seconds for `sum`.
void AppendTokenizerMetrics(std::string& out, const TokenizerStats::Snapshot& sum);

}  // namespace kvroute::tokenize
