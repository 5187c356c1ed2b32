#include "core/kvevents/sequence.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvroute::kvevents {
namespace {

using Kind = SeqStep::Kind;

// One line per step: "deliver 3", "replayed 4", "dup 2", "restart 0 after 9",
// "gap 3-5 repaired", "gap 3-5 lost", "replay from 3".
std::vector<std::string> Lines(const std::vector<SeqStep>& steps) {
  std::vector<std::string> out;
  for (const SeqStep& s : steps) {
    switch (s.kind) {
      case Kind::kDeliver:
        out.push_back((s.replayed ? "replayed " : "deliver ") + std::to_string(s.seq) + ":" +
                      s.payload);
        break;
      case Kind::kDuplicate: out.push_back("dup " + std::to_string(s.seq)); break;
      case Kind::kRestart:
        out.push_back("restart " + std::to_string(s.seq) + " after " + std::to_string(s.previous));
        break;
      case Kind::kGap:
        out.push_back("gap " + std::to_string(s.gap_from) + "-" + std::to_string(s.gap_to) +
                      (s.repaired ? " repaired" : " lost"));
        break;
      case Kind::kRequestReplay: out.push_back("replay from " + std::to_string(s.seq)); break;
    }
  }
  return out;
}

using V = std::vector<std::string>;

TEST(SequenceTracker, FirstMessageAcceptedAtAnySeqThenInOrder) {
  SequenceTracker t(/*can_replay=*/true);
  std::vector<SeqStep> out;
  t.OnLive(7, "a", &out);
  t.OnLive(8, "b", &out);
  EXPECT_EQ(Lines(out), (V{"deliver 7:a", "deliver 8:b"}));
  EXPECT_EQ(t.expected(), 9u);
}

TEST(SequenceTracker, GapWithoutReplayIsReportedLostAndDelivered) {
  SequenceTracker t(false);
  std::vector<SeqStep> out;
  t.OnLive(0, "a", &out);
  t.OnLive(3, "d", &out);
  EXPECT_EQ(Lines(out), (V{"deliver 0:a", "gap 1-3 lost", "deliver 3:d"}));
}

TEST(SequenceTracker, GapRepairedByReplayHoldsLiveMessagesAndDropsDuplicates) {
  SequenceTracker t(true);
  std::vector<SeqStep> out;
  t.OnLive(0, "a", &out);
  t.OnLive(3, "d", &out);  // 1 and 2 lost
  EXPECT_EQ(Lines(out), (V{"deliver 0:a", "replay from 1"}));
  out.clear();
  EXPECT_TRUE(t.repairing());
  t.OnLive(4, "e", &out);  // held while the replay runs
  EXPECT_TRUE(out.empty());
  t.OnReplayed(1, "b", &out);
  t.OnReplayed(2, "c", &out);
  t.OnReplayed(3, "d", &out);
  t.OnReplayEnd(&out);
  EXPECT_EQ(Lines(out), (V{"replayed 1:b", "replayed 2:c", "replayed 3:d", "gap 1-3 repaired",
                           "dup 3", "deliver 4:e"}));
  EXPECT_FALSE(t.repairing());
  out.clear();
  t.OnLive(5, "f", &out);
  EXPECT_EQ(Lines(out), (V{"deliver 5:f"}));
}

TEST(SequenceTracker, ReplayThatStartsPastTheGapLeavesItUnrepaired) {
  SequenceTracker t(true);
  std::vector<SeqStep> out;
  t.OnLive(0, "a", &out);
  t.OnLive(5, "f", &out);
  out.clear();
  t.OnReplayed(3, "d", &out);  // 1 and 2 are older than the publisher's buffer
  t.OnReplayed(4, "e", &out);
  t.OnReplayed(5, "f", &out);
  t.OnReplayEnd(&out);
  EXPECT_EQ(Lines(out), (V{"replayed 3:d", "replayed 4:e", "replayed 5:f", "gap 1-5 lost", "dup 5"}));
}

TEST(SequenceTracker, ReplayEndingEarlyOrTimingOutContinuesFromTheLiveMessage) {
  SequenceTracker t(true);
  std::vector<SeqStep> out;
  t.OnLive(0, "a", &out);
  t.OnLive(4, "e", &out);
  out.clear();
  t.OnReplayed(1, "b", &out);
  t.OnReplayEnd(&out);  // a timeout: 2 and 3 never came
  EXPECT_EQ(Lines(out), (V{"replayed 1:b", "gap 1-4 lost", "deliver 4:e"}));
  EXPECT_EQ(t.expected(), 5u);
}

TEST(SequenceTracker, SeqGoingBackIsARestartAndAMissingStartIsAGapFromZero) {
  SequenceTracker t(false);
  std::vector<SeqStep> out;
  t.OnLive(10, "a", &out);
  t.OnLive(11, "b", &out);
  t.OnLive(0, "x", &out);
  t.OnLive(1, "y", &out);
  t.OnLive(5, "z", &out);
  t.OnLive(2, "w", &out);  // back again: another restart, whose 0 and 1 were lost
  EXPECT_EQ(Lines(out), (V{"deliver 10:a", "deliver 11:b", "restart 0 after 11", "deliver 0:x",
                           "deliver 1:y", "gap 2-5 lost", "deliver 5:z", "restart 2 after 5",
                           "gap 0-2 lost", "deliver 2:w"}));
}

TEST(SequenceTracker, RestartSeenWhileReplayingIsHandledAfterIt) {
  SequenceTracker t(true);
  std::vector<SeqStep> out;
  t.OnLive(0, "a", &out);
  t.OnLive(2, "c", &out);
  t.OnLive(0, "new", &out);  // held: the publisher restarted meanwhile
  out.clear();
  t.OnReplayed(1, "b", &out);
  t.OnReplayed(2, "c", &out);
  t.OnReplayEnd(&out);
  EXPECT_EQ(Lines(out), (V{"replayed 1:b", "replayed 2:c", "gap 1-2 repaired", "dup 2",
                           "restart 0 after 2", "deliver 0:new"}));
}

TEST(SequenceTracker, RestartWhoseStartWasLostIsReportedOnceAndReplayedFromZero) {
  SequenceTracker t(true);
  std::vector<SeqStep> out;
  t.OnLive(20, "old", &out);
  t.OnLive(2, "c", &out);  // the new stream's 0 and 1 were lost while reconnecting
  t.OnReplayed(0, "a", &out);
  t.OnReplayed(1, "b", &out);
  t.OnReplayed(2, "c", &out);
  t.OnReplayEnd(&out);
  t.OnLive(3, "d", &out);
  EXPECT_EQ(Lines(out), (V{"deliver 20:old", "restart 2 after 20", "replay from 0",
                           "replayed 0:a", "replayed 1:b", "replayed 2:c", "gap 0-2 repaired",
                           "dup 2", "deliver 3:d"}));
}

TEST(SequenceTracker, ReplayMessagesOutsideARepairAreIgnored) {
  SequenceTracker t(true);
  std::vector<SeqStep> out;
  t.OnReplayed(3, "x", &out);
  t.OnReplayEnd(&out);
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(t.expected().has_value());
}

TEST(SequenceTracker, HeldMessagesAreBounded) {
  SequenceTracker t(true, /*max_held=*/2);
  std::vector<SeqStep> out;
  t.OnLive(0, "a", &out);
  t.OnLive(2, "c", &out);
  t.OnLive(3, "d", &out);
  t.OnLive(4, "e", &out);  // pushes the trigger (2) out
  out.clear();
  t.OnReplayEnd(&out);  // nothing replayed; the dropped trigger makes a second gap
  EXPECT_EQ(Lines(out), (V{"gap 1-2 lost", "replay from 2"}));
  out.clear();
  t.OnReplayEnd(&out);
  EXPECT_EQ(Lines(out), (V{"gap 2-3 lost", "deliver 3:d", "deliver 4:e"}));
}

}  // namespace
}  // namespace kvroute::kvevents
