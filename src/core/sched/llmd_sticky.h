// A re-implementation of llm-d Router's shipped default, "sticky until saturated"
// (docs/POLICIES.md names the guide, the version and the source files it follows), and its
// precise variant fed by KV-cache events.
//
// Per request (N prompt tokens; T = min(ceil(N / 64), 2048) blocks of 64 tokens, the last
// partial block included):
//   affinity a_s     the share of the request's blocks endpoint s holds: m_s / T
//   uncached u_s     N - the tokens s holds (never below 0)
//   in-flight I_s    the uncached prompt tokens of requests routed to s and not yet at
//                    their first token (added at dispatch, released at the first token, or
//                    at the end when none came)
// Filter: S = {s : a_s >= 0.80}. S empty: every candidate stays. Otherwise, when some
//   candidates are not in S and min I over S - min I over the rest > 286,704 tokens (the
//   guide's 15,928 tokens/s of prefill times an 18 s tolerated TTFT penalty), every
//   candidate stays ("saturated": affinity released); else only S.
// Score: 1 - min(1, (I_s + u_s) / 4,194,304); the highest wins, ties at random.
//
// Where m_s comes from:
//   llm-d-sticky   the approximate producer: prompt text in blocks of 256 characters
//                  (64 tokens at 4 bytes a token), chained hashes rooted in the model, one
//                  LRU per endpoint of num_gpu_blocks entries (31,250 when the endpoint
//                  does not report it) filled in chain order with all T hashes of every
//                  request dispatched there; the match walks the chain until the first
//                  block no endpoint holds, m_s = the walked blocks s holds.
//   llm-d-precise  the routing core's KV-event index (SchedRequest::events, the engines'
//                  token ids): m_s = the tier-weighted run of leading blocks s holds, in
//                  64-token units, with the index's speculative entries (2 s by default)
//                  covering the event delay. An endpoint whose events are not live is
//                  matched by the approximate producer instead (kvroute's rule: unknown
//                  state is never trusted); without events at all it is llm-d-sticky.
// The producer is the prefix model (prefix_model.h, ApproxRules: llm-d's walk, in-order
// LRU) and the merge is CacheView's (cache_view.h), as for every policy that scores
// cache overlap.
#pragma once

#include <cstdint>
#include <vector>

#include <memory>

#include "core/sched/cache_view.h"
#include "core/sched/prefix_model.h"
#include "core/sched/scheduler_base.h"

namespace kvroute::sched {

class LlmdStickyScheduler : public SchedulerBase {
 public:
  struct Config {
    bool precise = false;
    int64_t block_tokens = 64;          // the producer's block, in (estimated) tokens
    int64_t chars_per_token = 4;        // the estimate without a tokenizer
    size_t max_blocks = 2048;           // 131,072 tokens matched at most
    double affinity_threshold = 0.80;   // prefix-cache-affinity-filter
    double release_tokens = 15928.0 * 18.0;  // 286,704
    double load_scale_tokens = 4194304.0;    // token-load-scorer
    size_t default_lru_entries = 31250;      // when num_gpu_blocks is unknown
  };
  LlmdStickyScheduler(const Config& config, const SchedulerOptions& options);

  std::string_view policy() const override {
    return config_.precise ? "llm-d-precise" : "llm-d-sticky";
  }
  // consumed_fields: the default, none. Its own token load and prefix LRU (or the KV-event
  // index) and EndpointState's num_gpu_blocks: nothing from EndpointState::engine.
  // Rows reported: "affinity" (a_s) and "token-load" (the score); totals = the score.
  // `candidates` are those the filter kept.
  PickResult Pick(const SchedRequest& req, std::span<const EndpointState> endpoints,
                  double now_s) override;
  void OnEndpointRemoved(uint32_t endpoint_id) override;

  // The approximate producer's LRU and its chain (the trailing partial block included).
  const PrefixModel* prefix_model() const override { return lru_.get(); }
  void PrefixKey(const SchedRequest& req, std::vector<uint64_t>& out) const override {
    HashPromptBlocksWithPartial(req.model, req.cache_salt, req.prompt, BlockChars(),
                                config_.max_blocks, out);
  }

  // I_s: uncached prompt tokens in flight to the endpoint before their first token.
  int64_t InflightTokens(uint32_t endpoint_id) const {
    return endpoint_id < inflight_tokens_.size() ? inflight_tokens_[endpoint_id] : 0;
  }
  const Config& config() const { return config_; }

 private:
  struct Sequence {
    bool active = false;    // dispatched and holding load
    bool pending = false;   // no first token yet: its tokens count in I
    uint32_t endpoint = 0;
    int64_t tokens = 0;     // what it added to I
    int64_t prompt_tokens = 0;
    std::vector<int64_t> uncached_by_id;  // u_s from the pick, by endpoint id; -1 unknown
  };
  size_t BlockChars() const {
    return static_cast<size_t>(config_.block_tokens * config_.chars_per_token);
  }
  Sequence& SequenceOf(uint32_t slot);
  // The request's tokens leave I (first token, or the end without one).
  void EndPending(Sequence& s);
  // Not on its endpoint any more (finished, moved, or the endpoint removed).
  void Release(Sequence& s);
  void AdoptPolicyState(SchedulerBase& previous) override;
  // Dispatched: adds the request's uncached tokens there to the endpoint's in-flight load
  // and its chain to the endpoint's LRU. A second dispatch moves the load.
  double OnRequestDispatched(PendingRequest& p, uint32_t endpoint_id, const EndpointState& e,
                             double now_s) override;
  // First token: the request's tokens leave I. Finished: it leaves its endpoint.
  void OnRequestStarted(PendingRequest& p, double now_s) override;
  void OnRequestEnded(PendingRequest& p, double now_s) override;

  Config config_;
  std::unique_ptr<PrefixModel> lru_ =
      MakeApproxPrefixModel({ApproxRules::Count::kWalk, ApproxPrefixIndex::RecordOrder::kInOrder});
  std::vector<int64_t> inflight_tokens_;  // by endpoint id
  std::vector<Sequence> sequences_;       // by request slot
  // Per-pick buffers.
  CacheView view_;
  std::vector<double> affinity_;
  std::vector<int64_t> uncached_;
  std::vector<uint32_t> kept_;
};

}  // namespace kvroute::sched
