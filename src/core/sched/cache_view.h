// The cache view: how much of a request each candidate endpoint holds in its KV cache,
// and where that figure came from. The one place where the engines' reported cache and a
// policy's approximate model meet, read by every policy that scores cache overlap:
// prefix-cache-scorer and precise-prefix-cache-scorer (so kvroute and gie-default),
// dynamo-cost and dynamo-kv, llm-d-sticky and llm-d-precise.
//
// The rule: an endpoint whose KV-cache events are live (kvevents::EventIndex::Usable) is
// taken at its word, its run of the request's token-id keys weighed by tier; every other
// endpoint is counted by the policy's approximate model (PrefixModel) over the request's
// chain of prompt-text blocks. Unknown is never zero: a stale, resyncing or silent
// endpoint falls back to the model, it is not read as holding nothing.
//
// sglang-cache-aware does not read it, on purpose: SGLang's router decides by its own
// character radix tree of routed text, and that tree is part of the policy being
// compared, so it stays private to the policy (sglang_cache_aware.h).
//
// Per pick: Fill, then read one CachedPrefix per candidate (in candidate order) and the
// figures derived from it (Share, Tokens, RunTokens). Each policy turns those into its
// own score with its own arithmetic. The buffers are members, so a view reused from pick
// to pick allocates nothing in steady state. Not thread-safe: one view per concurrent
// pick (the scheduler's own, or PickScratch::cache for plugins).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/sched/prefix_model.h"
#include "core/sched/types.h"

namespace kvroute::kvevents {
class EventIndex;
struct TierWeights;
}  // namespace kvroute::kvevents

namespace kvroute::sched {

// Where one candidate's figure came from.
enum class CacheSource : uint8_t {
  kNone,    // no figure: no live events, and the prompt is shorter than one model block
  kApprox,  // the policy's approximate model (PrefixModel::Match over the chain)
  kEvents,  // the engine's KV-cache events (its events are live)
};

struct CachedPrefix {
  CacheSource source = CacheSource::kNone;
  // Blocks held. kApprox: the model's count over the chain (in chain blocks). kEvents:
  // the run of leading event keys held, on any tier (in keys of event_block_tokens()).
  uint32_t blocks = 0;
  // kEvents: that run weighed by tier (kvevents::TierWeights); otherwise `blocks`.
  double weighted = 0.0;
};

class CacheView {
 public:
  // What a policy brings to a pick.
  struct Query {
    // Its approximate model (never null) and the request's chain in the model's hashing
    // (empty when the prompt is shorter than one block: no approximate figure).
    const PrefixModel* model = nullptr;
    std::span<const uint64_t> chain;
    // Tokens one chain block stands for (Tokens, RunTokens); 0 when the policy reads
    // shares only.
    int64_t chain_block_tokens = 0;
    // Read the request's KV-event index (SchedRequest::events and event_keys) where an
    // endpoint's events are live. Off, or no index or keys for this request: the model
    // alone.
    bool events = false;
    // The tier weights the event run is weighed with; null: the index's own
    // (IndexOptions' cpu_weight and disk_weight, speculative entries as GPU).
    const kvevents::TierWeights* tiers = nullptr;
  };

  // Fills one entry per candidate (positions into `endpoints`). `req` supplies the event
  // index and keys (read under the caller's lock, as the pick reads them).
  void Fill(const Query& q, const SchedRequest& req, std::span<const EndpointState> endpoints,
            std::span<const uint32_t> candidates, double now_s);

  size_t size() const { return entries_.size(); }
  const CachedPrefix& operator[](size_t c) const { return entries_[c]; }
  // This pick read the event index (Query::events, with an index and keys for the request).
  bool events_used() const { return events_used_; }
  // Tokens one event key stands for (the index's block_tokens); 0 when events were not used.
  int64_t event_block_tokens() const { return event_block_tokens_; }
  // The largest endpoint id among the candidates (0 without candidates).
  uint32_t max_id() const { return max_id_; }

  // The share of the request candidate `c` holds: kEvents, the tier-weighted keys / the
  // request's keys; kApprox, the model's blocks / the chain's blocks; kNone, 0.
  double Share(size_t c) const;
  // The tokens it holds, tier-weighted: kEvents, weighted * event_block_tokens();
  // kApprox, blocks * chain_block_tokens; kNone, 0.
  double Tokens(size_t c) const;
  // The tokens of its held blocks, unweighted: blocks * the tokens of its source's block.
  int64_t RunTokens(size_t c) const;

 private:
  // Tokens one block of `e`'s source stands for (0 for kNone).
  int64_t UnitTokens(const CachedPrefix& e) const;

  std::vector<CachedPrefix> entries_;  // by candidate
  std::vector<uint32_t> match_;        // the model's count, by endpoint id
  std::vector<double> weighted_;       // the events' tier-weighted run, by endpoint id
  std::vector<uint32_t> run_;          // the events' run, by endpoint id
  // This pick's request size (Share's denominators) and block tokens, by source.
  size_t chain_blocks_ = 0, event_keys_ = 0;
  int64_t chain_block_tokens_ = 0, event_block_tokens_ = 0;
  bool events_used_ = false;
  uint32_t max_id_ = 0;
};

}  // namespace kvroute::sched
