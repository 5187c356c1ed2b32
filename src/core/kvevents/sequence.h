// Sequence tracking for one KV-event publisher (REFERENCE.md section 5): what a subscriber
// does with each batch's `seq` so that gaps, replays, duplicates and publisher restarts
// are told apart. No sockets and no clock: the transport feeds messages in and carries
// out the steps it gets back (deliver, report, ask for a replay), so a virtual-time
// simulator can drive the same logic.
//
// Rules, for one publisher instance's stream (PUB over TCP never reorders; it only drops):
//  - The first message is accepted whatever its seq (a subscriber joins late).
//  - seq == expected: delivered.
//  - seq > expected: a gap [expected, seq). With replay, a replay from `expected` is
//    requested and live messages are held until it ends; replayed messages fill the gap
//    (delivered as replayed); a replay that skips seqs, or ends (end marker or timeout)
//    before reaching `seq`, leaves the rest unrepaired. One kGap step reports the range
//    and whether it was fully repaired when the repair ends. Without replay the gap is
//    reported unrepaired at once and the message delivered.
//  - seq <= the last seq seen live: the publisher started again (a restart resets seq to
//    0): kRestart is reported, the stream starts over from 0 and the message is handled as
//    a new stream's (so a restart whose first messages were lost is a gap from 0).
//  - otherwise seq < expected (already delivered by a replay): a duplicate, dropped.
//
// Thread: not thread-safe; one tracker per publisher, used from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace kvroute::kvevents {

struct SeqStep {
  enum class Kind : uint8_t {
    kDeliver,        // deliver `payload` (seq); `replayed` when it came from a replay
    kDuplicate,      // `seq` was delivered already; dropped
    kRestart,        // the publisher restarted; `seq` is the new stream's first seq seen,
                     // `previous` the last seq of the old stream
    kGap,            // [gap_from, gap_to) was missing; `repaired` when a replay filled it all
    kRequestReplay,  // ask the publisher's replay socket for every batch from `seq`
  };
  Kind kind = Kind::kDeliver;
  uint64_t seq = 0;
  bool replayed = false;
  std::string payload;
  uint64_t previous = 0;
  uint64_t gap_from = 0;
  uint64_t gap_to = 0;
  bool repaired = false;
};

class SequenceTracker {
 public:
  // `can_replay`: the publisher has a replay socket. `max_held`: live messages kept while
  // a replay runs; beyond it the oldest are dropped (and become part of a later gap).
  explicit SequenceTracker(bool can_replay, size_t max_held = 100000)
      : can_replay_(can_replay), max_held_(max_held) {}

  // A live message. Appends the steps to `*out`.
  void OnLive(uint64_t seq, std::string payload, std::vector<SeqStep>* out);
  // A message of the replay requested last (ignored when no replay runs).
  void OnReplayed(uint64_t seq, std::string payload, std::vector<SeqStep>* out);
  // The replay ended: its end marker arrived or it timed out. Ends the repair, then
  // handles the held live messages (which may request another replay).
  void OnReplayEnd(std::vector<SeqStep>* out);

  // Replay became available (or not) for this publisher; applies from the next gap.
  void set_can_replay(bool can_replay) { can_replay_ = can_replay; }
  bool repairing() const { return repairing_; }
  // The next seq expected; nullopt before the first message.
  std::optional<uint64_t> expected() const { return expected_; }
  size_t held() const { return held_.size(); }

 private:
  struct Held {
    uint64_t seq;
    std::string payload;
    bool restart;       // decided at arrival: seq <= the seq seen live before it
    uint64_t previous;  // that seq
  };
  void Handle(Held m, std::vector<SeqStep>* out);
  void EndRepair(std::vector<SeqStep>* out);

  bool can_replay_;
  size_t max_held_;
  std::optional<uint64_t> expected_;
  std::optional<uint64_t> last_live_;
  bool repairing_ = false;
  uint64_t gap_from_ = 0;
  uint64_t gap_to_ = 0;
  bool gap_skipped_ = false;  // the replay jumped over part of the gap
  std::deque<Held> held_;
};

}  // namespace kvroute::kvevents
