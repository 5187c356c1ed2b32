// Fault injection for simulated replicas: the fault kinds, one fault's spec, its
// parsing and validation (shared by the fleet YAML, the scenario YAML and the replica's
// `POST /admin/fault` JSON body), a schedule's "what is active at time t", and the set of
// faults active on one replica. docs/FAULTS.md describes what each kind does to a client.
//
// Pure logic: no clock, no I/O. Times are seconds on the caller's clock (the live
// replica: wall seconds since it started; the discrete-event simulator: virtual time).
//
// Thread: values and a FaultSet are used from one thread at a time.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::fault {

// The names (FaultKindName) are a contract: tests, YAML files and admin calls use them.
enum class FaultKind : uint8_t {
  kCrash,           // "crash": refuses connections for `duration`
  kHang,            // "hang": accepts and reads, never answers
  kDelay,           // "delay": generation starts `delay` later
  kStall,           // "stall": a stream stops after `after_chunks` chunks, socket kept open
  kReset,           // "reset": a stream is cut after `after_chunks` chunks
  kHttpError,       // "http_error": generation answered at once with `status`
  kRestart,         // "restart": one-shot; empty engine, counters reset, optional downtime
  kSlow,            // "slow": engine steps take `factor` times longer
  kMetricsStale,    // "metrics_stale": /metrics frozen at the fault's start
  kMetricsNan,      // "metrics_nan": load gauges report NaN
  kMetricsMissing,  // "metrics_missing": load gauges omitted
  kMetricsSlow,     // "metrics_slow": /metrics answers after `delay`
  kEventsStall,     // "events_stall": the KV-event publisher sends nothing (replay keeps all)
  kEventsDrop,      // "events_drop": `fraction` of KV-event batches lost on PUB (seeded)
};
inline constexpr int kNumFaultKinds = 14;

// "crash", "hang", ... in enum order.
std::string_view FaultKindName(FaultKind kind);
const std::array<std::string_view, kNumFaultKinds>& FaultKindNames();
// The kind named `name` exactly; nullopt otherwise.
std::optional<FaultKind> FaultKindFromName(std::string_view name);

// One fault. Fields that do not apply to the kind keep their defaults (FieldApplies).
struct FaultSpec {
  FaultKind kind = FaultKind::kCrash;
  // Schedule only: start, seconds after the run began (the admin endpoint starts a fault
  // at once and ignores nothing else: `at` is rejected there).
  double at_s = 0.0;
  // How long the fault lasts; nullopt: until the run ends or it is cleared. For restart,
  // the downtime before it comes back (nullopt: back at once).
  std::optional<double> duration_s;
  double delay_s = 0.0;    // delay, metrics_slow: required, > 0
  int after_chunks = 1;    // stall, reset: chunks sent before the stream stops (>= 0)
  int status = 503;        // http_error: 400..599
  double fraction = 1.0;   // http_error: share of generation requests failed, (0, 1];
                           // events_drop: share of KV-event batches lost, (0, 1]
  uint64_t seed = 0;       // events_drop: which batches are lost (deterministic per seq)
  double factor = 1.0;     // slow: step-time multiplier, required, > 0
};

// The fields a spec may set, as written in YAML and JSON: "kind", "at", "duration",
// "delay", "after_chunks", "status", "fraction", "factor", "seed".
std::span<const std::string_view> FieldNames();
// True if `field` means something for `kind` ("kind", "at" and "duration" for all).
bool FieldApplies(FaultKind kind, std::string_view field);

// What is wrong with a spec: the field (as written, e.g. "delay") and why.
struct FaultError {
  std::string field;
  std::string message;
};

// "50ms", "2s", "1.5s", "250us", "1m", "1h", or a bare number of seconds (the syntax of
// config durations). Seconds, or nullopt when malformed, negative or not finite.
std::optional<double> ParseDurationText(std::string_view text);

// Sets `field` of `*spec` from its text as written (a YAML scalar, a JSON string or
// number). "kind" must come first (it decides which fields apply). Returns an error for
// an unknown field, a field that does not apply to the kind, or a malformed or
// out-of-range value; `*spec` is unchanged then.
std::optional<FaultError> SetField(FaultSpec* spec, std::string_view field, std::string_view text);

// Checks what SetField cannot see alone: required fields (delay for delay and
// metrics_slow, factor for slow) and, when `admin` is true, that crash has a duration
// and at is not set. `set_fields` are the fields the input named.
std::optional<FaultError> Validate(const FaultSpec& spec, std::span<const std::string> set_fields,
                                   bool admin);

// A spec or the error that stopped its parsing.
struct FaultOr {
  std::optional<FaultSpec> spec;
  FaultError error;
  bool ok() const { return spec.has_value(); }
};

// Parses an admin request body: a JSON object {"kind": "...", "duration": "5s", ...} with
// the fields above (durations as strings or numbers of seconds; null counts as absent).
// Validated with admin = true. Errors name the field (empty for malformed JSON).
FaultOr ParseFaultJson(std::string_view body);

// True if `spec` (scheduled) is active at `t_s`: at <= t < at + duration (no duration:
// t >= at). A restart is active during its downtime only (it is one-shot otherwise).
bool ActiveAt(const FaultSpec& spec, double t_s);
// The indexes of `schedule`'s entries active at `t_s`, in order.
std::vector<std::size_t> ActiveAt(std::span<const FaultSpec> schedule, double t_s);

// A fault in force on one replica.
struct ActiveFault {
  FaultSpec spec;
  double since_s = 0.0;
  std::optional<double> until_s;  // nullopt: until cleared
  uint64_t requests_seen = 0;     // http_error: generation requests counted so far
  uint64_t requests_failed = 0;   // http_error: of which answered with the error
};

// The faults active on one replica, at most one per kind: activating a kind that is
// active replaces it (its counters restart).
class FaultSet {
 public:
  // Starts `spec` at `now_s`; it ends at now_s + duration (if any). Restart without a
  // duration is not kept (it is one-shot): returns nullptr then; else the active entry.
  const ActiveFault* Activate(const FaultSpec& spec, double now_s);
  // Ends `kind` now. Returns false if it was not active.
  bool Clear(FaultKind kind);
  // Ends every fault; returns the kinds that were active.
  std::vector<FaultKind> ClearAll();
  // Ends the faults whose end time is <= `now_s`; returns their kinds (enum order).
  std::vector<FaultKind> Expire(double now_s);
  // The earliest end time among active faults; nullopt when none ends by itself.
  std::optional<double> NextExpiry() const;

  const ActiveFault* Find(FaultKind kind) const;
  bool active(FaultKind kind) const { return Find(kind) != nullptr; }
  bool empty() const;

  // http_error: counts one generation request and says whether it gets the error.
  // Deterministic: the k-th request (1-based) fails when floor(k * fraction) exceeds
  // floor((k - 1) * fraction), so fraction 0.5 fails every 2nd, 0.25 every 4th, 1 all.
  // False when http_error is not active.
  bool TakeHttpError();

  // events_drop: whether the KV-event batch numbered `seq` is lost on PUB: a hash of
  // (seed, seq) below `fraction` of the 64-bit range, so the same seed and seq always give
  // the same answer. False when events_drop is not active.
  bool DropsEventBatch(uint64_t seq) const;

  // {"active":[{"kind":"hang","since_s":1.2,"remaining_s":3.8,...},...]} in enum order;
  // times relative to `now_s` (remaining_s null for open-ended faults).
  std::string ToJson(double now_s) const;

 private:
  std::array<std::optional<ActiveFault>, kNumFaultKinds> faults_;
};

}  // namespace kvroute::fault
