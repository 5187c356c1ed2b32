#include "core/sched/inflight_tracker.h"

#include <gtest/gtest.h>

namespace kvroute::sched {
namespace {

EndpointState Ep(uint32_t id, double kv, double waiting, double running) {
  EndpointState e;
  e.id = id;
  e.kv_usage = kv;
  e.waiting = waiting;
  e.running = running;
  return e;
}

TEST(InflightTracker, PendingAddsToScrapedUntilAScrapeCoversIt) {
  InflightTracker t;
  const EndpointState e = Ep(0, 0.2, 1, 3);
  t.OnScrape(0, 0.5);
  t.Add(/*slot=*/0, /*endpoint=*/0, /*now=*/1.0, /*blocks=*/10);
  EndpointLoad l = t.Load(e, 100, true);
  EXPECT_DOUBLE_EQ(l.kv_usage, 0.3);
  EXPECT_DOUBLE_EQ(l.waiting, 2);
  EXPECT_DOUBLE_EQ(l.running, 3);
  EXPECT_EQ(l.inflight, 1u);

  t.MarkStarted(0);
  l = t.Load(e, 100, true);
  EXPECT_DOUBLE_EQ(l.waiting, 1);
  EXPECT_DOUBLE_EQ(l.running, 4);
  EXPECT_DOUBLE_EQ(l.kv_usage, 0.3);

  t.OnScrape(0, 0.9);  // taken before the dispatch: still pending
  EXPECT_EQ(t.PendingStarted(0), 1u);
  t.OnScrape(0, 1.0);  // taken at the dispatch: counted by the scrape now
  l = t.Load(e, 100, true);
  EXPECT_DOUBLE_EQ(l.kv_usage, 0.2);
  EXPECT_DOUBLE_EQ(l.waiting, 1);
  EXPECT_DOUBLE_EQ(l.running, 3);
  EXPECT_EQ(l.inflight, 1u);
  EXPECT_DOUBLE_EQ(l.active_blocks, 10);
}

TEST(InflightTracker, CountedRequestFinishingIsReleasedUntilNextScrape) {
  InflightTracker t;
  const EndpointState e = Ep(0, 0.5, 0, 2);
  t.Add(0, 0, 1.0, 20);
  t.OnScrape(0, 2.0);
  t.Remove(0, 3.0);
  EndpointLoad l = t.Load(e, 100, true);
  EXPECT_DOUBLE_EQ(l.kv_usage, 0.3);
  EXPECT_DOUBLE_EQ(l.running, 1);
  EXPECT_EQ(l.inflight, 0u);
  t.OnScrape(0, 2.5);  // taken before the finish: still shows the blocks
  EXPECT_DOUBLE_EQ(t.ReleasedBlocks(0), 20);
  t.OnScrape(0, 3.5);
  EXPECT_DOUBLE_EQ(t.ReleasedBlocks(0), 0);
  EXPECT_DOUBLE_EQ(t.Load(e, 100, true).kv_usage, 0.5);
}

TEST(InflightTracker, PendingRequestFinishingBeforeAnyScrapeLeavesNothing) {
  InflightTracker t;
  t.OnScrape(0, 0.0);
  t.Add(0, 0, 1.0, 5);
  t.Add(1, 0, 1.1, 7);
  EXPECT_DOUBLE_EQ(t.PendingBlocks(0), 12);
  t.Remove(0, 1.2);
  EXPECT_DOUBLE_EQ(t.PendingBlocks(0), 7);
  EXPECT_EQ(t.PendingNotStarted(0), 1u);
  EXPECT_EQ(t.ReleasedCount(0), 0u);
  t.Remove(1, 1.3);
  EXPECT_DOUBLE_EQ(t.PendingBlocks(0), 0);
  EXPECT_EQ(t.InFlight(0), 0u);
}

TEST(InflightTracker, DispatchBeforeLastScrapeTimeCountsAsCovered) {
  InflightTracker t;
  t.OnScrape(2, 5.0);
  t.Add(0, 2, 4.0, 5);  // a late notification of an older dispatch
  EXPECT_EQ(t.PendingNotStarted(2), 0u);
  EXPECT_EQ(t.InFlight(2), 1u);
}

TEST(InflightTracker, ScrapeCoversOnlyOlderDispatches) {
  InflightTracker t;
  t.Add(0, 1, 1.0, 1);
  t.Add(1, 1, 2.0, 2);
  t.Add(2, 1, 3.0, 4);
  t.OnScrape(1, 2.5);
  EXPECT_EQ(t.PendingNotStarted(1), 1u);
  EXPECT_DOUBLE_EQ(t.PendingBlocks(1), 4);
  EXPECT_DOUBLE_EQ(t.ActiveBlocks(1), 7);
}

TEST(InflightTracker, UnadjustedLoadIsTheScrape) {
  InflightTracker t;
  t.Add(0, 0, 1.0, 50);
  const EndpointLoad l = t.Load(Ep(0, 0.4, 2, 3), 100, false);
  EXPECT_DOUBLE_EQ(l.kv_usage, 0.4);
  EXPECT_DOUBLE_EQ(l.waiting, 2);
  EXPECT_DOUBLE_EQ(l.running, 3);
  EXPECT_EQ(l.inflight, 1u);
}

TEST(InflightTracker, MovingASlotReleasesTheOldEndpoint) {
  InflightTracker t;
  t.Add(0, 0, 1.0, 5);
  t.Add(0, 1, 1.5, 5);
  EXPECT_EQ(t.InFlight(0), 0u);
  EXPECT_EQ(t.InFlight(1), 1u);
  EXPECT_EQ(t.EndpointOf(0), 1u);
}

}  // namespace
}  // namespace kvroute::sched
