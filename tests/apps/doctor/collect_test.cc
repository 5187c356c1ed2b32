// Collect over loopback: in-process kvroute sim replicas on port 0, ports nobody listens
// on, a listener that never answers, and a stub that serves an HTML page. Round counts are
// exact (rounds are on a fixed grid that catches up when late), so nothing here depends on
// how loaded the machine is; the one timing assertion has a wide margin.
#include "apps/doctor/collect.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "adapters/http/test_client.h"
#include "support/sim_replica.h"
#include "support/stub_server.h"

namespace kvroute::doctor {
namespace {

using namespace std::chrono_literals;
using kvroute::test_support::ClosedPort;
using kvroute::test_support::kTestModel;
using kvroute::test_support::SilentListener;
using kvroute::test_support::SimReplica;
using kvroute::test_support::StubUpstream;

class CollectTest : public ::testing::Test {
 protected:
  void StartFleet(int n) {
    std::vector<sim::ReplicaConfig> rs(n, SimReplica());
    fleet_ = std::make_unique<sim::Fleet>(std::move(rs), 1);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  Target SimTarget(int i) const {
    return Target{"sim-" + std::to_string(i), "127.0.0.1", fleet_->port(i)};
  }
  std::unique_ptr<sim::Fleet> fleet_;
};

TEST_F(CollectTest, ScrapesEveryReplicaEachRoundWithIncreasingTimes) {
  StartFleet(2);
  CollectOptions o;
  o.targets = {SimTarget(0), SimTarget(1)};
  o.window_s = 0.6;
  o.interval_s = 0.2;
  int rounds = 0;
  o.on_round = [&](const std::vector<ReplicaHistory>& h) {
    ++rounds;
    ASSERT_EQ(h.size(), 2u);
    EXPECT_EQ(h[0].scrapes.size(), static_cast<size_t>(rounds));
  };
  const std::vector<ReplicaHistory> got = Collect(o);
  // 0, 0.2, 0.4 and 0.6 (the window's end).
  EXPECT_EQ(rounds, 4);
  ASSERT_EQ(got.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const ReplicaHistory& h = got[i];
    EXPECT_EQ(h.name, "sim-" + std::to_string(i));
    EXPECT_EQ(h.address, "127.0.0.1:" + std::to_string(fleet_->port(i)));
    ASSERT_EQ(h.scrapes.size(), 4u);
    for (size_t k = 0; k < h.scrapes.size(); ++k) {
      const Scrape& s = h.scrapes[k];
      EXPECT_TRUE(s.reachable) << s.error;
      EXPECT_TRUE(s.any_engine_series);
      EXPECT_TRUE(s.garbage.empty()) << s.garbage.front();
      EXPECT_EQ(s.num_gpu_blocks, 512);
      EXPECT_EQ(s.prefix_caching, true);
      EXPECT_EQ(s.model, kTestModel);
      ASSERT_TRUE(s.kv_usage.has_value());
      EXPECT_GE(s.t_s, 0.0);
      // Rounds start on the grid; a round's scrape is read after its start.
      EXPECT_GE(s.t_s, 0.2 * static_cast<double>(k) - 1e-6);
      if (k > 0) {
        EXPECT_GT(s.t_s, h.scrapes[k - 1].t_s);
      }
    }
  }
  // The window is covered: the last round begins at its end (the read comes after).
  EXPECT_GE(got[0].scrapes.back().t_s, 0.6);
}

TEST_F(CollectTest, CountersMoveWithTrafficBetweenRounds) {
  StartFleet(1);
  CollectOptions o;
  o.targets = {SimTarget(0)};
  o.window_s = 0.2;
  o.interval_s = 0.2;
  // Requests between the two rounds, sent from the round callback (the caller's thread).
  o.on_round = [&](const std::vector<ReplicaHistory>& h) {
    if (h[0].scrapes.size() != 1) return;
    for (int i = 0; i < 3; ++i) {
      auto r =
          http::Fetch("127.0.0.1", fleet_->port(0), "POST", "/v1/completions",
                      std::string("{\"model\":\"") + std::string(kTestModel) +
                          "\",\"prompt\":\"the same long shared prefix, said again and again\","
                          "\"max_tokens\":4}");
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->status, 200) << r->body;
    }
  };
  const std::vector<ReplicaHistory> got = Collect(o);
  ASSERT_EQ(got[0].scrapes.size(), 2u);
  const Scrape& a = got[0].scrapes[0];
  const Scrape& b = got[0].scrapes[1];
  ASSERT_TRUE(a.requests_finished && b.requests_finished);
  EXPECT_EQ(*b.requests_finished - *a.requests_finished, 3.0);
  ASSERT_TRUE(a.prefix_queries && b.prefix_queries && a.generation_tokens && b.generation_tokens);
  EXPECT_GT(*b.prefix_queries, *a.prefix_queries);
  EXPECT_EQ(*b.generation_tokens - *a.generation_tokens, 12.0);
  EXPECT_EQ(b.output_len.count - a.output_len.count, 3.0);
}

TEST_F(CollectTest, WindowZeroScrapesOnce) {
  StartFleet(1);
  CollectOptions o;
  o.targets = {SimTarget(0)};
  o.window_s = 0;
  const std::vector<ReplicaHistory> got = Collect(o);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].scrapes.size(), 1u);
  EXPECT_TRUE(got[0].scrapes[0].reachable);
}

TEST_F(CollectTest, RefusedPortIsAFailedScrapeAndAnUnreachableFinding) {
  StartFleet(1);
  const uint16_t closed = ClosedPort();
  CollectOptions o;
  o.targets = {SimTarget(0), Target{"", "127.0.0.1", closed}};
  o.window_s = 0.2;
  o.interval_s = 0.1;
  const std::vector<ReplicaHistory> got = Collect(o);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].name, "127.0.0.1:" + std::to_string(closed));  // unnamed: the address
  ASSERT_EQ(got[1].scrapes.size(), 3u);
  for (const Scrape& s : got[1].scrapes) {
    EXPECT_FALSE(s.reachable);
    EXPECT_NE(s.error.find("refused"), std::string::npos) << s.error;
    EXPECT_NE(s.error.find(std::to_string(closed)), std::string::npos) << s.error;
  }
  const Report r = Diagnose(got, DoctorOptions{});
  EXPECT_TRUE(r.readable);
  EXPECT_EQ(r.ExitCode(), 1);
  bool found = false;
  for (const Finding& f : r.findings) {
    if (f.rule != "unreachable") continue;
    found = true;
    EXPECT_EQ(f.replicas, std::vector<std::string>{got[1].name});
    EXPECT_FALSE(f.routing);
  }
  EXPECT_TRUE(found);
}

TEST_F(CollectTest, NothingReachableIsExitTwo) {
  CollectOptions o;
  o.targets = {Target{"a", "127.0.0.1", ClosedPort()}, Target{"b", "127.0.0.1", ClosedPort()}};
  o.window_s = 0;
  const Report r = Diagnose(Collect(o), DoctorOptions{});
  EXPECT_FALSE(r.readable);
  EXPECT_EQ(r.ExitCode(), 2);
}

// Twenty replicas that accept the connection and never answer: one round takes one
// timeout, not twenty.
TEST_F(CollectTest, SilentReplicasTimeOutTogether) {
  SilentListener silent(64);  // the kernel completes handshakes into the backlog; nobody reads
  const uint16_t port = silent.port();
  CollectOptions o;
  for (int i = 0; i < 20; ++i)
    o.targets.push_back(Target{"silent-" + std::to_string(i), "127.0.0.1", port});
  o.window_s = 0;
  o.timeout_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<ReplicaHistory> got = Collect(o);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(got.size(), 20u);
  for (const ReplicaHistory& h : got) {
    ASSERT_EQ(h.scrapes.size(), 1u);
    EXPECT_FALSE(h.scrapes[0].reachable);
    EXPECT_NE(h.scrapes[0].error.find("300ms"), std::string::npos) << h.scrapes[0].error;
  }
  // Sequential would be 6 s; concurrent is 0.3 s. 3 s leaves a loaded machine room.
  EXPECT_LT(took, 3.0);
}

TEST_F(CollectTest, HtmlPageIsReadButIsNotVllm) {
  StubUpstream html(StubUpstream::Mode::kOk,
                    "<!doctype html><html><body><h1>Welcome to nginx!</h1></body></html>\n",
                    "text/html");
  CollectOptions o;
  o.targets = {Target{"web", "127.0.0.1", html.port()}};
  o.window_s = 0;
  const std::vector<ReplicaHistory> got = Collect(o);
  ASSERT_EQ(got[0].scrapes.size(), 1u);
  EXPECT_TRUE(got[0].scrapes[0].reachable);
  EXPECT_FALSE(got[0].scrapes[0].any_engine_series);
  const Report r = Diagnose(got, DoctorOptions{});
  EXPECT_EQ(r.ExitCode(), 2);  // nothing readable
  bool not_vllm = false;
  for (const Finding& f : r.findings) not_vllm |= f.rule == "not-vllm";
  EXPECT_TRUE(not_vllm);
}

TEST_F(CollectTest, BodyOverTheLimitIsAFailedScrape) {
  StartFleet(1);
  CollectOptions o;
  o.targets = {SimTarget(0)};
  o.window_s = 0;
  o.max_body_bytes = 1000;  // the sim's exposition is several KB
  const std::vector<ReplicaHistory> got = Collect(o);
  ASSERT_EQ(got[0].scrapes.size(), 1u);
  EXPECT_FALSE(got[0].scrapes[0].reachable);
  EXPECT_NE(got[0].scrapes[0].error.find("larger than 1000 bytes"), std::string::npos)
      << got[0].scrapes[0].error;
}

TEST_F(CollectTest, StopFlagEndsTheWindowEarly) {
  StartFleet(1);
  std::atomic<bool> stop{false};
  CollectOptions o;
  o.targets = {SimTarget(0)};
  o.window_s = 600;
  o.interval_s = 0.05;
  o.stop = &stop;
  int rounds = 0;
  o.on_round = [&](const std::vector<ReplicaHistory>&) {
    if (++rounds == 3) stop.store(true);
  };
  const std::vector<ReplicaHistory> got = Collect(o);
  EXPECT_EQ(rounds, 3);
  EXPECT_EQ(got[0].scrapes.size(), 3u);
}

TEST_F(CollectTest, KeepHoldsOnlyTheLastWindowInStep) {
  StartFleet(2);
  std::atomic<bool> stop{false};
  CollectOptions o;
  o.targets = {SimTarget(0), SimTarget(1), Target{"down", "127.0.0.1", ClosedPort()}};
  o.window_s = std::numeric_limits<double>::infinity();
  o.interval_s = 0.05;
  o.keep_s = 0.1;
  o.stop = &stop;
  int rounds = 0;
  o.on_round = [&](const std::vector<ReplicaHistory>& h) {
    // Whole rounds are dropped: every history holds the same rounds.
    ASSERT_EQ(h[0].scrapes.size(), h[1].scrapes.size());
    ASSERT_EQ(h[0].scrapes.size(), h[2].scrapes.size());
    const std::vector<Scrape>& s = h[0].scrapes;
    ASSERT_FALSE(s.empty());
    // Rounds at most keep_s apart; a read lands after its round began (margin for that).
    EXPECT_LE(s.back().t_s - s.front().t_s, 0.1 + 1.0);
    if (++rounds == 12) stop.store(true);
  };
  const std::vector<ReplicaHistory> got = Collect(o);
  EXPECT_EQ(rounds, 12);
  EXPECT_LT(got[0].scrapes.size(), 12u);
}

}  // namespace
}  // namespace kvroute::doctor
