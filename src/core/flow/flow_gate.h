// FlowGate: flow control (issue 11) between a front end and the routing core. One for
// `kvroute serve` and one for `kvroute epp`: the same admission, release and expiry rules
// for both, so the front ends only say what "dispatch" and "expire" mean for their
// requests (forward an HTTP request; answer an ext_proc stream).
//
//   Admit(request, waiter, sched request)  at the pick: dispatch now, wait, or refuse
//   Pump(freed endpoint)                   capacity may have freed: release what fits
//   Cancel(id)                             the client left while waiting
//
// Admission reads the routing core's saturation detector (RoutingCore::Load). A request
// that waits gets its prefix chain computed once (RoutingCore::PrefixKey). Each Pump
// first expires what is due, then releases waiting requests one at a time while the pool
// is not saturated, at most the detector's room (PoolLoad::room, read once per pump) so a
// pick that prefers a saturated replica holding its prefix cannot empty the queue into
// that replica's engine queue. The first release of a pump caused by a completion binds
// late: the queue's prefix probe asks the routing core how many of each candidate's
// blocks the freed endpoint holds, so the freed replica takes the waiting request whose
// prefix it holds (FlowQueue::NextToDispatch); every other release is probed the same way
// against the endpoint with the most room (PoolLoad::roomiest). A sheddable request is
// admitted against flow::AdmissionState: shed unless some endpoint has more room than
// FlowOptions::sheddable_reserve. With FlowOptions::slo_aware, a request that will
// probably wait gets its late_s from RoutingCore::SloWaitBudget (the time after which it is
// predicted to miss its TTFT objective): after that it goes behind the on-time ones; a
// sheddable request is refused at admission when that time has already come (FlowQueue).
// Each released request is dispatched (its
// pick made) before the next verdict, which then counts it in flight. With slo_aware, a
// pump that finds no room by the detector still releases the request the queue would send
// next when the latency model predicts it meets its objective with room (predicted TTFT
// within slo_release_fraction of what is left of the objective after its wait), as
// admission does for a new request (with slo_admit_fraction): the detector's fixed queue bound is no reason to hold a request
// the engines would serve in time. Each such release is picked, so counted in the model's
// queue, before the next prediction; the releases stop when the next one no longer fits.
//
// With FlowOptions::admission naming a peer (peer_admission.h), the same calls apply that
// peer's rules instead: its detector decides admission and each release (read again
// before every release, with no room bound, no late binding and no prediction), Dynamo's
// rejection refuses with kAllBusy, and Dynamo's queue reads no priority (one band).
//
// Threads: every call from any thread. One mutex guards the queue and the waiting map;
// the waiters' Dispatch and Expire run outside it, on the calling thread. A pump that
// finds another pump running leaves its work to that one (it loops again), so waiters
// are never called re-entrantly from one Pump, and nothing is lost.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/flow/flow_queue.h"
#include "core/routing/routing_core.h"
#include "core/sched/types.h"

namespace kvroute::flow {

// A front end's handle on one waiting request. Both calls run outside the gate's lock,
// each at most once, and never both.
class FlowWaiter {
 public:
  virtual ~FlowWaiter() = default;
  // Capacity freed and this request goes: pick it now (synchronously, so the gate's next
  // verdict counts it in flight) and send it on. `waited_s`: its time in the queue.
  virtual void Dispatch(double now_s, double waited_s) = 0;
  // It waited past its TTL or deadline (429 with Retry-After), or no endpoint became ready
  // within the no-endpoint TTL (503).
  virtual void Expire(flow::ExpireReason reason) = 0;
};

class FlowGate {
 public:
  // `clock`: monotonic seconds, the time of every queue call.
  FlowGate(const flow::FlowOptions& options, routing::RoutingCore& core,
           std::function<double()> clock);
  FlowGate(const FlowGate&) = delete;
  FlowGate& operator=(const FlowGate&) = delete;

  // At the pick. Fills in `request.id`. kDispatchNow: the caller picks now as without flow
  // control; kRejected: the caller answers 429 (the reason says why); kQueued: the gate
  // holds `waiter` until it is dispatched, expired or cancelled. `sched_request` is read
  // only during the call (for the prefix chain of a request that waits).
  flow::AdmitResult Admit(flow::FlowRequest& request, std::shared_ptr<FlowWaiter> waiter,
                          const sched::SchedRequest& sched_request);
  // The client left while waiting: removed at once, its waiter dropped (not called).
  // False when it was no longer waiting (dispatched or expired meanwhile).
  bool Cancel(flow::RequestId id);
  // Capacity may have freed: a request finished on `freed` (kNoEndpoint: a scrape, a
  // timer, an admission). Expires what is due and releases what fits, as above.
  void Pump(uint32_t freed = routing::RoutingCore::kNoEndpoint);

  // Lock-free: does anything wait (the cheap test before a Pump), and the queue's next
  // expiry (+inf when nothing waits) for the front end's one timer.
  bool waiting() const { return waiting_count_.load(std::memory_order_relaxed) != 0; }
  double next_expiry() const { return next_expiry_.load(std::memory_order_relaxed); }
  // A copy of the queue's counters.
  flow::FlowStats stats() const;
  // Whether a request's first token may free capacity (Dynamo's queue: its prefill left
  // the worker's count): the front end pumps then too, not only at completions.
  bool releases_on_first_token() const {
    return options_.admission == flow::Admission::kDynamoQueue;
  }

 private:
  struct Entry {
    std::shared_ptr<FlowWaiter> waiter;
    std::vector<uint64_t> key;  // the prefix chain
    // What the latency model reads of it (no strings: its prompt as a token count), for a
    // release by prediction; only with slo_aware.
    sched::SchedRequest predict;
  };
  // Release by prediction: `w` may go now although the detector has no room.
  bool PredictedToFit(const flow::WaitingView& w, double waited_s) const;
  // Admit under a peer's rules (options_.admission is not kKvroute).
  flow::AdmitResult AdmitAsPeer(flow::FlowRequest& request, std::shared_ptr<FlowWaiter> waiter);
  // Whether the pool has capacity for one release, and (kvroute's rules) the detector's
  // room read at the start of a round (`budget` < 0: read it now).
  bool Capacity(double now, int64_t& budget, routing::RoutingCore::PoolLoad& load);
  void PublishLocked();

  routing::RoutingCore& core_;
  std::function<double()> clock_;
  const flow::FlowOptions options_;
  mutable std::mutex mu_;
  flow::FlowQueue queue_;                                  // mu_
  std::unordered_map<flow::RequestId, Entry> waiting_;     // mu_
  flow::RequestId next_id_ = 1;                            // mu_
  bool pumping_ = false, pump_again_ = false;              // mu_
  uint32_t freed_again_ = routing::RoutingCore::kNoEndpoint;  // mu_: the last freed endpoint
  std::vector<routing::RoutingCore::PeerSignal> peer_pool_;  // Capacity's scratch (one pump)
  std::atomic<std::size_t> waiting_count_{0};
  std::atomic<double> next_expiry_{std::numeric_limits<double>::infinity()};
};

// The saturation detector's verdict as the queue's pool state.
flow::PoolState PoolStateOf(const routing::RoutingCore::PoolLoad& load);

}  // namespace kvroute::flow
