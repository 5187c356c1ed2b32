#include "core/sched/prefix_index.h"

#include <algorithm>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute::sched {

void HashPromptBlocks(std::string_view model, std::string_view cache_salt,
                      std::string_view prompt, size_t block_chars, size_t max_blocks,
                      std::vector<uint64_t>& out) {
  out.clear();
  if (block_chars == 0) return;
  const size_t n = std::min(prompt.size() / block_chars, max_blocks);
  if (n == 0) return;
  out.reserve(n);
  // h0 = XXH64(model + salt) without building the concatenation.
  XXH64_state_t st;
  XXH64_reset(&st, 0);
  XXH64_update(&st, model.data(), model.size());
  XXH64_update(&st, cache_salt.data(), cache_salt.size());
  uint64_t h = XXH64_digest(&st);
  const char* p = prompt.data();
  // XXH3 per block: for 64-byte inputs it costs about a third of XXH64 (whose per-call
  // set-up and finalisation dominate at this size): 4 KB prompt, callgrind, 10.0k -> see
  // docs/BENCHMARKS.md "Routing core" for the figure.
  for (size_t i = 0; i < n; ++i, p += block_chars) {
    h = XXH3_64bits_withSeed(p, block_chars, h);
    out.push_back(h);
  }
}

void HashPromptBlocksWithPartial(std::string_view model, std::string_view cache_salt,
                                 std::string_view prompt, size_t block_chars, size_t max_blocks,
                                 std::vector<uint64_t>& out) {
  HashPromptBlocks(model, cache_salt, prompt, block_chars, max_blocks, out);
  if (block_chars == 0 || out.size() >= max_blocks) return;
  const size_t full = out.size() * block_chars;
  if (full >= prompt.size()) return;
  if (out.empty()) {
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    XXH64_update(&st, model.data(), model.size());
    XXH64_update(&st, cache_salt.data(), cache_salt.size());
    out.push_back(XXH3_64bits_withSeed(prompt.data(), prompt.size(), XXH64_digest(&st)));
    return;
  }
  out.push_back(XXH3_64bits_withSeed(prompt.data() + full, prompt.size() - full, out.back()));
}

namespace {
// Block hashes are already uniformly distributed; a cheap remix guards against structured
// keys in tests and user-supplied hashes.
inline size_t Slot(uint64_t h, size_t mask) {
  return static_cast<size_t>((h ^ (h >> 29)) * 0x9e3779b97f4a7c15ULL >> 20) & mask;
}
}  // namespace

ApproxPrefixIndex::ApproxPrefixIndex() {
  keys_.assign(1024, 0);
  values_.assign(1024, kNil);
  mask_ = 1023;
}

uint32_t ApproxPrefixIndex::FindChain(uint64_t hash) const {
  for (size_t i = Slot(hash, mask_);; i = (i + 1) & mask_) {
    if (values_[i] == kNil) return kNil;
    if (keys_[i] == hash) return values_[i];
  }
}

void ApproxPrefixIndex::Grow() {
  std::vector<uint64_t> old_keys = std::move(keys_);
  std::vector<uint32_t> old_values = std::move(values_);
  const size_t cap = old_keys.size() * 2;
  keys_.assign(cap, 0);
  values_.assign(cap, kNil);
  mask_ = cap - 1;
  used_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_values[i] != kNil) SetChain(old_keys[i], old_values[i]);
  }
}

void ApproxPrefixIndex::SetChain(uint64_t hash, uint32_t first) {
  size_t i = Slot(hash, mask_);
  for (;; i = (i + 1) & mask_) {
    if (values_[i] == kNil || keys_[i] == hash) break;
  }
  if (first != kNil) {
    if (values_[i] == kNil) {
      keys_[i] = hash;
      values_[i] = first;
      if (++used_ * 4 > keys_.size() * 3) Grow();
    } else {
      values_[i] = first;
    }
    return;
  }
  if (values_[i] == kNil) return;
  // Backward-shift deletion keeps probe chains intact without tombstones.
  values_[i] = kNil;
  --used_;
  for (size_t j = (i + 1) & mask_; values_[j] != kNil; j = (j + 1) & mask_) {
    const size_t home = Slot(keys_[j], mask_);
    // Move j into the hole at i if its home position is not within (i, j].
    const bool between = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
    if (!between) {
      keys_[i] = keys_[j];
      values_[i] = values_[j];
      values_[j] = kNil;
      i = j;
    }
  }
}

ApproxPrefixIndex::Lru& ApproxPrefixIndex::LruOf(uint32_t endpoint_id) {
  if (endpoint_id >= lru_.size()) lru_.resize(endpoint_id + 1);
  return lru_[endpoint_id];
}

uint32_t ApproxPrefixIndex::FindEntry(uint64_t hash, uint32_t endpoint_id) const {
  for (uint32_t e = FindChain(hash); e != kNil; e = entries_[e].same_hash_next) {
    if (entries_[e].endpoint == endpoint_id) return e;
  }
  return kNil;
}

void ApproxPrefixIndex::Unlink(uint32_t e) {
  Entry& x = entries_[e];
  Lru& l = lru_[x.endpoint];
  if (x.lru_prev != kNil) entries_[x.lru_prev].lru_next = x.lru_next;
  else l.head = x.lru_next;
  if (x.lru_next != kNil) entries_[x.lru_next].lru_prev = x.lru_prev;
  else l.tail = x.lru_prev;
  x.lru_prev = x.lru_next = kNil;
  l.size--;
}

void ApproxPrefixIndex::PushMru(uint32_t e) {
  Entry& x = entries_[e];
  Lru& l = lru_[x.endpoint];
  x.lru_prev = l.tail;
  x.lru_next = kNil;
  if (l.tail != kNil) entries_[l.tail].lru_next = e;
  else l.head = e;
  l.tail = e;
  l.size++;
}

void ApproxPrefixIndex::EraseEntry(uint32_t e) {
  Unlink(e);
  const uint64_t hash = entries_[e].hash;
  const uint32_t first = FindChain(hash);
  if (first == e) {
    SetChain(hash, entries_[e].same_hash_next);
  } else {
    for (uint32_t p = first; p != kNil; p = entries_[p].same_hash_next) {
      if (entries_[p].same_hash_next == e) {
        entries_[p].same_hash_next = entries_[e].same_hash_next;
        break;
      }
    }
  }
  free_.push_back(e);
}

size_t ApproxPrefixIndex::Match(std::span<const uint64_t> hashes,
                                std::vector<uint32_t>& match_by_endpoint) const {
  if (match_by_endpoint.size() < lru_.size()) match_by_endpoint.resize(lru_.size());
  std::fill(match_by_endpoint.begin(), match_by_endpoint.end(), 0u);
  // An endpoint's match grows from i to i+1 only if it held every earlier block, so the
  // scan ends at the first block that extends nobody's match.
  size_t best = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    bool extended = false;
    for (uint32_t e = FindChain(hashes[i]); e != kNil; e = entries_[e].same_hash_next) {
      uint32_t& m = match_by_endpoint[entries_[e].endpoint];
      if (m == i) {
        m = static_cast<uint32_t>(i + 1);
        extended = true;
      }
    }
    if (!extended) break;
    best = i + 1;
  }
  return best;
}

size_t ApproxPrefixIndex::MatchWalk(std::span<const uint64_t> hashes,
                                    std::vector<uint32_t>& held_by_endpoint) const {
  if (held_by_endpoint.size() < lru_.size()) held_by_endpoint.resize(lru_.size());
  std::fill(held_by_endpoint.begin(), held_by_endpoint.end(), 0u);
  size_t i = 0;
  for (; i < hashes.size(); ++i) {
    const uint32_t first = FindChain(hashes[i]);
    if (first == kNil) break;
    for (uint32_t e = first; e != kNil; e = entries_[e].same_hash_next) {
      ++held_by_endpoint[entries_[e].endpoint];
    }
  }
  return i;
}

size_t ApproxPrefixIndex::MatchOne(std::span<const uint64_t> hashes, uint32_t endpoint_id) const {
  size_t i = 0;
  while (i < hashes.size() && FindEntry(hashes[i], endpoint_id) != kNil) ++i;
  return i;
}

size_t ApproxPrefixIndex::Record(std::span<const uint64_t> hashes, uint32_t endpoint_id,
                                 size_t capacity, double now_s, RecordOrder order) {
  LruOf(endpoint_id);
  size_t held = hashes.size();  // the lowest index found missing
  auto visit = [&](size_t k) {
    const uint64_t h = hashes[k];
    uint32_t e = FindEntry(h, endpoint_id);
    if (e != kNil) {
      Unlink(e);
    } else {
      held = std::min(held, k);
      if (!free_.empty()) {
        e = free_.back();
        free_.pop_back();
      } else {
        e = static_cast<uint32_t>(entries_.size());
        entries_.push_back({});
      }
      Entry& x = entries_[e];
      x.hash = h;
      x.endpoint = endpoint_id;
      x.same_hash_next = FindChain(h);
      SetChain(h, e);
    }
    entries_[e].recorded_at = now_s;
    PushMru(e);
  };
  // One loop per order, so the per-block work has no branch on it (this runs per request).
  if (order == RecordOrder::kHeadLast) {
    for (size_t k = hashes.size(); k-- > 0;) visit(k);
  } else {
    for (size_t k = 0; k < hashes.size(); ++k) visit(k);
  }
  Lru& l = lru_[endpoint_id];
  while (l.size > capacity && l.head != kNil) EraseEntry(l.head);
  return held;
}

void ApproxPrefixIndex::ExpireBefore(double cutoff_s) {
  // Each LRU list is in recording order, so expired entries sit at its head.
  for (Lru& l : lru_) {
    while (l.head != kNil && entries_[l.head].recorded_at < cutoff_s) EraseEntry(l.head);
  }
}

void ApproxPrefixIndex::RemoveEndpoint(uint32_t endpoint_id) {
  if (endpoint_id >= lru_.size()) return;
  while (lru_[endpoint_id].head != kNil) EraseEntry(lru_[endpoint_id].head);
}

size_t ApproxPrefixIndex::Size(uint32_t endpoint_id) const {
  return endpoint_id < lru_.size() ? lru_[endpoint_id].size : 0;
}

size_t ApproxPrefixIndex::TotalEntries() const { return entries_.size() - free_.size(); }

bool ApproxPrefixIndex::Erase(uint64_t hash, uint32_t endpoint_id) {
  const uint32_t e = FindEntry(hash, endpoint_id);
  if (e == kNil) return false;
  EraseEntry(e);
  return true;
}

bool ApproxPrefixIndex::Contains(uint64_t hash, uint32_t endpoint_id) const {
  return FindEntry(hash, endpoint_id) != kNil;
}

}  // namespace kvroute::sched
