#include "core/sched/scheduler_base.h"

#include <algorithm>
#include <cmath>

#include "core/common/slot_pool.h"

namespace kvroute::sched {

SchedulerBase::SchedulerBase(const SchedulerOptions& options, size_t hash_rows)
    : own_(options.seed), options_(options), hash_rows_(hash_rows) {}

// Scheduler's defaults for schedulers without a concurrent path: never used by callers
// that check concurrent_picks().
PickResult Scheduler::Rank(const SchedRequest&, std::span<const EndpointState>, double,
                           PickScratch&) {
  PickResult r;
  r.status = PickStatus::kNoHealthyEndpoint;
  return r;
}
RequestHandle Scheduler::Commit(PickScratch&, std::span<const EndpointState>) { return kNoHandle; }

void SchedulerBase::FillPending(PendingRequest& p, const SchedRequest& req) const {
  p.prompt_tokens = req.EstimatedPromptTokens();
  p.prompt_chars = req.prompt.size();
  if (req.max_tokens >= 0) {
    p.expected_output_tokens = std::min(req.max_tokens, options_.max_expected_output_tokens);
  } else {
    p.expected_output_tokens = options_.default_output_tokens;
  }
  p.hashes.resize(hash_rows_);
  for (auto& h : p.hashes) h.clear();
}

PendingRequest& SchedulerBase::AllocateRequest() {
  const auto [s, fresh] = TakeSlot(slots_, free_slots_);
  Slot& slot = slots_[s];
  if (fresh) slot.req.hashes.resize(hash_rows_);
  slot.live = true;
  ++live_;
  slot.req.slot = s;
  return slot.req;
}

RequestHandle SchedulerBase::Commit(PickScratch& sc, std::span<const EndpointState> endpoints) {
  PendingRequest& p = AllocateRequest();
  p.prompt_tokens = sc.pending.prompt_tokens;
  p.prompt_chars = sc.pending.prompt_chars;
  p.expected_output_tokens = sc.pending.expected_output_tokens;
  // Swap, not copy: both sides keep their capacity, nothing is allocated.
  p.hashes.resize(hash_rows_);
  sc.pending.hashes.resize(hash_rows_);
  for (size_t i = 0; i < hash_rows_; ++i) p.hashes[i].swap(sc.pending.hashes[i]);
  for (uint32_t i : sc.order) Remember(endpoints[sc.candidates[i]]);
  return HandleOf(p);
}

PendingRequest& SchedulerBase::NewRequest(const SchedRequest& req) {
  PendingRequest& p = AllocateRequest();
  FillPending(p, req);
  return p;
}

RequestHandle SchedulerBase::HandleOf(const PendingRequest& p) const {
  return (static_cast<uint64_t>(slots_[p.slot].generation) << 32) | p.slot;
}

PendingRequest* SchedulerBase::Find(RequestHandle handle) {
  const uint32_t s = static_cast<uint32_t>(handle & 0xffffffffu);
  const uint32_t gen = static_cast<uint32_t>(handle >> 32);
  if (s >= slots_.size() || !slots_[s].live || slots_[s].generation != gen) return nullptr;
  return &slots_[s].req;
}

void SchedulerBase::Release(PendingRequest& p) {
  Slot& slot = slots_[p.slot];
  if (!slot.live) return;
  slot.live = false;
  // Generation 0 would make handle 0 possible; skip it on wrap-around.
  if (++slot.generation == 0) slot.generation = 1;
  --live_;
  free_slots_.push_back(p.slot);
}

bool SchedulerBase::AdoptStateFrom(Scheduler& previous) {
  // Every built-in scheduler derives from SchedulerBase; the cast stays inside kvroute_sched.
  auto* prev = dynamic_cast<SchedulerBase*>(&previous);
  if (prev == nullptr || prev == this) return false;
  tracker_ = std::move(prev->tracker_);
  slots_ = std::move(prev->slots_);
  free_slots_ = std::move(prev->free_slots_);
  live_ = prev->live_;
  known_ = std::move(prev->known_);
  for (Slot& s : slots_) {
    s.req.hashes.resize(hash_rows_);
    for (auto& h : s.req.hashes) h.clear();
  }
  prev->tracker_ = InflightTracker();
  prev->slots_.clear();
  prev->free_slots_.clear();
  prev->live_ = 0;
  prev->known_.clear();
  AdoptPolicyState(*prev);
  return true;
}

void SchedulerBase::OnDispatched(RequestHandle handle, uint32_t endpoint_id, double now_s) {
  PendingRequest* p = Find(handle);
  if (p == nullptr) return;
  const double blocks = OnRequestDispatched(*p, endpoint_id, Known(endpoint_id), now_s);
  tracker_.Add(p->slot, endpoint_id, now_s, blocks);
}

double SchedulerBase::OnRequestDispatched(PendingRequest& p, uint32_t endpoint_id,
                                          const EndpointState& e, double now_s) {
  return EstimateBlocks(p, e, 0);
}

void SchedulerBase::OnFirstToken(RequestHandle handle, double now_s) {
  PendingRequest* p = Find(handle);
  if (p == nullptr) return;
  tracker_.MarkStarted(p->slot);
  OnRequestStarted(*p, now_s);
}

void SchedulerBase::OnFinished(RequestHandle handle, double now_s) {
  PendingRequest* p = Find(handle);
  if (p == nullptr) return;
  OnRequestEnded(*p, now_s);
  tracker_.Remove(p->slot, now_s);
  Release(*p);
}

void SchedulerBase::OnMetricsUpdated(uint32_t endpoint_id, double scraped_at_s) {
  tracker_.OnScrape(endpoint_id, scraped_at_s);
}

int64_t SchedulerBase::PrefixEntries(uint32_t endpoint_id) const {
  const PrefixModel* m = prefix_model();
  return m != nullptr ? static_cast<int64_t>(m->Size(endpoint_id)) : -1;
}

size_t SchedulerBase::HeldBlocks(std::span<const uint64_t> key, uint32_t endpoint_id) const {
  const PrefixModel* m = prefix_model();
  return m == nullptr || key.empty() ? 0 : m->MatchOne(key, endpoint_id);
}

int64_t SchedulerBase::BlockSize(const EndpointState& e) const {
  return e.block_size > 0 ? e.block_size : options_.default_block_size;
}

double SchedulerBase::CapacityBlocks(const EndpointState& e) const {
  return static_cast<double>(e.num_gpu_blocks > 0 ? e.num_gpu_blocks
                                                  : options_.default_num_gpu_blocks);
}

double SchedulerBase::EstimateBlocks(const PendingRequest& p, const EndpointState& e,
                                     int64_t cached_chars) const {
  const int64_t cached_tokens = std::max<int64_t>(0, cached_chars) / 4;
  const int64_t uncached = std::max<int64_t>(0, p.prompt_tokens - cached_tokens);
  const int64_t bs = BlockSize(e);
  const int64_t blocks = (uncached + p.expected_output_tokens + bs - 1) / bs;  // rounded up
  return static_cast<double>(blocks);
}

void SchedulerBase::Remember(const EndpointState& e) {
  if (e.id >= known_.size()) {
    known_.resize(e.id + 1);
    for (size_t i = 0; i < known_.size(); ++i) known_[i].id = static_cast<uint32_t>(i);
  }
  EndpointState& k = known_[e.id];
  k.CopyScrapedFrom(e);
  k.healthy = e.healthy;
}

const EndpointState& SchedulerBase::Known(uint32_t endpoint_id) {
  if (endpoint_id >= known_.size()) {
    known_.resize(endpoint_id + 1);
    for (size_t i = 0; i < known_.size(); ++i) known_[i].id = static_cast<uint32_t>(i);
  }
  return known_[endpoint_id];
}

void SchedulerBase::ComputeLoads(PickScratch& sc, std::span<const EndpointState> endpoints,
                                 bool adjust) const {
  sc.loads.resize(endpoints.size());
  for (uint32_t pos : sc.candidates) {
    const EndpointState& e = endpoints[pos];
    sc.loads[pos] = tracker_.Load(e, CapacityBlocks(e), adjust);
  }
}

PickResult SchedulerBase::Finish(RequestHandle handle, std::span<const EndpointState> endpoints,
                                 std::span<const uint32_t> order) {
  candidate_ids_.clear();
  for (uint32_t pos : candidates_) candidate_ids_.push_back(endpoints[pos].id);
  ranked_ids_.clear();
  for (uint32_t i : order) {
    const EndpointState& e = endpoints[candidates_[i]];
    ranked_ids_.push_back(e.id);
    Remember(e);
  }
  PickResult r;
  r.status = PickStatus::kOk;
  r.handle = handle;
  r.ranked = ranked_ids_;
  r.candidates = candidate_ids_;
  r.scorer_names = scorer_names_;
  r.weights = weights_;
  r.scores = scores_;
  r.totals = totals_;
  return r;
}

bool SchedulerBase::HealthyCandidates(std::span<const EndpointState> endpoints) {
  candidates_.clear();
  for (uint32_t i = 0; i < endpoints.size(); ++i) {
    if (endpoints[i].healthy) candidates_.push_back(i);
  }
  return !candidates_.empty();
}

PickResult SchedulerBase::FinishByMaxScore(const PendingRequest& pending,
                                           std::span<const EndpointState> endpoints,
                                           std::span<const double> keys) {
  RankByMaxScore(keys, options_.max_ranked, rng_, rank_scratch_, rank_tiebreak_, order_);
  return Finish(HandleOf(pending), endpoints, order_);
}

PickResult SchedulerBase::Finish(PickScratch& sc, std::span<const EndpointState> endpoints) const {
  sc.candidate_ids.clear();
  for (uint32_t pos : sc.candidates) sc.candidate_ids.push_back(endpoints[pos].id);
  sc.ranked_ids.clear();
  for (uint32_t i : sc.order) sc.ranked_ids.push_back(endpoints[sc.candidates[i]].id);
  PickResult r;
  r.status = PickStatus::kOk;
  r.handle = kNoHandle;
  r.ranked = sc.ranked_ids;
  r.candidates = sc.candidate_ids;
  r.scorer_names = scorer_names_;
  r.weights = weights_;
  r.scores = sc.scores;
  r.totals = sc.totals;
  r.locality = sc.locality;
  return r;
}

PickResult SchedulerBase::Fail(PickStatus status) const {
  PickResult r;
  r.status = status;
  return r;
}

}  // namespace kvroute::sched
