// The latency trainer: samples from the request lifecycle (dispatch, first token, tokens,
// end), the prefill queued per endpoint, and prediction errors scored as answers come back.
#include "core/sched/latency_trainer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/common/rng.h"

namespace kvroute::sched {
namespace {

RequestHandle H(uint32_t slot, uint32_t gen = 1) { return (uint64_t{gen} << 32) | slot; }

LatencyTrainer::Dispatch D(uint32_t endpoint, double uncached, double waiting = 0) {
  LatencyTrainer::Dispatch d;
  d.endpoint = endpoint;
  d.prompt_tokens = uncached + 100;
  d.uncached_tokens = uncached;
  d.waiting = waiting;
  d.running = 10;
  d.kv_usage = 0.3;
  d.capacity_tokens = 400000;
  return d;
}

TEST(LatencyTrainer, QueuedPrefillIsUncachedTokensUntilTheFirstToken) {
  LatencyTrainer t;
  t.OnDispatched(H(0), D(2, 1000), 0.0);
  t.OnDispatched(H(1), D(2, 500), 0.0);
  EXPECT_EQ(t.QueuedPrefill(2), 1500);
  // The features of the next request see it queued ahead.
  EXPECT_EQ(t.TtftFeaturesOf(D(2, 10)).queued_prefill_tokens, 1500);
  EXPECT_EQ(t.TpotFeaturesOf(D(2, 10)).prefill_tokens_inflight, 1510);
  EXPECT_EQ(t.TpotFeaturesOf(D(2, 10)).batch, 11);
  EXPECT_EQ(t.TpotFeaturesOf(D(2, 10)).context_tokens, 0.3 * 400000 + 110);
  t.OnFirstToken(H(0), 0.1);
  EXPECT_EQ(t.QueuedPrefill(2), 500);
  // A retry of request 1 on endpoint 3 moves its tokens there.
  t.OnDispatched(H(1), D(3, 800), 0.2);
  EXPECT_EQ(t.QueuedPrefill(2), 0);
  EXPECT_EQ(t.QueuedPrefill(3), 800);
  // The end without a first token (a failure) releases it too.
  t.OnFinished(H(1), -1, 0.5);
  EXPECT_EQ(t.QueuedPrefill(3), 0);
  // A stale handle (another generation of slot 0) changes nothing.
  t.OnDispatched(H(0, 2), D(2, 300), 1.0);
  t.OnFirstToken(H(0, 1), 1.1);
  EXPECT_EQ(t.QueuedPrefill(2), 300);
}

// P/D (issue 25): a prefill leg is queued on its endpoint apart from its request (same
// handle), leaves the queue when it ends, and is a TTFT sample only when it answered there.
TEST(LatencyTrainer, APrefillLegIsQueuedOnItsEndpointAndLearnedWhenAnswered) {
  LatencyTrainer t;
  LatencyTrainer::Dispatch decode = D(1, 0);
  decode.remote_prefill = true;
  t.OnDispatched(H(0), decode, 0.0);
  t.OnPrefillSent(H(0), D(2, 1000), 0.0);
  EXPECT_EQ(t.QueuedPrefill(1), 0);
  EXPECT_EQ(t.QueuedPrefill(2), 1000);
  EXPECT_EQ(t.QueuedRequests(2), 1u);
  // Reported on another endpoint (a moved leg): ignored.
  t.OnPrefillAnswered(H(0), 3, true, 0.05);
  EXPECT_EQ(t.QueuedPrefill(2), 1000);
  t.OnPrefillAnswered(H(0), 2, true, 0.05);
  EXPECT_EQ(t.QueuedPrefill(2), 0);
  EXPECT_EQ(t.QueuedRequests(2), 0u);
  EXPECT_EQ(t.ttft_samples(), 1u);
  // The pair's own first token, 0.3 s after dispatch, is not a sample (it spans both legs),
  // and no objective was counted for the leg.
  t.OnFirstToken(H(0), 0.3);
  EXPECT_EQ(t.ttft_samples(), 1u);
  EXPECT_EQ(t.ttft_slo().observed, 0u);
  // A leg that failed leaves the queue without a sample; a second report changes nothing.
  t.OnPrefillSent(H(1), D(2, 700), 1.0);
  t.OnPrefillAnswered(H(1), 2, false, 1.2);
  t.OnPrefillAnswered(H(1), 2, true, 1.3);
  EXPECT_EQ(t.QueuedPrefill(2), 0);
  EXPECT_EQ(t.ttft_samples(), 1u);
  // A leg never reported is taken off its queue when its slot's next leg is sent.
  t.OnPrefillSent(H(2), D(2, 400), 2.0);
  t.OnPrefillSent(H(2, 2), D(3, 100), 3.0);
  EXPECT_EQ(t.QueuedPrefill(2), 0);
  EXPECT_EQ(t.QueuedPrefill(3), 100);
}

TEST(LatencyTrainer, LearnsFromTheLifecycleAndScoresItsPredictions) {
  LatencyTrainer t;
  Rng rng(2);
  double now = 0;
  // One replica: TTFT = 10 ms + uncached / 40k tokens/s; 20 ms a token.
  auto ttft_of = [](double uncached) { return 0.010 + uncached / 40000.0; };
  for (uint32_t i = 0; i < 300; ++i) {
    const double uncached = std::floor(rng.Uniform() * 6000);
    const RequestHandle h = H(i % 7, 1 + i);  // slots reused, generations new
    t.OnDispatched(h, D(0, uncached), now);
    const double first = now + ttft_of(uncached);
    t.OnFirstToken(h, first);
    for (int k = 1; k <= 50; ++k) t.OnTokens(h, k, first + 0.020 * (k - 1));
    t.OnFinished(h, -1, first + 0.020 * 49);
    now += 1.0;  // one at a time: nothing queued ahead
  }
  EXPECT_EQ(t.ttft_samples(), 300u);
  EXPECT_EQ(t.tpot_samples(), 300u);
  const auto p = t.PredictTtft(D(0, 4000));
  ASSERT_TRUE(p.has_value());
  EXPECT_NEAR(*p, ttft_of(4000), 1e-3);
  EXPECT_NEAR(*t.PredictTpot(D(0, 4000)), 0.020, 1e-4);
  // Scored from the 17th sample on (the model's min_samples), and good once trained.
  EXPECT_EQ(t.ttft_errors().n, 300u - 16u);
  EXPECT_LT(t.ttft_errors().Mape(), 0.02);
  EXPECT_LT(t.tpot_errors().Mape(), 0.01);
}

TEST(LatencyTrainer, ANonStreamedAnswerIsNoObservation) {
  LatencyTrainer t;
  LatencyTrainer::Dispatch d = D(0, 100);
  d.streaming = false;
  d.slo_ttft_s = 0.001;
  t.OnDispatched(H(0), d, 0.0);
  EXPECT_EQ(t.QueuedPrefill(0), 100);
  t.OnFirstToken(H(0), 1.0);  // the whole answer at once
  EXPECT_EQ(t.QueuedPrefill(0), 0);
  t.OnFinished(H(0), 20, 1.0);
  EXPECT_EQ(t.ttft_samples(), 0u);
  EXPECT_EQ(t.tpot_samples(), 0u);
  EXPECT_EQ(t.ttft_slo().observed, 0u);
  // A retry of a non-streamed request stays non-streamed.
  t.OnDispatched(H(1), d, 2.0);
  LatencyTrainer::Dispatch retry = D(1, 100);
  t.OnDispatched(H(1), retry, 2.1);
  t.OnFirstToken(H(1), 3.0);
  EXPECT_EQ(t.ttft_samples(), 0u);
}

TEST(LatencyTrainer, UnknownFeaturesTeachNothingAndCountOneTokenNoTpot) {
  LatencyTrainer t;
  LatencyTrainer::Dispatch d = D(0, 100);
  d.kv_usage = std::nan("");  // stale or missing scrape
  t.OnDispatched(H(0), d, 0.0);
  t.OnFirstToken(H(0), 0.1);
  t.OnFinished(H(0), 40, 1.0);
  EXPECT_EQ(t.ttft_samples(), 0u);
  EXPECT_EQ(t.tpot_samples(), 0u);
  // Known features, but one token only: a TTFT sample, no TPOT.
  t.OnDispatched(H(1), D(0, 100), 2.0);
  t.OnFirstToken(H(1), 2.1);
  t.OnFinished(H(1), 1, 2.1);
  EXPECT_EQ(t.ttft_samples(), 1u);
  EXPECT_EQ(t.tpot_samples(), 0u);
  // The final count given at the end, without OnTokens.
  t.OnDispatched(H(2), D(0, 100), 3.0);
  t.OnFirstToken(H(2), 3.1);
  t.OnFinished(H(2), 11, 3.6);
  EXPECT_EQ(t.tpot_samples(), 1u);
}

TEST(LatencyTrainer, QueuedRequestsCountEveryDispatchUntilItsFirstToken) {
  LatencyTrainer t;
  t.OnDispatched(H(0), D(0, 100), 0.0);
  t.OnDispatched(H(1), D(0, 100), 0.0);
  LatencyTrainer::Dispatch unknown = D(0, 0);
  unknown.uncached_tokens = std::nan("");  // a retry: its prompt's share unknown
  t.OnDispatched(H(2), unknown, 0.0);
  EXPECT_EQ(t.QueuedRequests(0), 3u);
  EXPECT_EQ(t.QueuedPrefill(0), 200);  // the unknown one adds no tokens
  // The next request's features see them ahead of it.
  EXPECT_EQ(t.TtftFeaturesOf(D(0, 5)).queued_requests, 3);
  t.OnFirstToken(H(0), 0.1);
  t.OnFirstToken(H(0), 0.2);  // twice: counted once
  EXPECT_EQ(t.QueuedRequests(0), 2u);
  t.OnDispatched(H(1), D(1, 100), 0.3);  // moved by a retry
  EXPECT_EQ(t.QueuedRequests(0), 1u);
  EXPECT_EQ(t.QueuedRequests(1), 1u);
  t.OnFinished(H(2), -1, 0.4);  // failed before its first token
  EXPECT_EQ(t.QueuedRequests(0), 0u);
  t.ForgetEndpoint(1);
  EXPECT_EQ(t.QueuedRequests(1), 0u);
  t.OnFirstToken(H(1), 0.5);  // forgotten: no underflow
  EXPECT_EQ(t.QueuedRequests(1), 0u);
}

// Slowness (issue 43): an endpoint's observed TPOT over the fleet fit's prediction for the
// same features, against the fastest quarter's; 1 until known, and 1 below the floor.
TEST(LatencyTrainer, SlownessIsTpotOverTheFleetsAgainstTheFastestQuarter) {
  LatencyTrainer t;
  // Per-token time by endpoint: two at 20 ms, one 1.2x (inside the fit's own noise), one
  // throttled to a third of the speed.
  const double tpot[4] = {0.020, 0.020, 0.024, 0.060};
  double now = 0;
  for (uint32_t i = 0; i < 400; ++i) {
    const uint32_t e = i % 4;
    const RequestHandle h = H(i % 5, 1 + i);
    t.OnDispatched(h, D(e, 500), now);
    t.OnFirstToken(h, now + 0.05);
    t.OnFinished(h, 21, now + 0.05 + 20 * tpot[e]);
    now += 1.0;
    if (i == 40) {
      // Known by now for none: the fleet fit predicts from its 16th sample and each
      // endpoint needs 8 ratios of its own.
      EXPECT_EQ(t.Slowness(3), 1.0);
    }
  }
  EXPECT_EQ(t.Slowness(0), 1.0);
  EXPECT_EQ(t.Slowness(1), 1.0);
  EXPECT_EQ(t.Slowness(2), 1.0);  // 1.2x: below the floor
  EXPECT_NEAR(t.Slowness(3), 3.0, 0.15);
  EXPECT_EQ(t.Slowness(9), 1.0);  // never seen
  t.ForgetEndpoint(3);            // restarted: unknown again
  EXPECT_EQ(t.Slowness(3), 1.0);
}

}  // namespace
}  // namespace kvroute::sched
