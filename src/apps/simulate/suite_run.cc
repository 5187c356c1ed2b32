#include "apps/simulate/suite_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "apps/simulate/simulator.h"
#include "config/scenario_config.h"
#include "core/api/openai.h"
#include "core/sched/registry.h"
#include "simkit/suite/generator.h"

namespace kvroute::simulate {

namespace {

bool IsPeer(const std::string& policy) { return policy.rfind("kvroute", 0) != 0; }

const report::PolicyReport* Find(const SuiteRun& run, const std::string& policy) {
  for (const report::PolicyReport& r : run.reports) {
    if (r.policy == policy) return &r;
  }
  return nullptr;
}

// The best peer of `run` other than `self`, by goodput: the requests that met both
// objectives. Every policy of a run is offered the same requests, so the count compares
// them; goodput a second divides it by the span to the last completion, which one slow
// straggler stretches.
const report::PolicyReport* BestPeer(const SuiteRun& run, const std::string& self) {
  const report::PolicyReport* best = nullptr;
  for (const report::PolicyReport& r : run.reports) {
    if (!IsPeer(r.policy) || r.policy == self) continue;
    if (!best || r.good > best->good) best = &r;
  }
  return best;
}

std::string Ms(double s) { return s >= 1.0 ? fmt::format("{:.2f} s", s) : fmt::format("{:.0f} ms", s * 1000); }

SuiteRun RunOne(const config::Scenario& sc, const std::vector<std::string>& policies) {
  SuiteRun run;
  run.scenario = sc.name;
  const double oracle = ComputeOracleHitRate(sc);
  for (const std::string& p : policies) {
    SimulationResult r = RunSimulation(sc, p, oracle);
    if (!r.error.empty()) {
      run.error = p + ": " + r.error;
      return run;
    }
    run.reports.push_back(std::move(r.report));
  }
  return run;
}

}  // namespace

SuiteResult RunSuite(const config::SuiteSpec& spec, std::optional<uint64_t> seed,
                     const std::vector<std::string>& policies, bool progress) {
  SuiteResult result;
  result.name = spec.name;
  result.policies = !policies.empty() ? policies : spec.policies;
  if (result.policies.empty()) {
    for (std::string_view p : sched::PolicyNames()) result.policies.emplace_back(p);
  }
  // Scenario files, then the generated families.
  struct Item {
    std::string label, family;
    config::ConfigOr<config::Scenario> scenario;
  };
  std::vector<Item> items;
  for (const std::string& path : spec.scenarios) {
    items.push_back({path, "file", config::LoadScenarioFile(path)});
  }
  if (spec.generate) {
    suite::GeneratorOptions g = *spec.generate;
    if (seed) g.seed = *seed;
    for (const suite::GeneratedScenario& s : suite::Generate(g)) {
      items.push_back({s.name, s.family + " " + s.regime, config::ParseScenario(s.yaml, s.name, ".")});
    }
  }
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < items.size(); ++i) {
    Item& it = items[i];
    SuiteRun run;
    if (!it.scenario.ok()) {
      run.scenario = it.label;
      run.error = it.scenario.error.ToString();
    } else {
      run = RunOne(*it.scenario.value, result.policies);
    }
    run.family = it.family;
    if (progress) {
      std::fprintf(stderr, "[%zu/%zu] %-48s %s (%.0f s)\n", i + 1, items.size(), run.scenario.c_str(),
                   run.error.empty() ? "ok" : run.error.c_str(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    result.runs.push_back(std::move(run));
  }
  return result;
}

Status WriteSuiteScenarios(const config::SuiteSpec& spec, std::optional<uint64_t> seed,
                           const std::string& dir, std::vector<std::string>* written) {
  written->clear();
  if (!spec.generate) return Status::InvalidArgument("the suite generates no scenario");
  suite::GeneratorOptions g = *spec.generate;
  if (seed) g.seed = *seed;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string policies;
  for (const std::string& p : spec.policies) policies += (policies.empty() ? "" : ", ") + p;
  for (const suite::GeneratedScenario& s : suite::Generate(g)) {
    const std::string path = (std::filesystem::path(dir) / (s.name + ".yaml")).string();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << s.yaml;
    if (!policies.empty()) f << "policies: [" << policies << "]\n";
    f.close();
    if (!f) return Status::Internal("cannot write " + path);
    written->push_back(path);
  }
  return Status::Ok();
}

std::optional<double> RatioToBestPeer(const SuiteRun& run, const std::string& policy) {
  const report::PolicyReport* self = Find(run, policy);
  const report::PolicyReport* best = BestPeer(run, policy);
  if (!self || !best || best->good <= 0) return std::nullopt;
  return static_cast<double>(self->good) / static_cast<double>(best->good);
}

std::vector<PolicySummary> SummarizeSuite(const SuiteResult& result) {
  std::vector<PolicySummary> out;
  for (const std::string& p : result.policies) {
    PolicySummary s;
    s.policy = p;
    double log_sum = 0;
    s.worst = std::numeric_limits<double>::infinity();
    for (const SuiteRun& run : result.runs) {
      if (!run.error.empty()) continue;
      const std::optional<double> r = RatioToBestPeer(run, p);
      if (!r) continue;
      ++s.runs;
      s.worst = std::min(s.worst, *r);
      log_sum += std::log(std::max(*r, 1e-9));
      if (*r >= 1.10) ++s.ahead_10pct;
      if (*r >= 0.99) ++s.within_1pct;
      else ++s.behind_1pct;
    }
    if (s.runs > 0) s.geomean = std::exp(log_sum / s.runs);
    else s.worst = 0;
    out.push_back(s);
  }
  return out;
}

std::string SuiteMarkdown(const SuiteResult& result, const std::string& reference, bool detail) {
  int ran = 0;
  for (const SuiteRun& r : result.runs) ran += r.error.empty() ? 1 : 0;
  std::string out = fmt::format("## Suite {}: {} scenarios ({} ran) x {} policies\n\n", result.name,
                                result.runs.size(), ran, result.policies.size());
  out += "Goodput (requests that met both objectives; every policy is offered the same requests) over the "
         "best peer's in each scenario (peers: the policies not named kvroute*, the policy itself "
         "excluded).\n\n"
         "| policy | runs | worst | geometric mean | >= best peer - 1% | ahead >= 10% | behind > 1% |\n"
         "|---|--:|--:|--:|--:|--:|--:|\n";
  for (const PolicySummary& s : SummarizeSuite(result)) {
    out += fmt::format("| {} | {} | {:.3f} | {:.3f} | {} | {} | {} |\n", s.policy, s.runs, s.worst, s.geomean,
                       s.within_1pct, s.ahead_10pct, s.behind_1pct);
  }
  out += fmt::format("\n### {} per scenario\n\n", reference);
  out += fmt::format("| scenario | kind | best peer | its good requests | {} good requests | ratio | hit rate ({} / peer) | "
                     "TTFT p99 ({} / peer) |\n|---|---|---|--:|--:|--:|--:|--:|\n",
                     reference, reference, reference);
  for (const SuiteRun& run : result.runs) {
    if (!run.error.empty()) {
      out += fmt::format("| {} | {} | error: {} | | | | | |\n", run.scenario, run.family, run.error);
      continue;
    }
    const report::PolicyReport* self = Find(run, reference);
    const report::PolicyReport* best = BestPeer(run, reference);
    if (!self || !best) continue;
    const std::optional<double> ratio = RatioToBestPeer(run, reference);
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {:.1f}% / {:.1f}% | {} / {} |\n", run.scenario,
                       run.family, best->policy, best->good, self->good,
                       ratio ? fmt::format("{:.3f}", *ratio) : "-", self->prefix_hit_rate * 100,
                       best->prefix_hit_rate * 100, Ms(self->ttft_s.p99), Ms(best->ttft_s.p99));
  }
  if (!detail) return out;
  out += "\n### Every policy per scenario\n";
  for (const SuiteRun& run : result.runs) {
    if (!run.error.empty()) continue;
    out += fmt::format("\n#### {} ({})\n\n| policy | good requests | goodput/s | ratio to best peer | hit rate | TTFT p99 |\n"
                       "|---|--:|--:|--:|--:|--:|\n",
                       run.scenario, run.family);
    for (const report::PolicyReport& r : run.reports) {
      const std::optional<double> ratio = RatioToBestPeer(run, r.policy);
      out += fmt::format("| {} | {} | {:.2f} | {} | {:.1f}% | {} |\n", r.policy, r.good, r.goodput_requests_per_s,
                         ratio ? fmt::format("{:.3f}", *ratio) : "-", r.prefix_hit_rate * 100, Ms(r.ttft_s.p99));
    }
  }
  return out;
}

std::string SuiteJson(const SuiteResult& result) {
  std::string out = "{\"suite\": ";
  api::AppendJsonString(out, result.name);
  out += ", \"scenarios\": [";
  for (size_t i = 0; i < result.runs.size(); ++i) {
    const SuiteRun& run = result.runs[i];
    if (i > 0) out += ", ";
    out += "{\"name\": ";
    api::AppendJsonString(out, run.scenario);
    out += ", \"kind\": ";
    api::AppendJsonString(out, run.family);
    if (!run.error.empty()) {
      out += ", \"error\": ";
      api::AppendJsonString(out, run.error);
    }
    out += ", \"policies\": {";
    for (size_t j = 0; j < run.reports.size(); ++j) {
      const report::PolicyReport& r = run.reports[j];
      if (j > 0) out += ", ";
      api::AppendJsonString(out, r.policy);
      const std::optional<double> ratio = RatioToBestPeer(run, r.policy);
      out += fmt::format(": {{\"good_requests\": {}, \"goodput\": {}, \"hit_rate\": {}, \"ttft_p99_s\": {}, "
                         "\"ratio_to_best_peer\": {}}}",
                         r.good, r.goodput_requests_per_s, r.prefix_hit_rate, r.ttft_s.p99,
                         ratio ? fmt::format("{}", *ratio) : "null");
    }
    out += "}}";
  }
  out += "]}\n";
  return out;
}

}  // namespace kvroute::simulate
