#include "core/sched/cache_view.h"

#include <algorithm>

#include "core/kvevents/event_index.h"

namespace kvroute::sched {

void CacheView::Fill(const Query& q, const SchedRequest& req,
                     std::span<const EndpointState> endpoints, std::span<const uint32_t> candidates,
                     double now_s) {
  max_id_ = 0;
  for (uint32_t pos : candidates) max_id_ = std::max(max_id_, endpoints[pos].id);
  chain_blocks_ = q.chain.size();
  chain_block_tokens_ = q.chain_block_tokens;
  if (!q.chain.empty()) {
    if (match_.size() <= max_id_) match_.resize(max_id_ + 1);
    q.model->Match(q.chain, match_);
  }
  const kvevents::EventIndex* events =
      q.events && req.events != nullptr && !req.event_keys.empty() ? req.events : nullptr;
  events_used_ = events != nullptr;
  event_keys_ = events_used_ ? req.event_keys.size() : 0;
  event_block_tokens_ = events_used_ ? events->options().block_tokens : 0;
  if (events_used_) {
    if (q.tiers != nullptr) {
      events->Match(req.event_keys, now_s, *q.tiers, weighted_, run_);
    } else {
      events->Match(req.event_keys, now_s, weighted_, run_);
    }
  }

  entries_.resize(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) {
    const uint32_t id = endpoints[candidates[c]].id;
    CachedPrefix& e = entries_[c];
    if (events_used_ && events->Usable(id, now_s)) {
      e.source = CacheSource::kEvents;
      e.blocks = id < run_.size() ? run_[id] : 0;
      e.weighted = id < weighted_.size() ? weighted_[id] : 0.0;
    } else if (!q.chain.empty()) {
      e.source = CacheSource::kApprox;
      e.blocks = match_[id];
      e.weighted = static_cast<double>(e.blocks);
    } else {
      e = CachedPrefix{};
    }
  }
}

int64_t CacheView::UnitTokens(const CachedPrefix& e) const {
  switch (e.source) {
    case CacheSource::kEvents:
      return event_block_tokens_;
    case CacheSource::kApprox:
      return chain_block_tokens_;
    case CacheSource::kNone:
      break;
  }
  return 0;
}

double CacheView::Share(size_t c) const {
  const CachedPrefix& e = entries_[c];
  // For kApprox, weighted is exactly the block count.
  const size_t total = e.source == CacheSource::kEvents   ? event_keys_
                       : e.source == CacheSource::kApprox ? chain_blocks_
                                                          : 0;
  return total > 0 ? e.weighted / static_cast<double>(total) : 0.0;
}

double CacheView::Tokens(size_t c) const {
  const CachedPrefix& e = entries_[c];
  return e.weighted * static_cast<double>(UnitTokens(e));
}

int64_t CacheView::RunTokens(size_t c) const {
  const CachedPrefix& e = entries_[c];
  return static_cast<int64_t>(e.blocks) * UnitTokens(e);
}

}  // namespace kvroute::sched
