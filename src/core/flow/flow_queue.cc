#include "core/flow/flow_queue.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <limits>
#include <string>

#include "core/common/enum_names.h"

namespace kvroute::flow {

std::string_view RejectReasonName(RejectReason r) {
  static constexpr std::array<std::string_view, kNumRejectReasons> kNames = {
      "none",           "sheddable",    "band_full_requests", "band_full_bytes",
      "too_many_bands", "duplicate_id", "predicted_miss", "all_busy"};
  return NameAt(kNames, r, "unknown");
}

std::string_view AdmissionName(Admission a) {
  static constexpr std::array<std::string_view, 4> kNames = {"kvroute", "llm-d",
                                                             "llm-d-flow-control", "dynamo-queue"};
  return NameAt(kNames, a, "unknown");
}

std::string_view ExpireReasonName(ExpireReason r) {
  static constexpr std::array<std::string_view, kNumExpireReasons> kNames = {
      "ttl", "no_endpoint_ttl", "deadline"};
  return NameAt(kNames, r, "unknown");
}

Status Validate(const FlowOptions& o) {
  auto positive_finite = [](double v) { return std::isfinite(v) && v > 0.0; };
  if (o.max_requests < 1) return Status::InvalidArgument("max_requests must be at least 1");
  if (o.max_bytes < 1) return Status::InvalidArgument("max_bytes must be at least 1");
  if (!positive_finite(o.default_ttl_s)) {
    return Status::InvalidArgument("default_ttl_s must be a positive number of seconds");
  }
  if (!positive_finite(o.no_endpoint_ttl_s)) {
    return Status::InvalidArgument("no_endpoint_ttl_s must be a positive number of seconds");
  }
  if (o.affinity_window < 1 || o.affinity_window > kMaxAffinityWindow) {
    return Status::InvalidArgument("affinity_window must be in 1.." +
                                   std::to_string(kMaxAffinityWindow));
  }
  if (o.max_bands < 1) return Status::InvalidArgument("max_bands must be at least 1");
  if (!(o.slo_admit_fraction >= 0.0 && o.slo_admit_fraction <= 1.0)) {
    return Status::InvalidArgument("slo_admit_fraction must be in 0..1");
  }
  if (!(o.slo_release_fraction >= 0.0 && o.slo_release_fraction <= 1.0)) {
    return Status::InvalidArgument("slo_release_fraction must be in 0..1");
  }
  if (o.sheddable_reserve < 0 || o.sheddable_reserve > 4) {
    return Status::InvalidArgument("sheddable_reserve must be in 0..4");
  }
  return Status::Ok();
}

PoolState AdmissionState(const FlowOptions& o, int64_t priority, PoolState pool, int64_t max_room) {
  if (pool == PoolState::kAvailable && priority < o.shed_below_priority &&
      max_room <= o.sheddable_reserve) {
    return PoolState::kSaturated;
  }
  return pool;
}

void WaitHistogram::Record(double wait_s) {
  // Bucket i holds waits in (bound[i-1], bound[i]], like Prometheus' `le`.
  const auto it = std::lower_bound(kWaitBucketBoundsS.begin(), kWaitBucketBoundsS.end(), wait_s);
  ++counts[static_cast<std::size_t>(it - kWaitBucketBoundsS.begin())];
  ++count;
  sum_s += wait_s;
}

namespace {

FlowOptions Clamped(FlowOptions o) {
  auto ttl = [](double v, double fallback) {
    return std::isfinite(v) && v > 0.0 ? v : fallback;
  };
  o.max_requests = std::max<uint64_t>(o.max_requests, 1);
  o.max_bytes = std::max<uint64_t>(o.max_bytes, 1);
  o.default_ttl_s = ttl(o.default_ttl_s, FlowOptions{}.default_ttl_s);
  o.no_endpoint_ttl_s = ttl(o.no_endpoint_ttl_s, FlowOptions{}.no_endpoint_ttl_s);
  o.affinity_window = std::clamp<uint32_t>(o.affinity_window, 1, kMaxAffinityWindow);
  o.max_bands = std::max<uint32_t>(o.max_bands, 1);
  return o;
}

}  // namespace

FlowQueue::FlowQueue(const FlowOptions& options)
    : options_(Clamped(options)), by_id_(&pool_), by_expiry_(&pool_), by_late_(&pool_) {}

FlowQueue::Band* FlowQueue::FindOrAddBand(int64_t priority) {
  if (auto it = bands_.find(priority); it != bands_.end()) return &it->second;
  if (bands_.size() >= options_.max_bands) return nullptr;
  Band& b = bands_.try_emplace(priority, &pool_).first->second;
  b.stats.priority = priority;
  return &b;
}

bool FlowQueue::HigherOrEqualWaits(int64_t priority) const {
  for (const auto& [p, band] : bands_) {  // highest first
    if (p < priority) break;
    if (band.stats.waiting_requests > 0) return true;
  }
  return false;
}

FlowQueue::Band* FlowQueue::HighestNonEmptyBand() {
  // Bands are few (max_bands) and never dropped; a linear walk beats keeping an index.
  for (auto& [p, band] : bands_) {
    if (band.stats.waiting_requests > 0) return &band;
  }
  return nullptr;
}

std::optional<int64_t> FlowQueue::HighestWaitingPriority() const {
  for (const auto& [p, band] : bands_) {
    if (band.stats.waiting_requests > 0) return p;
  }
  return std::nullopt;
}

void FlowQueue::Reject(Band* band, RejectReason reason, AdmitResult& result) {
  result = {AdmitOutcome::kRejected, reason};
  ++rejected_[static_cast<std::size_t>(reason)];
  if (band != nullptr) ++band->stats.rejected[static_cast<std::size_t>(reason)];
}

AdmitResult FlowQueue::Admit(const FlowRequest& req, double now_s, PoolState pool) {
  // A NaN time would break the ordered sets' strict weak ordering.
  assert(!std::isnan(now_s));
  AdmitResult result;
  Band* band = FindOrAddBand(req.priority);
  if (band == nullptr) {
    Reject(nullptr, RejectReason::kTooManyBands, result);
    return result;
  }
  if (by_id_.contains(req.id)) {
    Reject(band, RejectReason::kDuplicateId, result);
    return result;
  }
  const bool sheddable = req.priority < options_.shed_below_priority;
  const bool late_known = options_.slo_aware && req.late_s && !std::isnan(*req.late_s);
  if (sheddable && late_known && *req.late_s <= now_s) {
    Reject(band, RejectReason::kPredictedMiss, result);
    return result;
  }
  const bool must_wait = pool != PoolState::kAvailable || HigherOrEqualWaits(req.priority);
  if (!must_wait) {
    result = {AdmitOutcome::kDispatchNow, RejectReason::kNone};
    ++band->stats.dispatched_at_once;
    band->stats.wait.Record(0.0);
    return result;
  }
  if (sheddable) {
    Reject(band, RejectReason::kSheddable, result);
    return result;
  }
  if (band->stats.waiting_requests >= options_.max_requests) {
    Reject(band, RejectReason::kBandFullRequests, result);
    return result;
  }
  // Written so that a huge `bytes` cannot overflow the sum.
  if (req.bytes > options_.max_bytes - band->stats.waiting_bytes) {
    Reject(band, RejectReason::kBandFullBytes, result);
    return result;
  }

  Node& n = by_id_.try_emplace(req.id).first->second;
  n.id = req.id;
  n.flow_id = req.flow_id;
  n.bytes = req.bytes;
  n.prefix_key = req.prefix_key;
  n.admitted_s = now_s;
  const bool empty_pool = pool == PoolState::kEmpty;
  n.expires_s = now_s + (empty_pool ? options_.no_endpoint_ttl_s : options_.default_ttl_s);
  n.expire_reason = empty_pool ? ExpireReason::kNoEndpointTtl : ExpireReason::kTtl;
  if (req.deadline_s && *req.deadline_s < n.expires_s) {
    n.expires_s = *req.deadline_s;
    n.expire_reason = ExpireReason::kDeadline;
  }
  n.late = false;
  n.late_s = late_known ? *req.late_s : std::numeric_limits<double>::infinity();
  n.order_key = options_.ordering == Ordering::kEarliestDeadline ? n.expires_s : 0.0;
  n.seq = next_seq_++;
  n.band = band;

  // Global fairness is round-robin over one flow per band.
  const uint64_t key = options_.fairness == Fairness::kGlobal ? 0 : req.flow_id;
  auto [it, fresh] = band->flows.try_emplace(key, &pool_);
  Flow* f = &it->second;
  if (fresh) {
    f->key = key;
    if (band->turn == nullptr) {
      f->prev = f->next = f;
      band->turn = f;
    } else {
      // Join at the end of the current round: just before the flow whose turn it is.
      Flow* t = band->turn;
      f->next = t;
      f->prev = t->prev;
      t->prev->next = f;
      t->prev = f;
    }
  }
  n.flow = f;
  if (n.late_s <= now_s) {
    n.late = true;  // already predicted to miss: behind the on-time ones at once
    ++band->stats.went_late;
  } else {
    ++band->on_time;
    if (n.late_s < n.expires_s) by_late_.insert(&n);  // it may go late before it expires
  }
  f->waiting.insert(&n);
  by_expiry_.insert(&n);

  ++band->stats.queued;
  ++band->stats.waiting_requests;
  band->stats.waiting_bytes += n.bytes;
  waiting_bytes_ += n.bytes;
  result = {AdmitOutcome::kQueued, RejectReason::kNone};
  return result;
}

void FlowQueue::Remove(Node* n, bool took_turn) {
  Band* band = n->band;
  Flow* f = n->flow;
  f->waiting.erase(n);
  by_expiry_.erase(n);
  if (!n->late) {  // a late one is in neither
    by_late_.erase(n);
    band->on_time -= 1;
  }
  band->stats.waiting_requests -= 1;
  band->stats.waiting_bytes -= n->bytes;
  waiting_bytes_ -= n->bytes;
  if (f->waiting.empty()) {
    if (f->next == f) {
      band->turn = nullptr;
    } else {
      f->prev->next = f->next;
      f->next->prev = f->prev;
      if (band->turn == f) band->turn = f->next;
    }
    band->flows.erase(f->key);
  } else if (took_turn && band->turn == f) {
    band->turn = f->next;
  }
  by_id_.erase(n->id);  // destroys *n
}

std::optional<Dispatch> FlowQueue::Take(Node* n, double now_s, uint32_t held,
                                        DispatchCause cause) {
  Dispatch d;
  d.id = n->id;
  d.priority = n->band->stats.priority;
  d.flow_id = n->flow_id;
  d.bytes = n->bytes;
  d.waited_s = std::max(0.0, now_s - n->admitted_s);
  d.held_blocks = held;
  d.cause = cause;
  BandStats& s = n->band->stats;
  ++s.dispatched;
  if (cause == DispatchCause::kAffinity) ++s.dispatched_by_affinity;
  if (cause == DispatchCause::kAged) ++s.dispatched_aged;
  if (n->late) ++s.dispatched_late;
  s.wait.Record(d.waited_s);
  Remove(n, /*took_turn=*/true);
  return d;
}

FlowQueue::Flow* FlowQueue::TurnFlow(Band* band) {
  Flow* f = band->turn;
  if (band->on_time == 0 || !(*f->waiting.begin())->late) return f;
  // Some flow has an on-time request (each flow's on-time requests sort first).
  for (Flow* g = f->next; g != f; g = g->next) {
    if (!(*g->waiting.begin())->late) return g;
  }
  return f;  // unreachable while on_time counts correctly
}

std::optional<Dispatch> FlowQueue::NextToDispatch(double now_s) {
  Band* band = HighestNonEmptyBand();
  if (band == nullptr) return std::nullopt;
  Node* first = *TurnFlow(band)->waiting.begin();
  return Take(first, now_s, 0, DispatchCause::kOrder);
}

std::optional<Dispatch> FlowQueue::NextToDispatch(double now_s, PrefixProbe probe) {
  return Choose(now_s, probe, nullptr);
}

std::optional<Dispatch> FlowQueue::NextToDispatch(double now_s, PrefixProbe probe,
                                                  DispatchCheck check) {
  return Choose(now_s, probe, &check);
}

std::optional<Dispatch> FlowQueue::Choose(double now_s, PrefixProbe probe,
                                          const DispatchCheck* check) {
  Band* band = HighestNonEmptyBand();
  if (band == nullptr) return std::nullopt;

  // The band's first K requests in dispatch order: round r takes each flow's r-th request,
  // flows in ring order from the one whose turn it is. At most K flows can contribute.
  const std::size_t k = options_.affinity_window;
  std::array<Node*, kMaxAffinityWindow> window;
  std::array<NodeSet::iterator, kMaxAffinityWindow> cursor;
  std::array<NodeSet::iterator, kMaxAffinityWindow> end;
  // While on-time requests wait, the window holds only those (late ones sort last in each
  // flow, so a flow's cursor stops at its first late request).
  const bool on_time_only = band->on_time > 0;
  std::size_t n_flows = 0;
  Flow* const first_flow = TurnFlow(band);
  Flow* f = first_flow;
  do {
    cursor[n_flows] = f->waiting.begin();
    end[n_flows] = f->waiting.end();
    ++n_flows;
    f = f->next;
  } while (f != first_flow && n_flows < k);
  std::size_t n = 0;
  for (bool progress = true; progress && n < k;) {
    progress = false;
    for (std::size_t i = 0; i < n_flows && n < k; ++i) {
      if (cursor[i] == end[i] || (on_time_only && (*cursor[i])->late)) continue;
      window[n++] = *cursor[i]++;
      progress = true;
    }
  }

  // An aged request goes first; otherwise the most blocks held, ties to the earlier.
  std::size_t chosen = 0;
  uint32_t best = 0;
  bool aged = false;
  for (std::size_t i = 0; i < n; ++i) {
    if (window[i]->skips >= options_.max_affinity_skips) {
      chosen = i;
      aged = true;
      break;
    }
  }
  if (aged) {
    best = probe(WaitingView{window[chosen]->id, window[chosen]->prefix_key,
                             window[chosen]->flow_id});
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const uint32_t held =
          probe(WaitingView{window[i]->id, window[i]->prefix_key, window[i]->flow_id});
      if (held > best) {
        best = held;
        chosen = i;
      }
    }
  }
  if (check != nullptr) {
    const Node* c = window[chosen];
    if (!(*check)(WaitingView{c->id, c->prefix_key, c->flow_id},
                  std::max(0.0, now_s - c->admitted_s))) {
      return std::nullopt;
    }
  }
  for (std::size_t i = 0; i < chosen; ++i) ++window[i]->skips;
  const DispatchCause cause =
      aged ? DispatchCause::kAged : (chosen > 0 ? DispatchCause::kAffinity : DispatchCause::kOrder);
  return Take(window[chosen], now_s, best, cause);
}

bool FlowQueue::Cancel(RequestId id, double /*now_s*/) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  Node* n = &it->second;
  ++n->band->stats.cancelled;
  Remove(n, /*took_turn=*/false);
  return true;
}

std::size_t FlowQueue::Expire(double now_s, std::vector<Expired>& out) {
  std::size_t removed = 0;
  if (std::isnan(now_s)) return 0;  // would compare as "past every expiry"
  while (!by_expiry_.empty()) {
    Node* n = *by_expiry_.begin();
    if (n->expires_s > now_s) break;
    out.push_back(Expired{n->id, n->expire_reason});
    ++n->band->stats.expired[static_cast<std::size_t>(n->expire_reason)];
    Remove(n, /*took_turn=*/false);
    ++removed;
  }
  // Predicted misses: behind every on-time request of the band, keeping their order.
  while (!by_late_.empty()) {
    Node* n = *by_late_.begin();
    if (n->late_s > now_s) break;
    by_late_.erase(by_late_.begin());
    NodeSet& set = n->flow->waiting;
    set.erase(n);
    n->late = true;
    set.insert(n);
    n->band->on_time -= 1;
    ++n->band->stats.went_late;
  }
  return removed;
}

double FlowQueue::NextExpiry() const {
  return by_expiry_.empty() ? std::numeric_limits<double>::infinity()
                            : (*by_expiry_.begin())->expires_s;
}

FlowStats FlowQueue::stats() const {
  FlowStats s;
  s.bands.reserve(bands_.size());
  for (const auto& [p, band] : bands_) s.bands.push_back(band.stats);
  s.rejected = rejected_;
  s.waiting_requests = by_id_.size();
  s.waiting_bytes = waiting_bytes_;
  return s;
}

}  // namespace kvroute::flow
