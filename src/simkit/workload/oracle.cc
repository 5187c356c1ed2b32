#include "simkit/workload/oracle.h"

#include <algorithm>

namespace kvroute::workload {

PrefixOracle::PrefixOracle(int64_t block_size, int64_t bytes_per_token)
    : block_size_(block_size), bytes_per_token_(bytes_per_token) {}

// One 64-bit key per edge keeps the map flat; a collision would need two different
// (parent, key, size) triples to hash alike, about 2^-64 per pair.
uint64_t PrefixOracle::EdgeKey(uint32_t parent, const PrefixExtent& e) {
  return MixKey(MixKey(e.key, e.bytes), parent);
}

uint64_t PrefixOracle::CommonBytes(std::span<const PrefixExtent> extents) const {
  uint64_t bytes = 0;
  uint32_t node = 0;
  for (const PrefixExtent& e : extents) {
    auto it = edges_.find(EdgeKey(node, e));
    if (it == edges_.end()) {
      auto same_key = longest_.find(MixKey(e.key, node));
      if (same_key != longest_.end()) bytes += std::min(same_key->second, e.bytes);
      break;
    }
    node = it->second;
    bytes += e.bytes;
  }
  return bytes;
}

int64_t PrefixOracle::BestHit(std::span<const PrefixExtent> extents, int64_t prompt_tokens) const {
  if (prompt_tokens <= 1) return 0;
  const int64_t common_tokens = static_cast<int64_t>(CommonBytes(extents)) / bytes_per_token_;
  const int64_t cap = (prompt_tokens - 1) / block_size_ * block_size_;
  return std::min(common_tokens / block_size_ * block_size_, cap);
}

void PrefixOracle::Insert(std::span<const PrefixExtent> extents) {
  uint32_t node = 0;
  for (const PrefixExtent& e : extents) {
    auto [it, inserted] = edges_.try_emplace(EdgeKey(node, e), next_node_);
    if (inserted) {
      ++next_node_;
      uint32_t& longest = longest_[MixKey(e.key, node)];
      longest = std::max(longest, e.bytes);
    }
    node = it->second;
  }
}

int64_t PrefixOracle::Observe(std::span<const PrefixExtent> extents, int64_t prompt_tokens) {
  const int64_t hit = BestHit(extents, prompt_tokens);
  Insert(extents);
  queried_tokens_ += prompt_tokens;
  hit_tokens_ += hit;
  return hit;
}

double PrefixOracle::HitRate() const {
  return queried_tokens_ > 0 ? static_cast<double>(hit_tokens_) / queried_tokens_ : 0.0;
}

}  // namespace kvroute::workload
