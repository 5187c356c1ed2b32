// The latency model (issue 24, step 1): an online linear fit per endpoint and one for the
// fleet, against synthetic engines whose true TTFT and TPOT are known. Deterministic: the
// samples come from a seeded Rng, no clock.
#include "core/sched/latency_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/common/rng.h"

namespace kvroute::sched {
namespace {

// A replica's true TTFT: queueing behind the prefill ahead of it, its own prefill, a step.
struct Engine {
  double prefill_tokens_per_s = 50000.0;
  double step_s = 0.006;
  double ttft(const TtftFeatures& f) const {
    return step_s + (f.queued_prefill_tokens + f.uncached_tokens) / prefill_tokens_per_s +
           0.002 * f.queued_requests;
  }
  // Decode step: base, per sequence, per resident token, and prefill chunks sharing steps.
  double tpot(const TpotFeatures& f) const {
    return step_s + 6e-6 * f.batch + 5e-8 * f.context_tokens +
           1.0 / prefill_tokens_per_s * 0.1 * f.prefill_tokens_inflight;
  }
};

TtftFeatures RandomTtft(Rng& rng) {
  TtftFeatures f;
  f.uncached_tokens = std::floor(rng.Uniform() * 8000);
  f.queued_prefill_tokens = std::floor(rng.Uniform() * 40000);
  f.queued_requests = std::floor(rng.Uniform() * 10);
  f.waiting = 0;  // the engine reported no queue: the start-at-once fit (see below for the other)
  f.running = std::floor(rng.Uniform() * 200);
  f.kv_usage = rng.Uniform();
  return f;
}

TpotFeatures RandomTpot(Rng& rng) {
  TpotFeatures f;
  f.batch = 1 + std::floor(rng.Uniform() * 255);
  f.context_tokens = f.batch * (500 + rng.Uniform() * 4000);
  f.prefill_tokens_inflight = std::floor(rng.Uniform() * 8192);
  f.kv_usage = rng.Uniform();
  return f;
}

TEST(OnlineLinearFit, RecoversALinearFunctionExactly) {
  TtftFit fit;
  Rng rng(5);
  const TtftFit::Vec w{0.05, 0.2, -0.1, 0.03, 0.0, 0.5};
  for (int i = 0; i < 300; ++i) {
    TtftFit::Vec x{1.0, rng.Uniform() * 8, rng.Uniform() * 40, rng.Uniform(), rng.Uniform() * 2,
                   rng.Uniform()};
    double y = 0;
    for (size_t k = 0; k < x.size(); ++k) y += w[k] * x[k];
    ASSERT_TRUE(fit.Update(x, y));
  }
  for (size_t k = 0; k < w.size(); ++k) EXPECT_NEAR(fit.weights()[k], w[k], 1e-6) << k;
  EXPECT_EQ(fit.samples(), 300u);
  // Garbage is refused and changes nothing.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(fit.Update({1, nan, 0, 0, 0, 0}, 1.0));
  EXPECT_FALSE(fit.Update({1, 0, 0, 0, 0, 0}, std::numeric_limits<double>::infinity()));
  EXPECT_EQ(fit.samples(), 300u);
}

TEST(LatencyModel, PredictsOnlyOnceTrainedAndThenWithinAFewPercent) {
  LatencyModel m;
  Engine e;
  Rng rng(11);
  TtftFeatures probe;
  probe.uncached_tokens = 4000;
  probe.queued_prefill_tokens = 12000;
  probe.queued_requests = 3;
  probe.running = 40;
  probe.kv_usage = 0.5;
  for (int i = 0; i < 15; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    ASSERT_TRUE(m.ObserveTtft(0, f, e.ttft(f)));
  }
  EXPECT_FALSE(m.PredictTtft(0, probe).has_value());  // cold: 15 < 16 samples
  double abs_pct = 0;
  int n = 0;
  for (int i = 0; i < 400; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    // Noise: +-5% multiplicative, as real step times jitter.
    const double observed = e.ttft(f) * (1.0 + 0.05 * (2 * rng.Uniform() - 1));
    if (i >= 100) {
      const auto p = m.PredictTtft(0, f);
      ASSERT_TRUE(p.has_value());
      abs_pct += std::abs(*p - e.ttft(f)) / e.ttft(f);
      ++n;
    }
    m.ObserveTtft(0, f, observed);
  }
  EXPECT_LT(abs_pct / n, 0.05) << "MAPE " << abs_pct / n;
  EXPECT_NEAR(*m.PredictTtft(0, probe), e.ttft(probe), 0.05 * e.ttft(probe));
  EXPECT_EQ(m.TtftSamples(0), 415u);
}

TEST(LatencyModel, TpotFollowsBatchContextAndPrefillInterference) {
  LatencyModel m;
  Engine e;
  Rng rng(3);
  for (int i = 0; i < 300; ++i) {
    const TpotFeatures f = RandomTpot(rng);
    ASSERT_TRUE(m.ObserveTpot(2, f, e.tpot(f)));
  }
  for (int i = 0; i < 50; ++i) {
    const TpotFeatures f = RandomTpot(rng);
    EXPECT_NEAR(*m.PredictTpot(2, f), e.tpot(f), 1e-4 * e.tpot(f) + 1e-7);
  }
}

TEST(LatencyModel, FollowsAReplicaThatSlowsDown) {
  LatencyModel m;  // forgetting 0.98: about 50 samples of memory
  Engine fast, slow;
  slow.prefill_tokens_per_s = 25000.0;  // half the prefill speed (thermal throttling, a bad GPU)
  Rng rng(7);
  for (int i = 0; i < 300; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    m.ObserveTtft(0, f, fast.ttft(f));
  }
  TtftFeatures probe = RandomTtft(rng);
  EXPECT_NEAR(*m.PredictTtft(0, probe), fast.ttft(probe), 0.01 * fast.ttft(probe));
  // After the change, its own samples move the prediction: within 10% after 60 of them,
  // 2% after 200.
  for (int i = 0; i < 60; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    m.ObserveTtft(0, f, slow.ttft(f));
  }
  EXPECT_NEAR(*m.PredictTtft(0, probe), slow.ttft(probe), 0.10 * slow.ttft(probe));
  for (int i = 0; i < 140; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    m.ObserveTtft(0, f, slow.ttft(f));
  }
  EXPECT_NEAR(*m.PredictTtft(0, probe), slow.ttft(probe), 0.02 * slow.ttft(probe));
}

TEST(LatencyModel, AnEndpointWithoutSamplesUsesTheFleetModelThenItsOwn) {
  LatencyModel m;
  Engine fast, slow;
  slow.prefill_tokens_per_s = 20000.0;
  Rng rng(9);
  TtftFeatures probe = RandomTtft(rng);
  EXPECT_FALSE(m.PredictTtft(3, probe).has_value());
  for (int i = 0; i < 200; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    m.ObserveTtft(static_cast<uint32_t>(i % 2), f, fast.ttft(f));
  }
  // Endpoint 3 was never seen: the fleet's prediction.
  EXPECT_EQ(m.TtftSamples(3), 0u);
  EXPECT_NEAR(*m.PredictTtft(3, probe), fast.ttft(probe), 0.01 * fast.ttft(probe));
  // Its own samples take over from min_samples on.
  for (int i = 0; i < 100; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    m.ObserveTtft(3, f, slow.ttft(f));
  }
  EXPECT_NEAR(*m.PredictTtft(3, probe), slow.ttft(probe), 0.02 * slow.ttft(probe));
  // Its own model, not the fleet's (which also learned from endpoints 0 and 1): an endpoint
  // never seen gets another answer.
  EXPECT_NE(*m.PredictTtft(3, probe), *m.PredictTtft(7, probe));
  // A restart: its own model starts again, the fleet's answers meanwhile.
  m.ForgetEndpoint(3);
  EXPECT_EQ(m.TtftSamples(3), 0u);
  ASSERT_TRUE(m.PredictTtft(3, probe).has_value());
  EXPECT_EQ(*m.PredictTtft(3, probe), *m.PredictTtft(7, probe));
}

TEST(LatencyModel, UnknownFeaturesOrObservationsAreRefusedNotZero) {
  LatencyModel m;
  Engine e;
  Rng rng(1);
  for (int i = 0; i < 50; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    m.ObserveTtft(0, f, e.ttft(f));
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  TtftFeatures f = RandomTtft(rng);
  f.kv_usage = nan;  // the scrape said nothing usable
  EXPECT_FALSE(m.PredictTtft(0, f).has_value());
  EXPECT_FALSE(m.ObserveTtft(0, f, 0.1));
  f.kv_usage = 0.5;
  f.waiting = -1;
  EXPECT_FALSE(m.PredictTtft(0, f).has_value());
  f.waiting = 0;
  EXPECT_FALSE(m.ObserveTtft(0, f, -0.5));
  EXPECT_FALSE(m.ObserveTtft(0, f, nan));
  EXPECT_EQ(m.TtftSamples(0), 50u);
}

TEST(LatencyModel, NoWindUpWhenTheFeaturesStopVarying) {
  // An idle replica: the same sample a thousand times. The fit must stay finite and keep
  // predicting that sample; then varied samples retrain it.
  LatencyModel m;
  Engine e;
  Rng rng(4);
  for (int i = 0; i < 100; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    m.ObserveTtft(0, f, e.ttft(f));
  }
  TtftFeatures idle;
  idle.uncached_tokens = 2000;
  for (int i = 0; i < 1000; ++i) m.ObserveTtft(0, idle, e.ttft(idle));
  ASSERT_TRUE(m.PredictTtft(0, idle).has_value());
  EXPECT_NEAR(*m.PredictTtft(0, idle), e.ttft(idle), 1e-6);
  for (int i = 0; i < 200; ++i) {
    const TtftFeatures f = RandomTtft(rng);
    m.ObserveTtft(0, f, e.ttft(f));
  }
  const TtftFeatures probe = RandomTtft(rng);
  EXPECT_NEAR(*m.PredictTtft(0, probe), e.ttft(probe), 0.01 * e.ttft(probe));
}

// A request that queues in the engine (it reported waiting requests) is predicted by its
// own fit, on the requests queued ahead of it: the first regime's milliseconds do not
// drown the second's seconds, and a regime without samples does not predict.
TEST(LatencyModel, QueuedRequestsHaveTheirOwnFit) {
  LatencyModel m;
  Rng rng(5);
  auto starts_at_once = [](const TtftFeatures& f) { return 0.010 + f.uncached_tokens / 40000.0; };
  auto queues = [](const TtftFeatures& f) { return 0.2 + 0.022 * f.queued_requests; };
  TtftFeatures f;
  f.running = 40;
  f.kv_usage = 0.3;
  for (int i = 0; i < 200; ++i) {
    f.uncached_tokens = std::floor(rng.Uniform() * 3000);
    f.queued_requests = std::floor(rng.Uniform() * 3);
    f.queued_prefill_tokens = f.queued_requests * 200;
    f.waiting = 0;
    ASSERT_TRUE(m.ObserveTtft(0, f, starts_at_once(f)));
  }
  TtftFeatures q = f;
  q.waiting = 30;
  q.queued_requests = 300;
  EXPECT_FALSE(m.PredictTtft(0, q).has_value());  // no queued sample yet
  for (int i = 0; i < 200; ++i) {
    q.queued_requests = 20 + std::floor(rng.Uniform() * 200);  // 20..220 ahead
    q.uncached_tokens = std::floor(rng.Uniform() * 3000);
    q.waiting = q.queued_requests;
    ASSERT_TRUE(m.ObserveTtft(0, q, queues(q)));
  }
  // Past the trained range, linear in the queue: 500 ahead.
  q.queued_requests = 500;
  q.waiting = 480;
  EXPECT_NEAR(*m.PredictTtft(0, q), queues(q), 0.01 * queues(q));
  // The other regime kept its own law.
  f.uncached_tokens = 2000;
  f.queued_requests = 1;
  EXPECT_NEAR(*m.PredictTtft(0, f), starts_at_once(f), 0.002);
  EXPECT_EQ(m.TtftSamples(0), 400u);
}

}  // namespace
}  // namespace kvroute::sched
