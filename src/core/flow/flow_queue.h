// Flow control as pure logic (issue 11, step 1): the router-side queue where requests wait
// while every candidate endpoint is saturated, and the order in which they leave it when
// capacity frees. No sockets, no clock reads, no threads: every call takes the time as
// seconds on the caller's clock, so tests and the simulator drive it in virtual time. The
// adapter (serve, epp, simulate) owns the requests themselves; the queue holds ids, sizes
// and the keys it orders by.
//
//   Admit(request, now, pool) -> AdmitResult   dispatch now, queue, or reject with a reason
//   NextToDispatch(now[, probe]) -> Dispatch    capacity freed: which waiting request goes
//   Cancel(id, now)                             the client went away while waiting
//   Expire(now, out)                            past their TTL or deadline: removed
//   NextExpiry()                                when Expire next has something to do
//   stats()                                     counters and gauges the adapter exports
//
// Priorities follow the Gateway API Inference Extension (InferenceObjective.priority):
// higher is more important; below `shed_below_priority` (default 0) a request is
// sheddable. The adapter maps its own conventions onto this one (vLLM's request
// `priority` field orders the other way).
//
// Admission. A request is rejected at once, never queued, when it is sheddable and the
// pool is saturated or empty (kSheddable), or when something of its priority or higher
// already waits (strict priority: it would have to wait, and sheddable requests never
// wait). Otherwise it is dispatched at once (kDispatchNow, no queueing latency) when the
// pool is available and nothing of its priority or higher waits; else it is queued in its
// priority's band unless that band is full (kBandFullRequests, kBandFullBytes: bounds per
// band, `max_requests` and `max_bytes`). A request never displaces another.
//
// Order of leaving. Strict priority between bands: only the highest band with a waiting
// request is considered. Inside it, the fairness policy: round-robin across flows (each
// flow with waiting requests gets one dispatch per turn; a served flow and a flow that
// starts waiting go to the tail of the list, as in deficit round-robin with equal
// quanta), or one global order ignoring flows. Inside a flow, the
// ordering policy: FCFS (admission order) or earliest deadline (the request's expiry
// time, ties by admission order).
//
// Late binding with prefix preference. NextToDispatch with a probe (the replica that just
// freed up: how many of a waiting request's prefix blocks it holds) looks at the first
// `affinity_window` requests of that band in the order above and returns the one the
// replica holds the most blocks for (ties: the earlier in order; all zero: the first, as
// without a probe). It never looks into another band. Every request passed over that way
// counts one skip; a request with `max_affinity_skips` skips goes first, whatever the
// probe says, so affinity cannot starve anyone. Passing a request of another flow over
// the round-robin turn does not consume the turn: the flow whose turn it was still goes
// next.
//
// Latency objectives (issue 24). A request may carry `late_s`: the time after which, still
// waiting, it is predicted to miss its TTFT objective (the front end's admission time plus
// the objective minus the latency model's predicted TTFT were it dispatched; the objective
// alone without a prediction). With `FlowOptions::slo_aware` (default on):
// * a non-sheddable request that waits goes behind every on-time request of its band at
//   the first Expire(t) with t >= late_s (at once if late_s has passed when it is queued).
//   It still goes, after them, within its TTL: lateness never loses a request, and while
//   capacity is short it goes to requests that can still meet their objectives. Late
//   requests keep their order among themselves; round-robin across flows serves the flows
//   with an on-time request first, and the affinity window holds only on-time requests
//   while any waits;
// * a sheddable request already late at admission (late_s <= now) is refused
//   (kPredictedMiss), even when the pool has room: its work would not count.
//
// Expiry. Each queued request expires at min(now + ttl, deadline), ttl being
// `no_endpoint_ttl_s` when it was admitted into an empty pool and `default_ttl_s`
// otherwise; it is removed by the first Expire(t) with t >= that time (exactly at it, not
// after), which reports it with the reason. Requests leave only through Expire: call it
// before NextToDispatch with the same time so nothing is dispatched past its expiry.
//
// Every admitted request leaves exactly once: dispatched (Admit's kDispatchNow, or
// NextToDispatch), cancelled or expired. Ids are the adapter's; an id is unique among the
// waiting ones (a duplicate is rejected with kDuplicateId) and may be reused after it left.
//
// Cost. Admit, Cancel and each removal by Expire are O(log n); NextToDispatch is
// O(log n + K) with K = affinity_window (plus the number of bands, a handful). Nodes come
// from a pool owned by the queue, so steady-state operation allocates nothing.
//
// Thread: none of its own; the owner serialises every call (the adapter's lock).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory_resource>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/common/status.h"

namespace kvroute::flow {

using RequestId = uint64_t;

enum class Fairness : uint8_t {
  kRoundRobin,  // one dispatch per flow per round inside a band
  kGlobal,      // one order for the whole band, flows ignored (global strict)
};
enum class Ordering : uint8_t {
  kFcfs,              // admission order
  kEarliestDeadline,  // earliest expiry (deadline or TTL) first
};

// The largest `affinity_window` accepted.
inline constexpr uint32_t kMaxAffinityWindow = 64;

// Whose admission a FlowGate applies (peer_admission.h has the peers' rules and options).
// The queue itself is the same for all; what differs is when the pool counts as saturated
// and how much one pump may release.
enum class Admission : uint8_t {
  kKvroute,          // kvroute's flow control (this file and flow_gate.h)
  kLlmdShedOnly,     // llm-d as shipped: no queue; sheddable refused while saturated
  kLlmdFlowControl,  // llm-d with its flow control on
  kDynamoQueue,      // Dynamo's router queue and busy rejection
};
std::string_view AdmissionName(Admission a);  // "kvroute", "llm-d", "llm-d-flow-control",
                                              // "dynamo-queue"

struct FlowOptions {
  // Bounds per priority band on what waits.
  uint64_t max_requests = 5000;
  uint64_t max_bytes = uint64_t{1} << 30;  // 1 GiB
  // How long a request may wait; the second when admitted while the pool has no endpoint.
  double default_ttl_s = 30.0;
  double no_endpoint_ttl_s = 5.0;
  Fairness fairness = Fairness::kRoundRobin;
  Ordering ordering = Ordering::kFcfs;
  // Requests with a priority below this are sheddable: rejected when the pool is
  // saturated, never queued.
  int64_t shed_below_priority = 0;
  // Late binding: how many of the band's first waiting requests a probe looks at (K), and
  // how many times a request may be passed over for affinity before it goes first (N).
  uint32_t affinity_window = 16;
  uint32_t max_affinity_skips = 8;
  // At most this many distinct priorities (bands); a request with a further one is
  // rejected (kTooManyBands). Bands are never dropped, so their counters persist.
  uint32_t max_bands = 32;
  // Room kept for the bands that may wait: a sheddable request is also shed while no
  // replica has more than this many free queue slots by the saturation detector (its
  // room, 5 - waiting), so a flood of sheddable work leaves the engines' queues short for
  // what arrives in a higher band. 0: sheddable requests are shed only when saturated.
  int64_t sheddable_reserve = 0;
  // Order by predicted miss (FlowRequest::late_s, see the header comment); off: late_s is
  // ignored.
  bool slo_aware = true;
  // FlowGate (with slo_aware): a non-sheddable request whose predicted TTFT is at most this
  // share of its objective goes at once although the saturation detector says wait (0:
  // the detector alone decides). In 0..1.
  double slo_admit_fraction = 0.5;
  // FlowGate (with slo_aware): a pump that finds no room by the detector still releases
  // the request the queue would send next when its predicted TTFT is at most this share of
  // what is left of its objective after its wait (0: the detector's room alone bounds
  // releases). Lower than slo_admit_fraction because a burst that keeps the queue full is
  // where the model errs most (docs/POLICIES.md, "Flow control by predicted miss"). In 0..1.
  double slo_release_fraction = 0.15;

  // Whose rules decide saturation (above). Anything but kKvroute: no late binding, no
  // prediction, no room bound (each pump releases while the peer's detector says
  // available); the fields below are the peers' parameters (peer_admission.h).
  Admission admission = Admission::kKvroute;
  // llm-d's utilization detector: an endpoint's score is max(waiting / queue_depth,
  // KV usage / kv_threshold), 1 when its metrics are missing or older than stale_s; the
  // pool is saturated while the mean score over its endpoints is >= 1.
  double llmd_queue_depth = 5.0;
  double llmd_kv_threshold = 0.8;
  double llmd_stale_s = 0.2;
  // Dynamo: a worker is busy while the router's count of its active prefill tokens exceeds
  // queue_threshold x max_num_batched_tokens (the worker's, from its runtime config); a
  // request waits only while every worker is busy. A request is refused (529) when every
  // worker's KV usage is above reject_kv (0: rejection off).
  double dynamo_queue_threshold = 2.0;
  int64_t dynamo_max_batched_tokens = 8192;
  double dynamo_reject_kv = 0.85;
};

// Ok, or InvalidArgument naming the first bad field: bounds >= 1, TTLs > 0 and finite,
// affinity_window in 1..kMaxAffinityWindow, max_bands >= 1.
Status Validate(const FlowOptions& options);

// What the pool looks like to an arriving request (the saturation detector's verdict).
enum class PoolState : uint8_t {
  kAvailable,  // some candidate can take a request now
  kSaturated,  // every candidate is saturated
  kEmpty,      // no endpoint at all: queued requests get no_endpoint_ttl_s
};

// The verdict a request of `priority` is admitted against: `pool`, except that a
// sheddable one (priority below shed_below_priority) sees kSaturated while `max_room`
// (the most room any one replica has) is not above options.sheddable_reserve.
PoolState AdmissionState(const FlowOptions& options, int64_t priority, PoolState pool,
                         int64_t max_room);

struct FlowRequest {
  RequestId id = 0;
  int64_t priority = 0;
  uint64_t flow_id = 0;              // the objective or tenant, hashed by the adapter
  uint64_t bytes = 0;                // counted against max_bytes (the request body, say)
  std::optional<double> deadline_s;  // absolute; it expires then if not dispatched before
  uint64_t prefix_key = 0;           // opaque: handed back to the probe (the adapter's handle on
                                     // the request's prefix hashes)
  std::optional<double> late_s;      // absolute: after it, predicted to miss its TTFT objective
};

enum class AdmitOutcome : uint8_t { kDispatchNow, kQueued, kRejected };
enum class RejectReason : uint8_t {
  kNone = 0,
  kSheddable,         // below shed_below_priority and it would have to wait
  kBandFullRequests,  // the band already holds max_requests
  kBandFullBytes,     // the band's bytes plus this request's exceed max_bytes
  kTooManyBands,      // a new priority beyond max_bands
  kDuplicateId,       // a request with this id is already waiting
  kPredictedMiss,     // sheddable and already predicted to miss its TTFT objective (late_s)
  kAllBusy,           // Dynamo's rejection: every worker busy (FlowGate, not the queue; 529)
};
inline constexpr std::size_t kNumRejectReasons = 8;
std::string_view RejectReasonName(RejectReason r);  // "none", "sheddable",
// "band_full_requests", "band_full_bytes", "too_many_bands", "duplicate_id",
// "predicted_miss", "all_busy"

struct AdmitResult {
  AdmitOutcome outcome = AdmitOutcome::kRejected;
  RejectReason reason = RejectReason::kNone;  // kNone unless rejected
  bool operator==(const AdmitResult&) const = default;
};

enum class ExpireReason : uint8_t {
  kTtl,            // default_ttl_s ran out
  kNoEndpointTtl,  // admitted into an empty pool; no_endpoint_ttl_s ran out
  kDeadline,       // the request's own deadline came first
};
inline constexpr std::size_t kNumExpireReasons = 3;
std::string_view ExpireReasonName(ExpireReason r);  // "ttl", "no_endpoint_ttl", "deadline"

struct Expired {
  RequestId id = 0;
  ExpireReason reason = ExpireReason::kTtl;
  bool operator==(const Expired&) const = default;
};

// A waiting request as the probe sees it.
struct WaitingView {
  RequestId id;
  uint64_t prefix_key;
  uint64_t flow_id;
};

// A non-owning reference to a callable `R(Args...)`; the callable must outlive the
// NextToDispatch call it is passed to (no allocation, unlike std::function).
template <class Sig>
class CallRef;
template <class R, class... Args>
class CallRef<R(Args...)> {
 public:
  template <class F>
  CallRef(const F& f)  // NOLINT: implicit, so a lambda can be passed directly
      : obj_(&f), call_([](const void* o, Args... a) -> R {
          return (*static_cast<const F*>(o))(a...);
        }) {}
  R operator()(Args... a) const { return call_(obj_, a...); }

 private:
  const void* obj_;
  R (*call_)(const void*, Args...);
};

// How many of a waiting request's prefix blocks the freed replica holds. Called at most
// affinity_window times per NextToDispatch call.
using PrefixProbe = CallRef<uint32_t(const WaitingView&)>;
// Whether the request NextToDispatch chose may go now (`waited_s`: its time in the queue).
// Called once per call, after the choice.
using DispatchCheck = CallRef<bool(const WaitingView&, double)>;

// Why NextToDispatch chose the request it returned.
enum class DispatchCause : uint8_t {
  kOrder,     // first in order (no probe, or the probe preferred nothing)
  kAffinity,  // the probe's replica holds more of its prefix than of the ones before it
  kAged,      // passed over max_affinity_skips times
};

struct Dispatch {
  RequestId id = 0;
  int64_t priority = 0;
  uint64_t flow_id = 0;
  uint64_t bytes = 0;
  double waited_s = 0.0;     // now - admission time (0 if the clock went backwards)
  uint32_t held_blocks = 0;  // the probe's answer for it; 0 without a probe
  DispatchCause cause = DispatchCause::kOrder;
};

// Wait times of dispatched requests (a request dispatched at once by Admit counts as 0):
// counts per bucket, not cumulative; the last bucket is everything above the last bound.
inline constexpr std::array<double, 13> kWaitBucketBoundsS = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0};
struct WaitHistogram {
  std::array<uint64_t, kWaitBucketBoundsS.size() + 1> counts{};
  uint64_t count = 0;
  double sum_s = 0.0;
  void Record(double wait_s);
};

struct BandStats {
  int64_t priority = 0;
  // Gauges: what waits now.
  uint64_t waiting_requests = 0;
  uint64_t waiting_bytes = 0;
  // Counters.
  uint64_t dispatched_at_once = 0;      // Admit's kDispatchNow
  uint64_t queued = 0;                  // Admit's kQueued
  uint64_t dispatched = 0;              // left the queue through NextToDispatch
  uint64_t dispatched_by_affinity = 0;  // of those, cause kAffinity
  uint64_t dispatched_aged = 0;         // of those, cause kAged
  uint64_t went_late = 0;               // moved behind the on-time ones (late_s passed)
  uint64_t dispatched_late = 0;         // left through NextToDispatch after going late
  uint64_t cancelled = 0;
  std::array<uint64_t, kNumRejectReasons> rejected{};  // by RejectReason
  std::array<uint64_t, kNumExpireReasons> expired{};   // by ExpireReason
  WaitHistogram wait;
};

struct FlowStats {
  std::vector<BandStats> bands;  // every band seen, highest priority first
  // Rejections by reason over all bands, kTooManyBands included (it has no band).
  std::array<uint64_t, kNumRejectReasons> rejected{};
  uint64_t waiting_requests = 0;
  uint64_t waiting_bytes = 0;
};

class FlowQueue {
 public:
  // `options` should pass Validate; out-of-range values are clamped into range.
  explicit FlowQueue(const FlowOptions& options = {});
  FlowQueue(const FlowQueue&) = delete;
  FlowQueue& operator=(const FlowQueue&) = delete;

  // Decides what happens to an arriving request (see the header comment). kQueued: it now
  // waits and will leave exactly once, by NextToDispatch, Cancel or Expire. kDispatchNow
  // and kRejected: the queue keeps nothing but counters.
  AdmitResult Admit(const FlowRequest& request, double now_s, PoolState pool);

  // Capacity freed: removes and returns the waiting request to dispatch next, or nullopt
  // when none waits. The second form binds late: `probe` describes the replica that freed.
  // The caller decides whether there is capacity; the queue does not look at the pool.
  std::optional<Dispatch> NextToDispatch(double now_s);
  std::optional<Dispatch> NextToDispatch(double now_s, PrefixProbe probe);
  // The same choice, made only if `check` accepts it: otherwise nothing is removed or
  // counted (no skips either) and nullopt is returned. The gate's release by prediction
  // when the detector has no room (FlowGate::Pump).
  std::optional<Dispatch> NextToDispatch(double now_s, PrefixProbe probe, DispatchCheck check);

  // Removes waiting request `id` (its client disconnected). False, and nothing counted,
  // when no request with that id waits (already dispatched, expired or never queued).
  bool Cancel(RequestId id, double now_s);

  // Removes every waiting request whose expiry is <= now_s, earliest first, appending them
  // to `out`; returns how many. Then moves every non-sheddable request whose late_s is
  // <= now_s behind the on-time ones (slo_aware; not reported, it still waits).
  std::size_t Expire(double now_s, std::vector<Expired>& out);

  // The earliest expiry among waiting requests (arm one timer for it), or +inf when none
  // waits.
  double NextExpiry() const;

  bool Empty() const { return by_id_.empty(); }
  std::size_t size() const { return by_id_.size(); }
  bool Contains(RequestId id) const { return by_id_.contains(id); }
  // The highest priority with a waiting request; nullopt when none waits.
  std::optional<int64_t> HighestWaitingPriority() const;

  // A copy of the counters and gauges (allocates; for the metrics path, not per request).
  FlowStats stats() const;
  const FlowOptions& options() const { return options_; }

 private:
  struct Band;
  struct Flow;
  struct Node {
    RequestId id = 0;
    uint64_t flow_id = 0;
    uint64_t bytes = 0;
    uint64_t prefix_key = 0;
    double admitted_s = 0.0;
    double expires_s = 0.0;
    double order_key = 0.0;  // 0 for FCFS, expires_s for earliest deadline
    uint64_t seq = 0;        // admission order, unique
    uint32_t skips = 0;
    bool late = false;      // past late_s: ordered after every on-time request
    double late_s = 0.0;    // when it goes late (in by_late_ until then)
    ExpireReason expire_reason = ExpireReason::kTtl;
    Band* band = nullptr;
    Flow* flow = nullptr;
  };
  struct ByOrder {
    bool operator()(const Node* a, const Node* b) const {
      if (a->late != b->late) return b->late;  // on-time first
      return a->order_key != b->order_key ? a->order_key < b->order_key : a->seq < b->seq;
    }
  };
  struct ByLate {
    bool operator()(const Node* a, const Node* b) const {
      return a->late_s != b->late_s ? a->late_s < b->late_s : a->seq < b->seq;
    }
  };
  struct ByExpiry {
    bool operator()(const Node* a, const Node* b) const {
      return a->expires_s != b->expires_s ? a->expires_s < b->expires_s : a->seq < b->seq;
    }
  };
  using NodeSet = std::pmr::set<Node*, ByOrder>;
  struct Flow {
    explicit Flow(std::pmr::memory_resource* r) : waiting(r) {}
    uint64_t key = 0;
    NodeSet waiting;
    Flow* prev = nullptr;  // the band's round-robin ring of flows with waiting requests
    Flow* next = nullptr;
  };
  struct Band {
    explicit Band(std::pmr::memory_resource* r) : flows(r) {}
    std::pmr::unordered_map<uint64_t, Flow> flows;  // only flows with waiting requests
    Flow* turn = nullptr;                           // whose turn it is; nullptr when nothing waits
    uint64_t on_time = 0;                           // waiting requests not late
    BandStats stats;
  };

  Band* FindOrAddBand(int64_t priority);
  bool HigherOrEqualWaits(int64_t priority) const;
  Band* HighestNonEmptyBand();
  // The flow to serve in `band`: the one whose turn it is, or, when its first request is
  // late and the band has on-time requests, the next flow in the ring with an on-time one.
  static Flow* TurnFlow(Band* band);
  // Unlinks `n` from every structure and destroys it. `took_turn`: it left by a
  // dispatch in its flow's turn, which then passes to the next flow.
  void Remove(Node* n, bool took_turn);
  void Reject(Band* band, RejectReason reason, AdmitResult& result);
  std::optional<Dispatch> Take(Node* n, double now_s, uint32_t held, DispatchCause cause);
  std::optional<Dispatch> Choose(double now_s, PrefixProbe probe, const DispatchCheck* check);

  FlowOptions options_;
  std::pmr::unsynchronized_pool_resource pool_;
  std::map<int64_t, Band, std::greater<>> bands_;  // highest priority first
  std::pmr::unordered_map<RequestId, Node> by_id_;
  std::pmr::set<Node*, ByExpiry> by_expiry_;
  std::pmr::set<Node*, ByLate> by_late_;  // on-time requests with a late_s
  std::array<uint64_t, kNumRejectReasons> rejected_{};
  uint64_t waiting_bytes_ = 0;
  uint64_t next_seq_ = 0;
};

}  // namespace kvroute::flow
