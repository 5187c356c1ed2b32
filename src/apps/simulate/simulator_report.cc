// Simulation's totals (simulator_internal.h) and the report assembled from them
// (AssembleReport): the summary of the run's records, then its flow-control, tenant,
// region, P/D, latency-model, LoRA and KV-event blocks.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "apps/simulate/simulator_internal.h"
#include "core/flow/flow_gate.h"
#include "core/routing/routing_core.h"
#include "simkit/report/summary.h"

namespace kvroute::simulate::detail {

report::FleetTotals Simulation::Totals() const {
  report::FleetTotals t;
  for (const Replica& r : replicas_) {
    const engine::EngineStats s = r.engine.Stats();
    t.prefix_queries_tokens += s.prefix_queries_tokens + r.past_queries;
    t.prefix_hits_tokens += s.prefix_hits_tokens + r.past_hits;
    t.preemptions += s.preemptions + r.past_preemptions;
  }
  return t;
}

Simulation::LoraTotals Simulation::lora_totals() const {
  LoraTotals t;
  int64_t seen = 0;
  for (const Replica& r : replicas_) {
    const engine::EngineStats st = r.engine.Stats();
    t.loads += st.lora_loads + r.past_lora_loads;
    t.evictions += st.lora_evictions + r.past_lora_evictions;
    seen += std::count(r.adapters_seen.begin(), r.adapters_seen.end(), true);
  }
  if (!replicas_.empty()) t.adapters_per_replica = static_cast<double>(seen) / replicas_.size();
  return t;
}

routing::LatencyStats Simulation::latency() const {
  routing::LatencyStats t;
  for (const auto& c : cores_) {
    const routing::LatencyStats s = c->latency_stats();
    t.ttft_samples += s.ttft_samples;
    t.tpot_samples += s.tpot_samples;
    for (auto [to, from] : {std::pair{&t.ttft_errors, &s.ttft_errors},
                            std::pair{&t.tpot_errors, &s.tpot_errors}}) {
      to->n += from->n;
      to->abs_s += from->abs_s;
      to->abs_rel += from->abs_rel;
    }
  }
  return t;
}

Simulation::KvTotals Simulation::kv_totals() const {
  KvTotals t = kv_totals_;
  for (const auto& per_router : receivers_) {
    for (const EventReceiver& r : per_router) {
      t.gaps += static_cast<int64_t>(r.stats().gaps);
      t.unrepaired += static_cast<int64_t>(r.stats().unrepaired);
      t.restarts += static_cast<int64_t>(r.stats().restarts);
      t.replayed += static_cast<int64_t>(r.stats().replayed);
    }
  }
  return t;
}

std::vector<double> Simulation::transfer_times() const {
  std::vector<double> v;
  v.reserve(pulls_.size());
  for (const Pull& p : pulls_) v.push_back(p.transfer_s);
  return v;
}

std::pair<int64_t, int64_t> Simulation::holds_ended() const {
  std::pair<int64_t, int64_t> n{0, 0};
  for (const Replica& r : replicas_) {
    const engine::EngineStats st = r.engine.Stats();
    n.first += st.kv_holds_released + r.past_released;
    n.second += st.kv_holds_expired + r.past_expired;
  }
  return n;
}

int64_t Simulation::flow_affinity() const {
  if (!gate_) return 0;
  int64_t n = 0;
  for (const flow::BandStats& b : gate_->stats().bands)
    n += static_cast<int64_t>(b.dispatched_by_affinity);
  return n;
}

int64_t Simulation::flow_late() const {
  if (!gate_) return 0;
  int64_t n = 0;
  for (const flow::BandStats& b : gate_->stats().bands) n += static_cast<int64_t>(b.went_late);
  return n;
}

namespace {

// Requests by the region of the replica that served them (its last attempt's).
std::vector<report::RegionReport> ByRegion(const config::Scenario& sc,
                                           std::span<const report::RequestRecord> records) {
  const std::vector<config::FleetGroup> groups = sc.fleet.Groups();
  if (std::none_of(groups.begin(), groups.end(),
                   [](const config::FleetGroup& g) { return !g.region.empty(); })) {
    return {};
  }
  std::vector<report::RegionReport> rows;
  std::vector<size_t> row_of;  // replica id -> row
  for (const config::FleetGroup& g : groups) {
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const report::RegionReport& r) { return r.region == g.region; });
    if (it == rows.end()) {
      report::RegionReport r;
      r.region = g.region;
      r.local = g.region.empty() || sc.router_region.empty() || g.region == sc.router_region;
      it = rows.insert(rows.end(), std::move(r));
    }
    it->replicas += g.replicas;
    row_of.insert(row_of.end(), static_cast<size_t>(g.replicas),
                  static_cast<size_t>(it - rows.begin()));
  }
  std::vector<std::vector<double>> ttfts(rows.size());
  for (const report::RequestRecord& rec : records) {
    if (rec.endpoint < 0 || static_cast<size_t>(rec.endpoint) >= row_of.size()) continue;
    const size_t row = row_of[static_cast<size_t>(rec.endpoint)];
    ++rows[row].requests;
    if (!rec.ok()) continue;
    ++rows[row].succeeded;
    ttfts[row].push_back(rec.ttft_s);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!records.empty()) rows[i].share = static_cast<double>(rows[i].requests) / records.size();
    const report::Stats st = report::Summarize(ttfts[i]);
    rows[i].ttft_p50_s = st.p50;
    rows[i].ttft_p99_s = st.p99;
  }
  return rows;
}

// The P/D block of the report: the core's decisions, what the legs did, latency of the
// requests served disaggregated against the others, transfers, and busy time by role.
void ReportPd(const config::Scenario& sc, const Simulation& sim, report::PolicyReport* rep) {
  report::PdReport& pd = rep->pd;
  rep->pd_reported = true;
  for (size_t d = 0; d < routing::kNumPdDecisions; ++d) {
    pd.decisions.emplace_back(
        std::string(routing::PdDecisionName(static_cast<routing::PdDecision>(d))),
        sim.pd_decisions()[d]);
  }
  static_cast<report::PdLegCounts&>(pd) = sim.pd_totals();
  std::tie(pd.holds_released, pd.holds_expired) = sim.holds_ended();
  std::vector<report::RequestRecord> split[2];
  for (const report::RequestRecord& rec : sim.records()) {
    split[rec.prefill_endpoint >= 0 ? 1 : 0].push_back(rec);
  }
  for (int k = 0; k < 2; ++k) {
    const report::PolicyReport sub = report::Summarize(rep->policy, split[k], sc.slo,
                                                       report::FleetTotals{},
                                                       &sim.pd_gaps(k == 1), nullptr);
    report::PdClassReport& c = k == 1 ? pd.disaggregated_requests : pd.aggregated_requests;
    c.requests = sub.requests;
    c.succeeded = sub.succeeded;
    c.ttft_s = sub.ttft_s;
    c.tpot_s = sub.tpot_s;
    c.e2e_s = sub.e2e_s;
    c.itl_mean_s = sub.itl_mean_s;
    c.itl_p99_s = sub.itl_p99_s;
  }
  std::vector<double> transfers = sim.transfer_times();
  pd.transfer_s = report::Summarize(transfers);
  // Busy time by role, over the run's span (groups without a role: "none").
  size_t replica = 0;
  for (const config::FleetGroup& g : sc.fleet.Groups()) {
    const std::string role = g.role.empty() ? "none" : g.role;
    auto it = std::find_if(pd.roles.begin(), pd.roles.end(),
                           [&](const report::PdRoleReport& r) { return r.role == role; });
    if (it == pd.roles.end()) it = pd.roles.insert(pd.roles.end(), report::PdRoleReport{role});
    it->replicas += g.replicas;
    for (int k = 0; k < g.replicas; ++k, ++replica) {
      it->busy_s += sim.busy_s(replica);
      it->kv_usage_mean += sim.kv_mean(replica);  // a sum until divided below
    }
  }
  for (report::PdRoleReport& r : pd.roles) {
    if (r.replicas == 0) continue;
    if (rep->span_s > 0) r.utilization = r.busy_s / (rep->span_s * static_cast<double>(r.replicas));
    r.kv_usage_mean /= static_cast<double>(r.replicas);
  }
}

// Flow control's outcomes: the gate's counters and the router waits' mean and p99.
void ReportFlow(bool flow, Simulation& sim, report::PolicyReport* rep) {
  rep->flow_enabled = flow;
  rep->flow_queued = sim.flow_queued();
  rep->flow_shed = sim.flow_shed();
  rep->flow_expired = sim.flow_expired();
  rep->flow_affinity = sim.flow_affinity();
  rep->flow_late = sim.flow_late();
  if (!sim.router_waits().empty()) {
    const report::Stats w = report::Summarize(sim.router_waits());
    rep->router_wait_mean_s = w.mean;
    rep->router_wait_p99_s = w.p99;
  }
}

// Per tenant: the same summary over its own records (span: the whole run's).
void ReportTenants(const config::Scenario& scenario, const std::string& label,
                   const Simulation& sim, report::PolicyReport* rep) {
  for (size_t ti = 0; ti < scenario.tenants.size(); ++ti) {
    std::vector<report::RequestRecord> mine;
    for (size_t i = 0; i < sim.records().size(); ++i) {
      if (sim.record_tenants()[i] == static_cast<int32_t>(ti)) mine.push_back(sim.records()[i]);
    }
    const report::PolicyReport sub =
        report::Summarize(label, mine, scenario.slo, report::FleetTotals{}, nullptr, nullptr);
    report::TenantReport t;
    t.name = scenario.tenants[ti].name;
    t.priority = scenario.tenants[ti].priority;
    t.requests = sub.requests;
    t.succeeded = sub.succeeded;
    auto shed = sub.errors_by_kind.find("shed");
    t.shed = shed == sub.errors_by_kind.end() ? 0 : shed->second;
    t.ttft_p50_s = sub.ttft_s.p50;
    t.ttft_p99_s = sub.ttft_s.p99;
    t.goodput_requests_per_s = rep->span_s > 0 ? static_cast<double>(sub.good) / rep->span_s : 0.0;
    rep->tenants.push_back(std::move(t));
  }
}

// The latency models' samples and their prediction errors, every router replica summed.
void ReportLatency(const Simulation& sim, report::PolicyReport* rep) {
  const routing::LatencyStats lat = sim.latency();
  rep->latency_ttft_samples = static_cast<int64_t>(lat.ttft_samples);
  rep->latency_tpot_samples = static_cast<int64_t>(lat.tpot_samples);
  rep->latency_ttft_scored = static_cast<int64_t>(lat.ttft_errors.n);
  rep->latency_tpot_scored = static_cast<int64_t>(lat.tpot_errors.n);
  if (lat.ttft_errors.n > 0) {
    rep->latency_ttft_mape = lat.ttft_errors.Mape();
    rep->latency_ttft_mae_s = lat.ttft_errors.abs_s / static_cast<double>(lat.ttft_errors.n);
  }
  if (lat.tpot_errors.n > 0) {
    rep->latency_tpot_mape = lat.tpot_errors.Mape();
    rep->latency_tpot_mae_s = lat.tpot_errors.abs_s / static_cast<double>(lat.tpot_errors.n);
  }
}

// LoRA loads and evictions, and the adapters each replica served.
void ReportLora(const Simulation& sim, report::PolicyReport* rep) {
  const auto lora = sim.lora_totals();
  rep->lora_reported = true;
  rep->lora_loads = lora.loads;
  rep->lora_evictions = lora.evictions;
  rep->lora_adapters_per_replica = lora.adapters_per_replica;
}

// The KV-event transport's counts and the route receipts' error.
void ReportKvEvents(const config::Scenario& scenario, const Simulation& sim,
                    report::PolicyReport* rep) {
  const auto kv = sim.kv_totals();
  rep->kv_events_reported = true;
  rep->kv_events_enabled = scenario.kv_events.enabled;
  rep->router_replicas = std::max(1, scenario.router_replicas);
  rep->kv_batches = kv.batches;
  rep->kv_lost = kv.lost;
  rep->kv_gaps = kv.gaps;
  rep->kv_gaps_unrepaired = kv.unrepaired;
  rep->kv_restarts = kv.restarts;
  rep->kv_replayed = kv.replayed;
  rep->receipt_picks = kv.picks;
  rep->receipts = kv.receipts;
  if (kv.receipts > 0) {
    rep->receipt_mae_tokens = kv.abs_error_sum / static_cast<double>(kv.receipts);
    rep->receipt_off_block_share =
        static_cast<double>(kv.off_by_block) / static_cast<double>(kv.receipts);
  }
}

}  // namespace

report::PolicyReport AssembleReport(const config::Scenario& scenario, const std::string& label,
                                    bool flow, double oracle_hit_rate, Simulation& sim) {
  report::FleetTotals totals = sim.Totals();
  totals.oracle_hit_rate = oracle_hit_rate;
  report::PolicyReport rep =
      report::Summarize(label, sim.records(), scenario.slo, totals, &sim.gaps(), &sim.fleet());
  ReportFlow(flow, sim, &rep);
  ReportTenants(scenario, label, sim, &rep);
  rep.regions = ByRegion(scenario, sim.records());
  if (scenario.HasRoles()) ReportPd(scenario, sim, &rep);
  ReportLatency(sim, &rep);
  if (scenario.workload.adapters.count > 0) ReportLora(sim, &rep);
  if (scenario.kv_events.enabled || scenario.router_replicas > 1) {
    ReportKvEvents(scenario, sim, &rep);
  }
  return rep;
}

}  // namespace kvroute::simulate::detail
