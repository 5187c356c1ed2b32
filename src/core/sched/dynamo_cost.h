// A re-implementation of NVIDIA Dynamo's KV router (docs/POLICIES.md names the sources and
// the version). dynamo-cost is its mode without KV events: the block index is predicted
// from the router's own decisions with a TTL, as Dynamo's approximate mode does. dynamo-kv
// is its default mode: the overlap comes from what the engines report (the routing core's
// KV-event index, SchedRequest::events), each block weighed by its tier as Dynamo does
// (GPU 1.0, host 0.75, disk 0.25), with no speculative entries (Dynamo's indexer has none:
// its in-flight requests are in the active blocks and prefill tokens below). An endpoint
// whose events are not live is matched by the predicted index instead (both through
// CacheView, cache_view.h).
//   cost(worker) = overlap_weight * potential_prefill_blocks + potential_active_blocks
// potential_prefill_blocks: (prefill tokens of the worker's requests that have no first
//   token yet + this request's prompt tokens minus overlap blocks * block size) / block size;
// potential_active_blocks: the worker's active blocks (each block hash of its in-flight
//   requests counted once, however many share it) plus this request's prompt blocks not
//   among them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/kvevents/event_index.h"
#include "core/sched/cache_view.h"
#include "core/sched/prefix_model.h"
#include "core/sched/scheduler_base.h"

namespace kvroute::sched {

// The blocks of one worker's in-flight requests, keyed by block hash: a reference count
// (how many in-flight requests hold the hash) and a weight (1, or the decay fraction
// Dynamo assigns). Open addressing with linear probing and backward-shift deletion, so
// steady-state Acquire/Release allocate nothing (the table grows, rarely, at half full).
// Single-threaded.
class ActiveBlockSet {
 public:
  // Adds a reference to `hash`; a new hash enters with weight 1. Returns its entry's
  // reference count after the call.
  uint32_t Acquire(uint64_t hash);
  // Drops a reference; the hash leaves the set when none is left. Returns the weight it
  // had when it left, or 0 when it stays (or was absent).
  double Release(uint64_t hash);
  // 0 when absent.
  uint32_t Refs(uint64_t hash) const;
  // Sets the weight of a present hash; returns the change (new - old), 0 when absent.
  double SetWeight(uint64_t hash, double weight);
  size_t size() const { return size_; }
  void Clear();

 private:
  struct Entry {
    uint64_t hash = 0;
    uint32_t refs = 0;  // 0: empty slot
    double weight = 1.0;
  };
  size_t Find(uint64_t hash) const;  // slot index, or npos
  void Grow();
  std::vector<Entry> slots_;
  size_t size_ = 0;
};

class DynamoCostScheduler : public SchedulerBase {
 public:
  struct Config {
    double overlap_weight = 1.0;  // Dynamo's overlap_score_weight
    int64_t block_size = 16;      // tokens per block; hashed as 4 * block_size characters
    size_t max_blocks = 1 << 16;  // longest prompt prefix hashed, in blocks
    double temperature = 0.0;     // 0: lowest cost wins; > 0: softmax sampling over -cost
    double ttl_s = 120.0;         // predicted index blocks expire after this
    // Dynamo's router_track_output_blocks (off by default there): add one single-owner
    // block each time a request's prompt + generated tokens cross a block boundary, and
    // re-weight the request's single-reference blocks by 1 - generated / expected output
    // (kvroute's expected output: max_tokens capped, else the default) at each one.
    bool track_output_blocks = false;
    // dynamo-kv: overlap from the KV-event index where the endpoint's events are live.
    bool events = false;
    kvevents::TierWeights tiers{1.0, 0.75, 0.25, 0.0};
  };
  DynamoCostScheduler(const Config& config, const SchedulerOptions& options);

  std::string_view policy() const override {
    if (config_.events) return "dynamo-kv";
    return config_.track_output_blocks ? "dynamo-cost-output-blocks" : "dynamo-cost";
  }
  // consumed_fields: the default, none. Its own block accounting and the KV-event index:
  // nothing from EndpointState::engine.
  // Scores reported: row "cost" (raw block count, not clamped) and row "overlap"
  // (matched blocks / prompt blocks). totals = -cost.
  PickResult Pick(const SchedRequest& req, std::span<const EndpointState> endpoints,
                  double now_s) override;
  // Output blocks (when track_output_blocks) as the stream shows tokens.
  void OnTokens(RequestHandle handle, int64_t generated_tokens, double now_s) override;
  void OnEndpointRemoved(uint32_t endpoint_id) override;

  // Its predicted block index (the one prefix model, with Dynamo's TTL) and that index's
  // chain (block_size * 4 characters a block); blocks past the TTL still count until the
  // next pick expires them.
  const PrefixModel* prefix_model() const override { return index_.get(); }
  void PrefixKey(const SchedRequest& req, std::vector<uint64_t>& out) const override {
    HashPromptBlocks(req.model, req.cache_salt, req.prompt,
                     static_cast<size_t>(config_.block_size) * 4, config_.max_blocks, out);
  }

  // Dynamo's active_blocks(): the sum of the weights of the worker's unique active blocks
  // (1 each unless decayed), rounded to an integer. 0 for unknown workers.
  int64_t ActiveBlocks(uint32_t endpoint_id) const;
  // Unique block hashes active on the worker (prompt blocks; output blocks not included).
  size_t UniquePromptBlocks(uint32_t endpoint_id) const;
  // Prefill tokens of the worker's requests that have no first token yet (0 for an
  // unknown worker).
  int64_t ActivePrefillTokens(uint32_t endpoint_id) const override;

 private:
  struct Worker {
    ActiveBlockSet blocks;
    double weighted_blocks = 0.0;  // prompt blocks' weights + output blocks' weights
    int64_t prefill_tokens = 0;
    uint32_t requests = 0;
  };
  // One per request slot (SchedulerBase's PendingRequest::slot); vectors keep capacity.
  struct Sequence {
    bool active = false;
    bool prefill_pending = false;
    uint32_t endpoint = 0;
    std::vector<uint64_t> blocks;  // prompt block hashes, acquired on `endpoint`
    int64_t prefill_tokens = 0;
    int64_t prompt_tokens = 0;
    int64_t expected_output_tokens = 0;
    int64_t total_blocks = 0;   // ceil((prompt + generated) / block size) last counted
    int64_t output_blocks = 0;  // single-owner blocks added during generation
    double output_weight = 1.0;
    // Set at the pick: the prompt's tokens (the engines' count when tokenized) and, with
    // events, the reported overlap in tokens by endpoint id (-1: not live, use the index).
    int64_t pick_tokens = -1;
    std::vector<double> event_cached_by_id;
  };

  // Takes the previous dynamo-cost scheduler's index and active sequences when block_size
  // and max_blocks match.
  void AdoptPolicyState(SchedulerBase& previous) override;
  // Dispatched: adds the request's prompt blocks to the worker's active set and its
  // uncached prompt tokens to the worker's prefill tokens; records its blocks in the
  // predicted index. A second dispatch moves it (frees it from the first worker).
  double OnRequestDispatched(PendingRequest& p, uint32_t endpoint_id, const EndpointState& e,
                             double now_s) override;
  // First token: prefill done, the request's prefill tokens leave the worker's count.
  void OnRequestStarted(PendingRequest& p, double now_s) override;
  // Finished: frees the request's blocks (a block another in-flight request holds stays).
  void OnRequestEnded(PendingRequest& p, double now_s) override;
  Worker& WorkerOf(uint32_t endpoint_id);
  void Free(Sequence& s);
  Sequence& SequenceOf(uint32_t slot);
  // Dynamo's set_single_ref_blocks_as_fractional: every block only `s` holds takes
  // `fraction`.
  void Decay(Sequence& s, double fraction);

  Config config_;
  std::unique_ptr<PrefixModel> index_ = MakeApproxPrefixModel();
  std::vector<Worker> workers_;      // by endpoint id
  std::vector<Sequence> sequences_;  // by request slot
  CacheView view_;
  std::vector<double> keys_;
};

}  // namespace kvroute::sched
