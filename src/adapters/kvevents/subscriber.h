// The router side of KV events: one thread receiving from many publishers over ZMQ,
// tracking each one's seq (core/kvevents/sequence.h), repairing gaps from replay sockets
// and handing decoded batches to a callback per source.
//
// Sources:
//  - AddEndpoint: a SUB socket connected to one publisher ("tcp://10.0.0.5:5557"), with an
//    optional replay endpoint (a DEALER connected to its ROUTER). One seq stream.
//  - AddBound (llm-d's centralized mode): one SUB socket bound here that many publishers
//    connect to, subscribed to a topic prefix ("kv@"); each topic (kv@<podIP>@<model>) is
//    its own seq stream. SetTopicReplay gives a topic a replay endpoint.
//
// Reports reach the source's callback on the subscriber thread, in stream order: batches
// (live or replayed), gaps (with whether a replay repaired them), restarts and decode
// errors. Nothing in the input can crash the thread: a malformed frame or payload is a
// kDecodeError report. A replay with no end marker within replay_timeout ends the repair
// (unrepaired) and its socket is replaced, so late replies cannot confuse the next one.
//
// Threads: every public function may be called from any thread except from inside a
// callback (Add/Remove/SetTopicReplay wait for the subscriber thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "core/common/status.h"
#include "core/kvevents/kv_event.h"

namespace kvroute::kvevents {

struct SubscriberOptions {
  std::chrono::milliseconds replay_timeout{2000};
  size_t max_held = 100000;  // live messages held per stream while it replays
  int rcvhwm = 100000;
};

enum class ReportKind : uint8_t { kBatch, kReplayed, kGap, kRestart, kDecodeError };
std::string_view ReportKindName(ReportKind k);  // "batch", "replayed", "gap", ...

struct Report {
  ReportKind kind = ReportKind::kBatch;
  std::string source;  // the name given to Add*
  std::string topic;   // the message's topic ("" in per-endpoint mode by default)
  uint64_t seq = 0;    // kBatch/kReplayed: the batch; kRestart: the new stream's first seq
  KvEventBatch batch;  // kBatch, kReplayed
  size_t unknown_events = 0;  // kBatch, kReplayed: events skipped (unknown tag)
  uint64_t gap_from = 0, gap_to = 0;  // kGap: [from, to) was missing
  bool repaired = false;              // kGap
  uint64_t previous = 0;              // kRestart: the old stream's last seq
  std::string message;                // kDecodeError: what was wrong
};
using ReportCallback = std::function<void(const Report&)>;

// Per-source counters, readable from any thread (e.g. for /metrics).
struct SubscriberCounters {
  uint64_t batches = 0;   // delivered live
  uint64_t replayed = 0;  // delivered from a replay
  uint64_t events_stored = 0, events_removed = 0, events_cleared = 0, events_unknown = 0;
  uint64_t gaps = 0, gaps_repaired = 0;
  uint64_t replay_requests = 0;
  uint64_t duplicates = 0;
  uint64_t restarts = 0;
  uint64_t decode_errors = 0;
  std::optional<uint64_t> last_seq;  // of the last batch delivered
};

class Subscriber {
 public:
  explicit Subscriber(SubscriberOptions options = {});
  // Stops (see Stop).
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // Connects a SUB socket to `endpoint` (subscribed to `topic`, "" for every message) and,
  // when `replay_endpoint` is set, a DEALER to it for gap repair. InvalidArgument for a
  // duplicate name, Unavailable when ZMQ rejects an address.
  Status AddEndpoint(const std::string& name, const std::string& endpoint,
                     const std::string& replay_endpoint, ReportCallback callback,
                     const std::string& topic = "");
  // Binds a SUB socket at `bind_endpoint` ("tcp://*:5557", "tcp://127.0.0.1:*") for
  // publishers that connect, subscribed to `prefix`. Returns the bound endpoint (port
  // resolved).
  Result<std::string> AddBound(const std::string& name, const std::string& bind_endpoint,
                               ReportCallback callback, const std::string& prefix = "kv@");
  // A replay endpoint for one topic of a bound source.
  Status SetTopicReplay(const std::string& name, const std::string& topic,
                        const std::string& replay_endpoint);
  // Closes the source's sockets; no callback for it runs after this returns. NotFound
  // for an unknown name.
  Status Remove(const std::string& name);
  // A snapshot of the source's counters; nullopt for an unknown name.
  std::optional<SubscriberCounters> Counters(const std::string& name) const;
  // Closes everything and joins the thread. Idempotent; returns promptly.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute::kvevents
