// The KV transfer of a prefill/decode pair (REFERENCE.md section 20): how much of a prompt a
// decode leg pulls from the prefill replica's held blocks, and how long the pull takes. One
// rule for both drivers of the engine: the live simulator (`kvroute sim`, src/apps/sim/replica.cc)
// and the discrete-event simulator (`kvroute simulate`).
//
// Pure arithmetic: no clock, no engine state (the caller passes what the engines report).
#pragma once

#include <cstdint>

namespace kvroute::engine {

// Defaults of the P/D knobs, shared by the sim's fleet file and simulate's scenarios.
inline constexpr double kDefaultKvLeaseS = 30.0;          // engine seconds a hold lasts
inline constexpr double kDefaultKvTransferBandwidth = 25e9;  // bytes/s (RDMA at 200 Gb/s)
inline constexpr int kDefaultKvMinPullTokens = 64;        // below: recompute locally

struct KvTransferModel {
  int64_t bytes_per_token = 131072;  // EngineConfig::kv_bytes_per_token of the model
  double bandwidth = kDefaultKvTransferBandwidth;  // bytes per second, > 0
  int min_pull_tokens = kDefaultKvMinPullTokens;
};

// The prompt tokens a decode leg can load from `held_blocks` blocks the prefill leg holds:
// only whole blocks travel, and no more than the prompt's full blocks.
int PullableTokens(int prompt_tokens, int held_blocks, int block_size);

// What a decode leg does with `pullable_tokens` on offer when its own prefix cache already
// holds `local_cached_tokens` of the prompt.
struct KvPull {
  int load_tokens = 0;      // EngineRequest::kv_load_tokens; 0: recompute locally
  int missing_tokens = 0;   // the tokens that travel (load_tokens - local)
  double transfer_s = 0.0;  // missing_tokens * bytes_per_token / bandwidth
  bool pulls() const { return load_tokens > 0; }
};
// Pulls every pullable token when the missing ones (pullable - local) reach
// model.min_pull_tokens; else nothing (the decode leg recomputes them).
KvPull PlanKvPull(int pullable_tokens, int local_cached_tokens, const KvTransferModel& model);

}  // namespace kvroute::engine
