// Shared only inside src/apps/doctor/diagnosis: the readings the figures and the finding
// rules both use (diagnose.cc defines them), and the rules' entry points, which Diagnose
// calls in the order the findings are reported (diagnose_findings.cc, diagnose_router.cc).
// Pure like the rest of the folder: no sockets, no clock reads.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "apps/doctor/diagnosis/doctor.h"

namespace kvroute::doctor::detail {

using Opt = std::optional<double>;

bool Usable(const Scrape& s);

// A counter's increase from `a` to `b`; unknown when either is unknown or it went down
// (the replica restarted in between: the increase is not knowable from two points).
Opt Delta(const Opt& a, const Opt& b);

std::string Pct(double v);
std::string Num(double v);
std::string Threshold(double v);

struct Window {
  const Scrape* first = nullptr;  // first usable scrape
  const Scrape* last = nullptr;   // last usable scrape
  double dt = 0;
};

Window WindowOf(const ReplicaHistory& h);

// The tokens a replica computed (and so had to cache) between two usable scrapes:
// Δ prompt tokens − Δ prefix-cache hits, or Δ prompt tokens when the hit counter is absent.
// Unknown when a counter is unknown, went down, or the two disagree.
Opt ComputedTokens(const Scrape& a, const Scrape& b);

std::string JoinNames(const std::vector<std::string>& names, size_t max = 4);

// Appends a finding to `rep.findings`.
void AddFinding(Report& rep, std::string rule, std::string severity, std::string summary,
                std::string condition, std::string remedy, std::vector<std::string> names,
                bool routing);

// The findings read from the replicas' figures and scrapes, in report order: plumbing
// (unreachable, not-vllm, garbage-metrics, prefix-caching-off), then routing
// (prefix-reuse-lost, lopsided-kv, queue-imbalance), preemptions, and the KV-event rules.
// `live`: the replicas answering now with vLLM metrics (pointers into rep.replicas). Also
// fills rep.fleet.rounds and rep.fleet.lopsided_rounds (the lopsided-kv rule's reading).
void AddReplicaFindings(const std::vector<ReplicaHistory>& replicas,
                        const std::vector<const ReplicaFigures*>& live, const DoctorOptions& o,
                        Report& rep);

// Sets rep.router from the router's scrapes (--router) and adds its findings:
// router-unreadable, else latency-model-inaccurate and slo-missed.
void AddRouterFindings(const ReplicaHistory& router, const DoctorOptions& o, Report& rep);

}  // namespace kvroute::doctor::detail
