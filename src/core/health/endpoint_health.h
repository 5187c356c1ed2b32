// Endpoint health as pure logic: what the router has observed of one endpoint (scrapes,
// refused connections) in, a verdict at a given time out. No clock is read: every call
// takes the time, so tests drive it in virtual time.
//
// Conditions:
//   kNeverScraped  no scrape has succeeded yet
//   kUp            the last scrape succeeded and is not older than `staleness_s`
//   kStale         the last good scrape is older than `staleness_s`, or the last attempt
//                  failed without a connect error (timeout, bad status, no series)
//   kDown          the last scrape attempt could not connect, or a proxied connection
//                  was refused since the last good scrape; never picked
// Signals (KV usage, waiting, running) are known or unknown separately: a scrape whose
// value for a signal was missing, NaN, Inf, negative or out of range makes that signal
// unknown until a scrape brings a usable value. Unknown is never read as zero.
//
// Treatment, the one thing a scheduler needs to know:
//   kNormal     up and both load signals (KV, waiting) known: scraped values as they are
//   kSaturated  (stale_policy saturated) stale, never scraped or with an unknown load
//               signal: a candidate whose unknown/stale load counts as full (KV 1,
//               waiting kSaturatedWaiting)
//   kLastResort (stale_policy exclude) the same endpoints: not a candidate while any
//               kNormal endpoint exists; used only when nothing else is available
//   kDown       never a candidate
//
// Thread: a value type; the owner serialises access.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/metrics/engine_metrics.h"

namespace kvroute::health {

enum class StalePolicy { kExclude, kSaturated };

struct HealthOptions {
  double staleness_s = 2.0;
  StalePolicy stale_policy = StalePolicy::kExclude;
};

enum class Condition : uint8_t { kNeverScraped, kUp, kStale, kDown };
inline constexpr int kNumConditions = 4;
enum class Treatment : uint8_t { kNormal, kSaturated, kLastResort, kDown };
inline constexpr int kNumTreatments = 4;
enum class Signal : uint8_t { kKvUsage = 0, kWaiting = 1, kRunning = 2 };
inline constexpr int kNumSignals = 3;

// What a saturated endpoint's queue counts as.
inline constexpr double kSaturatedWaiting = 1000.0;

std::string_view ConditionName(Condition c);   // "never_scraped", "up", "stale", "down"
std::string_view TreatmentName(Treatment t);   // "normal", "saturated", "last_resort", "down"
std::string_view SignalName(Signal s);         // "kv_usage", "waiting", "running"

struct Verdict {
  Condition condition = Condition::kNeverScraped;
  Treatment treatment = Treatment::kLastResort;
  bool known[kNumSignals] = {false, false, false};
  // Ejected by passive outlier detection (health/outlier.h): treatment kDown until the
  // ejection ends, whatever the scrapes say. Set by the routing core, not by Assess.
  bool ejected = false;
  bool Known(Signal s) const { return known[static_cast<int>(s)]; }
  bool operator==(const Verdict&) const = default;
};

class EndpointHealth {
 public:
  // A scrape sent at `sent_at_s` succeeded with `m`. Signals `m` does not have (missing or
  // invalid) become unknown; the others take the new values.
  void OnScrape(const metrics::EngineMetrics& m, double sent_at_s);
  // A scrape attempt failed. `connect_failed`: nothing answered (down until a good scrape).
  void OnScrapeFailed(double attempted_at_s, bool connect_failed);
  // A proxied request could not connect: down until the next good scrape.
  void OnConnectFailed(double at_s);

  Verdict Assess(double now_s, const HealthOptions& options) const;
  // The earliest time after which Assess can change with no new observation (the moment
  // the last good scrape turns stale); +inf when no such moment exists.
  double NextChange(const HealthOptions& options) const;

  // The last usable value of each signal (meaningful only while Known).
  double kv_usage() const { return kv_usage_; }
  double waiting() const { return waiting_; }
  double running() const { return running_; }
  int64_t num_gpu_blocks() const { return num_gpu_blocks_; }
  // Every signal of the last good scrape, as the parser (or the simulated engine) gave
  // it, with its present/invalid bits: what reaches the scheduler's EndpointState::engine.
  const metrics::EngineMetrics& last() const { return last_; }
  int64_t block_size() const { return block_size_; }
  double scraped_at_s() const { return scraped_at_s_; }  // < 0: never
  bool last_attempt_ok() const { return last_ok_; }
  bool down() const { return down_; }

 private:
  double kv_usage_ = 0, waiting_ = 0, running_ = 0;
  int64_t num_gpu_blocks_ = 0, block_size_ = 0;
  bool known_[kNumSignals] = {false, false, false};
  double scraped_at_s_ = -1.0;
  metrics::EngineMetrics last_;
  bool last_ok_ = false;
  bool down_ = false;
};

}  // namespace kvroute::health
