// Health as pure logic, driven in virtual time (no clock, no sleeps).
#include "core/health/endpoint_health.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvroute::health {
namespace {

using metrics::EngineMetrics;

EngineMetrics Calm() {
  EngineMetrics m;
  m.kv_usage = 0.31;
  m.waiting = 0;
  m.running = 4;
  m.present = EngineMetrics::kKvUsage | EngineMetrics::kWaiting | EngineMetrics::kRunning;
  return m;
}

TEST(EndpointHealth, NeverScrapedIsLastResortUnderExclude) {
  EndpointHealth h;
  Verdict v = h.Assess(0.0, {2.0, StalePolicy::kExclude});
  EXPECT_EQ(v.condition, Condition::kNeverScraped);
  EXPECT_EQ(v.treatment, Treatment::kLastResort);
  EXPECT_FALSE(v.Known(Signal::kKvUsage));
  EXPECT_EQ(h.Assess(0.0, {2.0, StalePolicy::kSaturated}).treatment, Treatment::kSaturated);
  EXPECT_TRUE(std::isinf(h.NextChange({2.0, StalePolicy::kExclude})));
}

TEST(EndpointHealth, FreshUntilStalenessThenStaleByPolicy) {
  EndpointHealth h;
  h.OnScrape(Calm(), 10.0);
  const HealthOptions exclude{2.0, StalePolicy::kExclude};
  const HealthOptions saturated{2.0, StalePolicy::kSaturated};
  EXPECT_EQ(h.Assess(10.5, exclude).treatment, Treatment::kNormal);
  EXPECT_EQ(h.Assess(12.0, exclude).condition, Condition::kUp);  // exactly at the bound
  EXPECT_EQ(h.NextChange(exclude), 12.0);
  Verdict late = h.Assess(12.001, exclude);
  EXPECT_EQ(late.condition, Condition::kStale);
  EXPECT_EQ(late.treatment, Treatment::kLastResort);
  EXPECT_TRUE(late.Known(Signal::kKvUsage));  // the value is known, just old
  EXPECT_EQ(h.Assess(12.001, saturated).treatment, Treatment::kSaturated);
  h.OnScrape(Calm(), 12.5);
  EXPECT_EQ(h.Assess(13.0, exclude).treatment, Treatment::kNormal);
}

TEST(EndpointHealth, FailedScrapeWithoutConnectErrorIsStaleAtOnce) {
  EndpointHealth h;
  h.OnScrape(Calm(), 1.0);
  h.OnScrapeFailed(1.05, /*connect_failed=*/false);
  Verdict v = h.Assess(1.06, {2.0, StalePolicy::kExclude});
  EXPECT_EQ(v.condition, Condition::kStale);
  EXPECT_EQ(v.treatment, Treatment::kLastResort);
  EXPECT_TRUE(std::isinf(h.NextChange({2.0, StalePolicy::kExclude})));
}

TEST(EndpointHealth, ConnectFailuresMakeItDownUntilAGoodScrape) {
  EndpointHealth h;
  h.OnScrape(Calm(), 1.0);
  h.OnConnectFailed(1.1);
  EXPECT_EQ(h.Assess(1.2, {2.0, StalePolicy::kSaturated}).treatment, Treatment::kDown);
  h.OnScrapeFailed(1.15, /*connect_failed=*/true);
  EXPECT_EQ(h.Assess(1.2, {2.0, StalePolicy::kExclude}).condition, Condition::kDown);
  h.OnScrape(Calm(), 1.3);
  EXPECT_EQ(h.Assess(1.35, {2.0, StalePolicy::kExclude}).treatment, Treatment::kNormal);
}

TEST(EndpointHealth, UnknownSignalIsNeverNormal) {
  const HealthOptions exclude{2.0, StalePolicy::kExclude};
  for (auto missing : {EngineMetrics::kKvUsage, EngineMetrics::kWaiting}) {
    EndpointHealth h;
    EngineMetrics m = Calm();
    m.present &= ~missing;
    m.invalid |= missing;
    h.OnScrape(m, 0.0);
    Verdict v = h.Assess(0.1, exclude);
    EXPECT_EQ(v.condition, Condition::kUp);
    EXPECT_EQ(v.treatment, Treatment::kLastResort) << missing;
    EXPECT_EQ(h.Assess(0.1, {2.0, StalePolicy::kSaturated}).treatment, Treatment::kSaturated);
  }
  // Running unknown alone does not disqualify: the load signals are KV and the queue.
  EndpointHealth h;
  EngineMetrics m = Calm();
  m.present &= ~EngineMetrics::kRunning;
  h.OnScrape(m, 0.0);
  Verdict v = h.Assess(0.1, exclude);
  EXPECT_EQ(v.treatment, Treatment::kNormal);
  EXPECT_FALSE(v.Known(Signal::kRunning));
}

TEST(EndpointHealth, AGoodScrapeAfterGarbageRestoresTheSignal) {
  EndpointHealth h;
  EngineMetrics bad = Calm();
  bad.present &= ~EngineMetrics::kKvUsage;
  h.OnScrape(bad, 0.0);
  EXPECT_FALSE(h.Assess(0.0, {}).Known(Signal::kKvUsage));
  h.OnScrape(Calm(), 0.05);
  Verdict v = h.Assess(0.06, {});
  EXPECT_TRUE(v.Known(Signal::kKvUsage));
  EXPECT_EQ(h.kv_usage(), 0.31);
}

TEST(EndpointHealth, Names) {
  EXPECT_EQ(ConditionName(Condition::kStale), "stale");
  EXPECT_EQ(TreatmentName(Treatment::kLastResort), "last_resort");
  EXPECT_EQ(SignalName(Signal::kWaiting), "waiting");
}

}  // namespace
}  // namespace kvroute::health
