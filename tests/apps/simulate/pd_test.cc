// Prefill/decode disaggregation in virtual time (issue 25): the legs of a disaggregated
// request, the KV pull's wait, the hold's end, the decider, and the fallbacks when the
// prefill replica fails. Every expectation is derived from the engine's step model and
// the scenario's knobs, one request at a time on an idle fleet.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/scenario_config.h"
#include "core/engine/engine.h"
#include "core/engine/kv_transfer.h"
#include "apps/simulate/simulator.h"
#include "testdata.h"

namespace kvroute::simulate {
namespace {

using testing::MustParse;

constexpr double kDelay = 0.001;  // network_delay_s of every group below

// Random (unshared) prompts of `input_len` tokens and 10 output tokens, one request a
// second from t = 0, on `groups`; scrapes every `scrape_s`.
std::string PdScenario(int input_len, int requests, const std::string& groups,
                       const std::string& rest = "", double scrape_s = 0.05) {
  return "name: pd\nseed: 5\nworkload:\n  type: random\n  input_len: " +
         std::to_string(input_len) +
         "\n  output_len: 10\n"
         "arrivals: {process: constant, rate: 1, num_requests: " +
         std::to_string(requests) +
         "}\n"
         "fleet:\n  engine_preset: llama3-8b-h100\n  scrape_interval_s: " +
         std::to_string(scrape_s) +
         "\n  network_delay_s: 0.001\n  groups:\n" + groups + rest;
}

const std::string kOnePrefillOneDecode =
    "    - {replicas: 1, role: prefill}\n"
    "    - {replicas: 1, role: decode}\n";

int64_t Decisions(const report::PdReport& pd, const std::string& name) {
  for (const auto& [n, count] : pd.decisions) {
    if (n == name) return count;
  }
  ADD_FAILURE() << "no decision " << name;
  return -1;
}

// Seconds of one engine step of the llama3-8b-h100 preset.
double Step(int prefill_tokens, int decode_seqs, int64_t context) {
  return engine::PresetConfig("llama3-8b-h100")->step.StepSeconds(prefill_tokens, decode_seqs,
                                                                   context);
}

TEST(SimulatePdTest, LongPromptGoesPrefillThenDecodeAndWaitsForTheTransfer) {
  const config::Scenario s = MustParse(PdScenario(1000, 3, kOnePrefillOneDecode));
  const SimulationResult r = RunSimulation(s, "kvroute", -1);
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(r.records.size(), 3u);
  const engine::EngineConfig e = *engine::PresetConfig("llama3-8b-h100");
  // The decode replica pulls the prompt's full blocks (62 x 16 tokens) and computes the rest.
  const int pulled = 1000 / e.block_size * e.block_size;
  const double transfer = pulled * static_cast<double>(e.kv_bytes_per_token) /
                          engine::kDefaultKvTransferBandwidth;
  // To prefill, its one step (prompt and sampled token), back to the router, to decode, the
  // pull, decode's step over the last 8 tokens, back to the client.
  const double ttft = kDelay + Step(1000, 0, 1000) + kDelay + kDelay + transfer +
                      Step(1000 - pulled, 0, 1000) + kDelay;
  for (const report::RequestRecord& rec : r.records) {
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(rec.prompt_tokens, 1000);
    EXPECT_EQ(rec.output_tokens, 10);
    EXPECT_EQ(rec.prefill_endpoint, 0);  // prefill on replica 0 ...
    EXPECT_EQ(rec.endpoint, 1);          // ... then decode on replica 1
    EXPECT_DOUBLE_EQ(rec.kv_transfer_s, transfer);
    EXPECT_NEAR(rec.ttft_s, ttft, 1e-9);
    EXPECT_EQ(rec.cached_tokens, 0);  // the prefill leg's, not the loaded tokens
  }
  const report::PolicyReport& rep = r.report;
  ASSERT_TRUE(rep.pd_reported);
  EXPECT_EQ(Decisions(rep.pd, "disaggregate"), 3);
  EXPECT_EQ(rep.pd.disaggregated, 3);
  EXPECT_EQ(rep.pd.pulls, 3);
  EXPECT_EQ(rep.pd.recomputed, 0);
  EXPECT_EQ(rep.pd.local_prefills, 0);
  // Every hold ended when its pull completed, none by its lease.
  EXPECT_EQ(rep.pd.holds_released, 3);
  EXPECT_EQ(rep.pd.holds_expired, 0);
  EXPECT_EQ(rep.pd.disaggregated_requests.requests, 3);
  EXPECT_EQ(rep.pd.aggregated_requests.requests, 0);
  EXPECT_NEAR(rep.pd.disaggregated_requests.ttft_s.mean, ttft, 1e-9);
  EXPECT_DOUBLE_EQ(rep.pd.transfer_s.mean, transfer);
  ASSERT_EQ(rep.pd.roles.size(), 2u);
  EXPECT_EQ(rep.pd.roles[0].role, "prefill");
  EXPECT_EQ(rep.pd.roles[1].role, "decode");
  // The prefill replica ran one step per request.
  EXPECT_NEAR(rep.pd.roles[0].busy_s, 3 * Step(1000, 0, 1000), 1e-9);
}

TEST(SimulatePdTest, TransferTimeFollowsBandwidthAndBytesPerToken) {
  // A tenth of the bandwidth and twice the bytes: twenty times the wait.
  const config::Scenario s = MustParse(PdScenario(
      1000, 1, kOnePrefillOneDecode,
      "pd: {kv_transfer_bandwidth: 2500000000, kv_bytes_per_token: 256KiB}\n"));
  const SimulationResult r = RunSimulation(s, "kvroute", -1);
  ASSERT_EQ(r.records.size(), 1u);
  const double transfer = 992 * 262144.0 / 2.5e9;
  EXPECT_DOUBLE_EQ(r.records[0].kv_transfer_s, transfer);
  EXPECT_NEAR(r.records[0].ttft_s,
              4 * kDelay + Step(1000, 0, 1000) + transfer + Step(8, 0, 1000), 1e-9);
}

TEST(SimulatePdTest, ShortPromptIsServedByTheDecodeReplicaAlone) {
  const config::Scenario s = MustParse(PdScenario(200, 3, kOnePrefillOneDecode));
  const SimulationResult r = RunSimulation(s, "kvroute", -1);
  ASSERT_EQ(r.records.size(), 3u);
  for (const report::RequestRecord& rec : r.records) {
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(rec.prefill_endpoint, -1);
    EXPECT_EQ(rec.endpoint, 1);
    EXPECT_EQ(rec.kv_transfer_s, -1.0);
    EXPECT_NEAR(rec.ttft_s, 2 * kDelay + Step(200, 0, 200), 1e-9);
  }
  EXPECT_EQ(Decisions(r.report.pd, "short_prompt"), 3);
  EXPECT_EQ(Decisions(r.report.pd, "disaggregate"), 0);
  EXPECT_EQ(r.report.pd.disaggregated, 0);
  EXPECT_EQ(r.report.pd.aggregated_requests.requests, 3);
  // The prefill replica never ran.
  EXPECT_EQ(r.report.pd.roles[0].busy_s, 0.0);
}

TEST(SimulatePdTest, ThresholdsComeFromThePdBlock) {
  // prompt_tokens 150: the same 200-token prompts now disaggregate; the decode replica
  // pulls 192 tokens (12 blocks).
  const config::Scenario s = MustParse(
      PdScenario(200, 2, kOnePrefillOneDecode, "pd: {prompt_tokens: 150, non_cached_tokens: 150}\n"));
  const SimulationResult r = RunSimulation(s, "kvroute", -1);
  EXPECT_EQ(Decisions(r.report.pd, "disaggregate"), 2);
  EXPECT_EQ(r.report.pd.pulls, 2);
  // With a pull minimum above the 192 tokens on offer nothing travels: the decode replica
  // recomputes the prompt and the hold is dropped at once.
  const config::Scenario high = MustParse(PdScenario(
      200, 2, kOnePrefillOneDecode,
      "pd: {prompt_tokens: 150, non_cached_tokens: 150, kv_min_pull_tokens: 193}\n"));
  const SimulationResult h = RunSimulation(high, "kvroute", -1);
  EXPECT_EQ(h.report.pd.disaggregated, 2);
  EXPECT_EQ(h.report.pd.pulls, 0);
  EXPECT_EQ(h.report.pd.recomputed, 2);
  EXPECT_EQ(h.report.pd.holds_released, 2);
  for (const report::RequestRecord& rec : h.records) {
    EXPECT_EQ(rec.kv_transfer_s, -1.0);
    EXPECT_NEAR(rec.ttft_s, 4 * kDelay + Step(200, 0, 200) + Step(200, 0, 200), 1e-9);
  }
}

TEST(SimulatePdTest, CrashedPrefillReplicaFallsBackToLocalPrefill) {
  // The prefill replica crashes at 0.5 s; the router scrapes only every 10 s, so the pick
  // at 1 s still disaggregates: the leg is refused, no other prefill replica exists, and
  // the decode replica prefills locally. The refusal marks the replica down: the pick at
  // 2 s finds no prefill replica.
  const config::Scenario s =
      MustParse(PdScenario(1000, 3, kOnePrefillOneDecode,
                           "faults:\n  - {replica: 0, kind: crash, at: 0.5s}\n", 10.0));
  const SimulationResult r = RunSimulation(s, "kvroute", -1);
  ASSERT_EQ(r.records.size(), 3u);
  for (const report::RequestRecord& rec : r.records) {
    ASSERT_TRUE(rec.ok()) << rec.id;
    EXPECT_EQ(rec.endpoint, 1);
    EXPECT_EQ(rec.output_tokens, 10);
  }
  const report::RequestRecord* second = nullptr;
  for (const report::RequestRecord& rec : r.records) {
    if (rec.send_s == 1.0) second = &rec;
  }
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->prefill_endpoint, -1);
  // To the prefill replica and its refusal back, then a whole local prefill.
  EXPECT_NEAR(second->ttft_s, 4 * kDelay + Step(1000, 0, 1000), 1e-9);
  EXPECT_EQ(Decisions(r.report.pd, "disaggregate"), 2);
  EXPECT_EQ(Decisions(r.report.pd, "no_prefill"), 1);
  EXPECT_EQ(r.report.pd.disaggregated, 1);
  EXPECT_EQ(r.report.pd.local_prefills, 1);
  EXPECT_EQ(r.report.pd.prefill_retries, 0);
  EXPECT_TRUE(r.report.errors_by_kind.empty());
}

TEST(SimulatePdTest, PrefillLegCaughtByACrashMovesToAnotherPrefillReplica) {
  // Replica 0 (prefill, the pick's choice: the lower id on a tie) is slowed so that its
  // step is still running when it crashes; the leg moves to replica 1.
  const config::Scenario s = MustParse(PdScenario(
      1000, 1,
      "    - {replicas: 2, role: prefill}\n"
      "    - {replicas: 1, role: decode}\n",
      "faults:\n"
      "  - {replica: 0, kind: slow, at: 0s, factor: 1000}\n"
      "  - {replica: 0, kind: crash, at: 0.5s}\n"));
  const SimulationResult r = RunSimulation(s, "kvroute", -1);
  ASSERT_EQ(r.records.size(), 1u);
  const report::RequestRecord& rec = r.records[0];
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec.prefill_endpoint, 1);
  EXPECT_EQ(rec.endpoint, 2);
  EXPECT_EQ(r.report.pd.prefill_retries, 1);
  EXPECT_EQ(r.report.pd.local_prefills, 0);
  EXPECT_EQ(r.report.pd.pulls, 1);
  // The crash at 0.5 s, heard a network delay later; then the usual two legs.
  EXPECT_NEAR(rec.ttft_s,
              0.5 + 5 * kDelay + Step(1000, 0, 1000) + rec.kv_transfer_s + Step(8, 0, 1000),
              1e-9);
}

TEST(SimulatePdTest, HoldPastItsLeaseIsRecomputed) {
  // A 1 ms lease and a decode replica 200 ms away: the hold has expired when the decode leg
  // arrives, so it prefills the whole prompt itself (kv_load_failure_policy recompute).
  const config::Scenario s = MustParse(
      PdScenario(1000, 1,
                 "    - {replicas: 1, role: prefill}\n"
                 "    - {replicas: 1, role: decode, network_delay_s: 0.2}\n",
                 "pd: {kv_lease_s: 0.001}\n"));
  const SimulationResult r = RunSimulation(s, "kvroute", -1);
  ASSERT_EQ(r.records.size(), 1u);
  const report::RequestRecord& rec = r.records[0];
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec.prefill_endpoint, 0);
  EXPECT_EQ(rec.kv_transfer_s, -1.0);
  EXPECT_NEAR(rec.ttft_s, kDelay + Step(1000, 0, 1000) + kDelay + 0.2 + Step(1000, 0, 1000) + 0.2,
              1e-9);
  EXPECT_EQ(r.report.pd.disaggregated, 1);
  EXPECT_EQ(r.report.pd.pulls, 0);
  EXPECT_EQ(r.report.pd.pull_failures, 1);
  EXPECT_EQ(r.report.pd.holds_released, 0);
  EXPECT_EQ(r.report.pd.holds_expired, 1);
}

TEST(SimulatePdTest, AggregatedFleetWithRolesReportsDecisionsOff) {
  const config::Scenario s =
      MustParse(PdScenario(1000, 2, "    - {replicas: 2, role: prefill-decode}\n"));
  const SimulationResult r = RunSimulation(s, "kvroute", -1);
  ASSERT_TRUE(r.report.pd_reported);
  EXPECT_EQ(Decisions(r.report.pd, "off"), 2);
  EXPECT_EQ(r.report.pd.disaggregated, 0);
  // Without roles there is no P/D block at all.
  const config::Scenario plain = MustParse(PdScenario(1000, 2, "    - {replicas: 2}\n"));
  EXPECT_FALSE(RunSimulation(plain, "kvroute", -1).report.pd_reported);
}

TEST(SimulatePdTest, SameSeedSameRun) {
  const config::Scenario s = MustParse(
      "name: pd\nseed: 2\nworkload: {type: random, input_len: {min: 100, max: 3000, mean: 1500, "
      "std_dev: 800}, output_len: 40}\n"
      "arrivals: {process: poisson, rate: 40, num_requests: 200}\n"
      "fleet:\n  groups:\n    - {replicas: 2, role: prefill}\n    - {replicas: 2, role: decode}\n");
  const SimulationResult a = RunSimulation(s, "kvroute", -1);
  const SimulationResult b = RunSimulation(s, "kvroute", -1);
  ASSERT_EQ(a.records.size(), b.records.size());
  for (size_t i = 0; i < a.records.size(); ++i) {
    EXPECT_EQ(a.records[i].id, b.records[i].id);
    EXPECT_EQ(a.records[i].ttft_s, b.records[i].ttft_s);
    EXPECT_EQ(a.records[i].e2e_s, b.records[i].e2e_s);
    EXPECT_EQ(a.records[i].prefill_endpoint, b.records[i].prefill_endpoint);
  }
  EXPECT_GT(a.report.pd.disaggregated, 0);
  EXPECT_EQ(a.report.pd.disaggregated, b.report.pd.disaggregated);
}

}  // namespace
}  // namespace kvroute::simulate
