// Passive outlier ejection as pure logic, in virtual time.
#include "core/health/outlier.h"

#include <gtest/gtest.h>

namespace kvroute::health {
namespace {

TEST(Outlier, PanicThresholdNeverEjectsTheLastEndpoints) {
  OutlierOptions o;  // 50%
  EXPECT_EQ(MaxEjected(1, o), 0u);  // a pool of one is never ejected
  EXPECT_EQ(MaxEjected(2, o), 1u);
  EXPECT_EQ(MaxEjected(3, o), 1u);
  EXPECT_EQ(MaxEjected(8, o), 4u);
  o.max_ejection_percent = 10;
  EXPECT_EQ(MaxEjected(8, o), 1u);   // at least one of two or more
  EXPECT_EQ(MaxEjected(30, o), 3u);
  o.max_ejection_percent = 100;
  EXPECT_EQ(MaxEjected(4, o), 3u);   // never all of them
  o.consecutive_failures = 0;
  EXPECT_EQ(MaxEjected(8, o), 0u);   // detection off
  o = OutlierOptions{};
  EXPECT_TRUE(EjectionAllowed(3, 8, o));
  EXPECT_FALSE(EjectionAllowed(4, 8, o));
}

TEST(Outlier, EjectionDoublesWithRepeatsAndIsCappedAtTheMaximum) {
  OutlierOptions o;
  o.base_ejection_s = 5;
  o.max_ejection_s = 30;
  Ejection e;
  EXPECT_FALSE(e.Active(0.0));
  EXPECT_DOUBLE_EQ(e.Eject(100.0, o), 105.0);  // 5 s
  EXPECT_TRUE(e.Active(104.9));
  EXPECT_FALSE(e.Active(105.0));
  EXPECT_DOUBLE_EQ(e.Eject(106.0, o), 116.0);  // failed again 1 s after: 10 s
  EXPECT_DOUBLE_EQ(e.Eject(117.0, o), 137.0);  // 20 s
  EXPECT_DOUBLE_EQ(e.Eject(138.0, o), 168.0);  // 40 s capped at 30
  EXPECT_EQ(e.count(), 4u);
  EXPECT_EQ(e.level(), 4);
}

TEST(Outlier, LevelDecaysOneStepPerBaseEjectionOfCalm) {
  OutlierOptions o;
  o.base_ejection_s = 5;
  Ejection e;
  e.Eject(0.0, o);    // 5 s, ends at 5
  e.Eject(5.0, o);    // 10 s, ends at 15; level 2
  EXPECT_EQ(e.level(), 2);
  // 10 s of calm after the ejection ended: two steps down, back to the base time.
  EXPECT_DOUBLE_EQ(e.Eject(25.0, o), 30.0);
  EXPECT_EQ(e.level(), 1);
  // 4.9 s of calm: no step down yet, so 10 s.
  EXPECT_DOUBLE_EQ(e.Eject(34.9, o), 44.9);
}

}  // namespace
}  // namespace kvroute::health
