// RunSimulation and RunSimulationWith (simulator.h): a Simulation (simulator_internal.h)
// built and run, its report assembled; the Simulation's construction and event loop; and
// the workload's oracle hit rate.
#include "apps/simulate/simulator.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apps/simulate/event_transport.h"
#include "apps/simulate/simulator_internal.h"
#include "config/router_config.h"
#include "core/common/rng.h"
#include "core/engine/engine.h"
#include "core/engine/tokenizer.h"
#include "core/flow/flow_gate.h"
#include "core/metrics/engine_metrics.h"
#include "core/routing/routing_core.h"
#include "core/sched/registry.h"
#include "simkit/report/summary.h"
#include "simkit/workload/oracle.h"
#include "simkit/workload/workload.h"

namespace kvroute::simulate {
namespace detail {

void EngineOutputText(uint64_t id, int32_t tokens, std::string* out) {
  out->reserve(out->size() + static_cast<size_t>(tokens) * engine::kBytesPerToken);
  for (int32_t i = 0; i < tokens; ++i)
    out->append(engine::OutputTokenText(id, static_cast<size_t>(i)));
}

Simulation::Simulation(const config::Scenario& s, const routing::CoreOptions& options,
                       const ProgressFn& progress, const std::optional<flow::FlowOptions>& gate,
                       const CoreTap& tap, Status* error)
    : sc_(s),
      progress_(progress),
      tap_(tap),
      gen_(s.workload, s.arrivals, s.seed),
      fleet_(s.fleet.replicas) {
  const engine::EngineConfig config = s.fleet.EngineConfigFor();
  model_ = config.model_name;
  model_key_ = model_.empty() ? 0 : metrics::AdapterKey(model_);
  adapter_names_.reserve(static_cast<size_t>(std::max(0, s.workload.adapters.count)));
  for (int32_t k = 0; k < s.workload.adapters.count; ++k) {
    adapter_names_.push_back(workload::AdapterName(k));
  }
  kv_events_ = s.kv_events.enabled;
  pd_report_ = s.HasRoles();
  replicas_.reserve(static_cast<size_t>(s.fleet.replicas));
  const std::vector<config::FleetGroup> groups = s.fleet.Groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    engine::EngineConfig group_config = groups[g].EngineConfigFor();
    group_config.record_kv_events = kv_events_;
    for (int k = 0; k < groups[g].replicas; ++k)
      replicas_.emplace_back(group_config, groups[g].network_delay_s, static_cast<int>(g));
  }
  std::vector<routing::EndpointSpec> endpoints = SimulationEndpoints(s);
  assert(endpoints.size() == replicas_.size());
  kv_.resize(replicas_.size());
  waiting_.resize(replicas_.size());
  // Router replicas: configured alike but for their seeds (core k: seed + k).
  const int n_cores = std::max(1, s.router_replicas);
  for (int k = 0; k < n_cores; ++k) {
    cores_.push_back(std::make_unique<routing::RoutingCore>());
    routing::CoreOptions o = options;
    o.seed = options.seed + static_cast<uint64_t>(k);
    *error = cores_.back()->Configure(o, endpoints, 0.0);
    if (!error->ok()) return;
    // Fresh endpoints take ids 0..n-1 in order: replica i is endpoint i.
    assert(cores_.back()->table()->by_id.size() == replicas_.size());
  }
  if (gate && n_cores > 1) {
    *error = Status::InvalidArgument(
        "flow control is not modelled with several router replicas (router.replicas " +
        std::to_string(n_cores) + ")");
    return;
  }
  if (kv_events_) {
    for (size_t i = 0; i < replicas_.size(); ++i)
      publishers_.emplace_back(static_cast<uint64_t>(s.kv_events.buffer_steps));
    receivers_.resize(cores_.size());
    for (size_t k = 0; k < cores_.size(); ++k) {
      receivers_[k].assign(replicas_.size(), EventReceiver(s.kv_events.replay));
      loss_rng_.emplace_back(MixKey(s.seed ^ 0x6b76657674ULL, k));
    }
  }
  max_attempts_ = static_cast<uint32_t>(std::max(1, config::RetryConfig{}.max_attempts));
  if (gate) gate_ = std::make_unique<flow::FlowGate>(*gate, *cores_[0], [this] { return now_; });
  double total = 0;
  for (const config::ScenarioTenant& t : s.tenants) total += t.share;
  for (const config::ScenarioTenant& t : s.tenants) {
    tenant_cdf_.push_back((tenant_cdf_.empty() ? 0.0 : tenant_cdf_.back()) + t.share / total);
  }
}

void Simulation::Run() {
  for (size_t i = 0; i < sc_.faults.size(); ++i)
    Push(sc_.faults[i].spec.at_s, Ev::kFaultStart, static_cast<uint32_t>(i));
  Push(0.0, Ev::kScrape, 0);
  FetchNext();
  while (!queue_.empty()) {
    const Event ev = queue_.top();
    queue_.pop();
    now_ = ev.t;
    ++events_;
    switch (ev.type) {
      case Ev::kScrape:
        Scrape(ev.t);
        break;
      case Ev::kArrival:
        Arrival(ev.t);
        break;
      case Ev::kSend:
        TrySend(ev.a, ev.t);
        break;
      case Ev::kReach:
        Reach(ev.a, ev.t);
        break;
      case Ev::kStepDone:
        StepDone(ev.a, ev.t);
        break;
      case Ev::kFirstToken:
        FirstToken(ev.a, ev.t);
        break;
      case Ev::kFinished: {
        // The replica it ran on has a free slot: it binds the first release late.
        const uint32_t freed = Finish(ev.a, ev.t);
        Complete(ev.a, ev.t);
        Pump(freed);
        break;
      }
      case Ev::kFlowExpiry:
        if (ev.t >= flow_timer_at_) flow_timer_at_ = kInf;
        Pump();
        break;
      case Ev::kFail:
        Retry(ev.a, ev.t);
        break;
      case Ev::kFaultStart:
        FaultStart(sc_.faults[ev.a], ev.t);
        if (const auto& d = sc_.faults[ev.a].spec.duration_s) Push(ev.t + *d, Ev::kFaultEnd, ev.a);
        break;
      case Ev::kFaultEnd:
        FaultEnd(sc_.faults[ev.a]);
        break;
      case Ev::kKvArrive:
        KvArrive(ev.t);
        break;
      case Ev::kKvReplay:
        KvReplay(ev.a, ev.t);
        break;
      case Ev::kPrefillReach:
        PrefillReach(ev.a, ev.t);
        break;
      case Ev::kPrefillDone:
        PrefillDone(ev.a, ev.t);
        break;
      case Ev::kPrefillFail:
        PrefillFail(ev.a, ev.t);
        break;
      case Ev::kKvReady:
        if (!replicas_[ev.a].busy && replicas_[ev.a].engine.HasWork()) StartStep(ev.a, ev.t);
        break;
      case Ev::kTransferDone: {
        const Pull& p = pulls_[ev.a];
        replicas_[p.prefill].engine.ReleaseHold(p.id);
        break;
      }
      case Ev::kHoldExpiry:
        // A busy engine expires holds at its next step.
        if (!replicas_[ev.a].busy) replicas_[ev.a].engine.ExpireHolds(ev.t);
        break;
    }
    if (progress_ && (events_ & 0xffff) == 0) progress_(now_, sent_, finished_);
  }
  if (progress_) progress_(now_, sent_, finished_);
}

}  // namespace detail

SimulationResult RunSimulationWith(const config::Scenario& requested,
                                   const routing::CoreOptions& options, const std::string& label,
                                   double oracle_hit_rate, const ProgressFn& progress,
                                   const CoreTap& tap) {
  SimulationResult result;
  // `+local-only`: the same run on the router's region's groups alone.
  config::Scenario local;
  if (IsLocalOnly(label)) {
    if (Status st = LocalOnlyScenario(requested, &local); !st.ok()) {
      result.error = st.message();
      return result;
    }
  }
  const config::Scenario* chosen = IsLocalOnly(label) ? &local : &requested;
  // The policies defined by the engines' KV-cache events (llm-d-precise, dynamo-kv) run
  // with them even when the scenario leaves them off (the transport's defaults): without
  // events they would only repeat their approximate twins.
  config::Scenario with_events;
  if (sched::PolicyNeedsEvents(BasePolicy(label)) && !chosen->kv_events.enabled) {
    with_events = *chosen;
    with_events.kv_events.enabled = true;
    chosen = &with_events;
  }
  const config::Scenario& scenario = *chosen;
  Status configured;
  const std::optional<flow::FlowOptions> gate = GateOptions(scenario, label, &configured);
  if (!configured.ok()) {
    result.error = configured.message();
    return result;
  }
  const bool flow = gate.has_value();
  detail::Simulation sim(scenario, options, progress, gate, tap, &configured);
  if (!configured.ok()) {
    result.error = configured.message();
    return result;
  }
  sim.Run();
  result.report = detail::AssembleReport(scenario, label, flow, oracle_hit_rate, sim);
  result.events = sim.events();
  result.steps = sim.steps();
  result.records = std::move(sim.records());
  return result;
}

SimulationResult RunSimulation(const config::Scenario& scenario, const std::string& policy,
                               double oracle_hit_rate, const ProgressFn& progress) {
  // `<policy>+flow`: the policy with flow control on, `+local-only` on the local groups
  // (RunSimulationWith reads the label).
  return RunSimulationWith(scenario, SimulationCoreOptions(scenario, BasePolicy(policy)), policy,
                           oracle_hit_rate, progress);
}

double ComputeOracleHitRate(const config::Scenario& scenario) {
  workload::RequestGenerator gen(scenario.workload, scenario.arrivals, scenario.seed);
  const engine::EngineConfig config = scenario.fleet.EngineConfigFor();
  workload::PrefixOracle oracle(config.block_size, engine::kBytesPerToken);
  workload::RequestSpec spec;
  std::vector<workload::PrefixExtent> extents;
  std::string text;
  while (gen.Next(&spec)) {
    int64_t prompt_tokens = spec.prompt_tokens;
    if (spec.endpoint == api::Endpoint::kCompletions) {
      // Every generated token is 4 bytes (engine output text too): no need to render.
      extents.clear();
      for (const workload::Segment& s : spec.segments) {
        extents.push_back({s.key, static_cast<uint32_t>(s.tokens * engine::kBytesPerToken)});
      }
    } else {
      workload::RenderPrompt(spec, detail::EngineOutputText, &text, &extents);
      prompt_tokens = static_cast<int64_t>(engine::CountTokens(text));
    }
    oracle.Observe(extents, prompt_tokens);
    // The replica also caches the generated tokens; a follow-up turn may hit them.
    extents.push_back(
        {spec.id,
         static_cast<uint32_t>(spec.max_tokens * static_cast<int64_t>(engine::kBytesPerToken))});
    oracle.Insert(extents);
  }
  return oracle.HitRate();
}

}  // namespace kvroute::simulate
