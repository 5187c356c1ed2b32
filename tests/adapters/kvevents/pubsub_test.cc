// The publisher and subscriber over loopback TCP: in-order delivery, gaps repaired by
// replay, gaps beyond the replay buffer, publisher restarts, decode errors, centralized
// mode, and vLLM's replay frames in both forms.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "adapters/kvevents/publisher.h"
#include "adapters/kvevents/subscriber.h"
#include "adapters/kvevents/zmq_util.h"
#include "support/wait.h"

namespace kvroute::kvevents {
namespace {

using test_support::WaitFor;

// A batch whose one BlockRemoved carries `tag`, so a test can tell batches apart.
KvEventBatch Tagged(uint64_t tag) {
  KvEventBatch b;
  b.ts = 1.0;
  KvEvent e;
  e.kind = EventKind::kBlockRemoved;
  e.block_hashes = {tag};
  b.events.push_back(e);
  return b;
}

// Collects reports as "batch 3 tag=7", "replayed 4 tag=8", "gap 1-3 repaired",
// "gap 1-3 lost", "restart 0 after 5", "decode_error ...".
class Collector {
 public:
  ReportCallback Callback() {
    return [this](const Report& r) {
      std::string line(ReportKindName(r.kind));
      switch (r.kind) {
        case ReportKind::kBatch:
        case ReportKind::kReplayed:
          line += " " + std::to_string(r.seq);
          if (r.batch.events.size() == 1 && r.batch.events[0].block_hashes.size() == 1) {
            line += " tag=" + std::to_string(r.batch.events[0].block_hashes[0]);
          }
          break;
        case ReportKind::kGap:
          line += " " + std::to_string(r.gap_from) + "-" + std::to_string(r.gap_to) +
                  (r.repaired ? " repaired" : " lost");
          break;
        case ReportKind::kRestart:
          line += " " + std::to_string(r.seq) + " after " + std::to_string(r.previous);
          break;
        case ReportKind::kDecodeError:
          line += " " + r.message;
          break;
      }
      if (!r.topic.empty()) line = r.topic + ": " + line;
      std::lock_guard lock(mu_);
      lines_.push_back(line);
    };
  }
  std::vector<std::string> Lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return lines_.size();
  }
  void Clear() {
    std::lock_guard lock(mu_);
    lines_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

using V = std::vector<std::string>;

std::unique_ptr<Publisher> StartPublisher(bool replay, size_t buffer = 10000,
                                          ReplayReplyForm form = ReplayReplyForm::kTopicSeqPayload,
                                          std::string endpoint = "tcp://127.0.0.1:*",
                                          std::string topic = "") {
  PublisherOptions o;
  o.endpoint = endpoint;
  if (replay) o.replay_endpoint = "tcp://127.0.0.1:*";
  o.buffer_steps = buffer;
  o.replay_form = form;
  o.topic = topic;
  Result<std::unique_ptr<Publisher>> p = Publisher::Start(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

// PUB/SUB drops what is published before the subscription reaches the publisher: publish
// warm-up batches (tag 0) until one arrives, then start from a clean slate.
void Connect(Publisher& pub, Collector& got) {
  ASSERT_TRUE(WaitFor([&] {
    pub.Publish(Tagged(0));
    return WaitFor([&] { return got.size() > 0; }, std::chrono::milliseconds(50));
  }));
  pub.Flush();
}

TEST(KvEventsPubSub, InOrderDeliveryAndCounters) {
  auto pub = StartPublisher(false);
  Subscriber sub;
  Collector got;
  ASSERT_TRUE(sub.AddEndpoint("pod", pub->endpoint(), "", got.Callback()).ok());
  Connect(*pub, got);
  ASSERT_TRUE(WaitFor([&] { return sub.Counters("pod")->last_seq == pub->Counters().published - 1; }));
  const size_t warm = got.size();
  got.Clear();
  const uint64_t first = pub->Publish(Tagged(11));
  pub->Publish(Tagged(12));
  ASSERT_TRUE(WaitFor([&] { return got.size() == 2; }));
  EXPECT_EQ(got.Lines(), (V{"batch " + std::to_string(first) + " tag=11",
                            "batch " + std::to_string(first + 1) + " tag=12"}));
  const SubscriberCounters c = *sub.Counters("pod");
  EXPECT_EQ(c.batches, warm + 2);
  EXPECT_EQ(c.events_removed, c.batches);
  EXPECT_EQ(c.gaps, 0u);
  EXPECT_EQ(c.last_seq, first + 1);
  EXPECT_FALSE(sub.Counters("nobody").has_value());
}

class ReplayForms : public ::testing::TestWithParam<ReplayReplyForm> {};

TEST_P(ReplayForms, GapRepairedByReplay) {
  auto pub = StartPublisher(true, 10000, GetParam());
  Subscriber sub;
  Collector got;
  ASSERT_TRUE(sub.AddEndpoint("pod", pub->endpoint(), pub->replay_endpoint(), got.Callback()).ok());
  Connect(*pub, got);
  ASSERT_TRUE(WaitFor([&] { return sub.Counters("pod")->last_seq == pub->Counters().published - 1; }));
  got.Clear();
  const uint64_t a = pub->Publish(Tagged(1));
  pub->Publish(Tagged(2), SendMode::kBufferOnly);  // lost on PUB, kept for replay
  pub->Publish(Tagged(3), SendMode::kBufferOnly);
  pub->Publish(Tagged(4));
  ASSERT_TRUE(WaitFor([&] { return got.size() == 5; })) << ::testing::PrintToString(got.Lines());
  const auto s = [&](uint64_t k) { return std::to_string(a + k); };
  EXPECT_EQ(got.Lines(), (V{"batch " + s(0) + " tag=1", "replayed " + s(1) + " tag=2",
                            "replayed " + s(2) + " tag=3", "replayed " + s(3) + " tag=4",
                            "gap " + s(1) + "-" + s(3) + " repaired"}));
  const SubscriberCounters c = *sub.Counters("pod");
  EXPECT_EQ(c.gaps, 1u);
  EXPECT_EQ(c.gaps_repaired, 1u);
  EXPECT_EQ(c.replay_requests, 1u);
  EXPECT_EQ(c.replayed, 3u);
  EXPECT_EQ(c.duplicates, 1u);  // the live seq that showed the gap, replayed first
  EXPECT_EQ(pub->Counters().replay_requests, 1u);
}

INSTANTIATE_TEST_SUITE_P(BothReplyForms, ReplayForms,
                         ::testing::Values(ReplayReplyForm::kTopicSeqPayload,
                                           ReplayReplyForm::kSeqPayload),
                         [](const auto& info) {
                           return info.param == ReplayReplyForm::kSeqPayload ? "OldSeqPayload"
                                                                             : "TopicSeqPayload";
                         });

TEST(KvEventsPubSub, GapBeyondTheReplayBufferIsReportedUnrepaired) {
  auto pub = StartPublisher(true, /*buffer=*/2);
  Subscriber sub;
  Collector got;
  ASSERT_TRUE(sub.AddEndpoint("pod", pub->endpoint(), pub->replay_endpoint(), got.Callback()).ok());
  Connect(*pub, got);
  ASSERT_TRUE(WaitFor([&] { return sub.Counters("pod")->last_seq == pub->Counters().published - 1; }));
  got.Clear();
  const uint64_t a = pub->Publish(Tagged(1));
  for (int i = 0; i < 4; ++i) pub->Publish(Tagged(10 + i), SendMode::kBufferOnly);
  pub->Publish(Tagged(5));  // the buffer now holds only a+4 and a+5
  ASSERT_TRUE(WaitFor([&] { return got.size() == 4; })) << ::testing::PrintToString(got.Lines());
  const auto s = [&](uint64_t k) { return std::to_string(a + k); };
  EXPECT_EQ(got.Lines(), (V{"batch " + s(0) + " tag=1", "replayed " + s(4) + " tag=13",
                            "replayed " + s(5) + " tag=5", "gap " + s(1) + "-" + s(5) + " lost"}));
}

TEST(KvEventsPubSub, ReplayTimeoutLeavesTheGapUnrepaired) {
  auto pub = StartPublisher(false);
  // A ROUTER that never answers.
  zmq::context_t ctx;
  zmq::socket_t silent(ctx, zmq::socket_type::router);
  silent.set(zmq::sockopt::linger, 0);
  silent.bind("tcp://127.0.0.1:*");
  SubscriberOptions o;
  o.replay_timeout = std::chrono::milliseconds(100);
  Subscriber sub(o);
  Collector got;
  ASSERT_TRUE(sub.AddEndpoint("pod", pub->endpoint(), silent.get(zmq::sockopt::last_endpoint),
                              got.Callback()).ok());
  Connect(*pub, got);
  ASSERT_TRUE(WaitFor([&] { return sub.Counters("pod")->last_seq == pub->Counters().published - 1; }));
  got.Clear();
  const uint64_t a = pub->Publish(Tagged(1), SendMode::kBufferOnly);
  pub->Publish(Tagged(2));
  ASSERT_TRUE(WaitFor([&] { return got.size() == 2; }));
  EXPECT_EQ(got.Lines(), (V{"gap " + std::to_string(a) + "-" + std::to_string(a + 1) + " lost",
                            "batch " + std::to_string(a + 1) + " tag=2"}));
}

TEST(KvEventsPubSub, PublisherRestartIsDetected) {
  auto pub = StartPublisher(false, 10000, ReplayReplyForm::kTopicSeqPayload, "tcp://127.0.0.1:*");
  const std::string endpoint = pub->endpoint();
  Subscriber sub;
  Collector got;
  ASSERT_TRUE(sub.AddEndpoint("pod", endpoint, "", got.Callback()).ok());
  Connect(*pub, got);
  // The old stream ends well above anything the new one reaches before the subscriber
  // reconnects (one batch every 50 ms below, for at most 5 s): seq alone tells a restart
  // only when the new stream comes back at or below the old one's last seq.
  for (int i = 0; i < 200; ++i) pub->Publish(Tagged(0));
  ASSERT_TRUE(WaitFor([&] { return sub.Counters("pod")->last_seq == pub->Counters().published - 1; }));
  const uint64_t last = *sub.Counters("pod")->last_seq;
  ASSERT_GE(last, 200u);
  pub.reset();
  got.Clear();
  // A new publisher instance on the same port: seq starts again at 0.
  pub = StartPublisher(false, 10000, ReplayReplyForm::kTopicSeqPayload,
                       "tcp://*:" + endpoint.substr(endpoint.rfind(':') + 1));
  ASSERT_NE(pub, nullptr);
  ASSERT_TRUE(WaitFor([&] {
    pub->Publish(Tagged(9));
    return WaitFor([&] { return got.size() > 0; }, std::chrono::milliseconds(50));
  }));
  const V lines = got.Lines();
  ASSERT_GE(lines.size(), 1u);
  EXPECT_TRUE(lines[0].starts_with("restart ")) << lines[0];
  EXPECT_TRUE(lines[0].ends_with(" after " + std::to_string(last))) << lines[0];
  EXPECT_EQ(sub.Counters("pod")->restarts, 1u);
}

TEST(KvEventsPubSub, MalformedMessagesAreReportedNotFatal) {
  auto pub = StartPublisher(false);
  Subscriber sub;
  Collector got;
  ASSERT_TRUE(sub.AddEndpoint("pod", pub->endpoint(), "", got.Callback()).ok());
  Connect(*pub, got);
  ASSERT_TRUE(WaitFor([&] { return sub.Counters("pod")->last_seq == pub->Counters().published - 1; }));
  got.Clear();
  const uint64_t a = pub->PublishPayload("\x93\xcb");  // truncated msgpack
  pub->Publish(Tagged(5));
  ASSERT_TRUE(WaitFor([&] { return got.size() == 2; }));
  EXPECT_EQ(got.Lines(),
            (V{"decode_error seq " + std::to_string(a) +
                   ": not one complete msgpack value (truncated or malformed)",
               "batch " + std::to_string(a + 1) + " tag=5"}));
  EXPECT_EQ(sub.Counters("pod")->decode_errors, 1u);
}

TEST(KvEventsPubSub, CentralizedModeTellsPublishersApartByTopic) {
  Subscriber sub;
  Collector got;
  Result<std::string> bound = sub.AddBound("central", "tcp://127.0.0.1:*", got.Callback());
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  // Publishers with a host in the endpoint connect (ShouldBind is false).
  auto a = StartPublisher(false, 10000, ReplayReplyForm::kTopicSeqPayload, *bound,
                          "kv@10.0.0.1@llama");
  auto b = StartPublisher(false, 10000, ReplayReplyForm::kTopicSeqPayload, *bound,
                          "kv@10.0.0.2@llama");
  auto other = StartPublisher(false, 10000, ReplayReplyForm::kTopicSeqPayload, *bound, "metrics");
  ASSERT_TRUE(a && b && other);
  EXPECT_EQ(a->endpoint(), *bound);
  // Each publisher's first batch may be lost until it has connected: publish until seen.
  for (Publisher* p : {a.get(), b.get()}) {
    const std::string topic = p->options().topic;
    ASSERT_TRUE(WaitFor([&] {
      p->Publish(Tagged(0));
      other->Publish(Tagged(0));
      return WaitFor([&] {
        for (const auto& l : got.Lines()) if (l.starts_with(topic)) return true;
        return false;
      }, std::chrono::milliseconds(50));
    }));
  }
  a->Flush();
  b->Flush();
  got.Clear();
  const uint64_t sa = a->Publish(Tagged(100));
  const uint64_t sb = b->Publish(Tagged(200));
  ASSERT_TRUE(WaitFor([&] { return got.size() == 2; }));
  V lines = got.Lines();
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (V{"kv@10.0.0.1@llama: batch " + std::to_string(sa) + " tag=100",
                      "kv@10.0.0.2@llama: batch " + std::to_string(sb) + " tag=200"}));
  for (const auto& l : got.Lines()) EXPECT_FALSE(l.starts_with("metrics"));
  EXPECT_EQ(sub.Counters("central")->gaps, 0u);
  EXPECT_TRUE(sub.Remove("central").ok());
  EXPECT_EQ(sub.Remove("central").code(), StatusCode::kNotFound);
}

TEST(KvEventsPubSub, BindErrorsAndStopAreClean) {
  auto pub = StartPublisher(false);
  PublisherOptions o;
  o.endpoint = "tcp://*:" + pub->endpoint().substr(pub->endpoint().rfind(':') + 1);
  Result<std::unique_ptr<Publisher>> clash = Publisher::Start(o);
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(clash.status().message().find("Address already in use"), std::string::npos)
      << clash.status().message();
  Subscriber sub;
  Collector got;
  EXPECT_EQ(sub.AddEndpoint("x", "nonsense://", "", got.Callback()).code(), StatusCode::kUnavailable);
  ASSERT_TRUE(sub.AddEndpoint("x", pub->endpoint(), "", got.Callback()).ok());
  EXPECT_EQ(sub.AddEndpoint("x", pub->endpoint(), "", got.Callback()).code(),
            StatusCode::kInvalidArgument);
  sub.Stop();
  sub.Stop();
  EXPECT_EQ(sub.AddEndpoint("y", pub->endpoint(), "", got.Callback()).code(),
            StatusCode::kFailedPrecondition);
  pub->Stop();
  pub->Publish(Tagged(1));  // after Stop: a seq, nothing sent, no crash
}

TEST(KvEventsWire, BindRuleAndSeqFrames) {
  EXPECT_TRUE(ShouldBind("tcp://*:5557"));
  EXPECT_TRUE(ShouldBind("tcp://[::]:5557"));
  EXPECT_TRUE(ShouldBind("ipc:///tmp/kv"));
  EXPECT_TRUE(ShouldBind("inproc://kv"));
  EXPECT_FALSE(ShouldBind("tcp://10.0.0.1:5557"));
  EXPECT_EQ(SeqFrame(0x0102030405060708ULL),
            (std::array<uint8_t, 8>{1, 2, 3, 4, 5, 6, 7, 8}));
  const std::array<uint8_t, 8> end = SeqFrame(kEndMarkerSeq);
  EXPECT_EQ(end, (std::array<uint8_t, 8>{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}));
  EXPECT_EQ(ParseSeqFrame(end.data()), kEndMarkerSeq);
}

}  // namespace
}  // namespace kvroute::kvevents
