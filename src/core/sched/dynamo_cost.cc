#include "core/sched/dynamo_cost.h"

#include <algorithm>
#include <cmath>

namespace kvroute::sched {

namespace {

constexpr size_t kNpos = static_cast<size_t>(-1);

// Block hashes are already well mixed (XXH3 chains); fold the high half in anyway so a
// table indexed by the low bits never depends on one half alone.
size_t Bucket(uint64_t hash, size_t mask) {
  return static_cast<size_t>(hash ^ (hash >> 29)) & mask;
}

}  // namespace

// ---- ActiveBlockSet ----

size_t ActiveBlockSet::Find(uint64_t hash) const {
  if (slots_.empty()) return kNpos;
  const size_t mask = slots_.size() - 1;
  for (size_t i = Bucket(hash, mask);; i = (i + 1) & mask) {
    const Entry& e = slots_[i];
    if (e.refs == 0) return kNpos;
    if (e.hash == hash) return i;
  }
}

void ActiveBlockSet::Grow() {
  std::vector<Entry> old;
  old.swap(slots_);
  slots_.assign(old.empty() ? 64 : old.size() * 2, Entry{});
  const size_t mask = slots_.size() - 1;
  for (const Entry& e : old) {
    if (e.refs == 0) continue;
    size_t i = Bucket(e.hash, mask);
    while (slots_[i].refs != 0) i = (i + 1) & mask;
    slots_[i] = e;
  }
}

uint32_t ActiveBlockSet::Acquire(uint64_t hash) {
  if (const size_t i = Find(hash); i != kNpos) return ++slots_[i].refs;
  if ((size_ + 1) * 2 > slots_.size()) Grow();
  const size_t mask = slots_.size() - 1;
  size_t i = Bucket(hash, mask);
  while (slots_[i].refs != 0) i = (i + 1) & mask;
  slots_[i] = Entry{hash, 1, 1.0};
  ++size_;
  return 1;
}

double ActiveBlockSet::Release(uint64_t hash) {
  size_t i = Find(hash);
  if (i == kNpos) return 0.0;
  if (--slots_[i].refs > 0) return 0.0;
  const double weight = slots_[i].weight;
  --size_;
  // Backward-shift deletion: pull later entries of the run into the hole so that lookups
  // never need tombstones.
  const size_t mask = slots_.size() - 1;
  size_t hole = i;
  for (size_t j = (i + 1) & mask; slots_[j].refs != 0; j = (j + 1) & mask) {
    const size_t home = Bucket(slots_[j].hash, mask);
    // Move j into the hole unless its home lies cyclically in (hole, j].
    const bool home_after_hole = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!home_after_hole) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = Entry{};
  return weight;
}

uint32_t ActiveBlockSet::Refs(uint64_t hash) const {
  const size_t i = Find(hash);
  return i == kNpos ? 0 : slots_[i].refs;
}

double ActiveBlockSet::SetWeight(uint64_t hash, double weight) {
  const size_t i = Find(hash);
  if (i == kNpos) return 0.0;
  const double delta = weight - slots_[i].weight;
  slots_[i].weight = weight;
  return delta;
}

void ActiveBlockSet::Clear() {
  std::fill(slots_.begin(), slots_.end(), Entry{});
  size_ = 0;
}

// ---- DynamoCostScheduler ----

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
  prev->index_ = MakeApproxPrefixModel();
  // Request slots carry over with the handles (SchedulerBase moved the table), so the
  // sequences stay valid under the same indexes.
  workers_ = std::move(prev->workers_);
  sequences_ = std::move(prev->sequences_);
  prev->workers_.clear();
  prev->sequences_.clear();
}

DynamoCostScheduler::Worker& DynamoCostScheduler::WorkerOf(uint32_t endpoint_id) {
  if (endpoint_id >= workers_.size()) workers_.resize(endpoint_id + 1);
  return workers_[endpoint_id];
}

DynamoCostScheduler::Sequence& DynamoCostScheduler::SequenceOf(uint32_t slot) {
  if (slot >= sequences_.size()) sequences_.resize(slot + 1);
  return sequences_[slot];
}

int64_t DynamoCostScheduler::ActiveBlocks(uint32_t endpoint_id) const {
  if (endpoint_id >= workers_.size()) return 0;
  return static_cast<int64_t>(std::llround(std::max(0.0, workers_[endpoint_id].weighted_blocks)));
}

size_t DynamoCostScheduler::UniquePromptBlocks(uint32_t endpoint_id) const {
  return endpoint_id < workers_.size() ? workers_[endpoint_id].blocks.size() : 0;
}

int64_t DynamoCostScheduler::ActivePrefillTokens(uint32_t endpoint_id) const {
  return endpoint_id < workers_.size() ? workers_[endpoint_id].prefill_tokens : 0;
}

PickResult DynamoCostScheduler::Pick(const SchedRequest& req,
                                     std::span<const EndpointState> endpoints, double now_s) {
  if (!HealthyCandidates(endpoints)) return Fail(PickStatus::kNoHealthyEndpoint);
  PendingRequest& pending = NewRequest(req);
  const size_t n = candidates_.size();

  index_->ExpireBefore(now_s - config_.ttl_s);
  std::vector<uint64_t>& hashes = pending.hashes[0];
  const size_t block_chars = static_cast<size_t>(config_.block_size) * 4;
  HashPromptBlocks(req.model, req.cache_salt, req.prompt, block_chars, config_.max_blocks,
                   hashes);
  const int64_t bs = config_.block_size;
  // dynamo-kv: the engines' reported overlap (tier-weighted blocks of the index's size).
  view_.Fill({.model = index_.get(), .chain = hashes, .chain_block_tokens = bs,
              .events = config_.events, .tiers = &config_.tiers},
             req, endpoints, candidates_, now_s);

  const double prompt_blocks = static_cast<double>(hashes.size());
  const bool events = view_.events_used();
  const int64_t n_tokens =
      events ? static_cast<int64_t>(req.token_ids.size()) : pending.prompt_tokens;
  Sequence& seq = SequenceOf(pending.slot);
  seq.pick_tokens = n_tokens;
  seq.event_cached_by_id.clear();
  if (events) seq.event_cached_by_id.assign(view_.max_id() + 1, -1.0);
  scores_.resize(2 * n);
  totals_.resize(n);
  double lo = 1e300, hi = -1e300;
  for (size_t c = 0; c < n; ++c) {
    const uint32_t id = endpoints[candidates_[c]].id;
    double overlap = view_[c].blocks;
    if (view_[c].source == CacheSource::kEvents) {
      const double cached = view_.Tokens(c);
      seq.event_cached_by_id[id] = cached;
      overlap = cached / static_cast<double>(bs);
    }
    // Prefill: the worker's outstanding prefill plus this request's uncached tokens
    // (Dynamo's new_tokens: prompt tokens minus overlap blocks times the block size).
    const int64_t new_tokens = std::max<int64_t>(
        0, n_tokens - static_cast<int64_t>(std::llround(overlap * static_cast<double>(bs))));
    const int64_t queued = id < workers_.size() ? workers_[id].prefill_tokens : 0;
    const double prefill = static_cast<double>(new_tokens + queued) / static_cast<double>(bs);
    // Decode: active blocks plus the prompt blocks this worker's in-flight requests do
    // not already hold.
    int64_t new_blocks = static_cast<int64_t>(hashes.size());
    if (id < workers_.size() && workers_[id].blocks.size() > 0) {
      new_blocks = 0;
      for (uint64_t h : hashes) new_blocks += workers_[id].blocks.Refs(h) == 0 ? 1 : 0;
    }
    const double decode = static_cast<double>(ActiveBlocks(id) + new_blocks);
    const double cost = config_.overlap_weight * prefill + decode;
    scores_[c] = cost;
    scores_[n + c] = prompt_blocks > 0 ? std::min(overlap, prompt_blocks) / prompt_blocks : 0.0;
    totals_[c] = -cost;
    lo = std::min(lo, cost);
    hi = std::max(hi, cost);
  }

  if (config_.temperature <= 0) return FinishByMaxScore(pending, endpoints, totals_);
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
  return FinishByMaxScore(pending, endpoints, keys_);
}

double DynamoCostScheduler::OnRequestDispatched(PendingRequest& p, uint32_t endpoint_id,
                                                const EndpointState& e, double now_s) {
  Sequence& s = SequenceOf(p.slot);
  if (s.active) Free(s);  // a retry elsewhere: the first worker no longer holds it

  const size_t capacity = static_cast<size_t>(CapacityBlocks(e));
  // Record returns the blocks the index held there before this request: Dynamo's overlap
  // for add_request.
  const int64_t overlap =
      static_cast<int64_t>(index_->OnRouted(p.hashes[0], endpoint_id, capacity, now_s));
  const int64_t bs = config_.block_size;
  // With events live there at the pick, the engines' overlap; else the predicted index's.
  int64_t cached_tokens = overlap * bs;
  if (endpoint_id < s.event_cached_by_id.size() && s.event_cached_by_id[endpoint_id] >= 0) {
    cached_tokens = std::llround(s.event_cached_by_id[endpoint_id]);
  }
  const int64_t prompt_tokens = s.pick_tokens >= 0 ? s.pick_tokens : p.prompt_tokens;

  Worker& w = WorkerOf(endpoint_id);
  s.active = true;
  s.endpoint = endpoint_id;
  s.blocks.assign(p.hashes[0].begin(), p.hashes[0].end());
  for (uint64_t h : s.blocks) {
    if (w.blocks.Acquire(h) == 1) w.weighted_blocks += 1.0;
  }
  s.prompt_tokens = prompt_tokens;
  s.expected_output_tokens = p.expected_output_tokens;
  s.prefill_tokens = std::max<int64_t>(0, prompt_tokens - cached_tokens);
  s.prefill_pending = true;
  w.prefill_tokens += s.prefill_tokens;
  ++w.requests;
  s.total_blocks = (s.prompt_tokens + bs - 1) / bs;
  s.output_blocks = 0;
  s.output_weight = 1.0;

  // Observability: the router's in-flight count per endpoint (blocks: this request's own
  // prompt blocks; the cost reads the deduplicated set above, not this).
  return static_cast<double>(s.blocks.size());
}

void DynamoCostScheduler::OnRequestStarted(PendingRequest& p, double now_s) {
  if (p.slot >= sequences_.size()) return;
  Sequence& s = sequences_[p.slot];
  if (!s.active || !s.prefill_pending) return;
  s.prefill_pending = false;
  Worker& w = WorkerOf(s.endpoint);
  w.prefill_tokens -= s.prefill_tokens;
}

void DynamoCostScheduler::OnTokens(RequestHandle handle, int64_t generated_tokens, double now_s) {
  if (!config_.track_output_blocks) return;
  PendingRequest* p = Find(handle);
  if (p == nullptr || p->slot >= sequences_.size()) return;
  Sequence& s = sequences_[p->slot];
  if (!s.active) return;
  const int64_t bs = config_.block_size;
  const int64_t total = (s.prompt_tokens + std::max<int64_t>(0, generated_tokens) + bs - 1) / bs;
  if (total <= s.total_blocks) return;
  s.total_blocks = total;
  // As Dynamo's stream handler: one block per stream item that crosses a boundary.
  Worker& w = WorkerOf(s.endpoint);
  ++s.output_blocks;
  w.weighted_blocks += s.output_weight;
  const double expected = static_cast<double>(std::max<int64_t>(1, s.expected_output_tokens));
  Decay(s, std::max(0.0, 1.0 - static_cast<double>(generated_tokens) / expected));
}

void DynamoCostScheduler::Decay(Sequence& s, double fraction) {
  Worker& w = WorkerOf(s.endpoint);
  for (uint64_t h : s.blocks) {
    if (w.blocks.Refs(h) == 1) w.weighted_blocks += w.blocks.SetWeight(h, fraction);
  }
  w.weighted_blocks += static_cast<double>(s.output_blocks) * (fraction - s.output_weight);
  s.output_weight = fraction;
}

void DynamoCostScheduler::Free(Sequence& s) {
  if (!s.active) return;
  s.active = false;
  if (s.endpoint >= workers_.size()) return;  // the endpoint was removed meanwhile
  Worker& w = workers_[s.endpoint];
  for (uint64_t h : s.blocks) w.weighted_blocks -= w.blocks.Release(h);
  w.weighted_blocks -= static_cast<double>(s.output_blocks) * s.output_weight;
  if (s.prefill_pending) w.prefill_tokens -= s.prefill_tokens;
  s.prefill_pending = false;
  s.output_blocks = 0;
  if (w.requests > 0) --w.requests;
  // Rounding drift never outlives the last request.
  if (w.requests == 0) {
    w.weighted_blocks = 0.0;
    w.prefill_tokens = 0;
  }
}

void DynamoCostScheduler::OnRequestEnded(PendingRequest& p, double now_s) {
  if (p.slot < sequences_.size()) Free(sequences_[p.slot]);
}

void DynamoCostScheduler::OnEndpointRemoved(uint32_t endpoint_id) {
  index_->RemoveEndpoint(endpoint_id);
  tracker_.ResetEndpoint(endpoint_id);
  if (endpoint_id < workers_.size()) {
    // Its requests keep their handles; detach them so that finishing them later touches
    // nothing (the endpoint's set is gone).
    for (Sequence& s : sequences_) {
      if (s.active && s.endpoint == endpoint_id) {
        s.active = false;
        s.prefill_pending = false;
        s.output_blocks = 0;
      }
    }
    Worker& w = workers_[endpoint_id];
    w.blocks.Clear();
    w.weighted_blocks = 0.0;
    w.prefill_tokens = 0;
    w.requests = 0;
  }
}

}  // namespace kvroute::sched
