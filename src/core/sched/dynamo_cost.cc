#include "core/sched/dynamo_cost.h"

#include <algorithm>
#include <cmath>

namespace kvroute::sched {

DynamoCostScheduler::DynamoCostScheduler(const Config& config, const SchedulerOptions& options)
    : SchedulerBase(options, 1), config_(config) {
  scorer_names_ = {"cost", "overlap"};
  weights_ = {1.0, 1.0};
  scorer_roles_ = {ScorerRole::kCost, ScorerRole::kPrefix};
}

void DynamoCostScheduler::AdoptPolicyState(SchedulerBase& previous) {
  auto* prev = dynamic_cast<DynamoCostScheduler*>(&previous);
  if (prev == nullptr || prev->config_.block_size != config_.block_size ||
      prev->config_.max_blocks != config_.max_blocks) {
    return;
  }
  index_ = std::move(prev->index_);
  prev->index_ = ApproxPrefixIndex();
}

PickResult DynamoCostScheduler::Pick(const SchedRequest& req,
                                     std::span<const EndpointState> endpoints, double now_s) {
  candidates_.clear();
  for (uint32_t i = 0; i < endpoints.size(); ++i) {
    if (endpoints[i].healthy) candidates_.push_back(i);
  }
  if (candidates_.empty()) return Fail(PickStatus::kNoHealthyEndpoint);
  PendingRequest& pending = NewRequest(req);
  const size_t n = candidates_.size();

  index_.ExpireBefore(now_s - config_.ttl_s);
  std::vector<uint64_t>& hashes = pending.hashes[0];
  const size_t block_chars = static_cast<size_t>(config_.block_size) * 4;
  HashPromptBlocks(req.model, req.cache_salt, req.prompt, block_chars, config_.max_blocks,
                   hashes);
  uint32_t max_id = 0;
  for (uint32_t pos : candidates_) max_id = std::max(max_id, endpoints[pos].id);
  if (match_.size() <= max_id) match_.resize(max_id + 1);
  index_.Match(hashes, match_);

  const double bs = static_cast<double>(config_.block_size);
  const double prompt_blocks = std::ceil(static_cast<double>(pending.prompt_tokens) / bs);
  scores_.resize(2 * n);
  totals_.resize(n);
  double lo = 1e300, hi = -1e300;
  for (size_t c = 0; c < n; ++c) {
    const uint32_t id = endpoints[candidates_[c]].id;
    const double matched = std::min<double>(match_[id], prompt_blocks);
    const double prefill = prompt_blocks - matched;
    const double decode = tracker_.ActiveBlocks(id);
    const double cost = config_.overlap_weight * prefill + decode;
    scores_[c] = cost;
    scores_[n + c] = prompt_blocks > 0 ? matched / prompt_blocks : 0.0;
    totals_[c] = -cost;
    lo = std::min(lo, cost);
    hi = std::max(hi, cost);
  }

  if (config_.temperature <= 0) {
    RankByMaxScore(totals_, options_.max_ranked, rng_, scratch_, tiebreak_, order_);
  } else {
    // Softmax over costs normalised to [0,1]: sample the first, the rest by cost.
    const double range = hi > lo ? hi - lo : 1.0;
    keys_.resize(n);
    double sum = 0;
    for (size_t c = 0; c < n; ++c) {
      keys_[c] = std::exp(-(scores_[c] - lo) / range / config_.temperature);
      sum += keys_[c];
    }
    double r = rng_.Uniform() * sum;
    size_t chosen = n - 1;
    for (size_t c = 0; c < n; ++c) {
      if (r < keys_[c]) {
        chosen = c;
        break;
      }
      r -= keys_[c];
    }
    keys_.assign(totals_.begin(), totals_.end());
    keys_[chosen] = 1e300;
    RankByMaxScore(keys_, options_.max_ranked, rng_, scratch_, tiebreak_, order_);
  }
  return Finish(HandleOf(pending), endpoints, order_);
}

void DynamoCostScheduler::OnDispatched(RequestHandle handle, uint32_t endpoint_id, double now_s) {
  PendingRequest* p = Find(handle);
  if (p == nullptr) return;
  const EndpointState& e = Known(endpoint_id);
  // Dynamo counts a sequence's whole KV footprint as active, cached or not.
  const double blocks = std::ceil(
      static_cast<double>(p->prompt_tokens + p->expected_output_tokens) / config_.block_size);
  tracker_.Add(p->slot, endpoint_id, now_s, blocks);
  const size_t capacity = static_cast<size_t>(CapacityBlocks(e));
  index_.Record(p->hashes[0], endpoint_id, capacity, now_s);
}

void DynamoCostScheduler::OnEndpointRemoved(uint32_t endpoint_id) {
  index_.RemoveEndpoint(endpoint_id);
  tracker_.ResetEndpoint(endpoint_id);
}

}  // namespace kvroute::sched
