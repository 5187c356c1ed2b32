// The transport of KV-cache event batches in `kvroute simulate` (issue 23): what sits
// between a simulated engine's publisher and one router replica's routing core. Pure logic
// (no clock, no events of its own): the simulator decides when things arrive and calls in.
//
//   EventPublisher   one per engine replica: numbers its batches from 0 (Restart starts
//                    again at 0, as vLLM's publisher does when its process restarts) and
//                    keeps the last `buffer_steps` of them for replay.
//   EventReceiver    one per (router replica, engine replica): the router's side. Each
//                    arriving batch is compared with the sequence number it expects next:
//                      equal        the batch is delivered;
//                      higher       a gap. With replay on and every missing batch still in
//                                   the publisher's buffer (looked up now), a replay starts:
//                                   the missing batches are copied out, and when the caller
//                                   reports them arrived (ReplayArrived, one delay later)
//                                   the receiver delivers a repaired gap, the missing
//                                   batches in order, then the batch that revealed the gap;
//                                   batches arriving meanwhile are held and go through
//                                   these rules after it. Otherwise an unrepaired gap, then
//                                   the batch;
//                      lower        the publisher restarted: a restart, then the batch.
//                    The first batch expected is sequence 0 (the router is there before the
//                    engine publishes), so a lost batch 0 is a gap too.
// The outcome is a list of Deliveries the caller forwards to its routing core in order
// (OnKvEventsGap, OnKvEvents, OnKvEventsRestart). Kept apart from the ZMQ subscriber's
// tracker on purpose: this one models a transport, that one runs one.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "core/kvevents/kv_event.h"

namespace kvroute::simulate {

using BatchPtr = std::shared_ptr<const kvevents::KvEventBatch>;

class EventPublisher {
 public:
  explicit EventPublisher(uint64_t buffer_steps) : buffer_steps_(buffer_steps < 1 ? 1 : buffer_steps) {}

  // Numbers `batch` and keeps it for replay (dropping the oldest beyond buffer_steps).
  // Returns its sequence number.
  uint64_t Publish(BatchPtr batch);
  // The publisher's process restarted: numbering starts again at 0, the buffer is empty.
  void Restart();
  // Copies batches [from, to) into `*out` (appended, in order) when every one of them is
  // still buffered; otherwise returns false and leaves `*out` unchanged.
  bool Replay(uint64_t from, uint64_t to, std::vector<BatchPtr>* out) const;
  uint64_t next_seq() const { return next_; }
  size_t buffered() const { return buffer_.size(); }

 private:
  uint64_t buffer_steps_;
  uint64_t next_ = 0;
  std::deque<BatchPtr> buffer_;  // sequence numbers next_ - size .. next_ - 1
};

struct Delivery {
  enum class Kind : uint8_t { kBatch, kGap, kRestart };
  Kind kind = Kind::kBatch;
  bool repaired = false;  // kGap
  uint64_t seq = 0;       // kBatch: its sequence number
  BatchPtr batch;         // kBatch
};

struct ReceiverStats {
  uint64_t delivered = 0;    // batches delivered (replayed ones included)
  uint64_t replayed = 0;     // of which came by replay
  uint64_t gaps = 0;         // gaps found
  uint64_t unrepaired = 0;   // of which were not repaired
  uint64_t restarts = 0;
};

class EventReceiver {
 public:
  explicit EventReceiver(bool replay) : replay_(replay) {}

  // Batch `seq` arrived from `publisher`'s transport. Appends what to deliver now to
  // `*out`. Returns true when this call started a replay: the caller must call
  // ReplayArrived when the replayed batches arrive.
  bool Arrive(uint64_t seq, BatchPtr batch, const EventPublisher& publisher,
              std::vector<Delivery>* out);
  // The replay started by Arrive arrived: appends the repaired gap, the replayed batches,
  // the batch that revealed the gap, then the held batches' outcomes. Returns true when
  // one of the held batches started another replay.
  bool ReplayArrived(const EventPublisher& publisher, std::vector<Delivery>* out);

  bool replay_pending() const { return pending_; }
  uint64_t expected() const { return expected_; }
  const ReceiverStats& stats() const { return stats_; }

 private:
  void Deliver(uint64_t seq, BatchPtr batch, std::vector<Delivery>* out);

  bool replay_;
  uint64_t expected_ = 0;
  bool pending_ = false;
  std::vector<BatchPtr> replay_batches_;  // the missing ones, from replay_from_
  uint64_t replay_from_ = 0;
  uint64_t trigger_seq_ = 0;
  BatchPtr trigger_;
  std::deque<std::pair<uint64_t, BatchPtr>> held_;  // arrived while a replay was pending
  ReceiverStats stats_;
};

}  // namespace kvroute::simulate
