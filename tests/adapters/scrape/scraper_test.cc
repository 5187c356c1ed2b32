// Loopback tests of the Prometheus scraper: real HTTP to a real server on port 0 that
// serves what each test scripts (a vLLM fixture, an error, garbage, a slow answer).
// Every wait is bounded.
#include "adapters/scrape/scraper.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "metrics/testdata_util.h"
#include "adapters/http/io_pool.h"
#include "support/stub_server.h"
#include "support/wait.h"

namespace kvroute::metrics {
namespace {

using namespace std::chrono_literals;
using testing::kV010;
using testing::ReadTestdata;

constexpr const char* kLoad =
    "vllm:num_requests_running 1.0\nvllm:num_requests_waiting 2.0\nvllm:kv_cache_usage_perc 0.5\n";

using kvroute::test_support::WaitFor;

using kvroute::test_support::ClosedPort;

// Serves GET /metrics with a scripted status and body, optionally after a delay.
using kvroute::test_support::StubUpstream;

// The scraper on its own event loop, with a recording OnScrape.
class ScraperTest : public ::testing::Test {
 protected:
  ScraperTest() : pool_(1) { pool_.Start(); }
  ~ScraperTest() override {
    if (scraper_) scraper_->Stop();
    pool_.Stop();
  }

  void Make(std::vector<ScrapeTarget> targets, ScraperOptions options = {}) {
    options.timeout_s = std::min(options.timeout_s, 1.0);
    scraper_ = std::make_unique<MetricsScraper>(
        pool_.context(0), std::move(targets), std::move(options),
        [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); },
        [this](uint32_t i, const EndpointSnapshot& s) {
          std::lock_guard<std::mutex> lock(mu_);
          scraped_.push_back(i);
          scraped_ok_.push_back(s.ok);
        });
  }

  // ScrapeAll and wait (bounded) for its callback. Returns whether it was called.
  bool ScrapeAllAndWait(std::chrono::milliseconds limit = 5000ms) {
    auto called = std::make_shared<std::promise<void>>();
    std::future<void> f = called->get_future();
    scraper_->ScrapeAll([called] { called->set_value(); });
    return f.wait_for(limit) == std::future_status::ready;
  }

  std::vector<uint32_t> Scraped() {
    std::lock_guard<std::mutex> lock(mu_);
    return scraped_;
  }

  static ScrapeTarget Loopback(uint16_t port) { return {"127.0.0.1", port}; }

  http::IoPool pool_;
  std::unique_ptr<MetricsScraper> scraper_;
  std::mutex mu_;
  std::vector<uint32_t> scraped_;
  std::vector<bool> scraped_ok_;
};

TEST_F(ScraperTest, SnapshotOfTheVllmV010Fixture) {
  StubUpstream server;
  server.ServeMetrics(200, ReadTestdata(kV010));
  Make({Loopback(server.port())});
  EXPECT_FALSE(scraper_->Snapshot(0)->ok);  // nothing is scraped before Start/ScrapeAll
  EXPECT_EQ(server.metrics_requests(), 0);

  ASSERT_TRUE(ScrapeAllAndWait());
  auto s = scraper_->Snapshot(0);
  EXPECT_TRUE(s->ok) << s->error;
  EXPECT_FALSE(s->down);
  EXPECT_EQ(s->error, "");
  EXPECT_EQ(s->last_error, http::UpstreamError::kNone);
  EXPECT_EQ(s->metrics.running, 41.0);
  EXPECT_EQ(s->metrics.waiting, 132.0);
  EXPECT_EQ(s->metrics.kv_usage, 0.9812345679012346);
  // The raw counters ride along for callers that take deltas (the load generator).
  EXPECT_EQ(s->metrics.prefix_queries, 82634112.0);
  EXPECT_EQ(s->metrics.prefix_hits, 5784384.0);
  EXPECT_EQ(s->metrics.preemptions, 1874.0);
  EXPECT_EQ(s->metrics.num_gpu_blocks, 26304);
  EXPECT_EQ(s->metrics.block_size, 16);
  EXPECT_EQ(s->successes, 1u);
  EXPECT_EQ(s->failures, 0u);
  EXPECT_GE(s->scraped_at_s, 0.0);
  EXPECT_EQ(s->scraped_at_s, s->attempted_at_s);
  EXPECT_GE(s->Age(s->scraped_at_s + 1.5), 1.5);
  EXPECT_EQ(Scraped(), std::vector<uint32_t>{0});
}

TEST_F(ScraperTest, ModelFilterAppliesToTheFixture) {
  StubUpstream server;
  server.ServeMetrics(200, ReadTestdata(kV010));
  ScraperOptions o;
  o.model = "other-model";
  Make({Loopback(server.port())}, o);
  ASSERT_TRUE(ScrapeAllAndWait());
  auto s = scraper_->Snapshot(0);
  EXPECT_FALSE(s->ok);
  EXPECT_EQ(s->error, "no kv-usage/waiting/running series in the exposition");
  EXPECT_EQ(s->failures, 1u);
}

TEST_F(ScraperTest, FailedAttemptKeepsTheLastGoodValues) {
  StubUpstream server;
  server.ServeMetrics(200, ReadTestdata(kV010));
  Make({Loopback(server.port())});
  ASSERT_TRUE(ScrapeAllAndWait());
  const double good_at = scraper_->Snapshot(0)->scraped_at_s;

  server.ServeMetrics(500, "boom");
  ASSERT_TRUE(ScrapeAllAndWait());
  auto s = scraper_->Snapshot(0);
  EXPECT_FALSE(s->ok);
  EXPECT_FALSE(s->down);  // it answered
  EXPECT_EQ(s->error, "status 500");
  EXPECT_EQ(s->metrics.running, 41.0);  // kept
  EXPECT_EQ(s->scraped_at_s, good_at);
  EXPECT_GT(s->attempted_at_s, good_at);
  EXPECT_EQ(s->successes, 1u);
  EXPECT_EQ(s->failures, 1u);

  server.ServeMetrics(200, "this is not\nprometheus {{{\n");
  ASSERT_TRUE(ScrapeAllAndWait());
  s = scraper_->Snapshot(0);
  EXPECT_FALSE(s->ok);
  EXPECT_FALSE(s->error.empty());
  EXPECT_EQ(s->metrics.waiting, 132.0);
  EXPECT_EQ(s->failures, 2u);

  server.ServeMetrics(200, kLoad);
  ASSERT_TRUE(ScrapeAllAndWait());
  s = scraper_->Snapshot(0);
  EXPECT_TRUE(s->ok);
  EXPECT_EQ(s->error, "");
  EXPECT_EQ(s->metrics.running, 1.0);
  EXPECT_EQ(s->metrics.kv_usage, 0.5);
  EXPECT_EQ(s->successes, 2u);
}

TEST_F(ScraperTest, RefusedConnectionMarksTheEndpointDown) {
  Make({Loopback(ClosedPort())});
  ASSERT_TRUE(ScrapeAllAndWait());
  auto s = scraper_->Snapshot(0);
  EXPECT_FALSE(s->ok);
  EXPECT_TRUE(s->down);
  EXPECT_TRUE(http::IsConnectError(s->last_error));
  EXPECT_FALSE(s->error.empty());
  EXPECT_TRUE(std::isinf(s->Age(1e9)));
  EXPECT_EQ(s->failures, 1u);
}

TEST_F(ScraperTest, OversizedExpositionFails) {
  StubUpstream server;
  server.ServeMetrics(200, std::string(kLoad) + std::string(4096, '#'));
  ScraperOptions o;
  o.max_body_bytes = 1024;
  Make({Loopback(server.port())}, o);
  ASSERT_TRUE(ScrapeAllAndWait());
  auto s = scraper_->Snapshot(0);
  EXPECT_FALSE(s->ok);
  EXPECT_EQ(s->error, "exposition larger than 1024 bytes");
}

TEST_F(ScraperTest, SlowEndpointTimesOut) {
  StubUpstream server;
  server.ServeMetrics(200, kLoad, 2000ms);
  ScraperOptions o;
  o.timeout_s = 0.1;
  Make({Loopback(server.port())}, o);
  ASSERT_TRUE(ScrapeAllAndWait());
  auto s = scraper_->Snapshot(0);
  EXPECT_FALSE(s->ok);
  EXPECT_FALSE(s->down);
  EXPECT_EQ(s->last_error, http::UpstreamError::kFirstByteTimeout);
}

TEST_F(ScraperTest, ScrapeAllWaitsForEveryEndpoint) {
  StubUpstream fast(StubUpstream::Mode::kOk, kLoad), slow;
  slow.ServeMetrics(200, ReadTestdata(kV010), 150ms);
  Make({Loopback(fast.port()), Loopback(ClosedPort()), Loopback(slow.port())});
  ASSERT_TRUE(ScrapeAllAndWait());
  // Every endpoint reported (OnScrape first) before the round's callback.
  std::vector<uint32_t> seen = Scraped();
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_TRUE(scraper_->Snapshot(0)->ok);
  EXPECT_TRUE(scraper_->Snapshot(1)->down);
  EXPECT_TRUE(scraper_->Snapshot(2)->ok);
  EXPECT_EQ(scraper_->Snapshot(2)->metrics.waiting, 132.0);
}

TEST_F(ScraperTest, ScrapeAllDuringAnAttemptInFlightWaitsForAFreshOne) {
  StubUpstream server;
  server.ServeMetrics(200, "vllm:num_requests_running 1\n", 200ms);
  Make({Loopback(server.port())});
  auto first = std::make_shared<std::promise<void>>();
  std::future<void> first_done = first->get_future();
  scraper_->ScrapeAll([first] { first->set_value(); });
  ASSERT_TRUE(WaitFor([&] { return server.metrics_requests() == 1; }));
  // The first request is being answered; what the server says from now on differs.
  server.ServeMetrics(200, "vllm:num_requests_running 2\n");
  ASSERT_TRUE(ScrapeAllAndWait());
  EXPECT_EQ(first_done.wait_for(0ms), std::future_status::ready);
  EXPECT_EQ(server.metrics_requests(), 2);
  auto s = scraper_->Snapshot(0);
  EXPECT_EQ(s->metrics.running, 2.0);
  EXPECT_EQ(s->successes, 2u);
}

TEST_F(ScraperTest, ScrapeAllWithoutEndpointsCallsBack) {
  Make({});
  EXPECT_EQ(scraper_->size(), 0u);
  EXPECT_TRUE(ScrapeAllAndWait());
}

TEST_F(ScraperTest, StartScrapesOnTheInterval) {
  StubUpstream server;
  server.ServeMetrics(200, ReadTestdata(kV010));
  ScraperOptions o;
  o.interval_s = 0.01;
  Make({Loopback(server.port())}, o);
  scraper_->Start();
  ASSERT_TRUE(WaitFor([&] { return scraper_->Snapshot(0)->successes >= 5; }));
  EXPECT_EQ(scraper_->Snapshot(0)->failures, 0u);
  scraper_->Stop();
  // Stop: nothing more is published and ScrapeAll no longer calls back.
  std::this_thread::sleep_for(30ms);
  const uint64_t n = scraper_->Snapshot(0)->successes;
  EXPECT_FALSE(ScrapeAllAndWait(100ms));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(scraper_->Snapshot(0)->successes, n);
}

}  // namespace
}  // namespace kvroute::metrics

namespace kvroute::metrics {
namespace {

// Each successful scrape times its request to the response head (measured round trips
// for locality); the first also opened the connection, later ones reuse it.
TEST_F(ScraperTest, TimesTheRoundTripAndSaysWhenItOpenedTheConnection) {
  StubUpstream server;
  server.ServeMetrics(200, kLoad, 60ms);
  Make({Loopback(server.port())});
  ASSERT_TRUE(ScrapeAllAndWait());
  auto s = scraper_->Snapshot(0);
  ASSERT_TRUE(s->ok) << s->error;
  EXPECT_TRUE(s->round_trip_connected);
  EXPECT_GE(s->round_trip_s, 0.06);
  ASSERT_TRUE(ScrapeAllAndWait());
  s = scraper_->Snapshot(0);
  ASSERT_TRUE(s->ok) << s->error;
  EXPECT_FALSE(s->round_trip_connected);
  EXPECT_GE(s->round_trip_s, 0.06);
  EXPECT_LT(s->round_trip_s, 1.0);
}

}  // namespace
}  // namespace kvroute::metrics
