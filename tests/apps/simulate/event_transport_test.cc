#include "apps/simulate/event_transport.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace kvroute::simulate {
namespace {

BatchPtr MakeBatch(double ts) {
  auto b = std::make_shared<kvevents::KvEventBatch>();
  b->ts = ts;
  return b;
}

// The deliveries as text: "b3" a batch of sequence 3, "g+" a repaired gap, "g-" an
// unrepaired one, "r" a restart.
std::string Show(const std::vector<Delivery>& ds) {
  std::string out;
  for (const Delivery& d : ds) {
    if (!out.empty()) out += ' ';
    switch (d.kind) {
      case Delivery::Kind::kBatch:
        out += "b" + std::to_string(d.seq);
        break;
      case Delivery::Kind::kGap:
        out += d.repaired ? "g+" : "g-";
        break;
      case Delivery::Kind::kRestart:
        out += "r";
        break;
    }
  }
  return out;
}

// Publishes `n` batches (ts = their sequence number); returns them by sequence number.
std::vector<BatchPtr> PublishN(EventPublisher& pub, int n) {
  std::vector<BatchPtr> out;
  for (int i = 0; i < n; ++i) {
    BatchPtr b = MakeBatch(static_cast<double>(pub.next_seq()));
    EXPECT_EQ(pub.Publish(b), static_cast<uint64_t>(out.size()));
    out.push_back(b);
  }
  return out;
}

TEST(EventTransportTest, InOrderBatchesAreDeliveredAsTheyArrive) {
  EventPublisher pub(10);
  const std::vector<BatchPtr> b = PublishN(pub, 3);
  EventReceiver rx(/*replay=*/true);
  std::vector<Delivery> out;
  for (uint64_t s = 0; s < 3; ++s) EXPECT_FALSE(rx.Arrive(s, b[s], pub, &out));
  EXPECT_EQ(Show(out), "b0 b1 b2");
  EXPECT_EQ(out[1].batch, b[1]);  // the very batch published
  EXPECT_EQ(rx.expected(), 3u);
  EXPECT_EQ(rx.stats().delivered, 3u);
  EXPECT_EQ(rx.stats().gaps, 0u);
}

TEST(EventTransportTest, LossWithReplayIsRepairedInOrderAndHoldsLaterBatches) {
  EventPublisher pub(10);
  const std::vector<BatchPtr> b = PublishN(pub, 6);
  EventReceiver rx(/*replay=*/true);
  std::vector<Delivery> out;
  EXPECT_FALSE(rx.Arrive(0, b[0], pub, &out));
  // 1 and 2 were lost: 3 reveals the gap and starts a replay; nothing is delivered yet.
  EXPECT_TRUE(rx.Arrive(3, b[3], pub, &out));
  EXPECT_TRUE(rx.replay_pending());
  EXPECT_EQ(Show(out), "b0");
  // 4 arrives while the replay is under way: held behind it.
  EXPECT_FALSE(rx.Arrive(4, b[4], pub, &out));
  EXPECT_EQ(Show(out), "b0");
  out.clear();
  EXPECT_FALSE(rx.ReplayArrived(pub, &out));
  EXPECT_EQ(Show(out), "g+ b1 b2 b3 b4");
  EXPECT_EQ(out[1].batch, b[1]);
  EXPECT_EQ(out[2].batch, b[2]);
  EXPECT_FALSE(rx.replay_pending());
  EXPECT_EQ(rx.expected(), 5u);
  EXPECT_EQ(rx.stats().gaps, 1u);
  EXPECT_EQ(rx.stats().unrepaired, 0u);
  EXPECT_EQ(rx.stats().replayed, 2u);
  EXPECT_EQ(rx.stats().delivered, 5u);
  // A held batch that reveals another gap starts the next replay.
  EXPECT_FALSE(rx.ReplayArrived(pub, &out));  // nothing pending: a no-op
}

TEST(EventTransportTest, AHeldBatchCanStartTheNextReplay) {
  EventPublisher pub(10);
  const std::vector<BatchPtr> b = PublishN(pub, 6);
  EventReceiver rx(/*replay=*/true);
  std::vector<Delivery> out;
  EXPECT_FALSE(rx.Arrive(0, b[0], pub, &out));
  EXPECT_TRUE(rx.Arrive(2, b[2], pub, &out));   // 1 lost
  EXPECT_FALSE(rx.Arrive(5, b[5], pub, &out));  // 3, 4 lost; held
  out.clear();
  EXPECT_TRUE(rx.ReplayArrived(pub, &out));  // 5 is a new gap: a second replay
  EXPECT_EQ(Show(out), "g+ b1 b2");
  out.clear();
  EXPECT_FALSE(rx.ReplayArrived(pub, &out));
  EXPECT_EQ(Show(out), "g+ b3 b4 b5");
  EXPECT_EQ(rx.stats().gaps, 2u);
  EXPECT_EQ(rx.stats().replayed, 3u);
}

TEST(EventTransportTest, LossBeyondTheBufferIsAnUnrepairedGap) {
  EventPublisher pub(3);  // keeps sequence numbers 3, 4, 5 once 6 are published
  const std::vector<BatchPtr> b = PublishN(pub, 6);
  EXPECT_EQ(pub.buffered(), 3u);
  std::vector<BatchPtr> replayed;
  EXPECT_FALSE(pub.Replay(2, 5, &replayed));
  EXPECT_TRUE(replayed.empty());
  EXPECT_TRUE(pub.Replay(3, 5, &replayed));
  EXPECT_EQ(replayed.size(), 2u);

  EventReceiver rx(/*replay=*/true);
  std::vector<Delivery> out;
  EXPECT_FALSE(rx.Arrive(0, b[0], pub, &out));
  // 1..4 lost; 1 and 2 are no longer buffered: unrepaired, then 5 at once.
  EXPECT_FALSE(rx.Arrive(5, b[5], pub, &out));
  EXPECT_EQ(Show(out), "b0 g- b5");
  EXPECT_FALSE(rx.replay_pending());
  EXPECT_EQ(rx.stats().gaps, 1u);
  EXPECT_EQ(rx.stats().unrepaired, 1u);
  EXPECT_EQ(rx.stats().replayed, 0u);
}

TEST(EventTransportTest, WithoutReplayEveryGapIsUnrepaired) {
  EventPublisher pub(100);
  const std::vector<BatchPtr> b = PublishN(pub, 4);
  EventReceiver rx(/*replay=*/false);
  std::vector<Delivery> out;
  // Batch 0 itself lost: the first arrival is a gap too (the router expects 0).
  EXPECT_FALSE(rx.Arrive(1, b[1], pub, &out));
  EXPECT_FALSE(rx.Arrive(3, b[3], pub, &out));
  EXPECT_EQ(Show(out), "g- b1 g- b3");
  EXPECT_EQ(rx.stats().unrepaired, 2u);
}

TEST(EventTransportTest, ASequenceGoingBackIsARestart) {
  EventPublisher pub(100);
  const std::vector<BatchPtr> before = PublishN(pub, 4);
  EventReceiver rx(/*replay=*/true);
  std::vector<Delivery> out;
  for (uint64_t s = 0; s < 4; ++s) rx.Arrive(s, before[s], pub, &out);
  pub.Restart();
  EXPECT_EQ(pub.next_seq(), 0u);
  EXPECT_EQ(pub.buffered(), 0u);
  const std::vector<BatchPtr> after = PublishN(pub, 2);
  out.clear();
  EXPECT_FALSE(rx.Arrive(0, after[0], pub, &out));
  EXPECT_FALSE(rx.Arrive(1, after[1], pub, &out));
  EXPECT_EQ(Show(out), "r b0 b1");
  EXPECT_EQ(out[1].batch, after[0]);
  EXPECT_EQ(rx.stats().restarts, 1u);
  EXPECT_EQ(rx.stats().gaps, 0u);
  // The replay buffer holds only the new process's batches.
  std::vector<BatchPtr> replayed;
  EXPECT_TRUE(pub.Replay(0, 2, &replayed));
  EXPECT_EQ(replayed[0], after[0]);
}

}  // namespace
}  // namespace kvroute::simulate
