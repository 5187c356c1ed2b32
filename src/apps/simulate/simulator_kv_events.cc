// Simulation's KV-cache events (simulator_internal.h): each engine step's events published
// as one batch, carried to every router replica by the simulated transport (delay, loss,
// replay: event_transport.h) and applied to its core.
#include <cstdint>
#include <memory>
#include <utility>

#include "apps/simulate/event_transport.h"
#include "apps/simulate/simulator_internal.h"
#include "core/routing/routing_core.h"

namespace kvroute::simulate::detail {

void Simulation::PublishKvEvents(uint32_t ri, double t) {
  kv_drain_.clear();
  replicas_[ri].engine.DrainKvEvents(&kv_drain_);
  if (kv_drain_.empty()) return;
  auto batch = std::make_shared<kvevents::KvEventBatch>();
  batch->ts = t;
  batch->events = std::move(kv_drain_);
  kv_drain_ = {};
  const uint64_t seq = publishers_[ri].Publish(batch);
  ++kv_totals_.batches;
  for (size_t k = 0; k < cores_.size(); ++k) {
    if (sc_.kv_events.loss > 0 && loss_rng_[k].Uniform() < sc_.kv_events.loss) {
      ++kv_totals_.lost;
      continue;
    }
    kv_flight_.push_back({static_cast<uint32_t>(k), ri, seq, batch});
    Push(t + sc_.kv_events.delay_s, Ev::kKvArrive, 0);
  }
}

void Simulation::KvArrive(double t) {
  KvInFlight f = std::move(kv_flight_.front());
  kv_flight_.pop_front();
  deliveries_.clear();
  EventReceiver& rx = receivers_[f.router][f.source];
  if (rx.Arrive(f.seq, std::move(f.batch), publishers_[f.source], &deliveries_)) {
    Push(t + sc_.kv_events.delay_s, Ev::kKvReplay,
         static_cast<uint32_t>(f.router * replicas_.size() + f.source));
  }
  Deliver(f.router, f.source, t);
}

void Simulation::KvReplay(uint32_t a, double t) {
  const uint32_t router = a / static_cast<uint32_t>(replicas_.size());
  const uint32_t source = a % static_cast<uint32_t>(replicas_.size());
  deliveries_.clear();
  if (receivers_[router][source].ReplayArrived(publishers_[source], &deliveries_)) {
    Push(t + sc_.kv_events.delay_s, Ev::kKvReplay, a);
  }
  Deliver(router, source, t);
}

void Simulation::Deliver(uint32_t router, uint32_t source, double t) {
  routing::RoutingCore& core = *cores_[router];
  for (const Delivery& d : deliveries_) {
    switch (d.kind) {
      case Delivery::Kind::kBatch:
        core.OnKvEvents(source, *d.batch, t);
        break;
      case Delivery::Kind::kGap:
        core.OnKvEventsGap(source, d.repaired, t);
        break;
      case Delivery::Kind::kRestart:
        core.OnKvEventsRestart(source, t);
        break;
    }
  }
}

}  // namespace kvroute::simulate::detail
