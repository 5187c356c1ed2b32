// The prefix model: what a scheduler believes, approximately, about which endpoint holds
// which prefix blocks: learned from the router's own dispatches, since the router never
// sees the engines' caches. One interface for every policy that keeps such a belief, so
// that how it is kept (an LRU per endpoint, a TTL, which blocks count as a match) is one
// implementation behind it, not a change to every policy.
//
// Keys are chains: a prompt cut into blocks, each block's key depending on every block
// before it (HashPromptBlocks), so a chain's leading keys name a prefix. A model answers
// "how many blocks of this chain does endpoint e hold" and learns from one source:
// OnRouted, the router sent a request with this chain to e (the model assumes e now
// caches it).
//
// What the engines report they cache (KV-cache events) is not a prefix model: the routing
// core keeps it in kvevents::EventIndex and hands it to each pick (SchedRequest::events).
// The one place that merges the two, per candidate, is CacheView (cache_view.h): the
// engines' figure where an endpoint's events are live, this model's elsewhere.
//
// Who uses it: the prefix-cache-scorer plugin (and with it every plugin-profile policy:
// kvroute, gie-default), dynamo-cost's and dynamo-kv's predicted block index (with
// Dynamo's TTL), and llm-d-sticky's and llm-d-precise's approximate producer (llm-d's
// walk and in-order LRU, ApproxRules). sglang-cache-aware keeps its own character radix
// tree on purpose: it models SGLang's router, whose tree of routed text is part of the
// policy being compared; it neither holds a PrefixModel nor reads a CacheView.
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

class PrefixModel {
 public:
  virtual ~PrefixModel() = default;

  // For each endpoint id, the number of blocks of `chain` it holds, counted by the
  // model's rule (ApproxRules::count: the leading run by default).
  // `by_endpoint` is resized to at least the largest endpoint id + 1 and zeroed first.
  // Returns the longest leading match over all endpoints (kLeadingRun), or the length of
  // the walk (kWalk).
  virtual size_t Match(std::span<const uint64_t> chain, std::vector<uint32_t>& by_endpoint) const = 0;
  // Leading keys of `chain` held by one endpoint (a leading run whatever the rule: the
  // prefix probe, Scheduler::HeldBlocks).
  virtual size_t MatchOne(std::span<const uint64_t> chain, uint32_t endpoint_id) const = 0;
  // The router sent a request with `chain` to `endpoint_id`, whose cache holds about
  // `capacity` blocks. Returns how many leading keys it held before (MatchOne then).
  virtual size_t OnRouted(std::span<const uint64_t> chain, uint32_t endpoint_id, size_t capacity,
                          double now_s) = 0;
  // Forgets entries learned before `cutoff_s` (an approximate model's TTL).
  virtual void ExpireBefore(double cutoff_s) = 0;
  // The endpoint left the pool or restarted: everything it held is gone.
  virtual void RemoveEndpoint(uint32_t endpoint_id) = 0;
  // Blocks the model believes the endpoint holds.
  virtual size_t Size(uint32_t endpoint_id) const = 0;
  virtual size_t TotalEntries() const = 0;
};

// How an approximate model counts a match and orders a routed chain in its LRU.
struct ApproxRules {
  enum class Count : uint8_t {
    kLeadingRun,  // the endpoint's leading run of the chain (GIE, Dynamo)
    kWalk,        // llm-d's approximate producer: the chain is walked until the first block
                  // no endpoint holds; an endpoint's count is the walked blocks it holds
                  // (ApproxPrefixIndex::MatchWalk), not necessarily a leading run
  };
  Count count = Count::kLeadingRun;
  ApproxPrefixIndex::RecordOrder order = ApproxPrefixIndex::RecordOrder::kHeadLast;
};

// Today's model: an LRU per endpoint of the chains the router sent there (as the Gateway
// API Inference Extension's prefix-cache scorer keeps it), sized like the endpoint's KV
// cache.
class ApproxPrefixModel final : public PrefixModel {
 public:
  explicit ApproxPrefixModel(ApproxRules rules = {}) : rules_(rules) {}

  size_t Match(std::span<const uint64_t> chain, std::vector<uint32_t>& by_endpoint) const override {
    return rules_.count == ApproxRules::Count::kWalk ? index_.MatchWalk(chain, by_endpoint)
                                                     : index_.Match(chain, by_endpoint);
  }
  size_t MatchOne(std::span<const uint64_t> chain, uint32_t endpoint_id) const override {
    return index_.MatchOne(chain, endpoint_id);
  }
  size_t OnRouted(std::span<const uint64_t> chain, uint32_t endpoint_id, size_t capacity,
                  double now_s) override {
    return index_.Record(chain, endpoint_id, capacity, now_s, rules_.order);
  }
  void ExpireBefore(double cutoff_s) override { index_.ExpireBefore(cutoff_s); }
  void RemoveEndpoint(uint32_t endpoint_id) override { index_.RemoveEndpoint(endpoint_id); }
  size_t Size(uint32_t endpoint_id) const override { return index_.Size(endpoint_id); }
  size_t TotalEntries() const override { return index_.TotalEntries(); }
  const ApproxPrefixIndex& index() const { return index_; }
  const ApproxRules& rules() const { return rules_; }

 private:
  ApproxRules rules_;
  ApproxPrefixIndex index_;
};

// A fresh model of today's kind, for the policies that hold one.
std::unique_ptr<PrefixModel> MakeApproxPrefixModel(ApproxRules rules = {});

}  // namespace kvroute::sched
