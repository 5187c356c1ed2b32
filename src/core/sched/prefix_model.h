// The prefix model: what a scheduler believes about which endpoint holds which prefix
// blocks. One interface for every policy that keeps such a belief about the engines'
// caches, so that where the belief comes from (the router's own dispatches today; the
// engines' reports of what they cache, KV-cache events, next) is one implementation
// behind it, not a change to every policy.
//
// Keys are chains: a prompt cut into blocks, each block's key depending on every block
// before it (HashPromptBlocks), so a chain's leading keys name a prefix. A model answers
// "how many leading blocks of this chain does endpoint e hold" and learns from two
// sources:
//   OnRouted   the router sent a request with this chain to e (an approximate model
//              assumes e now caches it; a model fed by the engines may ignore it or keep
//              it as a speculative entry)
//   Apply      e reported a cache change (CacheUpdate: blocks stored, blocks removed, the
//              whole cache cleared), reaching the scheduler through
//              RoutingCore::OnCacheUpdate from an adapter, without a front end involved
//
// Who uses it: the prefix-cache-scorer plugin (and with it every plugin-profile policy:
// kvroute, gie-default) and dynamo-cost's predicted block index hold an ApproxPrefixModel.
// sglang-cache-aware keeps its own character radix tree on purpose: it models SGLang's
// router, whose tree of routed text is part of the policy being compared.
//
// Thread: like the scheduler that owns it (reads may run concurrently with each other;
// every write is exclusive). No clock: times are passed in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/sched/prefix_index.h"

namespace kvroute::sched {

// A change an endpoint reported to its cache, as chain keys in the model's hashing
// (leading block first for kStored). kCleared needs no blocks.
struct CacheUpdate {
  enum class Kind : uint8_t { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  std::span<const uint64_t> blocks;
};

class PrefixModel {
 public:
  virtual ~PrefixModel() = default;

  // For each endpoint id, the number of leading keys of `chain` it holds.
  // `by_endpoint` is resized to at least the largest endpoint id + 1 and zeroed first.
  // Returns the longest match over all endpoints.
  virtual size_t Match(std::span<const uint64_t> chain, std::vector<uint32_t>& by_endpoint) const = 0;
  // Leading keys of `chain` held by one endpoint.
  virtual size_t MatchOne(std::span<const uint64_t> chain, uint32_t endpoint_id) const = 0;
  // The router sent a request with `chain` to `endpoint_id`, whose cache holds about
  // `capacity` blocks. Returns how many leading keys it held before (MatchOne then).
  virtual size_t OnRouted(std::span<const uint64_t> chain, uint32_t endpoint_id, size_t capacity,
                          double now_s) = 0;
  // The endpoint reported a cache change.
  virtual void Apply(uint32_t endpoint_id, const CacheUpdate& update, double now_s) = 0;
  // Forgets entries learned before `cutoff_s` (an approximate model's TTL); a model whose
  // entries come from the engines may ignore it.
  virtual void ExpireBefore(double cutoff_s) = 0;
  // The endpoint left the pool or restarted: everything it held is gone.
  virtual void RemoveEndpoint(uint32_t endpoint_id) = 0;
  // Blocks the model believes the endpoint holds.
  virtual size_t Size(uint32_t endpoint_id) const = 0;
  virtual size_t TotalEntries() const = 0;
};

// Today's model: an LRU per endpoint of the chains the router sent there (as the Gateway
// API Inference Extension's prefix-cache scorer keeps it), sized like the endpoint's KV
// cache. Reported stores are recorded as routed chains are (most recent first); reported
// removals drop exactly those blocks; a clear drops the endpoint's entries.
class ApproxPrefixModel final : public PrefixModel {
 public:
  size_t Match(std::span<const uint64_t> chain, std::vector<uint32_t>& by_endpoint) const override {
    return index_.Match(chain, by_endpoint);
  }
  size_t MatchOne(std::span<const uint64_t> chain, uint32_t endpoint_id) const override {
    return index_.MatchOne(chain, endpoint_id);
  }
  size_t OnRouted(std::span<const uint64_t> chain, uint32_t endpoint_id, size_t capacity,
                  double now_s) override {
    capacity_ = capacity;
    return index_.Record(chain, endpoint_id, capacity, now_s);
  }
  void Apply(uint32_t endpoint_id, const CacheUpdate& update, double now_s) override;
  void ExpireBefore(double cutoff_s) override { index_.ExpireBefore(cutoff_s); }
  void RemoveEndpoint(uint32_t endpoint_id) override { index_.RemoveEndpoint(endpoint_id); }
  size_t Size(uint32_t endpoint_id) const override { return index_.Size(endpoint_id); }
  size_t TotalEntries() const override { return index_.TotalEntries(); }
  const ApproxPrefixIndex& index() const { return index_; }

 private:
  ApproxPrefixIndex index_;
  // The LRU bound last routed with (stores reported before any routing are bounded by
  // the index's own default).
  size_t capacity_ = 0;
};

// A fresh model of today's kind, for the policies that hold one.
std::unique_ptr<PrefixModel> MakeApproxPrefixModel();

}  // namespace kvroute::sched
