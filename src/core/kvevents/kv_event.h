// KV-cache events as vLLM publishes them (REFERENCE.md section 5), decoded: what an engine
// says it stored in and removed from its prefix cache. One type for every layer that
// handles them: the simulated engine records them, the sim's publisher encodes them, the
// router's subscriber decodes them and the routing core indexes them.
//
// Engine block hashes are opaque identities here. vLLM sends either the low 64 bits of the
// digest as an integer or the raw digest as bytes; the decoder keeps integers as they are
// and folds bytes to 64 bits (FoldHashBytes), so equal engine hashes stay equal. The router
// never recomputes them: it keys blocks by its own chain over token_ids.
//
// Pure data; no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::kvevents {

enum class EventKind : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };

// Where the blocks live (vLLM's `medium`): "GPU", "CPU" (offloaded), "DISK"; any other
// string is kOther. Absent means GPU.
enum class Medium : uint8_t { kGpu, kCpu, kDisk, kOther };
std::string_view MediumName(Medium m);     // "GPU", "CPU", "DISK", "OTHER"
Medium MediumFromName(std::string_view s);  // case-sensitive as vLLM writes them

struct KvEvent {
  EventKind kind = EventKind::kBlockStored;
  // kBlockStored: the stored blocks, chain order; kBlockRemoved: the removed blocks.
  std::vector<uint64_t> block_hashes;
  // kBlockStored: the block before the first one, or none for a chain's first block.
  std::optional<uint64_t> parent_hash;
  // kBlockStored: the blocks' token ids, concatenated (block_hashes.size() x block_size;
  // offloading connectors send none for CPU copies).
  std::vector<uint32_t> token_ids;
  int32_t block_size = 0;  // kBlockStored
  std::string lora_name;   // kBlockStored; empty for the base model
  Medium medium = Medium::kGpu;
};

// One published message: the events of one engine step.
struct KvEventBatch {
  double ts = 0.0;  // publisher's wall clock, seconds since the epoch
  std::vector<KvEvent> events;
  int32_t data_parallel_rank = 0;
};

// An engine hash sent as bytes (a sha256 or xxhash-128 digest), as one 64-bit identity.
uint64_t FoldHashBytes(std::span<const uint8_t> digest);

}  // namespace kvroute::kvevents
