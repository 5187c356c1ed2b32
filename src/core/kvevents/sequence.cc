#include "core/kvevents/sequence.h"

namespace kvroute::kvevents {

namespace {

SeqStep Deliver(uint64_t seq, std::string payload, bool replayed) {
  SeqStep s;
  s.kind = SeqStep::Kind::kDeliver;
  s.seq = seq;
  s.replayed = replayed;
  s.payload = std::move(payload);
  return s;
}

SeqStep Simple(SeqStep::Kind kind, uint64_t seq) {
  SeqStep s;
  s.kind = kind;
  s.seq = seq;
  return s;
}

SeqStep Gap(uint64_t from, uint64_t to, bool repaired) {
  SeqStep s;
  s.kind = SeqStep::Kind::kGap;
  s.seq = from;
  s.gap_from = from;
  s.gap_to = to;
  s.repaired = repaired;
  return s;
}

}  // namespace

void SequenceTracker::OnLive(uint64_t seq, std::string payload, std::vector<SeqStep>* out) {
  // Live order is the publisher's order, so a restart is decided on arrival, even for a
  // message that must wait for a replay.
  Held m{seq, std::move(payload), last_live_ && seq <= *last_live_, last_live_.value_or(0)};
  last_live_ = seq;
  if (repairing_) {
    if (held_.size() >= max_held_) held_.pop_front();
    held_.push_back(std::move(m));
    return;
  }
  Handle(std::move(m), out);
}

void SequenceTracker::Handle(Held m, std::vector<SeqStep>* out) {
  const uint64_t seq = m.seq;
  std::string& payload = m.payload;
  if (m.restart) {
    SeqStep r = Simple(SeqStep::Kind::kRestart, seq);
    r.previous = m.previous;
    out->push_back(std::move(r));
    expected_ = 0;  // a new stream: anything before `seq` in it is missing
  }
  if (!expected_ || seq == *expected_) {
    expected_ = seq + 1;
    out->push_back(Deliver(seq, std::move(payload), false));
    return;
  }
  if (seq < *expected_) {
    out->push_back(Simple(SeqStep::Kind::kDuplicate, seq));
    return;
  }
  // A gap [expected, seq).
  if (!can_replay_) {
    out->push_back(Gap(*expected_, seq, false));
    expected_ = seq + 1;
    out->push_back(Deliver(seq, std::move(payload), false));
    return;
  }
  repairing_ = true;
  gap_from_ = *expected_;
  gap_to_ = seq;
  gap_skipped_ = false;
  m.restart = false;  // reported already: after the repair it is an ordinary message
  held_.push_front(std::move(m));
  out->push_back(Simple(SeqStep::Kind::kRequestReplay, *expected_));
}

void SequenceTracker::OnReplayed(uint64_t seq, std::string payload, std::vector<SeqStep>* out) {
  if (!repairing_) return;
  if (seq < *expected_) {
    out->push_back(Simple(SeqStep::Kind::kDuplicate, seq));
    return;
  }
  if (seq > *expected_ && *expected_ < gap_to_) gap_skipped_ = true;  // older than the buffer
  expected_ = seq + 1;
  out->push_back(Deliver(seq, std::move(payload), true));
}

void SequenceTracker::OnReplayEnd(std::vector<SeqStep>* out) {
  if (!repairing_) return;
  EndRepair(out);
  // Held live messages, in arrival order, through the normal rules (one may start
  // another repair; the rest are held again).
  std::deque<Held> held;
  held.swap(held_);
  for (Held& m : held) {
    if (repairing_) {
      held_.push_back(std::move(m));
    } else {
      Handle(std::move(m), out);
    }
  }
}

void SequenceTracker::EndRepair(std::vector<SeqStep>* out) {
  repairing_ = false;
  const bool repaired = !gap_skipped_ && *expected_ >= gap_to_;
  out->push_back(Gap(gap_from_, gap_to_, repaired));
  // What the replay could not give is lost: continue from the message that showed the gap.
  if (*expected_ < gap_to_) expected_ = gap_to_;
}

}  // namespace kvroute::kvevents
