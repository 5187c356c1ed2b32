// `kvroute sim` replicas publishing KV-cache events, read by the project's subscriber and
// by a python3-zmq + python3-msgpack subscriber, over loopback.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/engine/engine.h"
#include "core/engine/tokenizer.h"
#include "adapters/http/test_client.h"
#include "adapters/kvevents/subscriber.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/test_paths.h"
#include "support/wait.h"

namespace kvroute::sim {
namespace {

using kvevents::Report;
using kvevents::ReportKind;
using test_support::WaitFor;

// A prompt of exactly `tokens` tokens, distinct per `n`.
std::string Prompt(int n, int tokens) {
  std::string s = "p" + std::to_string(n) + "-";
  while (s.size() < static_cast<size_t>(tokens) * engine::kBytesPerToken) s += 'x';
  s.resize(static_cast<size_t>(tokens) * engine::kBytesPerToken);
  return s;
}

class SimKvEvents : public ::testing::Test {
 protected:
  void StartFleet(const std::string& format = "array", const std::string& hash = "int") {
    ReplicaConfig r = test_support::SimReplica({.name = "r0"});
    r.kv_events.port = 0;
    r.kv_events.replay_port = 0;
    r.kv_events.format = format;
    r.kv_events.hash = hash;
    fleet_ = std::make_unique<Fleet>(std::vector<ReplicaConfig>{r}, 1);
    ASSERT_TRUE(fleet_->Start().ok());
    ASSERT_FALSE(fleet_->kv_events_endpoint(0).empty());
  }
  void Subscribe() {
    ASSERT_TRUE(sub_.AddEndpoint("r0", fleet_->kv_events_endpoint(0),
                                 fleet_->kv_events_replay_endpoint(0),
                                 [this](const Report& r) {
                                   std::lock_guard lock(mu_);
                                   reports_.push_back(r);
                                 }).ok());
    WarmUp();
  }
  // Until the subscription has reached the publisher: completions with fresh prompts.
  void WarmUp() {
    ASSERT_TRUE(WaitFor([&] {
      Post("/v1/completions", test_support::CompletionBody(Prompt(warm_++, 20), 1));
      return WaitFor([&] { return Count() > 0; }, std::chrono::milliseconds(100));
    }));
    Clear();
  }
  std::optional<http::ClientResponse> Post(std::string_view path, std::string_view body) {
    return http::Fetch("127.0.0.1", fleet_->port(0), "POST", path, body);
  }
  size_t Count() {
    std::lock_guard lock(mu_);
    return reports_.size();
  }
  std::vector<Report> Reports() {
    std::lock_guard lock(mu_);
    return reports_;
  }
  void Clear() {
    std::lock_guard lock(mu_);
    reports_.clear();
  }
  // The first BlockStored event whose token ids are `tokens`' first full blocks.
  std::optional<kvevents::KvEvent> StoredFor(const std::vector<uint32_t>& tokens) {
    for (const Report& r : Reports()) {
      for (const auto& e : r.batch.events) {
        if (e.kind == kvevents::EventKind::kBlockStored && !e.token_ids.empty() &&
            std::equal(e.token_ids.begin(), e.token_ids.end(), tokens.begin())) {
          return e;
        }
      }
    }
    return std::nullopt;
  }

  kvevents::Subscriber sub_;
  std::unique_ptr<Fleet> fleet_;
  std::mutex mu_;
  std::vector<Report> reports_;
  int warm_ = 0;
};

TEST_F(SimKvEvents, CompletionPublishesTheExactBlockStored) {
  StartFleet();
  Subscribe();
  const std::string prompt = Prompt(1000, 40);  // 2 full blocks of 16 and 8 tokens more
  const std::vector<uint32_t> tokens = engine::Tokenize(prompt);
  ASSERT_EQ(tokens.size(), 40u);
  auto res = Post("/v1/completions", test_support::CompletionBody(prompt, 1));
  ASSERT_TRUE(res && res->status == 200);
  ASSERT_TRUE(WaitFor([&] { return StoredFor(tokens).has_value(); }));
  const kvevents::KvEvent e = *StoredFor(tokens);
  const uint64_t h0 = engine::BlockHash(0, std::span(tokens).first(16), "", "");
  const uint64_t h1 = engine::BlockHash(h0, std::span(tokens).subspan(16, 16), "", "");
  EXPECT_EQ(e.block_hashes, (std::vector<uint64_t>{h0, h1}));
  EXPECT_EQ(e.token_ids, std::vector<uint32_t>(tokens.begin(), tokens.begin() + 32));
  EXPECT_EQ(e.block_size, 16);
  EXPECT_FALSE(e.parent_hash.has_value());
  EXPECT_EQ(e.medium, kvevents::Medium::kGpu);
  for (const Report& r : Reports()) {
    EXPECT_EQ(r.kind, ReportKind::kBatch);
    EXPECT_EQ(r.batch.data_parallel_rank, 0);
    EXPECT_GT(r.batch.ts, 1.7e9);
  }
  // POST /reset_prefix_cache: 200, empty body, then AllBlocksCleared.
  Clear();
  res = Post("/reset_prefix_cache", "");
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "");
  ASSERT_TRUE(WaitFor([&] { return Count() == 1; }));
  ASSERT_EQ(Reports()[0].batch.events.size(), 1u);
  EXPECT_EQ(Reports()[0].batch.events[0].kind, kvevents::EventKind::kAllBlocksCleared);
}

TEST_F(SimKvEvents, RestartStartsSeqAtZeroWithNewHashes) {
  StartFleet("map", "bytes");
  Subscribe();
  const std::string prompt = Prompt(2000, 33);
  const std::vector<uint32_t> tokens = engine::Tokenize(prompt);
  ASSERT_TRUE(Post("/v1/completions", test_support::CompletionBody(prompt, 1)));
  ASSERT_TRUE(WaitFor([&] { return StoredFor(tokens).has_value(); }));
  const std::vector<uint64_t> before = StoredFor(tokens)->block_hashes;
  ASSERT_EQ(before.size(), 2u);
  // Seq alone tells a restart only when the new stream comes back below the old one's
  // last seq (no event says so): let the old stream run ahead of what a reconnect loses.
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Post("/v1/completions", test_support::CompletionBody(Prompt(warm_++, 20), 1)));
  }
  ASSERT_TRUE(WaitFor([&] { return sub_.Counters("r0")->last_seq >= 20u; }));
  Clear();
  auto res = Post("/admin/fault", R"({"kind":"restart"})");
  ASSERT_TRUE(res && res->status == 200);
  // The SUB socket reconnects by itself; publish until the new stream is seen.
  ASSERT_TRUE(WaitFor([&] {
    Post("/v1/completions", test_support::CompletionBody(Prompt(warm_++, 20), 1));
    return WaitFor([&] {
      for (const Report& r : Reports()) if (r.kind == ReportKind::kRestart) return true;
      return false;
    }, std::chrono::milliseconds(100));
  })) << [&] {
    std::string s;
    for (const Report& r : Reports()) s += std::string(kvevents::ReportKindName(r.kind)) + " " + std::to_string(r.seq) + "; ";
    return s;
  }();
  std::optional<Report> restart;
  for (const Report& r : Reports()) if (r.kind == ReportKind::kRestart) restart = r;
  EXPECT_GE(restart->previous, restart->seq);  // seq went back (or repeated)
  EXPECT_EQ(sub_.Counters("r0")->restarts, 1u) << [&] {
    std::string s;
    for (const Report& r : Reports()) s += std::string(kvevents::ReportKindName(r.kind)) + " " + std::to_string(r.seq) + "/" + std::to_string(r.previous) + "; ";
    return s;
  }();
  if (restart->seq > 0) {  // its first batches were lost while reconnecting: replayed
    ASSERT_TRUE(WaitFor([&] {
      for (const Report& r : Reports()) if (r.kind == ReportKind::kGap) return r.repaired;
      return false;
    }));
  }
  // The restarted stream is whole from seq 0 (replayed when its first batches were lost).
  std::vector<uint64_t> seqs;
  bool after_restart = false;  // the old stream's last batches may land after Clear
  for (const Report& r : Reports()) {
    after_restart = after_restart || r.kind == ReportKind::kRestart;
    if (after_restart && (r.kind == ReportKind::kBatch || r.kind == ReportKind::kReplayed)) {
      seqs.push_back(r.seq);
    }
  }
  ASSERT_FALSE(seqs.empty());
  EXPECT_EQ(seqs.front(), 0u);
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i);
  Clear();
  ASSERT_TRUE(Post("/v1/completions", test_support::CompletionBody(prompt, 1)));
  ASSERT_TRUE(WaitFor([&] { return StoredFor(tokens).has_value(); }));
  const std::vector<uint64_t> after = StoredFor(tokens)->block_hashes;
  ASSERT_EQ(after.size(), 2u);
  EXPECT_NE(after[0], before[0]);
  EXPECT_NE(after[1], before[1]);
}

TEST_F(SimKvEvents, DroppedBatchesAreRepairedByReplay) {
  StartFleet();
  Subscribe();
  auto res = Post("/admin/fault", R"({"kind":"events_drop","fraction":1,"seed":3})");
  ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "");
  const std::string lost = Prompt(3000, 17);
  const std::vector<uint32_t> lost_tokens = engine::Tokenize(lost);
  ASSERT_TRUE(Post("/v1/completions", test_support::CompletionBody(lost, 1)));
  ASSERT_TRUE(http::Fetch("127.0.0.1", fleet_->port(0), "DELETE", "/admin/fault?kind=events_drop"));
  const std::string next = Prompt(3001, 17);
  ASSERT_TRUE(Post("/v1/completions", test_support::CompletionBody(next, 1)));
  ASSERT_TRUE(WaitFor([&] {
    for (const Report& r : Reports()) if (r.kind == ReportKind::kGap) return true;
    return false;
  }));
  const std::vector<Report> got = Reports();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].kind, ReportKind::kReplayed);  // the dropped batch
  EXPECT_EQ(got[1].kind, ReportKind::kReplayed);  // the live one that showed the gap
  EXPECT_EQ(got[2].kind, ReportKind::kGap);
  EXPECT_TRUE(got[2].repaired);
  EXPECT_EQ(got[2].gap_to, got[2].gap_from + 1);
  EXPECT_TRUE(StoredFor(lost_tokens).has_value());
}

TEST_F(SimKvEvents, PythonSubscriberDecodesTheSimsEvents) {
  StartFleet();
  const std::string cmd = "/usr/bin/python3 " + test_support::SourceDir() +
                          "/tests/apps/sim/py_kv_subscriber.py " + fleet_->kv_events_endpoint(0);
  FILE* py = popen(cmd.c_str(), "r");
  ASSERT_NE(py, nullptr);
  char line[256];
  ASSERT_NE(fgets(line, sizeof line, py), nullptr);
  ASSERT_STREQ(line, "ready\n");
  std::atomic<bool> done{false};
  std::thread sender([&] {
    for (int n = 0; !done && n < 400; ++n) {
      Post("/v1/completions", test_support::CompletionBody(Prompt(4000 + n, 40), 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // pacing, not timing logic
    }
  });
  std::string out;
  while (fgets(line, sizeof line, py) != nullptr) out += line;
  done = true;
  sender.join();
  EXPECT_EQ(pclose(py), 0) << out;
  EXPECT_TRUE(out.starts_with("BlockStored 2 32 16 nil\n")) << out;
  EXPECT_NE(out.find("rank 0\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvroute::sim
