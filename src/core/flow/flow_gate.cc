#include "core/flow/flow_gate.h"

#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/flow/peer_admission.h"

namespace kvroute::flow {

flow::PoolState PoolStateOf(const routing::RoutingCore::PoolLoad& load) {
  if (load.ready == 0) return flow::PoolState::kEmpty;
  return load.saturated_pool() ? flow::PoolState::kSaturated : flow::PoolState::kAvailable;
}

FlowGate::FlowGate(const flow::FlowOptions& options, routing::RoutingCore& core,
                   std::function<double()> clock)
    : core_(core), clock_(std::move(clock)), options_(options), queue_(options) {}

flow::AdmitResult FlowGate::Admit(flow::FlowRequest& request, std::shared_ptr<FlowWaiter> waiter,
                                  const sched::SchedRequest& sched_request) {
  if (options_.admission != flow::Admission::kKvroute) return AdmitAsPeer(request, std::move(waiter));
  const double now = clock_();
  // The verdict before the lock (Load may fold in scrapes); a sheddable request's keeps
  // the reserve free for the bands that may wait.
  const routing::RoutingCore::PoolLoad load = core_.Load(now);
  flow::PoolState state =
      flow::AdmissionState(options_, request.priority, PoolStateOf(load), load.max_room);
  // The chain of a request that will probably wait, hashed outside the lock; an admission
  // into an idle pool skips it.
  std::vector<uint64_t> key;
  const bool sheddable = request.priority < options_.shed_below_priority;
  if (state != flow::PoolState::kAvailable || waiting() || (sheddable && options_.slo_aware)) {
    core_.PrefixKey(sched_request, key);
    // By predicted miss (issue 24): when, still waiting, it would miss its TTFT objective
    // (a sheddable request is refused if that is already now).
    if (options_.slo_aware && !request.late_s) {
      if (const auto budget = core_.SloWaitBudget(sched_request, key)) {
        request.late_s = now + budget->wait_s;
        // Predicted to meet its objective where it would go, with room (its predicted
        // TTFT within slo_admit_fraction of the objective: the model errs most in
        // bursts): the engines' queue is no reason to wait, whatever the detector's fixed
        // thresholds say. A sheddable request still keeps the reserve free for the bands
        // that may wait.
        if (!sheddable && budget->predicted && budget->objective_s > 0 &&
            budget->objective_s - budget->wait_s <= options_.slo_admit_fraction * budget->objective_s &&
            state == flow::PoolState::kSaturated && load.ready > 0) {
          state = flow::PoolState::kAvailable;
        }
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  request.id = next_id_++;
  const flow::AdmitResult r = queue_.Admit(request, now, state);
  if (r.outcome == flow::AdmitOutcome::kQueued) {
    sched::SchedRequest predict;
    if (options_.slo_aware) {
      predict.priority = sched_request.priority;
      predict.prompt_tokens = sched_request.token_ids.empty()
                                  ? sched_request.EstimatedPromptTokens()
                                  : static_cast<int64_t>(sched_request.token_ids.size());
      predict.slo_ttft_s = sched_request.slo_ttft_s;
      predict.slo_tpot_s = sched_request.slo_tpot_s;
      predict.streaming = sched_request.streaming;
    }
    waiting_.emplace(request.id, Entry{std::move(waiter), std::move(key), predict});
    PublishLocked();
  }
  return r;
}

flow::AdmitResult FlowGate::AdmitAsPeer(flow::FlowRequest& request,
                                        std::shared_ptr<FlowWaiter> waiter) {
  const double now = clock_();
  std::vector<routing::RoutingCore::PeerSignal> pool;
  core_.PeerSignals(now, pool);
  flow::PoolState state = flow::PeerPoolState(options_, pool, now);
  switch (options_.admission) {
    case flow::Admission::kLlmdShedOnly:
      // Only a sheddable request reads the detector; nothing ever waits.
      if (request.priority >= options_.shed_below_priority) state = flow::PoolState::kAvailable;
      if (state == flow::PoolState::kEmpty) state = flow::PoolState::kSaturated;
      break;
    case flow::Admission::kDynamoQueue:
      request.priority = 0;  // its FCFS queue reads no priority
      if (flow::DynamoRejects(options_, pool)) {
        std::lock_guard<std::mutex> lock(mu_);
        request.id = next_id_++;
        return {flow::AdmitOutcome::kRejected, flow::RejectReason::kAllBusy};
      }
      break;
    default:
      break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  request.id = next_id_++;
  const flow::AdmitResult r = queue_.Admit(request, now, state);
  if (r.outcome == flow::AdmitOutcome::kQueued) {
    waiting_.emplace(request.id, Entry{std::move(waiter), {}, {}});
    PublishLocked();
  }
  return r;
}

bool FlowGate::Capacity(double now, int64_t& budget, routing::RoutingCore::PoolLoad& load) {
  if (options_.admission != flow::Admission::kKvroute) {
    core_.PeerSignals(now, peer_pool_);
    return flow::PeerPoolState(options_, peer_pool_, now) == flow::PoolState::kAvailable;
  }
  load = core_.Load(now);
  if (budget < 0) budget = load.room;
  return load.ready > 0 && !load.saturated_pool() && budget > 0;
}

bool FlowGate::Cancel(flow::RequestId id) {
  std::shared_ptr<FlowWaiter> gone;  // released after the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (!queue_.Cancel(id, clock_())) return false;
  if (auto it = waiting_.find(id); it != waiting_.end()) {
    gone = std::move(it->second.waiter);
    waiting_.erase(it);
  }
  PublishLocked();
  return true;
}

void FlowGate::Pump(uint32_t freed) {
  if (!waiting()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pumping_) {
      pump_again_ = true;
      if (freed != routing::RoutingCore::kNoEndpoint) freed_again_ = freed;
      return;
    }
    pumping_ = true;
  }
  std::vector<flow::Expired> expired;
  std::vector<std::pair<std::shared_ptr<FlowWaiter>, flow::ExpireReason>> expiring;
  int64_t budget = -1;  // the detector's room, read at the start of each round of events
  for (bool done = false; !done;) {
    const double now = clock_();
    const bool peer = options_.admission != flow::Admission::kKvroute;
    routing::RoutingCore::PoolLoad load;
    const bool capacity = Capacity(now, budget, load);
    const bool by_prediction = !peer && !capacity && options_.slo_aware &&
                               options_.slo_release_fraction > 0 && load.ready > 0;
    std::shared_ptr<FlowWaiter> next;
    double waited_s = 0.0;
    expired.clear();
    expiring.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Expire first, with the same time: nothing is dispatched past its TTL.
      queue_.Expire(now, expired);
      for (const flow::Expired& e : expired) {
        auto it = waiting_.find(e.id);
        if (it == waiting_.end()) continue;
        expiring.emplace_back(std::move(it->second.waiter), e.reason);
        waiting_.erase(it);
      }
      if (capacity && peer) {
        // A peer's release: its order alone, re-checked before each one.
        if (auto d = queue_.NextToDispatch(now)) {
          waited_s = d->waited_s;
          if (auto it = waiting_.find(d->id); it != waiting_.end()) {
            next = std::move(it->second.waiter);
            waiting_.erase(it);
          }
        }
      } else if (capacity || by_prediction) {
        // Late binding: the replica that freed (the first release after a completion),
        // else the one with the most room, takes the waiting request it holds the most
        // of (among the queue's affinity window).
        const uint32_t target = freed != routing::RoutingCore::kNoEndpoint ? freed : load.roomiest;
        freed = routing::RoutingCore::kNoEndpoint;  // one slot freed there
        std::optional<flow::Dispatch> d;
        if (target != routing::RoutingCore::kNoEndpoint || !capacity) {
          // (No endpoint with room, in a release by prediction: order alone.)
          auto probe = [&](const flow::WaitingView& w) -> uint32_t {
            auto it = waiting_.find(w.id);
            if (it == waiting_.end() || target == routing::RoutingCore::kNoEndpoint) return 0;
            return static_cast<uint32_t>(core_.HeldBlocks(it->second.key, target));
          };
          if (capacity) {
            d = queue_.NextToDispatch(now, probe);
          } else {
            auto fits = [&](const flow::WaitingView& w, double waited) {
              return PredictedToFit(w, waited);
            };
            d = queue_.NextToDispatch(now, probe, fits);
          }
        } else {
          d = queue_.NextToDispatch(now);
        }
        if (d) {
          waited_s = d->waited_s;
          if (auto it = waiting_.find(d->id); it != waiting_.end()) {
            next = std::move(it->second.waiter);
            waiting_.erase(it);
          }
        }
      }
      if (!next && expiring.empty()) {
        if (pump_again_) {
          // Events arrived while this pump ran: another round with a fresh budget.
          pump_again_ = false;
          freed = freed_again_;
          freed_again_ = routing::RoutingCore::kNoEndpoint;
          budget = -1;
        } else {
          pumping_ = false;
          done = true;
        }
      }
      PublishLocked();
    }
    for (auto& [waiter, reason] : expiring) waiter->Expire(reason);
    if (next) {
      next->Dispatch(now, waited_s);
      if (capacity && !peer) --budget;
    }
  }
}

bool FlowGate::PredictedToFit(const flow::WaitingView& w, double waited_s) const {
  auto it = waiting_.find(w.id);
  if (it == waiting_.end()) return false;
  sched::SchedRequest r = it->second.predict;
  r.queued_s = waited_s;
  const auto budget = core_.SloWaitBudget(r, it->second.key);
  if (!budget || !budget->predicted || !(budget->objective_s > 0)) return false;
  const double predicted = budget->objective_s - budget->wait_s;
  const double left = budget->objective_s - waited_s;
  return left > 0 && predicted <= options_.slo_release_fraction * left;
}

flow::FlowStats FlowGate::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.stats();
}

void FlowGate::PublishLocked() {
  waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
  next_expiry_.store(queue_.NextExpiry(), std::memory_order_relaxed);
}

}  // namespace kvroute::flow
