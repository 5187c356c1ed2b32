// vLLM's KV-cache event wire format (REFERENCE.md section 5): one msgpack payload per
// published batch, encoded and decoded.
//
// Decoding accepts every form a vLLM release has sent or may send:
//   batch   [ts, events, data_parallel_rank] | [ts, events] (old) |
//           {"ts": .., "events": [..], "data_parallel_rank": ..} (one snapshot)
//   event   [tag, field...] with trailing defaults dropped (until ~v0.24) |
//           {"type": tag, field: value, ...} with defaults omitted (v0.26)
//   hash    uint64 | negative int64 (before v0.10.2; kept as its two's complement) |
//           bin (a digest; folded to 64 bits with kvevents::FoldHashBytes)
// Unknown trailing array fields and unknown map keys are skipped; events with an unknown
// tag are skipped and counted (DecodeInfo). The payload is validated with msgpuck's
// mp_check before anything is read, and bounded by the limits below.
//
// Encoding writes the field order vLLM declares (block_hashes, parent_block_hash,
// token_ids, block_size, lora_id, medium, lora_name) in either event form and either hash
// form. The bytes form sends a 32-byte digest built from the 64-bit engine hash by
// ExpandHash, so, as in vLLM, the digest's low 64 bits (its last 8 bytes, big-endian) are
// the integer form's value.
//
// Pure: no I/O. Thread: functions of values, safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/common/status.h"
#include "core/kvevents/kv_event.h"

namespace kvroute::kvevents {

enum class Format : uint8_t { kArray, kMap };     // how events are encoded
enum class HashForm : uint8_t { kInt, kBytes };   // how block hashes are encoded

// Limits against hostile input; a payload over any of them is rejected whole.
inline constexpr size_t kMaxPayloadBytes = 64u << 20;
inline constexpr size_t kMaxEventsPerBatch = 100000;
inline constexpr size_t kMaxHashesPerEvent = 1u << 20;
inline constexpr size_t kMaxTokensPerBatch = 1u << 24;
inline constexpr size_t kMaxStringBytes = 4096;   // tags, medium, lora_name, map keys
inline constexpr int kMaxNesting = 16;            // arrays and maps inside each other
inline constexpr int32_t kMaxBlockSize = 1 << 20;

// The 32-byte digest the bytes form sends for engine hash `h`: bytes 0-23 are three
// SplitMix64 outputs of h (with distinct constants), bytes 24-31 are h big-endian.
std::array<uint8_t, 32> ExpandHash(uint64_t h);

// Appends the msgpack encoding of `batch` to `*out`: [ts (float64), [events...],
// data_parallel_rank]. Array events: ["BlockStored", block_hashes, parent (nil for a chain
// start), token_ids, block_size, lora_id (nil), medium, lora_name (only when set)],
// ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"]. Map events: the same
// fields by name after "type" (lora_id and an unset lora_name as nil, as the v0.26
// snapshot writes them).
void EncodeBatch(const KvEventBatch& batch, Format format, HashForm hash_form, std::string* out);

// What decoding skipped.
struct DecodeInfo {
  size_t unknown_events = 0;          // events with a tag this decoder does not know
  std::vector<std::string> unknown_tags;  // their tags, first 8 distinct
};

// Decodes one payload into `*out` (replaced). InvalidArgument with a message naming the
// place ("event 3 (BlockStored): token_ids[5]: must be an unsigned integer below 2^32")
// for malformed, truncated or over-limit input; `*out` is unspecified then.
Status DecodeBatch(std::span<const uint8_t> payload, KvEventBatch* out, DecodeInfo* info = nullptr);

}  // namespace kvroute::kvevents
