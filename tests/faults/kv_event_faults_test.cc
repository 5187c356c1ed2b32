// The fault matrix's KV-event rows (issue 23): the event-stream faults of `kvroute sim`
// (events_stall, events_drop) and a publisher restart (`restart`), under steady traffic
// through `kvroute serve` routing precisely (pool.kv_events configured, prompts tokenized
// through the replicas' POST /tokenize). As in fault_matrix_test.cc every request sent is
// classified, and none may be lost: each is answered 200 with a complete body (for the
// restart, a request cut in flight may also end in the documented OpenAI-shaped 502/503/
// 504). Each case also checks what the fault does to the subscriber, on /metrics:
// kvroute_kv_events_state, gaps (repaired by replay), restarts, route receipts.
//
// Settings are short (stale_after 300ms, resync 300ms, faults of 1-2 s); the only sleeps
// pace the traffic, every other wait polls with a generous deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "metrics/metric_sum.h"
#include "config/router_config.h"
#include "core/engine/tokenizer.h"
#include "adapters/http/test_client.h"
#include "apps/serve/router.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/kv_events_fleet.h"
#include "support/wait.h"

namespace kvroute {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using http::Fetch;
using metrics::testing::MetricSum;
using test_support::CompletionBody;
using test_support::WaitFor;

constexpr int kReplicas = 3;
constexpr int kClients = 3;
constexpr int kGroups = 6;  // shared contexts the traffic cycles through

std::string Prompt(const std::string& tag, int tokens) { return test_support::TokensPrompt(tag, tokens); }

// Request i: one of kGroups shared 256-token contexts (16 blocks), then a 48-token
// question of its own (3 new full blocks), so every request needs new blocks and most
// hit a cached prefix somewhere: what precise routing decides on.
std::string TrafficPrompt(int i) {
  return Prompt("context" + std::to_string(i % kGroups), 256) +
         Prompt("question" + std::to_string(i), 48);
}

bool IsOpenAiError(const std::string& json, int code) {
  return json.rfind("{\"error\":{\"message\":\"", 0) == 0 &&
         json.find("\"code\":" + std::to_string(code) + "}}") != std::string::npos;
}

struct Tally {
  int sent = 0, ok = 0, errored = 0, bad = 0;
  std::vector<std::string> bad_examples;
};

class KvEventFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    // Real time (~6 ms a step), so requests and batches overlap the faults.
    fleet_ = test_support::StartPublishingFleet(kReplicas, {.kv_blocks = 2048, .time_scale = 1.0});
    ASSERT_TRUE(fleet_);
    std::string y =
        "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n"
        "  kv_events: {speculative_ttl: 100ms, stale_after: 300ms, resync: 300ms}\n  endpoints:\n" +
        test_support::EventsEndpointsYaml(*fleet_);
    y += "scheduling:\n  policy: kvroute\n"
         "timeouts: {connect: 200ms, first_byte: 3s, idle: 2s}\n"
         "retries: {max_attempts: 3}\n";
    config::ConfigOr<config::RouterConfig> cfg = config::ParseRouterConfig(y, "kv-faults.yaml");
    ASSERT_TRUE(cfg.ok()) << cfg.error.ToString() << "\n" << y;
    router::RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = std::getenv("KVROUTE_FAULT_LOG") != nullptr;
    router_ = std::make_unique<router::Router>(std::move(*cfg.value), o);
    ASSERT_TRUE(router_->Start().ok());
    WaitAllLive();
  }

  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    fleet_.reset();
  }

  std::string Metrics() {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    return r && r->status == 200 ? r->body : std::string();
  }
  double Of(const std::string& m, const std::string& name, const std::string& ep = "r0") {
    return MetricSum(m, name, {{"endpoint", ep}});
  }
  bool IsState(const std::string& m, const std::string& state, const std::string& ep = "r0") {
    return MetricSum(m, "kvroute_kv_events_state", {{"endpoint", ep}, {"state", state}}) == 1;
  }

  // Directly to replica i, not through the router.
  void Direct(int i, const std::string& prompt) {
    auto r = Fetch("127.0.0.1", fleet_->port(i), "POST", "/v1/completions",
                   CompletionBody(prompt, 1), {}, 10s);
    ASSERT_TRUE(r && r->status == 200);
  }

  // Replica i's events are live in the router: fresh prompts go to it directly until the
  // router has applied one of its batches (a SUB misses what precedes its subscription).
  bool WaitLive(int i, std::chrono::milliseconds limit = 20000ms) {
    return WaitFor(
        [&] {
          if (IsState(Metrics(), "live", "r" + std::to_string(i))) return true;
          Direct(i, Prompt("warm" + std::to_string(warm_++), 40));
          return false;
        },
        limit, 20ms);
  }
  void WaitAllLive() {
    ASSERT_TRUE(
        WaitFor([&] { return MetricSum(Metrics(), "kvroute_endpoint_metrics_fresh") == kReplicas; },
                20000ms));
    for (int i = 0; i < kReplicas; ++i) ASSERT_TRUE(WaitLive(i)) << "r" << i << " never live";
  }

  // Clients send non-streamed requests back to back until `stop`, 5 ms apart each.
  void Traffic(std::atomic<bool>& stop, Tally& tally, std::mutex& mu) {
    std::vector<std::thread> clients;
    std::atomic<int> next{0};
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&] {
        while (!stop.load()) {
          const int i = next.fetch_add(1);
          auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions",
                         CompletionBody(TrafficPrompt(i), 4), {}, 15s);
          {
            std::lock_guard<std::mutex> lock(mu);
            ++tally.sent;
            if (r && r->status == 200 && r->body.find("\"choices\":[") != std::string::npos) {
              ++tally.ok;
            } else if (r && (r->status == 502 || r->status == 503 || r->status == 504) &&
                       IsOpenAiError(r->body, r->status)) {
              ++tally.errored;
            } else {
              ++tally.bad;
              if (tally.bad_examples.size() < 5) {
                tally.bad_examples.push_back(r ? "status " + std::to_string(r->status) + ": " +
                                                     r->body.substr(0, 200)
                                               : "no answer within the client's timeout");
              }
            }
          }
          std::this_thread::sleep_for(5ms);  // pace: leave the loaded machine some room
        }
      });
    }
    for (auto& t : clients) t.join();
  }

  std::string Examples(const Tally& t) {
    std::string s;
    for (const auto& b : t.bad_examples) s += "\n  " + b;
    return s;
  }

  void Inject(const std::string& body) {
    auto r = Fetch("127.0.0.1", fleet_->port(0), "POST", "/admin/fault", body);
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->status, 200) << r->body;
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<router::Router> router_;
  int warm_ = 0;
};

// (a) events_stall: r0 publishes nothing while work needing new blocks keeps reaching
// it, so it turns stale (approximate model) within stale_after; when the stall ends its
// next batch shows the gap, replay fills it, and r0 is live again.
TEST_F(KvEventFaults, EventsStallTurnsStaleThenLiveAgainByReplay) {
  Tally tally;
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::thread traffic([&] { Traffic(stop, tally, mu); });
  std::this_thread::sleep_for(300ms);  // steady traffic first
  const std::string before = Metrics();
  Inject(R"({"kind":"events_stall","duration":"1500ms"})");
  const auto start = Clock::now();
  bool saw_stale = false;
  while (Clock::now() < start + 1500ms) {
    if (IsState(Metrics(), "stale")) saw_stale = true;
    // Batches r0 computes meanwhile get their seq and are never sent: the gap to repair.
    Direct(0, Prompt("during-stall" + std::to_string(warm_++), 40));
    std::this_thread::sleep_for(20ms);
  }
  // After the stall: the gap is seen and repaired, r0 is live again (traffic still on).
  bool live = WaitFor(
      [&] {
        const std::string m = Metrics();
        return IsState(m, "live") &&
               Of(m, "kvroute_kv_events_gaps_total") > Of(before, "kvroute_kv_events_gaps_total");
      },
      20000ms, 20ms);
  stop = true;
  traffic.join();
  const std::string after = Metrics();
  EXPECT_TRUE(saw_stale) << "r0 was never stale during the stall";
  EXPECT_TRUE(live) << "r0 not live again with a gap seen after the stall";
  EXPECT_GT(Of(after, "kvroute_kv_events_gaps_total"), Of(before, "kvroute_kv_events_gaps_total"));
  EXPECT_GT(Of(after, "kvroute_kv_events_replays_total"),
            Of(before, "kvroute_kv_events_replays_total"));
  EXPECT_EQ(MetricSum(after, "kvroute_kv_events_gaps_unrepaired_total"), 0);
  EXPECT_EQ(tally.bad, 0) << Examples(tally);
  EXPECT_EQ(tally.errored, 0);
  EXPECT_EQ(tally.sent, tally.ok);
  EXPECT_GT(tally.sent, 20);
  std::printf("events_stall: %d requests, all 200; gaps %.0f, replays %.0f\n", tally.sent,
              Of(after, "kvroute_kv_events_gaps_total"),
              Of(after, "kvroute_kv_events_replays_total"));
}

// (b) events_drop 0.1: a tenth of r0's batches never arrive; each loss is a gap the next
// batch reveals and replay fills, so r0 stays live and the route receipts stay right.
TEST_F(KvEventFaults, EventsDropRepairedByReplayStaysLive) {
  Tally tally;
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::thread traffic([&] { Traffic(stop, tally, mu); });
  std::this_thread::sleep_for(300ms);
  const std::string before = Metrics();
  Inject(R"({"kind":"events_drop","fraction":0.1,"seed":7,"duration":"2s"})");
  const auto start = Clock::now();
  std::vector<std::string> not_live;
  while (Clock::now() < start + 2s) {
    const std::string m = Metrics();
    if (!IsState(m, "live")) {
      for (const char* s : {"unknown", "stale", "resync", "mismatch"}) {
        if (IsState(m, s)) not_live.push_back(s);
      }
    }
    // Batches of r0's own (one at least a request) besides the traffic's: enough of them
    // that some are dropped whatever seqs the run reaches.
    Direct(0, Prompt("during-drop" + std::to_string(warm_++), 40));
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(300ms);  // traffic after the fault: the last loss is revealed
  stop = true;
  traffic.join();
  // Replays still under way when traffic stops finish within the replay timeout.
  std::string after;
  WaitFor(
      [&] {
        after = Metrics();
        return Of(after, "kvroute_kv_events_gaps_total") >
               Of(before, "kvroute_kv_events_gaps_total");
      },
      10000ms, 20ms);
  EXPECT_TRUE(IsState(after, "live"));
  EXPECT_TRUE(not_live.empty()) << "r0 left live: " << not_live.front();
  EXPECT_GT(Of(after, "kvroute_kv_events_gaps_total"), Of(before, "kvroute_kv_events_gaps_total"));
  EXPECT_GT(Of(after, "kvroute_kv_events_replays_total"),
            Of(before, "kvroute_kv_events_replays_total"));
  EXPECT_EQ(MetricSum(after, "kvroute_kv_events_gaps_unrepaired_total"), 0);
  EXPECT_EQ(tally.bad, 0) << Examples(tally);
  EXPECT_EQ(tally.errored, 0);
  EXPECT_EQ(tally.sent, tally.ok);
  EXPECT_GT(tally.sent, 20);
  const double receipts = MetricSum(after, "kvroute_route_receipts_total") -
                          MetricSum(before, "kvroute_route_receipts_total");
  const double wrong = MetricSum(after, "kvroute_route_receipts_mispredicted_total") -
                       MetricSum(before, "kvroute_route_receipts_mispredicted_total");
  std::printf(
      "events_drop 0.1: %d requests, all 200; gaps %.0f, replays %.0f; receipts %.0f, mispredicted "
      "%.0f\n",
      tally.sent, Of(after, "kvroute_kv_events_gaps_total"),
      Of(after, "kvroute_kv_events_replays_total"), receipts, wrong);
  EXPECT_GT(receipts, 20);
  EXPECT_LE(wrong, 0.1 * receipts)
      << "route receipts mispredicted: " << wrong << " of " << receipts;
}

// (c) restart: r0's publisher starts again at seq 0 with a new hash seed. The subscriber
// sees the sequence go back (or passes through resync), drops r0's entries, and r0 is
// live again; a prompt then computed on r0 directly draws the router's next request with
// that prefix there.
TEST_F(KvEventFaults, PublisherRestartDropsEntriesThenRoutesPrecisely) {
  Tally tally;
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::thread traffic([&] { Traffic(stop, tally, mu); });
  std::this_thread::sleep_for(300ms);
  const std::string before = Metrics();
  ASSERT_EQ(Of(before, "kvroute_kv_events_restarts_total"), 0);
  ASSERT_GT(Of(before, "kvroute_kv_events_blocks"), 0);
  Inject(R"({"kind":"restart"})");
  bool saw_resync = false;
  const bool noticed = WaitFor(
      [&] {
        const std::string m = Metrics();
        if (IsState(m, "resync")) saw_resync = true;
        return Of(m, "kvroute_kv_events_restarts_total") >= 1 || saw_resync;
      },
      20000ms, 10ms);
  std::this_thread::sleep_for(500ms);  // traffic after the restart
  stop = true;
  traffic.join();
  EXPECT_TRUE(noticed) << "the publisher restart went unnoticed";
  const double restarts = Of(Metrics(), "kvroute_kv_events_restarts_total");
  EXPECT_TRUE(restarts == 1 || (restarts == 0 && saw_resync)) << restarts;
  EXPECT_EQ(tally.bad, 0) << Examples(tally);
  EXPECT_EQ(tally.sent, tally.ok + tally.errored);
  EXPECT_GT(tally.sent, 20);

  // Live again, and precise: a long prompt computed on r0 after the restart.
  ASSERT_TRUE(WaitLive(0)) << "r0 not live again after the restart";
  const std::string p = Prompt("after-restart", 800);  // 50 blocks
  const double blocks = Of(Metrics(), "kvroute_kv_events_blocks");
  Direct(0, p);
  ASSERT_TRUE(WaitFor([&] { return Of(Metrics(), "kvroute_kv_events_blocks") >= blocks + 49; },
                      20000ms, 10ms));
  auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions",
                 CompletionBody(p + " and a question", 1), {}, 15s);
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(r->Header("x-kvroute-endpoint"), "r0");
  std::printf("restart: %d requests, %d ok, %d documented errors; restarts %.0f, resync seen %d\n",
              tally.sent, tally.ok, tally.errored, restarts, saw_resync ? 1 : 0);
}

}  // namespace
}  // namespace kvroute
