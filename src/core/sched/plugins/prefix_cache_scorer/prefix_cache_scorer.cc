#include "core/sched/plugins/prefix_cache_scorer/prefix_cache_scorer.h"

#include <algorithm>
#include <vector>

#include "core/sched/cache_view.h"

namespace kvroute::sched {

void PrefixCacheScorer::Score(const PickContext& ctx, std::span<const uint32_t> candidates,
                              std::span<double> out) {
  // Hash once per request; OnDispatched records the same chain.
  std::vector<uint64_t>& hashes = ctx.pending->hashes[index()];
  HashPromptBlocks(ctx.request->model, ctx.request->cache_salt, ctx.request->prompt,
                   p_.block_chars, p_.max_blocks, hashes);
  CacheView& view = ctx.scratch->cache;
  view.Fill({.model = model_.get(),
             .chain = hashes,
             .events = p_.precise,
             .tiers = p_.speculative == 1.0 ? nullptr : &tiers_},
            *ctx.request, ctx.endpoints, candidates, ctx.now_s);
  for (size_t i = 0; i < candidates.size(); ++i) out[i] = view.Share(i);
  if (!p_.min_max) return;
  double lo = 0, hi = 0;
  bool any = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!(out[i] > 0)) continue;
    lo = any ? std::min(lo, out[i]) : out[i];
    hi = any ? std::max(hi, out[i]) : out[i];
    any = true;
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!(out[i] > 0)) {
      out[i] = 0;
    } else {
      out[i] = hi > lo ? (out[i] - lo) / (hi - lo) : 1.0;
    }
  }
}

void PrefixCacheScorer::AdoptStateFrom(Plugin& previous) {
  // Same type() as this one (the scheduler matched them), so the same class.
  auto& prev = static_cast<PrefixCacheScorer&>(previous);
  if (prev.p_.block_chars != p_.block_chars || prev.p_.max_blocks != p_.max_blocks) return;
  model_ = std::move(prev.model_);
  prev.model_ = MakeApproxPrefixModel();
}

size_t PrefixCacheScorer::CapacityFor(const EndpointState& e) const {
  if (p_.lru_capacity > 0) return p_.lru_capacity;
  if (e.num_gpu_blocks > 0 && e.block_size > 0) {
    // The endpoint holds num_gpu_blocks * block_size tokens; one of our blocks is about
    // block_chars / 4 tokens.
    const double tokens_per_block = std::max(1.0, p_.block_chars / 4.0);
    return static_cast<size_t>(static_cast<double>(e.num_gpu_blocks) *
                               static_cast<double>(e.block_size) / tokens_per_block);
  }
  return kDefaultCapacity;
}

int64_t PrefixCacheScorer::OnDispatched(const PendingRequest& req, const EndpointState& endpoint,
                                        double now_s) {
  const std::vector<uint64_t>& hashes = req.hashes[index()];
  if (hashes.empty()) return 0;
  const size_t held = model_->OnRouted(hashes, endpoint.id, CapacityFor(endpoint), now_s);
  return static_cast<int64_t>(held * p_.block_chars);
}

// prefix-cache-scorer: approximate (the router's own dispatches) unless `preciseEvents` is
// 1; precise-prefix-cache-scorer: precise where an endpoint's KV-cache events are live,
// approximate elsewhere, unless `preciseEvents` is 0.
PluginFactory PrefixCacheScorerFactory(bool precise_default) {
  return {PluginKind::kScorer,
          {{"blockSize", 1, 1 << 20, true},
           {"maxPrefixBlocksToMatch", 1, 1 << 24, true},
           {"lruCapacityPerServer", 1, 1e12, true},
           {"preciseEvents", 0, 1, true},
           {"speculativeWeight", 0, 1, false},
           {"minMaxNormalize", 0, 1, true}},
          [precise_default](const PluginParams& p) -> std::unique_ptr<Plugin> {
            PrefixCacheScorer::Params q;
            q.block_chars = static_cast<size_t>(p.Get("blockSize", 64));
            q.max_blocks = static_cast<size_t>(p.Get("maxPrefixBlocksToMatch", 256));
            q.lru_capacity = static_cast<size_t>(p.Get("lruCapacityPerServer", 0));
            q.precise = p.Get("preciseEvents", precise_default ? 1 : 0) != 0;
            q.speculative = p.Get("speculativeWeight", 1.0);
            q.min_max = p.Get("minMaxNormalize", 0) != 0;
            return std::make_unique<PrefixCacheScorer>(q);
          }};
}

}  // namespace kvroute::sched
