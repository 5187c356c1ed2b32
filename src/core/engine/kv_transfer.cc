#include "core/engine/kv_transfer.h"

#include <algorithm>

namespace kvroute::engine {

int PullableTokens(int prompt_tokens, int held_blocks, int block_size) {
  if (block_size < 1 || prompt_tokens < 1 || held_blocks < 1) return 0;
  return std::min(held_blocks, prompt_tokens / block_size) * block_size;
}

KvPull PlanKvPull(int pullable_tokens, int local_cached_tokens, const KvTransferModel& model) {
  KvPull p;
  const int missing = pullable_tokens - local_cached_tokens;
  // A pull of a few tokens costs its setup and a round trip for less than a local
  // prefill chunk would take.
  if (missing < model.min_pull_tokens || missing <= 0) return p;
  p.load_tokens = pullable_tokens;
  p.missing_tokens = missing;
  p.transfer_s = static_cast<double>(missing) * static_cast<double>(model.bytes_per_token) /
                 model.bandwidth;
  return p;
}

}  // namespace kvroute::engine
