// `kvroute simulate --suite FILE`: every scenario of a suite (files, and families generated
// from a seed) under every policy, one table (docs/SUITE.md). A policy's figure on a
// scenario is its goodput over the best peer's there (peers: the policies not named
// kvroute*, itself excluded); the summary gives, per policy, the worst and geometric mean
// of that ratio, the runs within 1% and the runs ahead by 10% or more.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/suite_config.h"
#include "core/common/status.h"
#include "simkit/report/summary.h"

namespace kvroute::simulate {

struct SuiteRun {
  std::string scenario;  // its name
  std::string family;    // generated: the family and regime; files: "file"
  std::string error;     // it could not be loaded or run ("" when it ran)
  std::vector<report::PolicyReport> reports;  // in the suite's policy order
};

struct SuiteResult {
  std::string name;
  std::vector<std::string> policies;
  std::vector<SuiteRun> runs;
};

// Runs the suite: `seed` overrides generate.seed, `policies` (non-empty) the suite's. With
// `progress`, a line per scenario on stderr.
SuiteResult RunSuite(const config::SuiteSpec& spec, std::optional<uint64_t> seed,
                     const std::vector<std::string>& policies, bool progress);

// The suite's generated scenarios (`seed` overriding generate.seed), each a scenario file
// `<dir>/<name>.yaml` with the suite's policies, to run alone with --scenario. Fills
// `written` with the paths. InvalidArgument when the suite generates nothing, Internal
// when a file cannot be written (naming it).
Status WriteSuiteScenarios(const config::SuiteSpec& spec, std::optional<uint64_t> seed,
                           const std::string& dir, std::vector<std::string>* written);

struct PolicySummary {
  std::string policy;
  int runs = 0;                 // scenarios with a ratio (a peer served something)
  double worst = 0, geomean = 0;
  int within_1pct = 0;          // ratio >= 0.99
  int ahead_10pct = 0;          // ratio >= 1.10
  int behind_1pct = 0;          // ratio < 0.99
};

// The goodput ratio of `policy` to the best peer in `run`; nullopt when no peer other than
// it ran or the best had no goodput.
std::optional<double> RatioToBestPeer(const SuiteRun& run, const std::string& policy);
std::vector<PolicySummary> SummarizeSuite(const SuiteResult& result);

// The summary and the reference policy's per-scenario table; with `detail`, every policy's
// goodput, hit rate and TTFT p99 per scenario as well.
std::string SuiteMarkdown(const SuiteResult& result, const std::string& reference, bool detail);
// One JSON object: per scenario, per policy {good_requests, goodput (a second), hit_rate,
// ttft_p99_s, ratio_to_best_peer (by good requests)}.
std::string SuiteJson(const SuiteResult& result);

}  // namespace kvroute::simulate
