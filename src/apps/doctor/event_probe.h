// `kvroute doctor`'s KV-event probe: while doctor scrapes, it subscribes to each replica's
// KV-cache event publisher (kvevents::Subscriber, one thread, no replay: doctor only needs
// to know whether and what the engine publishes) and records every batch's arrival time and
// BlockStored block sizes, as the pure diagnosis reads them (doctor.h EventProbe).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "apps/doctor/diagnosis/doctor.h"

namespace kvroute::kvevents {
class Subscriber;
}

namespace kvroute::doctor {

class EventsProbe {
 public:
  // Times are seconds since `origin` on the steady clock (Collect's origin, so batches and
  // scrapes share a clock). `replicas`: one slot per target; Listen fills some.
  EventsProbe(std::chrono::steady_clock::time_point origin, std::size_t replicas);
  ~EventsProbe();  // Stop
  EventsProbe(const EventsProbe&) = delete;
  EventsProbe& operator=(const EventsProbe&) = delete;

  // Subscribes replica `index` to `url` ("tcp://HOST:PORT"). A URL the subscriber
  // rejects is recorded as the probe's error, not returned.
  void Listen(std::size_t index, const std::string& name, const std::string& url);
  // Whether any replica is probed.
  bool any() const;
  // A copy of what was seen so far, per replica (nullopt: not probed). With `since_s`,
  // batches before it are dropped for good first (--watch keeps one window).
  std::vector<std::optional<EventProbe>> Snapshot(std::optional<double> since_s = std::nullopt);
  // Closes every subscription; no batch is recorded after it returns. Idempotent.
  void Stop();

 private:
  const std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<std::optional<EventProbe>> seen_;
  std::unique_ptr<kvevents::Subscriber> sub_;
};

}  // namespace kvroute::doctor
