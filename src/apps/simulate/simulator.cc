#include "apps/simulate/simulator.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <queue>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "config/core_options.h"
#include "config/router_config.h"
#include "core/engine/engine.h"
#include "core/engine/kv_transfer.h"
#include "core/engine/tokenizer.h"
#include "core/flow/flow_gate.h"
#include "core/flow/flow_queue.h"
#include "simkit/report/summary.h"
#include "core/routing/routing_core.h"
#include "core/sched/registry.h"
#include "simkit/workload/oracle.h"
#include "simkit/workload/workload.h"
#include "apps/simulate/event_transport.h"
#include "core/common/rng.h"

namespace kvroute::simulate {
namespace {

// The engine's generated text, so a follow-up turn's prompt holds exactly what the
// replica produced (and re-tokenizes to the same ids: tokenizer.h).
void EngineOutputText(uint64_t id, int32_t tokens, std::string* out) {
  out->reserve(out->size() + static_cast<size_t>(tokens) * engine::kBytesPerToken);
  for (int32_t i = 0; i < tokens; ++i)
    out->append(engine::OutputTokenText(id, static_cast<size_t>(i)));
}

enum class Ev : uint8_t {
  kScrape,      // the router scrapes every replica
  kArrival,     // the next generated request is due
  kSend,        // a held-back request (follow-up turn) may be sent: a = slot
  kReach,       // a request reaches its replica: a = slot
  kStepDone,    // a replica's step ends: a = replica
  kFirstToken,  // the first token reaches the router/client: a = slot
  kFinished,    // the last token (or an error) reaches the router/client: a = slot
  kFail,        // the router learns an attempt failed (refused, reset): a = slot
  kFaultStart,  // scenario fault a begins
  kFaultEnd,    // scenario fault a ends
  kFlowExpiry,  // the flow queue's earliest expiry is due
  kKvArrive,    // the oldest KV-event batch in transit reaches its router replica
  kKvReplay,    // a replay reaches its router replica: a = router * replicas + replica
  // P/D (issue 25).
  kPrefillReach,  // a prefill leg reaches its prefill replica: a = slot
  kPrefillDone,   // the prefill leg's answer reaches the router: a = slot
  kPrefillFail,   // the router learns the prefill leg failed (refused, reset): a = slot
  kKvReady,       // a decode leg's KV pull completes on replica a: its engine may step
  kTransferDone,  // a pull completes: the prefill replica's hold ends (a = index in pulls_)
  kHoldExpiry,    // a hold's lease on replica a may have ended
};

// Where a live request is; a crash or restart acts on those at or heading to the replica.
// A disaggregated request's prefill leg: kPrefillNetwork (heading to its prefill replica),
// kPrefill (in that engine), kPrefillAnswer (the answer on its way back); then the decode
// leg goes through kNetwork and kEngine as any request.
enum class Stage : uint8_t {
  kWaiting, kNetwork, kEngine, kDone, kPrefillNetwork, kPrefill, kPrefillAnswer
};

constexpr uint32_t kNoEndpoint = routing::RoutingCore::kNoEndpoint;

struct Event {
  double t;
  uint64_t seq;  // FIFO among equal times: determinism
  uint32_t a;
  Ev type;
};

struct Later {
  bool operator()(const Event& x, const Event& y) const {
    return x.t > y.t || (x.t == y.t && x.seq > y.seq);
  }
};

// A request between its arrival and its completion. Slots are recycled, and with them
// the capacity of their vectors.
struct Live {
  workload::RequestSpec spec;
  std::vector<uint32_t> tokens;
  double send_s = 0.0;
  double queued_s = 0.0;  // waited in the router's flow queue before its pick
  double first_token_s = -1.0;
  double last_token_s = 0.0;
  double max_gap_s = 0.0;
  sched::RequestHandle handle = sched::kNoHandle;
  int32_t replica = -1;
  // The core's ranking for this request: attempt k goes to ranked[k].
  std::array<uint32_t, routing::kMaxRanked> ranked{};
  uint32_t n_ranked = 0;
  bool refused = false;  // the failed attempt could not connect (a free retry)
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;
  int32_t retries = 0;
  int32_t tenant = 0;      // index into the scenario's tenants (0 without tenants)
  uint32_t core = 0;       // the router replica (routing core) that picked it
  bool tokens_ready = false;  // `tokens` holds the prompt's ids for the next attempt
  // Route receipt: the pick's predicted cached tokens (-1: none) and the engine's cached
  // tokens at the first attempt's first admission (-1: not admitted yet).
  int64_t predicted_cached = -1;
  int64_t admitted_cached = -1;
  bool flow_queued = false;  // waiting in the flow gate now
  // P/D (a disaggregated pick): the prefill leg's replica and the prefill work the core
  // charged there (released once, by OnPrefillDone), the prefill replicas that failed it,
  // and what the decode leg takes.
  int32_t prefill = -1;
  double prefill_charge = 0.0;
  bool prefill_charged = false;
  bool prefill_rejected = false;  // its engine refused the leg (a 4xx: no other prefill)
  std::vector<uint32_t> prefill_tried;
  bool pull = false;         // the next decode attempt carries the prefill's answer
  int held_blocks = 0;       // blocks the prefill leg held at its finish (remote_block_ids)
  bool served_pd = false;    // the decode leg reached its replica with that answer
  int64_t prefill_cached = -1;  // the prefill leg's cached tokens (what serve reports)
  double transfer_s = -1.0;  // the decode leg's pull; -1: none
  Stage stage = Stage::kWaiting;
  report::ErrorKind error = report::ErrorKind::kNone;
};

struct Replica {
  Replica(const engine::EngineConfig& c, double delay_s, int group)
      : config(c), engine(c), delay_s(delay_s), group(group) {}
  engine::EngineConfig config;  // its group's: a restart starts a fresh engine from it
  engine::Engine engine;
  double delay_s;  // its group's network_delay_s: router -> replica and back, each way
  int group;       // index into the scenario's fleet.Groups()
  engine::StepResult step;  // the step in progress (outputs visible at its end)
  bool busy = false;
  bool stale_step = false;  // the step in flight belongs to an engine a restart replaced
  // Faults: refusing connections (crash, restart downtime), step-time multiplier (slow),
  // and the counters of engines replaced by restarts (for the run's totals).
  int down = 0;  // crash and restart downtime may overlap
  double slow = 1.0;
  int64_t past_queries = 0, past_hits = 0, past_preemptions = 0;
  int restarts = 0;  // restart faults so far (each new engine gets another hash seed)
  double busy_s = 0.0;  // virtual seconds of steps run (per-role utilisation)
  double kv_sum = 0.0;  // KV usage summed over scrapes (its mean, per role)
  int64_t past_released = 0, past_expired = 0;  // P/D holds of replaced engines
  int64_t past_lora_loads = 0, past_lora_evictions = 0;  // LoRA, of replaced engines
  std::vector<bool> adapters_seen;  // LoRA: adapters whose requests reached it
};

// A KV pull in progress: when it completes, the prefill replica's hold on `id` ends.
struct Pull {
  uint32_t prefill = 0;
  uint64_t id = 0;
  double transfer_s = 0.0;
};

// A KV-event batch on its way to one router replica.
struct KvInFlight {
  uint32_t router = 0;
  uint32_t source = 0;  // engine replica
  uint64_t seq = 0;
  BatchPtr batch;
};

class Simulation {
 public:
  // `options`: the core's (SimulationCoreOptions or a caller's). `error` is set when the
  // core refuses them (an invalid scheduling spec); the simulation must not run then.
  Simulation(const config::Scenario& s, const routing::CoreOptions& options,
             const ProgressFn& progress, bool flow, const CoreTap& tap, Status* error)
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
    if (flow && n_cores > 1) {
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
    max_attempts_ = static_cast<uint32_t>(std::max(1, config::RouterConfig{}.retries.max_attempts));
    if (flow) {
      gate_ = std::make_unique<flow::FlowGate>(s.flow.options, *cores_[0], [this] { return now_; });
    }
    double total = 0;
    for (const config::ScenarioTenant& t : s.tenants) total += t.share;
    for (const config::ScenarioTenant& t : s.tenants) {
      tenant_cdf_.push_back((tenant_cdf_.empty() ? 0.0 : tenant_cdf_.back()) + t.share / total);
    }
  }

  void Run() {
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

  report::FleetTotals Totals() const {
    report::FleetTotals t;
    for (const Replica& r : replicas_) {
      const engine::EngineStats s = r.engine.Stats();
      t.prefix_queries_tokens += s.prefix_queries_tokens + r.past_queries;
      t.prefix_hits_tokens += s.prefix_hits_tokens + r.past_hits;
      t.preemptions += s.preemptions + r.past_preemptions;
    }
    return t;
  }

  // LoRA totals over the fleet (engines replaced by restarts included).
  struct LoraTotals {
    int64_t loads = 0, evictions = 0;
    double adapters_per_replica = 0.0;  // distinct adapters served, mean over replicas
  };
  LoraTotals lora_totals() const {
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

  std::vector<report::RequestRecord>& records() { return records_; }
  const std::vector<report::RequestRecord>& records() const { return records_; }
  const report::GapHistogram& gaps() const { return gaps_; }
  const report::FleetRecorder& fleet() const { return fleet_; }
  int64_t events() const { return events_; }
  // KV events and route receipts (kv_events.enabled).
  struct KvTotals {
    int64_t batches = 0;      // published (per engine step with events)
    int64_t lost = 0;         // (batch, router replica) deliveries lost in transit
    int64_t gaps = 0, unrepaired = 0, restarts = 0, replayed = 0;  // summed over routers
    int64_t picks = 0;        // dispatched picks
    int64_t receipts = 0;     // of which had a prediction and an admission to compare
    double abs_error_sum = 0.0;
    int64_t off_by_block = 0;  // |predicted - actual| > the engine's block size
  };
  // The latency models of every router replica, summed.
  routing::LatencyStats latency() const {
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
  KvTotals kv_totals() const {
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
  int64_t steps() const { return steps_; }
  // P/D: the core's decisions (by PdDecision), what the legs did, the inter-token gaps of
  // requests served aggregated [0] and disaggregated [1] (when some group has a role), and
  // each replica's busy seconds.
  struct PdTotals {
    int64_t served = 0;           // decode legs that reached their replica with an answer
    int64_t pulls = 0;            // of which pulled KV
    int64_t recomputed = 0;       // of which had too little to pull (kv_min_pull_tokens)
    int64_t pull_failures = 0;    // of which found the prefill replica down or its hold gone
    int64_t prefill_retries = 0;  // prefill legs moved to another prefill replica
    int64_t local_prefills = 0;   // disaggregated picks the decode replica prefilled alone
  };
  const std::array<int64_t, routing::kNumPdDecisions>& pd_decisions() const {
    return pd_decisions_;
  }
  const PdTotals& pd_totals() const { return pd_totals_; }
  const report::GapHistogram& pd_gaps(bool disaggregated) const {
    return pd_gaps_[disaggregated ? 1 : 0];
  }
  double busy_s(size_t replica) const { return replicas_[replica].busy_s; }
  // Every pull's transfer time, in start order.
  std::vector<double> transfer_times() const {
    std::vector<double> v;
    v.reserve(pulls_.size());
    for (const Pull& p : pulls_) v.push_back(p.transfer_s);
    return v;
  }
  // Mean KV usage of `replica` over the scrapes (0 before any).
  double kv_mean(size_t replica) const {
    return fleet_.samples() > 0 ? replicas_[replica].kv_sum / static_cast<double>(fleet_.samples())
                                : 0.0;
  }
  // Holds ended by a release and by their lease, every engine of the run.
  std::pair<int64_t, int64_t> holds_ended() const {
    std::pair<int64_t, int64_t> n{0, 0};
    for (const Replica& r : replicas_) {
      const engine::EngineStats st = r.engine.Stats();
      n.first += st.kv_holds_released + r.past_released;
      n.second += st.kv_holds_expired + r.past_expired;
    }
    return n;
  }
  // Flow control's outcomes: tenant of each record (records() order), router waits of
  // the requests that left the queue by dispatch (0 for those dispatched at admission).
  const std::vector<int32_t>& record_tenants() const { return record_tenants_; }
  std::vector<double>& router_waits() { return router_waits_; }
  int64_t flow_queued() const { return flow_queued_; }
  int64_t flow_shed() const { return flow_shed_; }
  int64_t flow_expired() const { return flow_expired_; }
  // Released by the late-binding probe (the gate's dispatches of cause kAffinity).
  int64_t flow_affinity() const {
    if (!gate_) return 0;
    int64_t n = 0;
    for (const flow::BandStats& b : gate_->stats().bands)
      n += static_cast<int64_t>(b.dispatched_by_affinity);
    return n;
  }
  // Moved behind the on-time ones by predicted miss (issue 24).
  int64_t flow_late() const {
    if (!gate_) return 0;
    int64_t n = 0;
    for (const flow::BandStats& b : gate_->stats().bands) n += static_cast<int64_t>(b.went_late);
    return n;
  }

 private:
  void Push(double t, Ev type, uint32_t a) { queue_.push({t, seq_++, a, type}); }

  bool Done() const { return generator_done_ && live_ == 0; }

  void FetchNext() {
    if (gen_.Next(&next_)) {
      Push(next_.arrival_s, Ev::kArrival, 0);
    } else {
      generator_done_ = true;
    }
  }

  uint32_t AllocSlot() {
    uint32_t s;
    if (!free_slots_.empty()) {
      s = free_slots_.back();
      free_slots_.pop_back();
    } else {
      s = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Live& l = slots_[s];
    l.first_token_s = -1.0;
    l.max_gap_s = 0.0;
    l.handle = sched::kNoHandle;
    l.replica = -1;
    l.n_ranked = 0;
    l.refused = false;
    l.flow_queued = false;
    l.queued_s = 0.0;
    l.output_tokens = l.cached_tokens = 0;
    l.retries = 0;
    l.prefill = -1;
    l.prefill_charge = 0.0;
    l.prefill_charged = false;
    l.prefill_rejected = false;
    l.prefill_tried.clear();
    l.pull = false;
    l.held_blocks = 0;
    l.served_pd = false;
    l.prefill_cached = -1;
    l.transfer_s = -1.0;
    l.stage = Stage::kWaiting;
    l.error = report::ErrorKind::kNone;
    ++live_;
    return s;
  }

  void Arrival(double t) {
    const uint32_t s = AllocSlot();
    Live& l = slots_[s];
    std::swap(l.spec, next_);  // keeps both segment buffers' capacity in circulation
    const uint64_t id = l.spec.id;
    if (finish_s_.size() <= id)
      finish_s_.resize(std::max<size_t>(id + 1, finish_s_.size() * 2), -1.0);
    FetchNext();
    if (l.spec.after_request >= 0) {
      const double done = finish_s_[static_cast<size_t>(l.spec.after_request)];
      if (done < 0) {
        blocked_on_[static_cast<uint64_t>(l.spec.after_request)] = s;
        return;
      }
      const double ready = done + l.spec.think_time_s;
      if (ready > t) {
        Push(ready, Ev::kSend, s);
        return;
      }
    }
    TrySend(s, t);
  }

  void TrySend(uint32_t s, double t) {
    if (sc_.arrivals.max_concurrency > 0 && in_flight_ >= sc_.arrivals.max_concurrency) {
      held_.push_back(s);
      return;
    }
    Send(s, t);
  }

  void Send(uint32_t s, double t) {
    Live& l = slots_[s];
    ++in_flight_;
    ++sent_;
    l.send_s = t;
    l.tenant = TenantOf(l.spec.id);
    // Router replicas take requests round-robin in send order.
    l.core = static_cast<uint32_t>(next_core_);
    if (++next_core_ == cores_.size()) next_core_ = 0;
    if (!gate_) {
      Dispatch(s, t);
      return;
    }
    // Admission is the front end's call into the gate, as in serve: dispatch now, wait,
    // or refuse.
    flow::FlowRequest fr;
    fr.priority = sc_.tenants.empty() ? 0 : sc_.tenants[static_cast<size_t>(l.tenant)].priority;
    fr.flow_id = static_cast<uint64_t>(l.tenant);
    fr.bytes = static_cast<uint64_t>(l.spec.prompt_tokens) * engine::kBytesPerToken;
    Render(l.spec);
    sched::SchedRequest req;
    req.model = ModelOf(l);
    req.prompt = text_;
    const flow::AdmitResult admitted =
        gate_->Admit(fr, std::make_shared<Waiter>(this, s), req);
    switch (admitted.outcome) {
      case flow::AdmitOutcome::kDispatchNow:
        router_waits_.push_back(0.0);
        Dispatch(s, t);
        break;
      case flow::AdmitOutcome::kQueued:
        ++flow_queued_;
        l.flow_queued = true;
        ArmFlowTimer();
        break;
      case flow::AdmitOutcome::kRejected:
        ++flow_shed_;
        l.error = report::ErrorKind::kShed;  // 429 in serve
        l.stage = Stage::kDone;
        Push(t, Ev::kFinished, s);
        break;
    }
  }

  // A request waiting in the gate: released (picked now) or expired.
  class Waiter final : public flow::FlowWaiter {
   public:
    Waiter(Simulation* sim, uint32_t slot) : sim_(sim), slot_(slot) {}
    void Dispatch(double now_s, double waited_s) override {
      sim_->slots_[slot_].flow_queued = false;
      sim_->slots_[slot_].queued_s = waited_s;
      sim_->router_waits_.push_back(waited_s);
      sim_->Dispatch(slot_, now_s);
    }
    void Expire(flow::ExpireReason reason) override {
      Live& l = sim_->slots_[slot_];
      l.flow_queued = false;
      ++sim_->flow_expired_;
      l.error = reason == flow::ExpireReason::kNoEndpointTtl ? report::ErrorKind::kNoEndpoint
                                                             : report::ErrorKind::kShed;
      l.stage = Stage::kDone;
      sim_->Push(sim_->now_, Ev::kFinished, slot_);
    }

   private:
    Simulation* sim_;
    uint32_t slot_;
  };

  // Which tenant sends request `id`: a draw seeded by the scenario seed and the id, so
  // the split is the same under every policy.
  int32_t TenantOf(uint64_t id) const {
    if (tenant_cdf_.size() <= 1) return 0;
    uint64_t z = id + sc_.seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
    for (size_t i = 0; i + 1 < tenant_cdf_.size(); ++i) {
      if (u < tenant_cdf_[i]) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(tenant_cdf_.size() - 1);
  }

  // Capacity may have freed (a completion on `freed`, a scrape) or a TTL ran out: the
  // gate expires what is due and releases what fits (flow::FlowGate::Pump).
  void Pump(uint32_t freed = kNoEndpoint) {
    if (!gate_ || !gate_->waiting()) return;
    gate_->Pump(freed);
    ArmFlowTimer();
  }

  void ArmFlowTimer() {
    const double at = gate_->next_expiry();
    if (at < flow_timer_at_) {
      flow_timer_at_ = at;
      Push(at, Ev::kFlowExpiry, 0);
    }
  }

  // The core picks for the request in slot `s` and it is sent to the best endpoint; fails
  // it with no_endpoint (503 in serve) when the core has nowhere to send it.
  void Dispatch(uint32_t s, double t) {
    Live& l = slots_[s];
    Render(l.spec);
    l.prompt_tokens = static_cast<int64_t>(engine::CountTokens(text_));
    routing::PickRequest pr;
    FillSchedRequest(l, &pr.request);
    pr.dispatch_first = true;
    l.tokens_ready = false;
    if (kv_events_) {
      // The engine's token ids, exactly those the replica will get (for precise picks).
      l.tokens.clear();
      engine::TokenizeInto(text_, &l.tokens);
      l.tokens_ready = true;
      pr.request.token_ids = l.tokens;
    }
    const routing::PickResult pick = Core(l).Pick(pr, t);
    l.predicted_cached = pick.ok() && pick.dispatched ? pick.predicted_cached_tokens : -1;
    l.admitted_cached = -1;
    if (pick.ok() && pick.dispatched) ++kv_totals_.picks;
    Tap(l.core, CoreCall::Kind::kPick, t, [&](CoreCall& c) {
      c.model = ModelOf(l);
      c.prompt = text_;
      c.max_tokens = pr.request.max_tokens;
      c.prompt_tokens = pr.request.prompt_tokens;
      c.handle = pick.handle;
      c.ranked.assign(pick.ranked.begin(), pick.ranked.begin() + pick.n_ranked);
      if (!pick.ok()) c.ranked.clear();
      c.pd = pick.pd;
      if (pick.disaggregated()) {
        c.prefill = pick.prefill;
        c.tokens = pick.prefill_tokens;
      }
    });
    if (!pick.ok() || pick.n_ranked == 0) {
      l.error = report::ErrorKind::kNoEndpoint;
      l.handle = pick.handle;  // kNoHandle unless the core gave one
      l.replica = -1;
      l.stage = Stage::kDone;
      Push(t, Ev::kFinished, s);
      return;
    }
    l.handle = pick.handle;
    l.n_ranked = static_cast<uint32_t>(pick.n_ranked);
    std::copy(pick.ranked.begin(), pick.ranked.begin() + pick.n_ranked, l.ranked.begin());
    ++pd_decisions_[static_cast<size_t>(pick.pd)];
    if (pick.disaggregated()) {
      // Both legs send the same prompt ids: tokenize once.
      if (!l.tokens_ready) {
        l.tokens.clear();
        engine::TokenizeInto(text_, &l.tokens);
        l.tokens_ready = true;
      }
      l.prefill = static_cast<int32_t>(pick.prefill);
      l.prefill_charge = pick.prefill_tokens;
      l.prefill_charged = true;
      SendPrefill(s, t);
      return;
    }
    SendAttempt(s, 0, t);
  }

  // The request as the core's scheduler sees it (text_ holds its rendered prompt).
  void FillSchedRequest(Live& l, sched::SchedRequest* req) {
    req->model = ModelOf(l);
    req->prompt = text_;
    req->max_tokens = l.spec.max_tokens;
    req->prompt_tokens = l.prompt_tokens;
    req->queued_s = l.queued_s;
  }

  // ---- P/D: the prefill leg of a disaggregated pick, as serve runs it ----

  // The prefill leg (max_tokens 1, blocks held for the lease) leaves for l.prefill.
  void SendPrefill(uint32_t s, double t) {
    Live& l = slots_[s];
    l.stage = Stage::kPrefillNetwork;
    l.prefill_rejected = false;
    Push(t + replicas_[static_cast<size_t>(l.prefill)].delay_s, Ev::kPrefillReach, s);
  }

  void PrefillReach(uint32_t s, double t) {
    Live& l = slots_[s];
    if (l.stage != Stage::kPrefillNetwork) return;  // failed on the way
    const auto pi = static_cast<uint32_t>(l.prefill);
    Replica& r = replicas_[pi];
    if (r.down) {
      l.stage = Stage::kWaiting;
      l.refused = true;
      Push(t + r.delay_s, Ev::kPrefillFail, s);
      return;
    }
    engine::EngineRequest er;
    er.id = l.spec.id;
    er.prompt_tokens = l.tokens;  // a copy: the decode leg sends them again
    SetAdapter(l, r, &er);
    er.max_tokens = 1;
    er.arrival_s = t;
    er.kv_hold_s = sc_.pd.kv_lease_s;
    if (slot_of_.size() <= l.spec.id)
      slot_of_.resize(std::max<size_t>(l.spec.id + 1, slot_of_.size() * 2));
    slot_of_[l.spec.id] = s;
    if (auto err = r.engine.AddRequest(std::move(er))) {
      l.stage = Stage::kWaiting;
      l.prefill_rejected = true;  // a 400: the request's doing, not the replica's
      Push(t + r.delay_s, Ev::kPrefillFail, s);
      return;
    }
    l.stage = Stage::kPrefill;
    if (!r.busy) StartStep(pi, t);
  }

  // A step of replica `ri` produced the prefill leg's token: the leg is done (its length
  // cap is 1), and its answer, with the blocks it holds, reaches the router `visible`.
  void PrefillOutput(uint32_t s, uint32_t ri, const engine::RequestOutput& o, double visible) {
    Live& l = slots_[s];
    if (!o.finished) return;
    Replica& r = replicas_[ri];
    l.stage = Stage::kPrefillAnswer;
    l.prefill_cached = o.cached_tokens;
    // Finished by anything but its length cap, it holds nothing (null kv_transfer_params).
    l.held_blocks = o.reason == engine::FinishReason::kLength
                        ? static_cast<int>(r.engine.HeldBlocks(o.id).size())
                        : 0;
    if (l.held_blocks > 0) Push(o.finish_s + sc_.pd.kv_lease_s, Ev::kHoldExpiry, ri);
    Push(visible, Ev::kPrefillDone, s);
  }

  // The prefill leg's charge on its replica ends (answered, failed or given up).
  // `answered`: the leg's answer reached the router (the latency model learns its TTFT).
  void PrefillEnded(Live& l, bool answered) {
    if (!l.prefill_charged) return;
    l.prefill_charged = false;
    PrefillDoneCall(l, static_cast<uint32_t>(l.prefill), l.prefill_charge, l.handle, answered);
  }

  void PrefillDoneCall(const Live& l, uint32_t prefill, double tokens,
                       sched::RequestHandle handle = sched::kNoHandle, bool answered = false) {
    Core(l).OnPrefillDone(prefill, tokens, handle, answered, now_);
    Tap(l.core, CoreCall::Kind::kPrefillDone, now_, [&](CoreCall& c) {
      c.endpoint = prefill;
      c.prefill = prefill;
      c.tokens = tokens;
      c.handle = handle;
      c.flag = answered;
    });
  }

  // The prefill answer reached the router: the decode leg leaves with it (none: the
  // decode replica prefills alone).
  void PrefillDone(uint32_t s, double t) {
    Live& l = slots_[s];
    if (l.stage != Stage::kPrefillAnswer) return;
    PrefillEnded(l, /*answered=*/true);
    Core(l).OnAttemptSucceeded(static_cast<uint32_t>(l.prefill));
    Tap(l.core, CoreCall::Kind::kAttemptSucceeded, t, [&](CoreCall& c) {
      c.endpoint = static_cast<uint32_t>(l.prefill);
    });
    l.pull = l.held_blocks > 0;
    if (!l.pull) ++pd_totals_.local_prefills;
    SendAttempt(s, 0, t);
  }

  // The prefill leg failed before answering: as serve, a replica's fault moves it to
  // another prefill replica within the retry budget; else (or for a 4xx) the decode
  // replica prefills locally. Nothing is lost either way.
  void PrefillFail(uint32_t s, double t) {
    Live& l = slots_[s];
    const auto pi = static_cast<uint32_t>(l.prefill);
    PrefillEnded(l, /*answered=*/false);
    const bool refused = l.refused;
    l.refused = false;
    // A rejected leg (4xx: the request itself) is not the replica's fault.
    routing::PrefillFailure f;
    f.prefill_id = pi;
    f.failure = {refused ? "connect_refused" : "reset", refused};
    f.server_fault = !l.prefill_rejected;
    sched::SchedRequest req;
    if (f.server_fault) {
      Render(l.spec);
      FillSchedRequest(l, &req);
    }
    f.request = &req;
    f.decode_id = l.ranked[0];
    f.tried = &l.prefill_tried;
    const std::vector<uint32_t> tried_before = l.prefill_tried;
    const routing::PrefillDecision d = Core(l).OnPrefillFailed(f, t);
    Tap(l.core, CoreCall::Kind::kPrefillFailed, t, [&](CoreCall& c) {
      c.endpoint = pi;
      c.failure_kind = std::string(f.failure.kind);
      c.flag = refused;
      c.server_fault = f.server_fault;
      c.model = ModelOf(l);
      c.prompt = text_;
      c.max_tokens = req.max_tokens;
      c.prompt_tokens = req.prompt_tokens;
      c.decode = f.decode_id;
      c.exclude = tried_before;
      c.allowed = d.move();
      c.prefill = d.prefill;
      c.tokens = d.prefill_tokens;
    });
    if (d.move()) {
      l.prefill = static_cast<int32_t>(d.prefill);
      l.prefill_charge = d.prefill_tokens;
      l.prefill_charged = true;
      ++pd_totals_.prefill_retries;
      SendPrefill(s, t);
      return;
    }
    ++pd_totals_.local_prefills;
    l.pull = false;
    SendAttempt(s, 0, t);
  }

  // The decode leg reached replica `r` with the prefill's answer: it pulls the prompt's
  // full blocks it lacks (engine::PlanKvPull, as `kvroute sim` does) and waits for them in
  // its engine; the prefill replica's hold ends when the pull completes. Too little to
  // pull: recomputed, and the hold is dropped now. The prefill replica down or its lease
  // gone: recomputed (kv_load_failure_policy recompute).
  void PlanPull(Live& l, Replica& r, uint32_t ri, engine::EngineRequest* er, double t) {
    l.served_pd = true;
    ++pd_totals_.served;
    const auto pi = static_cast<uint32_t>(l.prefill);
    Replica& p = replicas_[pi];
    const int prompt = static_cast<int>(er->prompt_tokens.size());
    const int local = r.engine.PeekCachedTokens(er->prompt_tokens);
    const engine::KvPull pull = engine::PlanKvPull(
        engine::PullableTokens(prompt, l.held_blocks, r.config.block_size), local,
        sc_.pd.TransferModel(r.config));
    if (!pull.pulls()) {
      ++pd_totals_.recomputed;
      if (!p.down) p.engine.ReleaseHold(er->id);
      return;
    }
    if (p.down || p.engine.HeldBlocks(er->id).empty()) {
      ++pd_totals_.pull_failures;
      return;
    }
    er->kv_load_tokens = pull.load_tokens;
    er->kv_ready_s = t + pull.transfer_s;
    l.transfer_s = pull.transfer_s;
    ++pd_totals_.pulls;
    pulls_.push_back({pi, er->id, pull.transfer_s});
    Push(t + pull.transfer_s, Ev::kTransferDone, static_cast<uint32_t>(pulls_.size() - 1));
    Push(er->kv_ready_s, Ev::kKvReady, ri);
  }

  // Attempt `attempt` of slot `s` goes to ranked[attempt] (the first was recorded with
  // the pick; a fallback is recorded now, as serve does).
  void SendAttempt(uint32_t s, uint32_t attempt, double t) {
    Live& l = slots_[s];
    const uint32_t ep = l.ranked[attempt];
    l.replica = static_cast<int32_t>(ep);
    if (attempt > 0) {
      Core(l).OnDispatched(l.handle, ep, t);
      Tap(l.core, CoreCall::Kind::kDispatched, t, [&](CoreCall& c) {
        c.handle = l.handle;
        c.endpoint = ep;
      });
    }
    l.stage = Stage::kNetwork;
    if (!l.tokens_ready) {
      l.tokens.clear();
      engine::TokenizeInto(text_, &l.tokens);
    }
    l.tokens_ready = false;  // moved into the engine request when it arrives
    Push(t + replicas_[ep].delay_s, Ev::kReach, s);
  }

  // Shows the tap (when there is one) a call just made into the core: `fill` sets the
  // call's arguments and answer.
  template <typename Fill>
  void Tap(uint32_t core, CoreCall::Kind kind, double t, Fill&& fill) const {
    if (!tap_) return;
    CoreCall c;
    c.core = core;
    c.kind = kind;
    c.t = t;
    fill(c);
    tap_(c);
  }

  // RenderPrompt, with long segments' text kept between requests: shared system
  // prompts are rendered once instead of once per request (a large share of the
  // simulator's own time otherwise). Chat prompts go through RenderPrompt.
  void Render(const workload::RequestSpec& spec) {
    if (spec.endpoint != api::Endpoint::kCompletions) {
      workload::RenderPrompt(spec, EngineOutputText, &text_);
      return;
    }
    text_.clear();
    for (const workload::Segment& seg : spec.segments) {
      if (seg.is_output) {
        EngineOutputText(seg.key, seg.tokens, &text_);
      } else if (seg.tokens < kCacheMinTokens) {
        workload::AppendSegmentText(seg.key, seg.tokens, &text_);
      } else {
        auto it = text_cache_.find(seg.key);
        if (it == text_cache_.end() || it->second.size() != static_cast<size_t>(seg.tokens) * 4) {
          if (text_cache_bytes_ > kCacheMaxBytes) {
            text_cache_.clear();
            text_cache_bytes_ = 0;
          }
          std::string text;
          workload::AppendSegmentText(seg.key, seg.tokens, &text);
          text_cache_bytes_ += text.size();
          it = text_cache_.insert_or_assign(seg.key, std::move(text)).first;
        }
        text_.append(it->second);
      }
    }
  }

  void Reach(uint32_t s, double t) {
    Live& l = slots_[s];
    if (l.stage != Stage::kNetwork) return;  // failed on the way (the replica crashed)
    Replica& r = replicas_[static_cast<size_t>(l.replica)];
    if (r.down) {
      // Connection refused: the router hears it a network delay later.
      l.stage = Stage::kWaiting;
      l.refused = true;
      Push(t + r.delay_s, Ev::kFail, s);
      return;
    }
    l.stage = Stage::kEngine;
    engine::EngineRequest er;
    er.id = l.spec.id;
    er.prompt_tokens = std::move(l.tokens);
    SetAdapter(l, r, &er);
    er.max_tokens = static_cast<int>(l.spec.max_tokens);
    er.arrival_s = t;
    if (l.pull) {
      l.pull = false;
      PlanPull(l, r, static_cast<uint32_t>(l.replica), &er, t);
    }
    if (slot_of_.size() <= l.spec.id)
      slot_of_.resize(std::max<size_t>(l.spec.id + 1, slot_of_.size() * 2));
    slot_of_[l.spec.id] = s;
    if (auto err = r.engine.AddRequest(std::move(er))) {
      l.stage = Stage::kDone;
      l.error = report::ErrorKind::kRejected;  // a 400 from the replica
      Push(t + r.delay_s, Ev::kFinished, s);
      return;
    }
    if (!r.busy) StartStep(static_cast<uint32_t>(l.replica), t);
  }

  void StartStep(uint32_t ri, double t) {
    Replica& r = replicas_[ri];
    r.engine.Step(t, &r.step);
    if (r.step.duration_s <= 0.0) {
      // Nothing schedulable: decode legs waiting for their KV pull (kKvReady wakes the
      // replica); otherwise it should not happen with work queued. Wait for the next
      // event rather than spin.
      r.busy = false;
      return;
    }
    ++steps_;
    r.busy = true;
    r.busy_s += r.step.duration_s * r.slow;
    Push(t + r.step.duration_s * r.slow, Ev::kStepDone, ri);
  }

  void StepDone(uint32_t ri, double t) {
    Replica& r = replicas_[ri];
    const double visible = t + r.delay_s;
    if (r.stale_step) {
      r.stale_step = false;
      r.step.outputs.clear();
    }
    if (kv_events_) PublishKvEvents(ri, t);
    for (const engine::RequestOutput& o : r.step.outputs) {
      const uint32_t s = slot_of_[o.id];
      Live& l = slots_[s];
      if (l.stage == Stage::kPrefill && l.prefill == static_cast<int32_t>(ri)) {
        PrefillOutput(s, ri, o, visible);
        continue;
      }
      // Dropped by a crash or restart during the step (and perhaps sent elsewhere since).
      if (l.stage != Stage::kEngine || l.replica != static_cast<int32_t>(ri)) continue;
      if (o.new_tokens > 0) {
        if (o.first_token) {
          l.first_token_s = visible;
          Push(visible, Ev::kFirstToken, s);
        } else {
          const double gap = visible - l.last_token_s;
          gaps_.Add(gap);
          if (pd_report_) pd_gaps_[l.served_pd ? 1 : 0].Add(gap);
          l.max_gap_s = std::max(l.max_gap_s, gap);
        }
        l.last_token_s = visible;
      }
      l.output_tokens = o.completion_tokens;
      l.cached_tokens = o.cached_tokens;
      // A decode leg's cached tokens include the ones it pulled: no route receipt for it.
      if (l.admitted_cached < 0 && l.retries == 0 && l.transfer_s < 0) {
        l.admitted_cached = o.cached_tokens;
      }
      // The router sees the tokens on the stream network_delay_s from now; telling the
      // scheduler here (stamped with that time) saves one event per token and step.
      if (o.new_tokens > 0 && l.handle != sched::kNoHandle) {
        Core(l).OnTokens(l.handle, o.completion_tokens, visible);
        Tap(l.core, CoreCall::Kind::kTokens, visible, [&](CoreCall& c) {
          c.handle = l.handle;
          c.value = o.completion_tokens;
        });
      }
      if (o.finished) {
        if (o.reason == engine::FinishReason::kAbort) l.error = report::ErrorKind::kAborted;
        l.stage = Stage::kDone;
        Push(visible, Ev::kFinished, s);
      }
    }
    r.busy = false;
    if (r.engine.HasWork()) StartStep(ri, t);
  }

  void Complete(uint32_t s, double t) {
    Live& l = slots_[s];
    report::RequestRecord rec;
    rec.id = l.spec.id;
    rec.send_s = l.send_s;
    rec.error = l.error;
    rec.endpoint = l.replica;
    rec.prompt_tokens = l.prompt_tokens;
    rec.output_tokens = l.output_tokens;
    rec.cached_tokens = l.cached_tokens;
    rec.max_itl_s = l.max_gap_s;
    rec.retries = l.retries;
    if (l.served_pd) {
      rec.prefill_endpoint = l.prefill;
      rec.kv_transfer_s = l.transfer_s;
      // As serve's usage: the prefill leg's cached tokens, not the tokens decode loaded.
      if (l.prefill_cached >= 0) rec.cached_tokens = l.prefill_cached;
    }
    if (l.first_token_s >= 0) rec.ttft_s = l.first_token_s - l.send_s;
    if (l.error == report::ErrorKind::kNone) rec.e2e_s = t - l.send_s;
    records_.push_back(rec);
    record_tenants_.push_back(l.tenant);
    if (l.predicted_cached >= 0 && l.admitted_cached >= 0) {
      const int64_t err = std::abs(l.predicted_cached - l.admitted_cached);
      ++kv_totals_.receipts;
      kv_totals_.abs_error_sum += static_cast<double>(err);
      const size_t ri = static_cast<size_t>(l.ranked[0]);
      if (err > replicas_[ri].config.block_size) ++kv_totals_.off_by_block;
    }
    finish_s_[l.spec.id] = t;
    --in_flight_;
    ++finished_;
    --live_;
    free_slots_.push_back(s);
    // A follow-up turn waiting for this one.
    if (!blocked_on_.empty()) {
      auto it = blocked_on_.find(l.spec.id);
      if (it != blocked_on_.end()) {
        const uint32_t next = it->second;
        blocked_on_.erase(it);
        const double ready =
            std::max(t + slots_[next].spec.think_time_s, slots_[next].spec.arrival_s);
        Push(ready, Ev::kSend, next);
      }
    }
    while (!held_.empty() &&
           (sc_.arrivals.max_concurrency <= 0 || in_flight_ < sc_.arrivals.max_concurrency)) {
      const uint32_t next = held_.front();
      held_.pop_front();
      Send(next, t);
    }
  }

  // The first token reached the router: the attempt succeeded (a response head below
  // 500 in serve), and the request is no longer queued there.
  void FirstToken(uint32_t s, double t) {
    Live& l = slots_[s];
    if (l.replica >= 0) {
      Core(l).OnAttemptSucceeded(static_cast<uint32_t>(l.replica));
      Tap(l.core, CoreCall::Kind::kAttemptSucceeded, t, [&](CoreCall& c) {
        c.endpoint = static_cast<uint32_t>(l.replica);
      });
    }
    Core(l).OnFirstToken(l.handle, t);
    if (l.handle != sched::kNoHandle) {
      Tap(l.core, CoreCall::Kind::kFirstToken, t, [&](CoreCall& c) {
        c.handle = l.handle;
      });
    }
  }

  // The request's answer reached the client: the core releases its handle and counts it
  // under the endpoint and the HTTP status serve would answer. Returns the endpoint that
  // freed a slot (kNoEndpoint when none did).
  uint32_t Finish(uint32_t s, double t) {
    Live& l = slots_[s];
    const uint32_t ep = l.replica >= 0 ? static_cast<uint32_t>(l.replica) : kNoEndpoint;
    int code = 200;
    switch (l.error) {
      case report::ErrorKind::kNone: code = 200; break;
      case report::ErrorKind::kRejected: code = 400; break;
      case report::ErrorKind::kNoEndpoint: code = 503; break;
      case report::ErrorKind::kShed: code = 429; break;
      case report::ErrorKind::kUpstream: code = l.first_token_s >= 0 ? 200 : 502; break;
      case report::ErrorKind::kTimeout: code = 504; break;
      case report::ErrorKind::kAborted: code = 499; break;
    }
    if (l.error == report::ErrorKind::kRejected && ep != kNoEndpoint) {
      Core(l).OnAttemptSucceeded(ep);  // a 4xx is the client's doing
      Tap(l.core, CoreCall::Kind::kAttemptSucceeded, t, [&](CoreCall& c) {
        c.endpoint = ep;
      });
    }
    Core(l).OnFinished(l.handle, ep, code, t);
    Tap(l.core, CoreCall::Kind::kFinished, t, [&](CoreCall& c) {
      c.handle = l.handle;
      c.endpoint = ep;
      c.value = code;
    });
    const bool freed = l.handle != sched::kNoHandle && ep != kNoEndpoint;
    l.handle = sched::kNoHandle;
    return freed ? ep : kNoEndpoint;
  }

  // An attempt failed before or after its first token: an upstream failure for the core
  // (a refused connection marks the endpoint down until its next good scrape; every
  // failure counts toward outlier ejection). Before the first token the request goes to
  // the pick's next-ranked endpoint when serve's attempt limit and the core's retry
  // budget allow (a refused connection never reached an engine: a free retry); else, or
  // after the first token (the client already has part of a stream, as with serve's SSE
  // error frame), it ends with an upstream error.
  void Retry(uint32_t s, double t) {
    Live& l = slots_[s];
    const auto ep = static_cast<uint32_t>(l.replica);
    const bool refused = l.refused;
    l.refused = false;
    routing::AttemptFailure f;
    f.endpoint_id = ep;
    f.failure = {refused ? "connect_refused" : "reset", refused};
    f.attempt = static_cast<uint32_t>(l.retries);
    f.n_ranked = l.n_ranked;
    f.max_attempts = static_cast<uint32_t>(max_attempts_);
    f.started = l.first_token_s >= 0;
    const routing::AttemptDecision d = Core(l).OnAttemptFailed(f, t);
    Tap(l.core, CoreCall::Kind::kAttemptFailed, t, [&](CoreCall& c) {
      c.endpoint = ep;
      c.failure_kind = std::string(f.failure.kind);
      c.flag = refused;
      c.attempt = f.attempt;
      c.n_ranked = static_cast<uint32_t>(f.n_ranked);
      c.max_attempts = f.max_attempts;
      c.started = f.started;
      c.allowed = d.retry();
    });
    const uint32_t attempt = f.attempt;
    const bool retry = d.retry();
    if (!retry) {
      l.error = report::ErrorKind::kUpstream;
      l.stage = Stage::kDone;
      Push(t, Ev::kFinished, s);
      return;
    }
    ++l.retries;
    // A decode leg that failed is retried as an ordinary request (and counts as one).
    l.pull = false;
    l.served_pd = false;
    l.transfer_s = -1.0;
    Render(l.spec);
    SendAttempt(s, attempt + 1, t);
  }

  // Every request at or heading to replica `ri` fails now (the router hears of it a
  // network delay later). With `abort_engine`, their engine requests are aborted (a
  // crash keeps the engine; a restart replaces it).
  void DropRequestsOn(uint32_t ri, double t, bool abort_engine) {
    for (uint32_t s = 0; s < slots_.size(); ++s) {
      Live& l = slots_[s];
      if (l.prefill == static_cast<int32_t>(ri) &&
          (l.stage == Stage::kPrefillNetwork || l.stage == Stage::kPrefill)) {
        if (l.stage == Stage::kPrefill && abort_engine) replicas_[ri].engine.Abort(l.spec.id);
        l.stage = Stage::kWaiting;
        Push(t + replicas_[ri].delay_s, Ev::kPrefillFail, s);
        continue;
      }
      if (l.replica != static_cast<int32_t>(ri)) continue;
      if (l.stage != Stage::kNetwork && l.stage != Stage::kEngine) continue;
      if (l.stage == Stage::kEngine && abort_engine) replicas_[ri].engine.Abort(l.spec.id);
      l.stage = Stage::kWaiting;
      Push(t + replicas_[ri].delay_s, Ev::kFail, s);
    }
  }

  void FaultStart(const config::ScenarioFault& f, double t) {
    const auto ri = static_cast<uint32_t>(f.replica);
    Replica& r = replicas_[ri];
    switch (f.spec.kind) {
      case fault::FaultKind::kCrash:
        ++r.down;
        DropRequestsOn(ri, t, /*abort_engine=*/true);
        break;
      case fault::FaultKind::kRestart: {
        if (f.spec.duration_s) ++r.down;
        DropRequestsOn(ri, t, /*abort_engine=*/false);
        const engine::EngineStats st = r.engine.Stats();
        r.past_queries += st.prefix_queries_tokens;
        r.past_hits += st.prefix_hits_tokens;
        r.past_preemptions += st.preemptions;
        r.past_released += st.kv_holds_released;
        r.past_expired += st.kv_holds_expired;
        r.past_lora_loads += st.lora_loads;
        r.past_lora_evictions += st.lora_evictions;
        // A step in flight still ends (its outputs are ignored: nothing is on it now).
        // The new engine hashes with another seed (vLLM without PYTHONHASHSEED) and its
        // publisher numbers batches from 0 again.
        ++r.restarts;
        if (kv_events_) {
          r.config.hash_seed = MixKey(sc_.seed * 0x9e3779b97f4a7c15ULL + ri,
                                      static_cast<uint64_t>(r.restarts));
          publishers_[ri].Restart();
        }
        r.engine = engine::Engine(r.config);
        r.stale_step = r.busy;
        break;
      }
      case fault::FaultKind::kSlow:
        r.slow = f.spec.factor;
        break;
      default:
        break;  // the scenario loader admits only the kinds above
    }
  }

  void FaultEnd(const config::ScenarioFault& f) {
    Replica& r = replicas_[static_cast<size_t>(f.replica)];
    if (f.spec.kind == fault::FaultKind::kSlow) r.slow = 1.0;
    if (f.spec.kind == fault::FaultKind::kCrash || f.spec.kind == fault::FaultKind::kRestart) {
      r.down = std::max(0, r.down - 1);
    }
  }

  // The router scrapes every replica: what its engine reports reaches the core as a
  // scrape result, as vLLM's /metrics would carry it; a replica that is down refuses it.
  void Scrape(double t) {
    for (size_t i = 0; i < replicas_.size(); ++i) {
      routing::ScrapeResult r;
      r.sent_at_s = t;
      const engine::EngineStats st = replicas_[i].engine.Stats();
      if (replicas_[i].down) {
        r.ok = false;
        r.connect_failed = true;
      } else {
        using F = metrics::EngineMetrics;
        r.ok = true;
        F& m = r.metrics;
        m.running = static_cast<double>(st.running);
        m.waiting = static_cast<double>(st.waiting);
        m.kv_usage = st.kv_cache_usage;
        m.prefix_queries = static_cast<double>(st.prefix_queries_tokens);
        m.prefix_hits = static_cast<double>(st.prefix_hits_tokens);
        m.preemptions = static_cast<double>(st.preemptions);
        m.block_size = replicas_[i].config.block_size;
        m.num_gpu_blocks = replicas_[i].config.num_gpu_blocks;
        m.engines = 1;
        m.present = F::kRunning | F::kWaiting | F::kKvUsage | F::kPrefixQueries |
                    F::kPrefixHits | F::kPreemptions | F::kBlockSize | F::kNumGpuBlocks;
        // The served model, as the model_name label of vLLM's load series tells it: what
        // tells an adapter nobody has loaded yet from the base model (sched/lora.h).
        m.base_model_key = model_key_;
        if (replicas_[i].config.lora.enabled) FillLora(replicas_[i], &m);
      }
      for (size_t k = 0; k < cores_.size(); ++k) {
        cores_[k]->OnScrape(static_cast<uint32_t>(i), r, t);
        Tap(static_cast<uint32_t>(k), CoreCall::Kind::kScrape, t, [&](CoreCall& c) {
          c.endpoint = static_cast<uint32_t>(i);
          c.scrape = r;
        });
      }
      kv_[i] = st.kv_cache_usage;
      replicas_[i].kv_sum += st.kv_cache_usage;
      waiting_[i] = st.waiting;
    }
    fleet_.AddSample(t, kv_, waiting_);
    if (!Done()) Push(t + sc_.fleet.scrape_interval_s, Ev::kScrape, 0);
    Pump();
  }

  routing::RoutingCore& Core(const Live& l) { return *cores_[l.core]; }

  // LoRA: the model a request names (its adapter's name, else the base model's), as a
  // client sends it and the router reads it.
  std::string_view ModelOf(const Live& l) const {
    return l.spec.adapter >= 0 ? std::string_view(adapter_names_[static_cast<size_t>(l.spec.adapter)])
                               : std::string_view(model_);
  }
  // The engine request names the adapter; the replica remembers it served it.
  void SetAdapter(const Live& l, Replica& r, engine::EngineRequest* er) {
    if (l.spec.adapter < 0) return;
    const auto k = static_cast<size_t>(l.spec.adapter);
    er->lora_name = adapter_names_[k];
    if (r.adapters_seen.size() <= k) r.adapters_seen.resize(adapter_names_.size());
    r.adapters_seen[k] = true;
  }

  // LoRA: what a scrape of vllm:lora_requests_info gives (its newest series: max_lora and
  // the adapters with running and with waiting requests), as the metrics parser fills it.
  void FillLora(const Replica& r, metrics::EngineMetrics* m) {
    using F = metrics::EngineMetrics;
    r.engine.LoraActivity(&lora_running_, &lora_waiting_);
    m->max_lora = r.config.lora.max_loras;
    m->lora_truncated = false;
    auto fill = [&](const std::vector<std::string>& names, std::array<uint64_t, F::kMaxLoraListed>* keys,
                    uint8_t* n) {
      *n = 0;
      for (const std::string& name : names) {
        if (*n == F::kMaxLoraListed) {
          m->lora_truncated = true;
          break;
        }
        (*keys)[(*n)++] = metrics::AdapterKey(name);
      }
    };
    fill(lora_running_, &m->running_loras, &m->n_running_loras);
    fill(lora_waiting_, &m->waiting_loras, &m->n_waiting_loras);
    m->present |= F::kLora;
  }

  // The events replica `ri`'s engine recorded during the step that just ended: one batch
  // (when there are any), numbered by its publisher and sent to every router replica,
  // each delivery lost with probability kv_events.loss (its own draw).
  void PublishKvEvents(uint32_t ri, double t) {
    kv_drain_.clear();
    replicas_[ri].engine.DrainKvEvents(&kv_drain_);
    if (kv_drain_.empty()) return;
    auto batch = std::make_shared<kvevents::KvEventBatch>();
    batch->ts = t;
    batch->events = std::move(kv_drain_);
    kv_drain_ = {};
    const uint64_t seq = publishers_[ri].Publish(batch);
    ++kv_totals_.batches;
    for (size_t k = 0; k < cores_.size(); ++k) {
      if (sc_.kv_events.loss > 0 && loss_rng_[k].Uniform() < sc_.kv_events.loss) {
        ++kv_totals_.lost;
        continue;
      }
      kv_flight_.push_back({static_cast<uint32_t>(k), ri, seq, batch});
      Push(t + sc_.kv_events.delay_s, Ev::kKvArrive, 0);
    }
  }

  // The oldest batch in transit reaches its router replica (every batch travels one
  // delay, so transit is first in, first out).
  void KvArrive(double t) {
    KvInFlight f = std::move(kv_flight_.front());
    kv_flight_.pop_front();
    deliveries_.clear();
    EventReceiver& rx = receivers_[f.router][f.source];
    if (rx.Arrive(f.seq, std::move(f.batch), publishers_[f.source], &deliveries_)) {
      Push(t + sc_.kv_events.delay_s, Ev::kKvReplay,
           static_cast<uint32_t>(f.router * replicas_.size() + f.source));
    }
    Deliver(f.router, f.source, t);
  }

  void KvReplay(uint32_t a, double t) {
    const uint32_t router = a / static_cast<uint32_t>(replicas_.size());
    const uint32_t source = a % static_cast<uint32_t>(replicas_.size());
    deliveries_.clear();
    if (receivers_[router][source].ReplayArrived(publishers_[source], &deliveries_)) {
      Push(t + sc_.kv_events.delay_s, Ev::kKvReplay, a);
    }
    Deliver(router, source, t);
  }

  void Deliver(uint32_t router, uint32_t source, double t) {
    routing::RoutingCore& core = *cores_[router];
    for (const Delivery& d : deliveries_) {
      switch (d.kind) {
        case Delivery::Kind::kBatch:
          core.OnKvEvents(source, *d.batch, t);
          break;
        case Delivery::Kind::kGap:
          core.OnKvEventsGap(source, d.repaired, t);
          break;
        case Delivery::Kind::kRestart:
          core.OnKvEventsRestart(source, t);
          break;
      }
    }
  }

  const config::Scenario& sc_;
  const ProgressFn& progress_;
  const CoreTap& tap_;
  // The router replicas (router.replicas; one by default).
  std::vector<std::unique_ptr<routing::RoutingCore>> cores_;
  size_t next_core_ = 0;  // round-robin over cores_
  uint32_t max_attempts_ = 1;  // serve's retries.max_attempts (first attempt included)
  workload::RequestGenerator gen_;
  workload::RequestSpec next_;
  bool generator_done_ = false;
  std::string model_;
  uint64_t model_key_ = 0;  // metrics::AdapterKey(model_), 0 without a model name
  std::vector<std::string> adapter_names_;  // LoRA: workload::AdapterName(k)
  std::vector<std::string> lora_running_, lora_waiting_;  // FillLora's scratch
  std::vector<Replica> replicas_;
  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  uint64_t seq_ = 0;
  double now_ = 0.0;
  std::vector<Live> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<uint32_t> slot_of_;  // engine request id -> slot
  std::vector<double> finish_s_;   // request id -> completion time (-1: not yet)
  std::unordered_map<uint64_t, uint32_t> blocked_on_;  // predecessor id -> waiting slot
  std::deque<uint32_t> held_;                          // over max_concurrency, in arrival order
  int64_t in_flight_ = 0;
  int64_t live_ = 0;
  int64_t sent_ = 0;
  int64_t finished_ = 0;
  int64_t events_ = 0;
  int64_t steps_ = 0;
  std::string text_;
  static constexpr int32_t kCacheMinTokens = 512;
  static constexpr size_t kCacheMaxBytes = size_t{256} << 20;
  std::unordered_map<uint64_t, std::string> text_cache_;
  size_t text_cache_bytes_ = 0;
  std::vector<double> kv_, waiting_;
  std::vector<report::RequestRecord> records_;
  report::GapHistogram gaps_;
  report::FleetRecorder fleet_;
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  std::unique_ptr<flow::FlowGate> gate_;  // null: flow control off
  double flow_timer_at_ = kInf;  // the earliest kFlowExpiry pending
  std::vector<double> tenant_cdf_;
  std::vector<int32_t> record_tenants_;
  std::vector<double> router_waits_;
  int64_t flow_queued_ = 0, flow_shed_ = 0, flow_expired_ = 0;
  // KV events (kv_events.enabled): a publisher per engine replica, a receiver per router
  // replica and engine replica, the batches in transit (one delay each: FIFO), a loss
  // draw source per router replica.
  bool kv_events_ = false;
  std::vector<EventPublisher> publishers_;
  std::vector<std::vector<EventReceiver>> receivers_;
  std::deque<KvInFlight> kv_flight_;
  std::vector<Rng> loss_rng_;
  std::vector<kvevents::KvEvent> kv_drain_;
  std::vector<Delivery> deliveries_;
  KvTotals kv_totals_;
  // P/D (issue 25).
  bool pd_report_ = false;  // some fleet group has a role
  std::array<int64_t, routing::kNumPdDecisions> pd_decisions_{};
  PdTotals pd_totals_;
  std::array<report::GapHistogram, 2> pd_gaps_;
  std::vector<Pull> pulls_;  // every pull started, indexed by its kTransferDone event
};

constexpr std::string_view kFlowSuffix = "+flow";

bool HasFlowSuffix(std::string_view policy) {
  return policy.size() > kFlowSuffix.size() && policy.ends_with(kFlowSuffix);
}

constexpr std::string_view kLocalOnlySuffix = "+local-only";
constexpr std::string_view kLocalOnlyPolicy = "local-only";  // kvroute+local-only

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
  const Simulation::PdTotals& t = sim.pd_totals();
  pd.disaggregated = t.served;
  pd.pulls = t.pulls;
  pd.recomputed = t.recomputed;
  pd.pull_failures = t.pull_failures;
  pd.prefill_retries = t.prefill_retries;
  pd.local_prefills = t.local_prefills;
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

}  // namespace

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
  routing::CoreOptions opts = config::CoreOptionsFrom(config::RouterConfig{});
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
  const bool flow = scenario.flow.enabled || HasFlowSuffix(label);
  Status configured;
  Simulation sim(scenario, options, progress, flow, tap, &configured);
  if (!configured.ok()) {
    result.error = configured.message();
    return result;
  }
  sim.Run();
  report::FleetTotals totals = sim.Totals();
  totals.oracle_hit_rate = oracle_hit_rate;
  result.report =
      report::Summarize(label, sim.records(), scenario.slo, totals, &sim.gaps(), &sim.fleet());
  report::PolicyReport& rep = result.report;
  rep.flow_enabled = flow;
  rep.flow_queued = sim.flow_queued();
  rep.flow_shed = sim.flow_shed();
  rep.flow_expired = sim.flow_expired();
  rep.flow_affinity = sim.flow_affinity();
  rep.flow_late = sim.flow_late();
  if (!sim.router_waits().empty()) {
    const report::Stats w = report::Summarize(sim.router_waits());
    rep.router_wait_mean_s = w.mean;
    rep.router_wait_p99_s = w.p99;
  }
  // Per tenant: the same summary over its own records (span: the whole run's).
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
    t.goodput_requests_per_s = rep.span_s > 0 ? static_cast<double>(sub.good) / rep.span_s : 0.0;
    rep.tenants.push_back(std::move(t));
  }
  rep.regions = ByRegion(scenario, sim.records());
  if (scenario.HasRoles()) ReportPd(scenario, sim, &rep);
  {
    const routing::LatencyStats lat = sim.latency();
    rep.latency_ttft_samples = static_cast<int64_t>(lat.ttft_samples);
    rep.latency_tpot_samples = static_cast<int64_t>(lat.tpot_samples);
    rep.latency_ttft_scored = static_cast<int64_t>(lat.ttft_errors.n);
    rep.latency_tpot_scored = static_cast<int64_t>(lat.tpot_errors.n);
    if (lat.ttft_errors.n > 0) {
      rep.latency_ttft_mape = lat.ttft_errors.Mape();
      rep.latency_ttft_mae_s = lat.ttft_errors.abs_s / static_cast<double>(lat.ttft_errors.n);
    }
    if (lat.tpot_errors.n > 0) {
      rep.latency_tpot_mape = lat.tpot_errors.Mape();
      rep.latency_tpot_mae_s = lat.tpot_errors.abs_s / static_cast<double>(lat.tpot_errors.n);
    }
  }
  if (scenario.workload.adapters.count > 0) {
    const auto lora = sim.lora_totals();
    rep.lora_reported = true;
    rep.lora_loads = lora.loads;
    rep.lora_evictions = lora.evictions;
    rep.lora_adapters_per_replica = lora.adapters_per_replica;
  }
  if (scenario.kv_events.enabled || scenario.router_replicas > 1) {
    const auto kv = sim.kv_totals();
    rep.kv_events_reported = true;
    rep.kv_events_enabled = scenario.kv_events.enabled;
    rep.router_replicas = std::max(1, scenario.router_replicas);
    rep.kv_batches = kv.batches;
    rep.kv_lost = kv.lost;
    rep.kv_gaps = kv.gaps;
    rep.kv_gaps_unrepaired = kv.unrepaired;
    rep.kv_restarts = kv.restarts;
    rep.kv_replayed = kv.replayed;
    rep.receipt_picks = kv.picks;
    rep.receipts = kv.receipts;
    if (kv.receipts > 0) {
      rep.receipt_mae_tokens = kv.abs_error_sum / static_cast<double>(kv.receipts);
      rep.receipt_off_block_share =
          static_cast<double>(kv.off_by_block) / static_cast<double>(kv.receipts);
    }
  }
  result.events = sim.events();
  result.steps = sim.steps();
  result.records = std::move(sim.records());
  return result;
}

std::string PolicyWithoutFlow(const std::string& policy) {
  return HasFlowSuffix(policy) ? policy.substr(0, policy.size() - kFlowSuffix.size()) : policy;
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
      workload::RenderPrompt(spec, EngineOutputText, &text, &extents);
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
