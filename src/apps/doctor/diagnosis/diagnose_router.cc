// The router's side of the diagnosis (--router): its figures from its own /metrics (the
// latency model's prediction errors, the objectives' attainment) and the findings they
// fire: router-unreadable, latency-model-inaccurate, slo-missed.
#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/doctor/diagnosis/diagnose_internal.h"
#include "apps/doctor/diagnosis/doctor.h"

namespace kvroute::doctor {

using detail::Delta;
using detail::Opt;

// The router's figures over its scrapes: counter deltas between its first and last usable
// scrapes (totals with one).
RouterFigures RouterFiguresOf(const ReplicaHistory& h) {
  RouterFigures f;
  f.name = h.name;
  f.address = h.address;
  const Scrape* first = nullptr;
  const Scrape* last = nullptr;
  for (const Scrape& s : h.scrapes) {
    ++f.scrapes;
    if (!s.reachable) {
      ++f.failures;
      continue;
    }
    if (!s.any_router_series) continue;
    if (!first) first = &s;
    last = &s;
  }
  if (!h.scrapes.empty()) {
    f.reachable = h.scrapes.back().reachable;
    f.error = h.scrapes.back().error;
  }
  if (!last) return f;
  f.kvroute = true;
  f.flow_control = last->router.flow_control;
  const bool one = first == last;
  auto window = [&](const std::optional<double>(Scrape::RouterSeries::*field)[2], size_t k) -> Opt {
    const Opt b = (last->router.*field)[k];
    if (one) return b;
    return Delta((first->router.*field)[k], b);
  };
  for (size_t k = 0; k < 2; ++k) {
    RouterFigures::Kind& out = k == 0 ? f.ttft : f.tpot;
    out.predictions = window(&Scrape::RouterSeries::scored, k);
    const Opt abs_s = window(&Scrape::RouterSeries::abs_error_s, k);
    const Opt rel = window(&Scrape::RouterSeries::abs_rel_error, k);
    if (out.predictions && *out.predictions > 0) {
      if (rel) out.mape = *rel / *out.predictions;
      if (abs_s) out.mean_abs_error_s = *abs_s / *out.predictions;
    }
    out.slo_requests = window(&Scrape::RouterSeries::slo_requests, k);
    out.slo_violations = window(&Scrape::RouterSeries::slo_violations, k);
    if (out.slo_requests && out.slo_violations && *out.slo_requests > 0 &&
        *out.slo_violations <= *out.slo_requests) {
      out.attainment = 1.0 - *out.slo_violations / *out.slo_requests;
    }
  }
  return f;
}

namespace detail {
namespace {

void RouterUnreadableFinding(const RouterFigures& r, Report& rep) {
  AddFinding(rep, "router-unreadable", "warning",
      r.reachable ? fmt::format("router {} answered /metrics without kvroute's latency "
                                "series",
                                r.address)
                  : fmt::format("router {} unreachable: {}", r.address, r.error),
      "--router given, and no scrape in the window had kvroute_latency_* or kvroute_slo_* "
      "series",
      "point --router at `kvroute serve`'s listen address or `kvroute epp`'s metrics "
      "address (its /metrics), not at a replica or a gateway",
      {r.name}, false);
}

// `lead`, then what `say` says of the router's TTFT figures and of its TPOT figures
// ("; "-joined; an empty part is nothing to say). Empty when it says nothing of either.
template <class Say>
std::string ForEachKind(const RouterFigures& r, std::string_view lead, Say say) {
  std::string out;
  for (size_t k = 0; k < 2; ++k) {
    const std::string part = say(k == 0 ? r.ttft : r.tpot, k == 0 ? "TTFT" : "TPOT");
    if (part.empty()) continue;
    out += out.empty() ? std::string(lead) : std::string("; ");
    out += part;
  }
  return out;
}

void LatencyModelFinding(const RouterFigures& r, const DoctorOptions& o, Report& rep) {
  std::string summary = ForEachKind(
      r, "router's latency model: ",
      [&](const RouterFigures::Kind& x, std::string_view kind) -> std::string {
        if (!(x.mape && x.predictions && x.mean_abs_error_s &&
              *x.predictions >= o.latency_min_predictions && *x.mape > o.latency_max_mape &&
              *x.mean_abs_error_s > o.latency_min_abs_error_s)) {
          return {};
        }
        return fmt::format("{} predictions off by {} on average (mean {:.3f} s) over {} "
                           "predictions",
                           kind, Pct(*x.mape), x.mean_abs_error_s.value_or(0),
                           Num(*x.predictions));
      });
  if (!summary.empty()) {
    AddFinding(rep, "latency-model-inaccurate", "warning", std::move(summary),
        fmt::format("mean relative error > {} and mean absolute error > {} s over >= {} "
                    "scored predictions in the window",
                    Pct(o.latency_max_mape), Threshold(o.latency_min_abs_error_s),
                    Threshold(o.latency_min_predictions)),
        "the model steers flow control by predicted miss (flow.slo_aware) and the "
        "kvroute-slo policy. Check that the replicas' metrics are fresh "
        "(pool.scrape_interval, kvroute_endpoint_scrape_age_seconds) and that answers "
        "stream (only streamed answers teach it). It errs most in bursts; "
        "flow.slo_admit_fraction and flow.slo_release_fraction: 0 keep admission and "
        "release to the saturation detector, "
        "flow.slo_aware: false orders the queue by arrival again",
        {r.name}, false);
  }
}

void SloMissedFinding(const RouterFigures& r, const DoctorOptions& o, Report& rep) {
  std::string summary = ForEachKind(
      r, "at the router: ",
      [&](const RouterFigures::Kind& x, std::string_view kind) -> std::string {
        if (!(x.attainment && x.slo_requests && *x.slo_requests >= o.slo_min_requests &&
              1.0 - *x.attainment > o.slo_max_violation)) {
          return {};
        }
        return fmt::format("{} of {} requests missed their {} objective",
                           Pct(1.0 - *x.attainment), Num(*x.slo_requests), kind);
      });
  if (!summary.empty()) {
    AddFinding(rep, "slo-missed", "warning", std::move(summary),
        fmt::format("more than {} of >= {} requests with an objective (x-llm-d-slo-*-ms, "
                    "epp.objectives, scheduling.slo) missed it in the window",
                    Pct(o.slo_max_violation), Threshold(o.slo_min_requests)),
        r.flow_control
            ? "flow control is on: requests predicted to miss already yield to those that "
              "can still meet theirs, so the fleet lacks capacity for these objectives at "
              "this load: add replicas, or mark batch traffic sheddable (an objective with "
              "priority < 0) so it is refused when predicted to miss"
            : "flow: {enabled: true} (flow.slo_aware is its default): in overload, requests "
              "predicted to miss their objective wait behind those that can still meet "
              "theirs instead of queueing in the engines (docs/POLICIES.md, \"Flow control "
              "by predicted miss\"); if they still miss, the fleet lacks capacity",
        {r.name}, true);
  }
}

}  // namespace

void AddRouterFindings(const ReplicaHistory& router, const DoctorOptions& o, Report& rep) {
  rep.router = RouterFiguresOf(router);
  const RouterFigures& r = *rep.router;
  if (!r.kvroute) {
    RouterUnreadableFinding(r, rep);
  } else {
    LatencyModelFinding(r, o, rep);
    SloMissedFinding(r, o, rep);
  }
}

}  // namespace detail
}  // namespace kvroute::doctor
