// `kvroute doctor`'s I/O half: scrapes each replica's /metrics over HTTP on a fixed
// interval for a window and hands the bodies, with their times, to the pure diagnosis
// (core/doctor). Used by the `kvroute doctor` command and by `kvroute demo`.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "core/doctor/doctor.h"

namespace kvroute::doctor {

struct Target {
  std::string name;     // shown in reports
  std::string host;
  uint16_t port = 0;
};

struct CollectOptions {
  std::vector<Target> targets;
  double window_s = 30;     // scrape for this long (0: one scrape of each replica)
  double interval_s = 2;    // between scrape rounds
  double timeout_s = 2;     // per scrape (connect + response)
  const std::atomic<bool>* stop = nullptr;  // polled; ends the window early
  // Called after every scrape round with the histories so far (on the caller's thread).
  std::function<void(const std::vector<ReplicaHistory>&)> on_round;
};

// Blocking: scrapes every target each interval until window_s has passed (at least two
// rounds when window_s > 0), with the monotonic clock. Unreachable targets become failed
// scrapes, never an exception.
std::vector<ReplicaHistory> Collect(const CollectOptions& options);

}  // namespace kvroute::doctor
