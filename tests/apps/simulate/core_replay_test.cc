// simulate is a front end of the routing core and nothing else decides: the calls it makes
// into RoutingCore during a run (scrapes of its engines, picks with their request texts,
// dispatches, first tokens, streamed token counts, failures, retries, completions) are
// replayed into a second RoutingCore driven directly, and the replayed core answers every
// pick with exactly the ranking simulate got. A private health, saturation, retry or flow
// rule in simulate would make the two disagree: the replay sees only the core's inputs.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/routing/routing_core.h"
#include "apps/simulate/simulator.h"
#include "testdata.h"

namespace kvroute::simulate {
namespace {

using testing::MustParse;

// 4 replicas, shared prefixes, a crash (refused connections, dropped requests: failures,
// retries, ejection) and a restart (counters reset: the core's restart detection).
const char* kFaulty = R"(
name: replay
seed: 5
workload:
  type: shared-prefix
  num_groups: 6
  num_prompts_per_group: 8
  system_prompt_len: 1500
  question_len: {min: 1000, max: 3000, mean: 2000, std_dev: 400}
  output_len: {min: 20, max: 120, mean: 60, std_dev: 30}
arrivals: {process: poisson, rate: 40, num_requests: 400}
fleet:
  replicas: 4
  engine_preset: llama3-8b-h100
  kv_blocks: 4000
  scrape_interval_s: 0.05
  network_delay_s: 0.001
faults:
  - {replica: 1, kind: slow, at: 2.5s, duration: 0.5s, factor: 20}
  - {replica: 1, kind: crash, at: 3s, duration: 2s}
  - {replica: 2, kind: slow, at: 3.5s, duration: 0.5s, factor: 20}
  - {replica: 2, kind: restart, at: 4s}
  - {replica: 0, kind: slow, at: 5.5s, duration: 0.5s, factor: 20}
  - {replica: 0, kind: crash, at: 6s, duration: 1s}
)";

struct Replayed {
  int picks = 0, mismatches = 0, retries_checked = 0;
  int attempt_decisions = 0, prefill_decisions = 0, prefill_moves = 0;
  std::map<CoreCall::Kind, int> calls;
};

// Replays `calls` into a fresh core configured as simulate configures its own.
Replayed Replay(const config::Scenario& s, const std::string& policy,
                const std::vector<CoreCall>& calls) {
  Replayed out;
  routing::RoutingCore core;
  EXPECT_TRUE(core.Configure(SimulationCoreOptions(s, policy), SimulationEndpoints(s), 0.0).ok());
  std::map<sched::RequestHandle, sched::RequestHandle> handle;  // simulate's -> the replay's
  auto h = [&](sched::RequestHandle recorded) {
    auto it = handle.find(recorded);
    return it == handle.end() ? sched::kNoHandle : it->second;
  };
  for (const CoreCall& c : calls) {
    ++out.calls[c.kind];
    switch (c.kind) {
      case CoreCall::Kind::kScrape:
        core.OnScrape(c.endpoint, c.scrape, c.t);
        break;
      case CoreCall::Kind::kPick: {
        routing::PickRequest pr;
        pr.request.model = c.model;
        pr.request.prompt = c.prompt;
        pr.request.max_tokens = c.max_tokens;
        pr.request.prompt_tokens = c.prompt_tokens;
        pr.dispatch_first = true;
        const routing::PickResult r = core.Pick(pr, c.t);
        std::vector<uint32_t> ranked;
        if (r.ok()) ranked.assign(r.ranked.begin(), r.ranked.begin() + r.n_ranked);
        ++out.picks;
        if (ranked != c.ranked || r.pd != c.pd) ++out.mismatches;
        if (r.disaggregated() && (r.prefill != c.prefill || r.prefill_tokens != c.tokens)) {
          ++out.mismatches;
        }
        if (r.handle != sched::kNoHandle) handle[c.handle] = r.handle;
        break;
      }
      case CoreCall::Kind::kDispatched:
        core.OnDispatched(h(c.handle), c.endpoint, c.t);
        break;
      case CoreCall::Kind::kFirstToken:
        core.OnFirstToken(h(c.handle), c.t);
        break;
      case CoreCall::Kind::kTokens:
        core.OnTokens(h(c.handle), c.value, c.t);
        break;
      case CoreCall::Kind::kFinished:
        core.OnFinished(h(c.handle), c.endpoint, static_cast<int>(c.value), c.t);
        break;
      case CoreCall::Kind::kAttemptSucceeded:
        core.OnAttemptSucceeded(c.endpoint);
        break;
      case CoreCall::Kind::kAttemptFailed: {
        routing::AttemptFailure f;
        f.endpoint_id = c.endpoint;
        f.failure = {c.failure_kind, c.flag};
        f.attempt = c.attempt;
        f.n_ranked = c.n_ranked;
        f.max_attempts = c.max_attempts;
        f.started = c.started;
        const routing::AttemptDecision d = core.OnAttemptFailed(f, c.t);
        EXPECT_EQ(d.retry(), c.allowed) << "attempt decision at t=" << c.t;
        if (d.retry()) {
          EXPECT_EQ(d.next_attempt, c.attempt + 1);
        }
        ++out.attempt_decisions;
        if (d.retry()) ++out.retries_checked;
        if (d.retry() != c.allowed) ++out.mismatches;
        break;
      }
      case CoreCall::Kind::kPrefillDone:
        core.OnPrefillDone(c.prefill, c.tokens, c.handle, c.flag, c.t);
        break;
      case CoreCall::Kind::kPrefillFailed: {
        sched::SchedRequest req;
        req.model = c.model;
        req.prompt = c.prompt;
        req.max_tokens = c.max_tokens;
        req.prompt_tokens = c.prompt_tokens;
        std::vector<uint32_t> tried = c.exclude;
        routing::PrefillFailure f;
        f.prefill_id = c.endpoint;
        f.failure = {c.failure_kind, c.flag};
        f.server_fault = c.server_fault;
        f.request = &req;
        f.decode_id = c.decode;
        f.tried = &tried;
        const routing::PrefillDecision d = core.OnPrefillFailed(f, c.t);
        ++out.prefill_decisions;
        if (d.move()) ++out.prefill_moves;
        if (d.move() != c.allowed || (d.move() && (d.prefill != c.prefill || d.prefill_tokens != c.tokens))) {
          ++out.mismatches;
        }
        break;
      }
    }
  }
  return out;
}

TEST(CoreReplayTest, SimulatesPicksAreTheCoresAnswersToTheSameInputs) {
  const config::Scenario s = MustParse(kFaulty);
  for (const std::string policy : {"kvroute", "round-robin", "sglang-cache-aware"}) {
    SCOPED_TRACE(policy);
    std::vector<CoreCall> calls;
    const SimulationResult r =
        RunSimulationWith(s, SimulationCoreOptions(s, policy), policy, -1, {},
                          [&](const CoreCall& c) { calls.push_back(c); });
    ASSERT_EQ(r.error, "");
    ASSERT_EQ(r.report.requests, 400);
    Replayed replay = Replay(s, policy, calls);
    // Every request was picked at least once (retries go to the pick's fallbacks).
    EXPECT_GE(replay.picks, 400);
    EXPECT_EQ(replay.mismatches, 0);
    // The run exercised the core's failure paths, not only the happy one.
    // Both answers of the attempt rule: requests moved to a fallback, and requests ended.
    EXPECT_GT(replay.retries_checked, 0);
    EXPECT_GT(replay.attempt_decisions, replay.retries_checked);
    EXPECT_GT(replay.calls[CoreCall::Kind::kTokens], 0);
    EXPECT_EQ(replay.calls[CoreCall::Kind::kFinished], 400);
  }
}

// The same with prefill/decode pairs: 2 prefill and 2 decode replicas (a few prompts short
// or cached enough to stay aggregated), both prefill replicas crashing while they run legs
// (moved to the other prefill replica, or prefilled locally when both are down) and a
// decode replica restarting. The decisions, prefill choices and
// moves are the core's answers to the same inputs.
TEST(CoreReplayTest, PrefillDecodePairsAreTheCoresAnswers) {
  const config::Scenario s = MustParse(R"(
name: replay-pd
seed: 7
workload:
  type: shared-prefix
  num_groups: 6
  num_prompts_per_group: 100
  system_prompt_len: 200
  question_len: {min: 10, max: 3000, mean: 1200, std_dev: 900}
  output_len: {min: 20, max: 120, mean: 60, std_dev: 30}
arrivals: {process: poisson, rate: 40, num_requests: 400}
fleet:
  engine_preset: llama3-8b-h100
  kv_blocks: 4000
  scrape_interval_s: 0.05
  network_delay_s: 0.001
  groups:
    - {replicas: 2, role: prefill}
    - {replicas: 2, role: decode}
faults:
  - {replica: 0, kind: slow, at: 2.5s, duration: 0.5s, factor: 50}
  - {replica: 0, kind: crash, at: 3s, duration: 2s}
  - {replica: 1, kind: slow, at: 3.5s, duration: 0.5s, factor: 50}
  - {replica: 1, kind: crash, at: 4s, duration: 0.5s}
  - {replica: 3, kind: restart, at: 4s}
)");
  std::vector<CoreCall> calls;
  const SimulationResult r =
      RunSimulationWith(s, SimulationCoreOptions(s, "kvroute"), "kvroute", -1, {},
                        [&](const CoreCall& c) { calls.push_back(c); });
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.report.requests, 400);
  const Replayed replay = Replay(s, "kvroute", calls);
  EXPECT_EQ(replay.mismatches, 0);
  // Every path ran: pairs, aggregated picks, a moved leg, a local prefill.
  EXPECT_GT(r.report.pd.disaggregated, 0);
  EXPECT_GT(r.report.pd.aggregated_requests.requests, 0);
  // Both answers of the prefill rule: legs moved, and legs given up to a local prefill.
  EXPECT_GT(replay.prefill_moves, 0);
  EXPECT_GT(replay.prefill_decisions, replay.prefill_moves);
  EXPECT_GT(r.report.pd.prefill_retries, 0);
  EXPECT_GT(r.report.pd.local_prefills, 0);
  // Every prefill leg sent was released exactly once.
  int64_t charged = 0, released = 0;
  for (const CoreCall& c : calls) {
    if (c.kind == CoreCall::Kind::kPick && c.pd == routing::PdDecision::kDisaggregate) ++charged;
    if (c.kind == CoreCall::Kind::kPrefillFailed && c.allowed) ++charged;
    if (c.kind == CoreCall::Kind::kPrefillDone) ++released;
  }
  EXPECT_EQ(charged, released);
}

// The replay would not notice a simulate that ignored the core's answer; the records do:
// every request that succeeded ran on the endpoint its last pick or fallback named.
TEST(CoreReplayTest, RequestsRunWhereTheCoreSentThem) {
  const config::Scenario s = MustParse(kFaulty);
  std::map<sched::RequestHandle, std::vector<uint32_t>> sent;  // handle -> endpoints, in order
  std::vector<uint32_t> finished_on;
  const SimulationResult r = RunSimulationWith(
      s, SimulationCoreOptions(s, "kvroute"), "kvroute", -1, {}, [&](const CoreCall& c) {
        if (c.kind == CoreCall::Kind::kPick && !c.ranked.empty()) sent[c.handle] = {c.ranked[0]};
        if (c.kind == CoreCall::Kind::kDispatched) sent[c.handle].push_back(c.endpoint);
        if (c.kind == CoreCall::Kind::kFinished && c.handle != sched::kNoHandle) {
          EXPECT_EQ(c.endpoint, sent[c.handle].back()) << "handle " << c.handle;
          finished_on.push_back(c.endpoint);
        }
      });
  ASSERT_EQ(r.error, "");
  std::vector<uint32_t> record_endpoints;
  for (const report::RequestRecord& rec : r.records) {
    if (rec.endpoint >= 0) record_endpoints.push_back(static_cast<uint32_t>(rec.endpoint));
  }
  EXPECT_EQ(record_endpoints, finished_on);
}

}  // namespace
}  // namespace kvroute::simulate
