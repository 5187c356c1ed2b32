// The tpot-guard-filter (issue 43): endpoints whose requests lately decoded slower than the
// request's TPOT objective allows are dropped, by measurement (LatencyTrainer::RecentTpot),
// unless all of them are; unknown (too few or too old measurements) is kept.
#include "core/sched/plugins/tpot_guard_filter/tpot_guard_filter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/sched/latency_trainer.h"
#include "core/sched/sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;
using testing::MustBuild;
using testing::Plugin;
using testing::Req;
using testing::SpecOf;

RequestHandle H(uint32_t slot, uint32_t gen) { return (uint64_t{gen} << 32) | slot; }

// Finishes `n` streamed requests of 11 tokens on `endpoint`, each decoding at `tpot`,
// the last at `end_s`.
void Finish(LatencyTrainer& t, uint32_t endpoint, int n, double tpot, double end_s) {
  static uint32_t gen = 1;
  for (int i = 0; i < n; ++i) {
    LatencyTrainer::Dispatch d;
    d.endpoint = endpoint;
    d.prompt_tokens = 100;
    d.uncached_tokens = 100;
    const double first = end_s - 10 * tpot;
    t.OnDispatched(H(endpoint, ++gen), d, first - 0.01);
    t.OnFirstToken(H(endpoint, gen), first);
    t.OnFinished(H(endpoint, gen), 11, end_s);
  }
}

TEST(LatencyTrainer, RecentTpotIsMeasuredFreshAndUnknownOtherwise) {
  LatencyTrainer t;
  EXPECT_FALSE(t.RecentTpot(0, 0.0, 2.0, 1).has_value());  // never seen
  Finish(t, 0, 3, 0.040, 1.0);
  ASSERT_TRUE(t.RecentTpot(0, 1.0, 2.0, 3).has_value());
  EXPECT_NEAR(*t.RecentTpot(0, 1.0, 2.0, 3), 0.040, 1e-12);
  EXPECT_FALSE(t.RecentTpot(0, 1.0, 2.0, 4).has_value());  // fewer than min_samples
  EXPECT_FALSE(t.RecentTpot(0, 3.5, 2.0, 3).has_value());  // last sample 2.5 s old
  // EWMA with weight 1/4: one 80 ms sample moves 40 ms to 50 ms.
  Finish(t, 0, 1, 0.080, 3.5);
  EXPECT_NEAR(*t.RecentTpot(0, 3.5, 2.0, 1), 0.050, 1e-12);
  // A forgotten endpoint starts again.
  t.ForgetEndpoint(0);
  EXPECT_FALSE(t.RecentTpot(0, 3.5, 2.0, 1).has_value());
}

struct Fixture {
  std::vector<EndpointState> eps = MakeEndpoints(3);
  LatencyTrainer trainer;
  std::unique_ptr<Scheduler> s = MustBuild(
      SpecOf({Plugin("tpot-guard-filter"), Plugin("round-robin-picker")}));
  // The candidates left after the filter, as the picker ranks all of them.
  std::vector<uint32_t> Kept(double slo_tpot_s, double now_s, bool with_model = true) {
    SchedRequest r = Req("hello");
    r.slo_tpot_s = slo_tpot_s;
    r.latency = with_model ? &trainer : nullptr;
    PickResult p = s->Pick(r, eps, now_s);
    EXPECT_TRUE(p.ok());
    std::vector<uint32_t> out(p.ranked.begin(), p.ranked.end());
    s->OnFinished(p.handle, now_s);
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST(TpotGuardFilter, DropsEndpointsMeasuredSlowerThanTheObjective) {
  Fixture f;
  Finish(f.trainer, 0, 4, 0.012, 10.0);
  Finish(f.trainer, 1, 4, 0.046, 10.0);  // above 0.9 x 50 ms
  // 2: no measurement (unknown): kept.
  EXPECT_EQ(f.Kept(0.050, 10.0), (std::vector<uint32_t>{0, 2}));
  // 1 decodes at 46 ms: within 0.9 x 60 ms, kept.
  EXPECT_EQ(f.Kept(0.060, 10.0), (std::vector<uint32_t>{0, 1, 2}));
  // No objective, or no latency model: nothing judged.
  EXPECT_EQ(f.Kept(0.0, 10.0), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(f.Kept(0.050, 10.0, false), (std::vector<uint32_t>{0, 1, 2}));
  // 1's measurement ages out after maxAgeSeconds (2 s): tried again.
  EXPECT_EQ(f.Kept(0.050, 12.5), (std::vector<uint32_t>{0, 1, 2}));
}

TEST(TpotGuardFilter, KeepsEveryoneWhenAllFail) {
  Fixture f;
  for (uint32_t e = 0; e < 3; ++e) Finish(f.trainer, e, 4, 0.070 + 0.01 * e, 5.0);
  EXPECT_EQ(f.Kept(0.050, 5.0), (std::vector<uint32_t>{0, 1, 2}));
  // One recovers: only it is left.
  Finish(f.trainer, 2, 12, 0.010, 5.5);
  EXPECT_EQ(f.Kept(0.050, 5.5), (std::vector<uint32_t>{2}));
}

TEST(TpotGuardFilter, ParametersAreChecked) {
  EXPECT_FALSE(BuildScheduler(SpecOf({Plugin("tpot-guard-filter", {{"fraction", -1.0}}),
                                      Plugin("max-score-picker")}),
                              {})
                   .ok());
  EXPECT_FALSE(BuildScheduler(SpecOf({Plugin("tpot-guard-filter", {{"minSamples", 0.0}}),
                                      Plugin("max-score-picker")}),
                              {})
                   .ok());
  Fixture f;
  f.s = MustBuild(SpecOf({Plugin("tpot-guard-filter", {{"fraction", 1.0}, {"minSamples", 5.0}}),
                          Plugin("round-robin-picker")}));
  Finish(f.trainer, 1, 4, 0.046, 1.0);
  EXPECT_EQ(f.Kept(0.050, 1.0), (std::vector<uint32_t>{0, 1, 2}));  // 4 < minSamples 5
  Finish(f.trainer, 1, 1, 0.060, 1.0);  // EWMA 49.5 ms, 5 samples: within 1.0 x 50 ms
  EXPECT_EQ(f.Kept(0.050, 1.0), (std::vector<uint32_t>{0, 1, 2}));
  Finish(f.trainer, 1, 2, 0.070, 1.0);
  EXPECT_EQ(f.Kept(0.050, 1.0), (std::vector<uint32_t>{0, 2}));
}

}  // namespace
}  // namespace kvroute::sched
