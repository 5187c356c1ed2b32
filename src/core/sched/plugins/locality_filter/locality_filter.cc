#include "core/sched/plugins/locality_filter/locality_filter.h"

#include <algorithm>
#include <cmath>

#include "core/sched/latency_trainer.h"
#include "core/sched/prefix_index.h"

namespace kvroute::sched {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A NaN or missing value makes the load unknown: such an endpoint is neither room nor
// evidence of saturation, and never a spill target (docs/POLICIES.md).
// (EndpointState::MetricsFresh, inlined: this runs per endpoint and pick.)
bool Known(const EndpointState& e, const EndpointLoad& l, double now_s, double stale_after_s) {
  return e.scrape_ok && e.scraped_at_s >= 0 && now_s - e.scraped_at_s <= stale_after_s &&
         std::isfinite(l.kv_usage) && std::isfinite(l.waiting);
}

// How Apply's first pass classifies each candidate (PickScratch::u32_a).
enum : uint32_t { kRemote = 0, kLocalEp = 1, kCanTake = 2 };

bool SameRegion(const EndpointState& a, const EndpointState& b) {
  if (a.region_key != 0 && b.region_key != 0) return a.region_key == b.region_key;
  return a.region == b.region;
}

// Expected queueing wait at an endpoint: waiting x secondsPerQueuedRequest.
double ExpectedWait(const EndpointLoad& l, const LocalityFilter::Params& p) {
  return std::max(0.0, l.waiting) * p.seconds_per_queued;
}

// What Apply's pass 1 learns about the local candidates.
struct LocalPass {
  size_t n_local = 0;
  size_t n_remote = 0;
  size_t n_known = 0;
  bool room = false;
  double local_wait = kInf;
};

// Pass 1 classifies every candidate into `cls` (kept in the plugin scratch for the
// compaction in Apply) and reads local loads until the answer is settled: once a local
// endpoint has room and nothing to wait for, no other local load can change the decision,
// so a pool below saturation costs one region compare per endpoint.
LocalPass ClassifyCandidates(const LocalityFilter& f, bool spilling, const PickContext& ctx,
                             std::span<const uint32_t> candidates, std::vector<uint32_t>& cls) {
  const LocalityFilter::Params& p = f.params();
  const double now = ctx.now_s;
  LocalPass out;
  cls.resize(candidates.size());
  bool settled = false;
  for (size_t c = 0; c < candidates.size(); ++c) {
    const uint32_t pos = candidates[c];
    const EndpointState& e = ctx.endpoints[pos];
    if (!f.IsLocal(e)) {
      cls[c] = kRemote;
      ++out.n_remote;
      continue;
    }
    cls[c] = kLocalEp;
    ++out.n_local;
    if (settled) continue;
    const EndpointLoad& l = ctx.loads[pos];
    if (!Known(e, l, now, p.stale_after_s)) continue;
    ++out.n_known;
    // Hysteresis: while spilling, an endpoint has room again only clearly below the
    // thresholds.
    out.room = out.room || (spilling ? l.waiting <= p.recover_queue_threshold &&
                                           l.kv_usage <= p.recover_kv_threshold
                                     : !f.Saturated(l));
    out.local_wait = std::min(out.local_wait, ExpectedWait(l, p));
    settled = out.room && out.local_wait <= 0;
  }
  return out;
}

// What Apply's pass 2 learns about the remote candidates.
struct RemotePass {
  double best_cost = kInf;
  const EndpointState* best_region = nullptr;  // an endpoint of the best region
  bool any_finite_remote = false;
  uint32_t sticky_pos = PickScratch::kNoPin;
};

// Pass 2: which remote endpoints can take the request (marked kCanTake in `cls`), the
// best region (lowest round trip + expected wait) and where the sticky replica `sticky`
// (-1: none) sits among the candidates.
RemotePass RankRemote(const LocalityFilter& f, const PickContext& ctx,
                      std::span<const uint32_t> candidates, int64_t sticky,
                      std::vector<uint32_t>& cls) {
  const LocalityFilter::Params& p = f.params();
  const double now = ctx.now_s;
  RemotePass out;
  // Endpoints of one region usually sit together in the table: look each run up once.
  const EndpointState* last_region = nullptr;
  double last_rtt = kInf;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (cls[c] != kRemote) continue;
    const uint32_t pos = candidates[c];
    const EndpointState& e = ctx.endpoints[pos];
    if (last_region == nullptr || !SameRegion(*last_region, e)) {
      last_region = &e;
      last_rtt = f.RttOf(e.region);
    }
    if (!(last_rtt < kInf)) continue;
    out.any_finite_remote = true;
    const EndpointLoad& l = ctx.loads[pos];
    if (!Known(e, l, now, p.stale_after_s) || f.Saturated(l)) continue;
    cls[c] = kCanTake;
    const double cost = last_rtt + ExpectedWait(l, p);
    if (cost < out.best_cost) {
      out.best_cost = cost;
      out.best_region = &e;
    }
    if (sticky >= 0 && e.id == static_cast<uint64_t>(sticky)) out.sticky_pos = pos;
  }
  return out;
}

}  // namespace

void LocalityFilter::Configure(std::string region,
                               std::span<const std::pair<std::string, double>> rtt_s) {
  region_ = std::move(region);
  region_key_ = RegionKey(region_);
  rtt_s_.clear();
  for (const auto& [r, s] : rtt_s) SetRegionRtt(r, s);
}

void LocalityFilter::SetRegionRtt(std::string_view region, double seconds) {
  auto it = std::find_if(rtt_s_.begin(), rtt_s_.end(),
                         [&](const auto& e) { return e.first == region; });
  if (!std::isfinite(seconds) || seconds < 0) {
    if (it != rtt_s_.end()) rtt_s_.erase(it);
    return;
  }
  if (it != rtt_s_.end()) {
    it->second = seconds;
  } else {
    rtt_s_.emplace_back(std::string(region), seconds);
  }
}

double LocalityFilter::RttOf(std::string_view region) const {
  // A handful of regions: a linear scan beats hashing the name.
  for (const auto& [r, s] : rtt_s_) {
    if (r == region) return s;
  }
  return p_.default_rtt_s;
}

void LocalityFilter::Apply(const PickContext& ctx, std::vector<uint32_t>& candidates) {
  PickScratch& sc = *ctx.scratch;
  if (region_.empty()) {
    sc.locality = Locality::kOff;
    return;
  }
  const double now = ctx.now_s;
  // The prefix key (one block hashed, kept for OnDispatched) is needed to look the sticky
  // table up while it holds live entries, and to record a spill; otherwise skipped.
  std::vector<uint64_t>& key = ctx.pending->hashes[index()];
  bool hashed = false;
  auto hash_key = [&] {
    if (hashed || p_.sticky_s <= 0) return;
    hashed = true;
    HashPromptBlocks(ctx.request->model, ctx.request->cache_salt, ctx.request->prompt,
                     p_.block_chars, 1, key);
  };
  int64_t sticky = -1;
  if (now < sticky_live_until_s_) {
    hash_key();
    if (!key.empty()) sticky = StickyTarget(key[0], now);
  }
  // Pass 1: the candidates' classes and the local side (ClassifyCandidates).
  std::vector<uint32_t>& cls = sc.u32_a;
  const LocalPass local = ClassifyCandidates(*this, spilling_, ctx, candidates, cls);
  const size_t n_local = local.n_local;
  const size_t n_remote = local.n_remote;
  const bool room = local.room;
  const double local_wait = local.local_wait;

  // Pass 2, only when the remote side can matter (RankRemote).
  RemotePass remote;
  if (n_remote > 0 &&
      (n_local == 0 || !room || local_wait > 0 || spilling_ || sticky >= 0)) {
    remote = RankRemote(*this, ctx, candidates, sticky, cls);
  }
  const double best_cost = remote.best_cost;
  const EndpointState* best_region = remote.best_region;
  const uint32_t sticky_pos = remote.sticky_pos;

  // Keeps candidate c when keep(c, pos); order preserved.
  auto compact = [&](auto keep) {
    size_t w = 0;
    for (size_t c = 0; c < candidates.size(); ++c) {
      if (keep(c, candidates[c])) candidates[w++] = candidates[c];
    }
    candidates.resize(w);
  };
  auto keep_local = [&] {
    if (n_remote == 0) return;  // nothing to remove
    compact([&](size_t c, uint32_t pos) { return cls[c] == kLocalEp || pos == sc.pinned; });
  };
  Locality reason;
  if (n_local == 0) {
    // Nowhere local to go: any remote, preferring regions with a known round trip.
    reason = Locality::kNoLocal;
    sc.pinned = sticky_pos;
    if (remote.any_finite_remote) {
      compact([&](size_t, uint32_t pos) { return RttOf(ctx.endpoints[pos].region) < kInf; });
    }
  } else if (local.n_known == 0) {
    // No local load is known: no evidence of saturation, so garbage moves nothing.
    reason = Locality::kLocal;
    keep_local();
  } else {
    const bool full = !room;
    const double bar = spilling_ ? p_.recover_wait_ratio * best_cost : best_cost;
    bool slow = p_.seconds_per_queued > 0 && best_region != nullptr && local_wait > bar;
    const bool hold = spilling_ && now - spill_since_s_ < p_.min_spill_s;
    // Predicted miss (issue 24): with the latency model and a TTFT objective, spill when
    // every known local endpoint is predicted to miss the objective even with the whole
    // prompt cached there, and a remote endpoint that can take the request is predicted to
    // meet it with its round trip even with nothing cached. Both bounds are the safe side
    // of the prefix model the filter does not read (scorers run after filters), so the move
    // is never a gamble on re-prefill.
    if (best_region == nullptr || !(full || slow || hold)) {
      if (const EndpointState* target = PredictedMissTarget(ctx, candidates, cls)) {
        best_region = target;
        slow = true;
      }
    }
    if (best_region != nullptr && (full || slow || hold)) {
      reason = full ? Locality::kSpillSaturated : slow ? Locality::kSpillWait : spill_reason_;
      sc.pinned = sticky_pos;
      // The best remote region's endpoints that can take it (and the prefix's sticky
      // replica, wherever it is); the scorers choose among them.
      compact([&](size_t c, uint32_t pos) {
        return pos == sticky_pos ||
               (cls[c] == kCanTake && SameRegion(ctx.endpoints[pos], *best_region));
      });
    } else if (sticky_pos != PickScratch::kNoPin) {
      // Recovered, but this prefix spilled less than stickySeconds ago: it stays on its
      // remote replica (ranked first), local candidates behind it. (A sticky replica that
      // can take it implies a best region, so the pool is not full here.)
      reason = Locality::kSpillSticky;
      sc.pinned = sticky_pos;
      keep_local();
    } else {
      reason = full ? Locality::kLocalSaturated : Locality::kLocal;
      keep_local();
    }
  }
  if (IsRemote(reason)) hash_key();
  sc.locality = reason;
}

uint32_t LocalityFilter::consumed_fields() const {
  // What LatencyTrainer::DispatchOf reads of a candidate's engine.
  using F = metrics::EngineMetrics;
  return F::kWaiting | F::kRunning | F::kKvUsage;
}

const EndpointState* LocalityFilter::PredictedMissTarget(const PickContext& ctx,
                                                        std::span<const uint32_t> candidates,
                                                        std::vector<uint32_t>& cls) const {
  const SchedRequest& req = *ctx.request;
  if (req.latency == nullptr || !(req.slo_ttft_s > 0)) return nullptr;
  const LatencyTrainer& model = *req.latency;
  const double objective = req.slo_ttft_s;
  const double now = ctx.now_s;
  // Local: the best case (the whole prompt cached). One predicted to meet it, or one
  // without a prediction: no predicted miss.
  size_t predicted_local = 0;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (cls[c] != kLocalEp) continue;
    const EndpointState& e = ctx.endpoints[candidates[c]];
    if (!Known(e, ctx.loads[candidates[c]], now, p_.stale_after_s)) continue;
    const auto p = model.PredictTtft(LatencyTrainer::DispatchOf(req, e, 1.0));
    if (!p || !std::isfinite(*p) || *p <= objective) return nullptr;
    ++predicted_local;
  }
  if (predicted_local == 0) return nullptr;
  // Remote: the worst case (nothing cached) plus the round trip.
  const EndpointState* best = nullptr;
  double best_cost = kInf;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (cls[c] == kLocalEp) continue;
    const uint32_t pos = candidates[c];
    const EndpointState& e = ctx.endpoints[pos];
    const EndpointLoad& l = ctx.loads[pos];
    const double rtt = RttOf(e.region);
    if (!(rtt < kInf) || !Known(e, l, now, p_.stale_after_s)) continue;
    if (Saturated(l)) continue;
    cls[c] = kCanTake;
    const auto p = model.PredictTtft(LatencyTrainer::DispatchOf(req, e, 0.0));
    if (!p || !std::isfinite(*p)) continue;
    const double cost = rtt + *p;
    if (cost <= objective && cost < best_cost) {
      best_cost = cost;
      best = &e;
    }
  }
  return best;
}

void LocalityFilter::OnCommit(const PickScratch& sc, std::span<const EndpointState> endpoints) {
  const Locality r = sc.locality;
  if (r == Locality::kOff) return;
  ++stats_.picks[static_cast<size_t>(r)];
  if (r == Locality::kSpillSaturated || r == Locality::kSpillWait) {
    if (!spilling_) {
      spilling_ = true;
      spill_since_s_ = sc.now_s;
      ++stats_.spills_started;
    }
    spill_reason_ = r;
  } else if (r == Locality::kLocal || r == Locality::kLocalSaturated) {
    spilling_ = false;
  }
  stats_.spilling = spilling_;
  for (uint32_t i : sc.order) {
    const EndpointState& e = endpoints[sc.candidates[i]];
    if (e.id >= remote_.size()) remote_.resize(e.id + 1, 0);
    remote_[e.id] = IsLocal(e) ? 0 : 1;
  }
}

int64_t LocalityFilter::OnDispatched(const PendingRequest& req, const EndpointState& endpoint,
                                     double now_s) {
  if (region_.empty() || p_.sticky_s <= 0) return -1;
  const std::vector<uint64_t>& key = req.hashes[index()];
  if (key.empty()) return -1;
  if (endpoint.id < remote_.size() && remote_[endpoint.id]) {
    StickyPut(key[0], endpoint.id, now_s);
  } else if (!sticky_.empty()) {
    StickyDrop(key[0]);
  }
  return -1;
}

void LocalityFilter::AdoptStateFrom(Plugin& previous) {
  // Same type() as this one (the scheduler matched them), so the same class.
  auto& prev = static_cast<LocalityFilter&>(previous);
  stats_ = prev.stats_;
  if (prev.region_ != region_) {
    stats_.spilling = false;
    return;
  }
  spilling_ = prev.spilling_;
  spill_since_s_ = prev.spill_since_s_;
  spill_reason_ = prev.spill_reason_;
  remote_ = std::move(prev.remote_);
  if (prev.p_.sticky_capacity == p_.sticky_capacity && prev.p_.block_chars == p_.block_chars) {
    sticky_ = std::move(prev.sticky_);
    sticky_live_until_s_ = prev.sticky_live_until_s_;
  }
  prev.sticky_.clear();
  prev.remote_.clear();
}

int64_t LocalityFilter::StickyTarget(uint64_t key, double now_s) const {
  if (sticky_.empty()) return -1;
  const size_t mask = sticky_.size() - 1;
  for (size_t i = 0; i < kProbe; ++i) {
    const StickyEntry& s = sticky_[(key + i) & mask];
    if (s.key == key && s.expires_s > now_s) return s.endpoint;
  }
  return -1;
}

void LocalityFilter::StickyPut(uint64_t key, uint32_t endpoint, double now_s) {
  if (sticky_.empty()) {
    size_t n = kProbe;
    while (n < p_.sticky_capacity) n <<= 1;
    sticky_.resize(n);
  }
  const size_t mask = sticky_.size() - 1;
  size_t victim = 0;
  double victim_expires = kInf;
  for (size_t i = 0; i < kProbe; ++i) {
    const size_t slot = (key + i) & mask;
    StickyEntry& s = sticky_[slot];
    if (s.key == key && s.expires_s > -kInf) {
      // Not refreshed while it points at the same replica: the TTL runs from the spill,
      // so a busy conversation is re-decided every stickySeconds and can come home.
      if (s.expires_s > now_s && s.endpoint == endpoint) return;
      s.endpoint = endpoint;
      s.expires_s = now_s + p_.sticky_s;
      sticky_live_until_s_ = std::max(sticky_live_until_s_, s.expires_s);
      return;
    }
    if (s.expires_s < victim_expires) {
      victim = slot;
      victim_expires = s.expires_s;
    }
  }
  // A free (expired) slot, else the entry closest to expiring: memory stays bounded.
  sticky_[victim] = StickyEntry{key, endpoint, now_s + p_.sticky_s};
  sticky_live_until_s_ = std::max(sticky_live_until_s_, now_s + p_.sticky_s);
}

void LocalityFilter::StickyDrop(uint64_t key) {
  const size_t mask = sticky_.size() - 1;
  for (size_t i = 0; i < kProbe; ++i) {
    StickyEntry& s = sticky_[(key + i) & mask];
    if (s.key == key) s.expires_s = -kInf;
  }
}

PluginFactory LocalityFilterFactory() {
  using P = LocalityFilter::Params;
  return ParamsFactory<LocalityFilter>(
      PluginKind::kFilter,
      {{{"kvThreshold", 0, kParamUnbounded, false}, &P::kv_threshold},
       {{"queueThreshold", 0, kParamUnbounded, false}, &P::queue_threshold},
       {{"recoverKvThreshold", 0, kParamUnbounded, false}, &P::recover_kv_threshold},
       {{"recoverQueueThreshold", 0, kParamUnbounded, false}, &P::recover_queue_threshold},
       {{"minSpillSeconds", 0, kParamUnbounded, false}, &P::min_spill_s},
       {{"staleAfterSeconds", 0, kParamUnbounded, false}, &P::stale_after_s},
       {{"secondsPerQueuedRequest", 0, kParamUnbounded, false}, &P::seconds_per_queued},
       {{"recoverWaitRatio", 0, 1, false}, &P::recover_wait_ratio},
       {{"defaultRttSeconds", 0, kParamUnbounded, false}, &P::default_rtt_s},
       {{"stickySeconds", 0, kParamUnbounded, false}, &P::sticky_s},
       {{"stickyCapacity", 1, 1 << 24, true}, &P::sticky_capacity},
       {{"blockSize", 1, 1 << 20, true}, &P::block_chars}});
}

}  // namespace kvroute::sched
