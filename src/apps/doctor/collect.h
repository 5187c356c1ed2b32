// `kvroute doctor`'s I/O half: scrapes each replica's /metrics over HTTP on a fixed
// interval for a window and hands the bodies, with their times, to the pure diagnosis
// (apps/doctor/diagnosis). Used by the `kvroute doctor` command and by `kvroute demo`.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apps/doctor/diagnosis/doctor.h"

namespace kvroute::doctor {

struct Target {
  std::string name;  // shown in reports
  std::string host;
  uint16_t port = 0;
  // Where its KV-cache events are published ("tcp://HOST:PORT"), "" when not configured.
  // Collect does not read it; doctor's event probe does.
  std::string kv_events = {};
};

struct CollectOptions {
  std::vector<Target> targets;
  double window_s = 30;                     // scrape for this long (0: one scrape of each replica)
  double interval_s = 2;                    // between scrape rounds
  double timeout_s = 2;                     // per scrape (connect + response)
  const std::atomic<bool>* stop = nullptr;  // polled; ends the window early
  // A /metrics body larger than this is a failed scrape (vLLM's is ~100 KB per engine).
  std::size_t max_body_bytes = 16u << 20;
  // When > 0, only the rounds that began at most keep_s before the newest round are kept,
  // the same rounds in every history (a --watch that runs for hours holds one window, not
  // the whole session).
  double keep_s = 0;
  // The time 0 of Scrape::t_s; unset: when Collect begins. doctor's event probe shares it.
  std::optional<std::chrono::steady_clock::time_point> origin;
  // Called after every scrape round with the histories so far (on the caller's thread).
  std::function<void(const std::vector<ReplicaHistory>&)> on_round;
};

// Blocking: scrapes every target each interval until window_s has passed (at least two
// rounds when window_s > 0), with the monotonic clock. Unreachable targets become failed
// scrapes, never an exception.
//
// Every round scrapes all targets at once on one event loop (the caller's thread), so a
// round takes at most timeout_s however many targets are down. Rounds are at 0, interval,
// 2*interval, ... and the last at window_s; Scrape::t_s is seconds since Collect began
// (steady clock) when the body was read. Failures: connect errors (the client's text,
// naming the address), timeouts, a non-200 status ("HTTP 503"), a body over
// max_body_bytes; each is FailedScrape with that text. A 200 is ParseScrape'd whatever it
// holds (garbage is the diagnosis' business). Histories are in target order, named
// Target::name (or host:port when empty), address host:port. Every round adds one scrape
// to every history, so the i-th scrapes of all replicas are one round. When `stop` is raised the
// round in flight is abandoned (its unfinished scrapes are not recorded) and Collect
// returns what it has. A window_s of +inf runs until `stop` (with keep_s, for --watch).
std::vector<ReplicaHistory> Collect(const CollectOptions& options);

}  // namespace kvroute::doctor
