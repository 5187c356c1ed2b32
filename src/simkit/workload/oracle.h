// The prefix-cache hit bound a workload allows: every request is served where its
// longest already-seen prefix lives, with unlimited cache capacity. Granularity follows
// the engine: tokens are 4-byte runs, only whole blocks hit, and at most
// floor((n - 1) / block_size) * block_size of an n-token prompt (the last prompt token
// is always recomputed).
//
// Prompts are described by extents (workload.h: one per segment, in rendered bytes).
// Two prompts share their common leading extents (same key and size), plus, where they
// first differ, min(size) bytes if that extent has the same key in both (a segment's
// text of n tokens is a prefix of the same key's text of m > n tokens). Other text
// shared inside a diverging segment is not counted (generated segments diverge on their
// first token anyway).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "simkit/workload/workload.h"

namespace kvroute::workload {

class PrefixOracle {
 public:
  explicit PrefixOracle(int64_t block_size = 16, int64_t bytes_per_token = kBytesPerToken);

  // The best hit (tokens) for a prompt of `prompt_tokens` tokens made of `extents`,
  // given everything inserted so far. Does not record it.
  int64_t BestHit(std::span<const PrefixExtent> extents, int64_t prompt_tokens) const;

  // Records text now cached somewhere (a prompt, or a prompt followed by its output).
  void Insert(std::span<const PrefixExtent> extents);

  // BestHit, then Insert, and adds to the totals below.
  int64_t Observe(std::span<const PrefixExtent> extents, int64_t prompt_tokens);

  int64_t queried_tokens() const { return queried_tokens_; }
  int64_t hit_tokens() const { return hit_tokens_; }
  // hit / queried, 0 when nothing was queried.
  double HitRate() const;
  size_t nodes() const { return next_node_; }

 private:
  // Common leading bytes with the trie.
  uint64_t CommonBytes(std::span<const PrefixExtent> extents) const;
  static uint64_t EdgeKey(uint32_t parent, const PrefixExtent& e);

  int64_t block_size_;
  int64_t bytes_per_token_;
  // Edges (parent node, segment key, size) -> child node. Node 0 is the root.
  std::unordered_map<uint64_t, uint32_t> edges_;
  // (parent node, segment key) -> the longest size recorded under that parent.
  std::unordered_map<uint64_t, uint32_t> longest_;
  uint32_t next_node_ = 1;
  int64_t queried_tokens_ = 0;
  int64_t hit_tokens_ = 0;
};

}  // namespace kvroute::workload
