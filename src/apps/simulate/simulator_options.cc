// The names and set-up of a simulation run (simulator.h): policy labels and their
// "+flow", "+admission" and "+local-only" suffixes, the admission gate a label gets, the local-only scenario, and the routing core's
// endpoints and options for a scenario.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "apps/simulate/simulator.h"
#include "apps/simulate/simulator_internal.h"
#include "config/core_options.h"
#include "config/router_config.h"
#include "core/engine/engine.h"
#include "core/flow/peer_admission.h"
#include "core/routing/routing_core.h"
#include "core/sched/scheduler.h"

namespace kvroute::simulate {
namespace {

constexpr std::string_view kFlowSuffix = "+flow";
constexpr std::string_view kAdmissionSuffix = "+admission";

constexpr std::string_view kLocalOnlySuffix = "+local-only";
constexpr std::string_view kLocalOnlyPolicy = "local-only";  // kvroute+local-only

}  // namespace

namespace detail {

bool HasFlowSuffix(std::string_view policy) {
  return policy.size() > kFlowSuffix.size() && policy.ends_with(kFlowSuffix);
}

bool HasAdmissionSuffix(std::string_view policy) {
  return policy.size() > kAdmissionSuffix.size() && policy.ends_with(kAdmissionSuffix);
}

}  // namespace detail

std::string PolicyWithoutFlow(const std::string& policy) {
  if (detail::HasFlowSuffix(policy)) return policy.substr(0, policy.size() - kFlowSuffix.size());
  if (detail::HasAdmissionSuffix(policy))
    return policy.substr(0, policy.size() - kAdmissionSuffix.size());
  return policy;
}

std::optional<flow::FlowOptions> GateOptions(const config::Scenario& scenario,
                                             const std::string& label, Status* error) {
  *error = Status::Ok();
  if (scenario.flow.enabled || detail::HasFlowSuffix(label)) return scenario.flow.options;
  const std::string base = BasePolicy(label);
  if (detail::HasAdmissionSuffix(label)) {
    const std::optional<flow::Admission> a = flow::PeerAdmissionOf(base, /*turned_on=*/true);
    if (!a) {
      *error = Status::InvalidArgument(
          "policy " + label + ": " + base +
          " has no admission of its own to turn on (+admission: dynamo-kv, llm-d-sticky, "
          "llm-d-precise)");
      return std::nullopt;
    }
    return flow::PeerFlowOptions(*a, scenario.fleet.EngineConfigFor().max_num_batched_tokens);
  }
  // A peer's admission that is on as it ships: only a sheddable request ever reads it, so
  // without one the run needs no gate.
  if (const std::optional<flow::Admission> a = flow::PeerAdmissionOf(base, false)) {
    flow::FlowOptions o = flow::PeerFlowOptions(*a);
    for (const config::ScenarioTenant& t : scenario.tenants) {
      if (t.priority < o.shed_below_priority) return o;
    }
  }
  return std::nullopt;
}

std::string BasePolicy(const std::string& policy) {
  std::string base = PolicyWithoutFlow(policy);
  if (base == kLocalOnlyPolicy) return "kvroute";
  if (base.size() > kLocalOnlySuffix.size() && base.ends_with(kLocalOnlySuffix))
    base.resize(base.size() - kLocalOnlySuffix.size());
  return base;
}

bool IsLocalOnly(const std::string& policy) {
  const std::string base = PolicyWithoutFlow(policy);
  return base == kLocalOnlyPolicy ||
         (base.size() > kLocalOnlySuffix.size() && base.ends_with(kLocalOnlySuffix));
}

Status LocalOnlyScenario(const config::Scenario& scenario, config::Scenario* out) {
  if (scenario.router_region.empty()) {
    return Status::InvalidArgument(
        "local-only needs the router's region (router: {region: R} in the scenario)");
  }
  *out = scenario;
  out->fleet.groups.clear();
  out->faults.clear();
  std::vector<int> new_id;  // old replica id -> new, -1 when removed
  int kept = 0;
  for (const config::FleetGroup& g : scenario.fleet.Groups()) {
    const bool local = g.region.empty() || g.region == scenario.router_region;
    for (int k = 0; k < g.replicas; ++k) new_id.push_back(local ? kept++ : -1);
    if (local) out->fleet.groups.push_back(g);
  }
  if (kept == 0) {
    return Status::InvalidArgument("local-only: no replica in region '" + scenario.router_region +
                                   "'");
  }
  out->fleet.replicas = kept;
  for (config::ScenarioFault f : scenario.faults) {
    if (new_id[static_cast<size_t>(f.replica)] < 0) continue;
    f.replica = new_id[static_cast<size_t>(f.replica)];
    out->faults.push_back(f);
  }
  return Status::Ok();
}

void ApplyRouterRegion(const config::Scenario& scenario, routing::CoreOptions* opts) {
  opts->region = scenario.router_region;
  opts->region_rtt_s.clear();
  if (scenario.router_region.empty()) return;
  // The simulated router knows its network: a remote region's round trip is twice its
  // groups' one-way delay (the largest, should its groups differ).
  for (const config::FleetGroup& g : scenario.fleet.Groups()) {
    if (g.region.empty() || g.region == scenario.router_region) continue;
    auto it = std::find_if(opts->region_rtt_s.begin(), opts->region_rtt_s.end(),
                           [&](const auto& r) { return r.first == g.region; });
    if (it == opts->region_rtt_s.end()) {
      opts->region_rtt_s.emplace_back(g.region, 2 * g.network_delay_s);
    } else {
      it->second = std::max(it->second, 2 * g.network_delay_s);
    }
  }
}

std::vector<routing::EndpointSpec> SimulationEndpoints(const config::Scenario& scenario) {
  std::vector<routing::EndpointSpec> endpoints;
  for (const config::FleetGroup& g : scenario.fleet.Groups()) {
    for (int k = 0; k < g.replicas; ++k) {
      routing::EndpointSpec e;
      e.address = "replica-" + std::to_string(endpoints.size());
      e.name = e.address;
      e.host = e.address;
      // As `labels: {region: R}` on a configured endpoint of `kvroute serve`.
      if (!g.region.empty()) e.labels.emplace_back("region", g.region);
      if (!g.zone.empty()) e.labels.emplace_back("zone", g.zone);
      if (!g.role.empty()) e.labels.emplace_back(std::string(routing::kRoleLabel), g.role);
      if (scenario.kv_events.enabled) e.kv_events = "sim://" + e.address;
      endpoints.push_back(std::move(e));
    }
  }
  return endpoints;
}

routing::CoreOptions SimulationCoreOptions(const config::Scenario& scenario,
                                           const std::string& policy) {
  // serve's defaults (a named object: GCC 12 misreads a temporary RouterConfig's strings as
  // maybe uninitialised).
  static const config::RouterConfig kServeDefaults;
  routing::CoreOptions opts = config::CoreOptionsFrom(kServeDefaults);
  opts.scheduling = sched::SchedulingSpec{};
  opts.scheduling.policy = policy;
  opts.seed = scenario.seed;
  // The scenario's SLOs are the pool default (requests carry none of their own).
  opts.default_slo_ttft_s = scenario.slo.ttft_s;
  opts.default_slo_tpot_s = scenario.slo.tpot_s;
  opts.pd = scenario.pd.options;
  ApplyRouterRegion(scenario, &opts);
  return opts;
}

}  // namespace kvroute::simulate
