#include "core/sched/llmd_sticky.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvroute::sched {

LlmdStickyScheduler::LlmdStickyScheduler(const Config& config, const SchedulerOptions& options)
    : SchedulerBase(options, 1), config_(config) {
  scorer_names_ = {"affinity", "token-load"};
  weights_ = {1.0, 1.0};
  scorer_roles_ = {ScorerRole::kPrefix, ScorerRole::kLoad};
}

LlmdStickyScheduler::Sequence& LlmdStickyScheduler::SequenceOf(uint32_t slot) {
  if (slot >= sequences_.size()) sequences_.resize(slot + 1);
  return sequences_[slot];
}

void LlmdStickyScheduler::AdoptPolicyState(SchedulerBase& previous) {
  auto* prev = dynamic_cast<LlmdStickyScheduler*>(&previous);
  if (prev == nullptr || prev->BlockChars() != BlockChars() ||
      prev->config_.max_blocks != config_.max_blocks) {
    return;
  }
  std::swap(lru_, prev->lru_);
  // Request slots moved with the handles, so the sequences keep their indexes.
  inflight_tokens_ = std::move(prev->inflight_tokens_);
  sequences_ = std::move(prev->sequences_);
  prev->inflight_tokens_.clear();
  prev->sequences_.clear();
}

PickResult LlmdStickyScheduler::Pick(const SchedRequest& req,
                                     std::span<const EndpointState> endpoints, double now_s) {
  if (!HealthyCandidates(endpoints)) return Fail(PickStatus::kNoHealthyEndpoint);
  PendingRequest& pending = NewRequest(req);
  std::vector<uint64_t>& hashes = pending.hashes[0];
  HashPromptBlocksWithPartial(req.model, req.cache_salt, req.prompt, BlockChars(),
                              config_.max_blocks, hashes);
  const int64_t bt = config_.block_tokens;
  view_.Fill({.model = lru_.get(), .chain = hashes, .chain_block_tokens = bt,
              .events = config_.precise},
             req, endpoints, candidates_, now_s);
  const bool precise = view_.events_used();
  // Prompt tokens: the engines' count when the front end tokenized (precise), else bytes / 4.
  const int64_t cpt = std::max<int64_t>(1, config_.chars_per_token);
  const int64_t estimated = (static_cast<int64_t>(req.prompt.size()) + cpt - 1) / cpt;
  const int64_t n_tokens = precise ? static_cast<int64_t>(req.token_ids.size()) : estimated;
  const double t_precise =
      precise ? static_cast<double>(std::min<int64_t>((n_tokens + bt - 1) / bt,
                                                      static_cast<int64_t>(config_.max_blocks)))
              : 0.0;

  Sequence& seq = SequenceOf(pending.slot);
  seq.active = false;
  seq.pending = false;
  seq.prompt_tokens = n_tokens;
  seq.uncached_by_id.assign(view_.max_id() + 1, -1);

  const size_t n = candidates_.size();
  affinity_.resize(n);
  uncached_.resize(n);
  bool any_in = false, any_out = false;
  int64_t min_in = std::numeric_limits<int64_t>::max();
  int64_t min_out = std::numeric_limits<int64_t>::max();
  for (size_t c = 0; c < n; ++c) {
    const uint32_t id = endpoints[candidates_[c]].id;
    // The approximate share is m / T; the engines' is their weighted run in 64-token
    // blocks over T's token count, at most 1.
    double a = view_.Share(c);
    if (view_[c].source == CacheSource::kEvents) {
      a = t_precise > 0
              ? std::min(1.0, view_.Tokens(c) / static_cast<double>(bt) / t_precise)
              : 0.0;
    }
    const int64_t cached = view_.RunTokens(c);
    const int64_t u = std::max<int64_t>(0, n_tokens - cached);
    affinity_[c] = a;
    uncached_[c] = u;
    seq.uncached_by_id[id] = u;
    const int64_t load = InflightTokens(id);
    if (a >= config_.affinity_threshold) {
      any_in = true;
      min_in = std::min(min_in, load);
    } else {
      any_out = true;
      min_out = std::min(min_out, load);
    }
  }
  // prefix-cache-affinity-filter.
  const bool keep_all =
      !any_in || (any_out && static_cast<double>(min_in - min_out) > config_.release_tokens);
  kept_.clear();
  for (size_t c = 0; c < n; ++c) {
    if (keep_all || affinity_[c] >= config_.affinity_threshold) kept_.push_back(static_cast<uint32_t>(c));
  }
  // token-load-scorer over the kept candidates (compacted in place, order kept).
  const size_t k = kept_.size();
  scores_.resize(2 * k);
  totals_.resize(k);
  for (size_t j = 0; j < k; ++j) {
    const size_t c = kept_[j];
    const uint32_t id = endpoints[candidates_[c]].id;
    const double load = static_cast<double>(InflightTokens(id) + uncached_[c]);
    const double score = 1.0 - std::min(1.0, load / config_.load_scale_tokens);
    scores_[j] = affinity_[c];
    scores_[k + j] = score;
    totals_[j] = score;
    candidates_[j] = candidates_[c];
  }
  candidates_.resize(k);
  return FinishByMaxScore(pending, endpoints, totals_);
}

double LlmdStickyScheduler::OnRequestDispatched(PendingRequest& p, uint32_t endpoint_id,
                                                const EndpointState& e, double now_s) {
  Sequence& s = SequenceOf(p.slot);
  if (s.active) Release(s);  // a retry elsewhere
  const size_t capacity = e.num_gpu_blocks > 0 ? static_cast<size_t>(e.num_gpu_blocks)
                                               : config_.default_lru_entries;
  lru_->OnRouted(p.hashes[0], endpoint_id, capacity, now_s);
  const int64_t u = endpoint_id < s.uncached_by_id.size() && s.uncached_by_id[endpoint_id] >= 0
                        ? s.uncached_by_id[endpoint_id]
                        : s.prompt_tokens;
  if (endpoint_id >= inflight_tokens_.size()) inflight_tokens_.resize(endpoint_id + 1, 0);
  inflight_tokens_[endpoint_id] += u;
  s.active = true;
  s.pending = true;
  s.endpoint = endpoint_id;
  s.tokens = u;
  const int64_t cached_chars = std::max<int64_t>(0, s.prompt_tokens - u) * config_.chars_per_token;
  return EstimateBlocks(p, e, cached_chars);
}

void LlmdStickyScheduler::EndPending(Sequence& s) {
  if (s.pending && s.endpoint < inflight_tokens_.size()) inflight_tokens_[s.endpoint] -= s.tokens;
  s.pending = false;
}

void LlmdStickyScheduler::Release(Sequence& s) {
  if (!s.active) return;
  s.active = false;
  EndPending(s);
}

void LlmdStickyScheduler::OnRequestStarted(PendingRequest& p, double now_s) {
  if (p.slot < sequences_.size() && sequences_[p.slot].active) EndPending(sequences_[p.slot]);
}

void LlmdStickyScheduler::OnRequestEnded(PendingRequest& p, double now_s) {
  if (p.slot < sequences_.size()) Release(sequences_[p.slot]);
}

void LlmdStickyScheduler::OnEndpointRemoved(uint32_t endpoint_id) {
  lru_->RemoveEndpoint(endpoint_id);
  tracker_.ResetEndpoint(endpoint_id);
  for (Sequence& s : sequences_) {
    if (s.active && s.endpoint == endpoint_id) {
      s.active = false;
      s.pending = false;
    }
  }
  if (endpoint_id < inflight_tokens_.size()) inflight_tokens_[endpoint_id] = 0;
}

}  // namespace kvroute::sched
