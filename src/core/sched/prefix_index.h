// Approximate prefix affinity, as the Gateway API Inference Extension's prefix-cache scorer
// does it: the router never sees the engines' caches, so it remembers which prompt-text
// blocks it sent where and assumes they are still cached there (bounded by an LRU per
// endpoint sized like the endpoint's KV cache).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kvroute::sched {

// Cuts a prompt into fixed-size character blocks (trailing partial block dropped) and
// chains their hashes: h0 = XXH64(model + cache_salt, seed 0),
// h_i = XXH3_64bits(block_i, seed = h_{i-1}) for i = 1..n (GIE chains xxh64 the same way;
// the hashes stay inside kvroute, so the faster XXH3 is used per block). The chain makes a block's hash depend
// on everything before it, so equal hashes mean equal prefixes.
// Appends at most `max_blocks` hashes (h_1..h_n, not h0) to `out` after clearing it.
void HashPromptBlocks(std::string_view model, std::string_view cache_salt,
                      std::string_view prompt, size_t block_chars, size_t max_blocks,
                      std::vector<uint64_t>& out);
// The same chain with the trailing partial block included (llm-d Router's approximate
// producer hashes it too): ceil(prompt.size() / block_chars) hashes, at most `max_blocks`.
void HashPromptBlocksWithPartial(std::string_view model, std::string_view cache_salt,
                                 std::string_view prompt, size_t block_chars, size_t max_blocks,
                                 std::vector<uint64_t>& out);

// Block hash -> endpoints that (probably) hold it, with one LRU per endpoint.
// Capacity is per endpoint and may change between calls (Record passes it); an endpoint
// over capacity evicts its least recently recorded hashes.
// Single-threaded. Memory: one 40-byte entry per (hash, endpoint) plus the hash table.
class ApproxPrefixIndex {
 public:
  ApproxPrefixIndex();

  // For each endpoint id, the number of leading hashes of `hashes` it holds (the longest
  // matched prefix, in blocks). `match_by_endpoint` is resized to at least the largest
  // endpoint id + 1 and zeroed first; entries of endpoints holding nothing stay 0.
  // Returns the longest match over all endpoints.
  size_t Match(std::span<const uint64_t> hashes, std::vector<uint32_t>& match_by_endpoint) const;

  // Leading hashes of `hashes` held by one endpoint.
  size_t MatchOne(std::span<const uint64_t> hashes, uint32_t endpoint_id) const;

  // llm-d Router's walk: through `hashes` in order until the first hash no endpoint holds;
  // for each endpoint, how many of the walked hashes it holds (not necessarily a leading
  // run). `held_by_endpoint` is resized and zeroed as in Match. Returns the walk's length.
  size_t MatchWalk(std::span<const uint64_t> hashes, std::vector<uint32_t>& held_by_endpoint) const;

  // Which end of a recorded chain becomes most recently used.
  enum class RecordOrder : uint8_t {
    kHeadLast,  // the first block last (most recent): a chain is evicted tail first (vLLM)
    kInOrder,   // in chain order, the last block most recent: evicted head first (llm-d's
                // approximate producer adds a request's hashes to its LRU in order)
  };

  // Records that `endpoint_id` now holds every hash of `hashes` (a request's chain) and
  // marks them most recently used, the first block last so that a chain is evicted tail
  // first (as vLLM does): its shared head stays longest. Then evicts down to `capacity`.
  // `now_s` stamps the entries for ExpireBefore; pass non-decreasing times (or 0 when no
  // expiry is used). Returns how many leading hashes the endpoint held before the call
  // (what MatchOne would have returned).
  size_t Record(std::span<const uint64_t> hashes, uint32_t endpoint_id, size_t capacity,
              double now_s = 0.0, RecordOrder order = RecordOrder::kHeadLast);

  // Drops every entry last recorded before `cutoff_s` (a TTL, as Dynamo's approximate
  // indexer uses). Cost: proportional to the entries dropped plus the number of endpoints.
  void ExpireBefore(double cutoff_s);

  // Drops every entry of the endpoint.
  void RemoveEndpoint(uint32_t endpoint_id);
  // Drops one entry; false when the endpoint did not hold `hash`.
  bool Erase(uint64_t hash, uint32_t endpoint_id);

  size_t Size(uint32_t endpoint_id) const;  // entries held by the endpoint
  size_t TotalEntries() const;
  bool Contains(uint64_t hash, uint32_t endpoint_id) const;

 private:
  static constexpr uint32_t kNil = 0xffffffffu;
  struct Entry {
    uint64_t hash;
    double recorded_at;
    uint32_t endpoint;
    uint32_t lru_prev, lru_next;  // the endpoint's LRU list (head = least recent)
    uint32_t same_hash_next;      // other endpoints holding the same hash
  };
  struct Lru {
    uint32_t head = kNil, tail = kNil;
    size_t size = 0;
  };

  // Open-addressing table hash -> first entry of its chain (kNil when absent).
  uint32_t FindChain(uint64_t hash) const;
  void SetChain(uint64_t hash, uint32_t first);  // first == kNil erases
  void Grow();
  uint32_t FindEntry(uint64_t hash, uint32_t endpoint_id) const;
  void Unlink(uint32_t e);
  void PushMru(uint32_t e);
  void EraseEntry(uint32_t e);
  Lru& LruOf(uint32_t endpoint_id);

  std::vector<Entry> entries_;
  std::vector<uint32_t> free_;
  std::vector<Lru> lru_;
  // Table slots: key and value; value kNil marks an empty slot.
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;
  size_t used_ = 0;
  size_t mask_ = 0;
};

}  // namespace kvroute::sched
