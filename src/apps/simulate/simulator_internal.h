// The simulator's engine room, shared by the files of apps/simulate only: the event
// queue's events, a live request's record, a simulated replica, and the Simulation class
// that runs them, whose member functions are defined by concern:
//   simulator.cc            construction and the event loop (Run), RunSimulationWith
//   simulator_requests.cc   a request at the router: arrival, follow-up turns, the
//                           concurrency limit, flow-gate admission, the pick, completion
//   simulator_attempts.cc   an attempt on a replica: sent, queued in its engine, its steps'
//                           tokens back to the router, failure and retry
//   simulator_pd.cc         P/D: the prefill leg and the decode leg's KV pull
//   simulator_faults.cc     crash, restart and slow faults
//   simulator_scrape.cc     a replica's engine state as the router's scrape result
//   simulator_kv_events.cc  KV-event batches: publish, transit, delivery to the cores
//   simulator_report.cc     the run's totals and the report assembled from them
// Nothing here is part of simulate's interface (simulator.h).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "apps/simulate/event_transport.h"
#include "apps/simulate/simulator.h"
#include "config/scenario_config.h"
#include "core/common/rng.h"
#include "core/common/status.h"
#include "core/engine/engine.h"
#include "core/flow/flow_gate.h"
#include "core/routing/routing_core.h"
#include "core/sched/scheduler.h"
#include "simkit/report/summary.h"
#include "simkit/workload/workload.h"

namespace kvroute::simulate::detail {

// The engine's generated text, so a follow-up turn's prompt holds exactly what the
// replica produced (and re-tokenizes to the same ids: core/engine/tokenizer.h).
void EngineOutputText(uint64_t id, int32_t tokens, std::string* out);

// Whether `policy` ends in "+flow" / "+admission" (with a policy name before it).
bool HasFlowSuffix(std::string_view policy);
bool HasAdmissionSuffix(std::string_view policy);

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

// One run: the replicas, the routing core(s) and the requests between them, in virtual
// time.
class Simulation {
 public:
  // `options`: the core's (SimulationCoreOptions or a caller's). `error` is set when the
  // core refuses them (an invalid scheduling spec); the simulation must not run then.
  Simulation(const config::Scenario& s, const routing::CoreOptions& options,
             const ProgressFn& progress, const std::optional<flow::FlowOptions>& gate,
             const CoreTap& tap, Status* error);

  // Processes the events in time order (FIFO among equal times) until none is left
  // (simulator.cc).
  void Run();

  // The run's totals and outcomes, for the report (simulator_report.cc defines the ones
  // that are computed).
  report::FleetTotals Totals() const;

  // LoRA totals over the fleet (engines replaced by restarts included).
  struct LoraTotals {
    int64_t loads = 0, evictions = 0;
    double adapters_per_replica = 0.0;  // distinct adapters served, mean over replicas
  };
  LoraTotals lora_totals() const;

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
  routing::LatencyStats latency() const;
  KvTotals kv_totals() const;
  int64_t steps() const { return steps_; }
  // P/D: the core's decisions (by PdDecision), what the legs did, the inter-token gaps of
  // requests served aggregated [0] and disaggregated [1] (when some group has a role), and
  // each replica's busy seconds.
  using PdTotals = report::PdLegCounts;
  const std::array<int64_t, routing::kNumPdDecisions>& pd_decisions() const {
    return pd_decisions_;
  }
  const PdTotals& pd_totals() const { return pd_totals_; }
  const report::GapHistogram& pd_gaps(bool disaggregated) const {
    return pd_gaps_[disaggregated ? 1 : 0];
  }
  double busy_s(size_t replica) const { return replicas_[replica].busy_s; }
  // Every pull's transfer time, in start order.
  std::vector<double> transfer_times() const;
  // Mean KV usage of `replica` over the scrapes (0 before any).
  double kv_mean(size_t replica) const {
    return fleet_.samples() > 0 ? replicas_[replica].kv_sum / static_cast<double>(fleet_.samples())
                                : 0.0;
  }
  // Holds ended by a release and by their lease, every engine of the run.
  std::pair<int64_t, int64_t> holds_ended() const;
  // Flow control's outcomes: tenant of each record (records() order), router waits of
  // the requests that left the queue by dispatch (0 for those dispatched at admission).
  const std::vector<int32_t>& record_tenants() const { return record_tenants_; }
  std::vector<double>& router_waits() { return router_waits_; }
  int64_t flow_queued() const { return flow_queued_; }
  int64_t flow_shed() const { return flow_shed_; }
  int64_t flow_expired() const { return flow_expired_; }
  // Released by the late-binding probe (the gate's dispatches of cause kAffinity).
  int64_t flow_affinity() const;
  // Moved behind the on-time ones by predicted miss (issue 24).
  int64_t flow_late() const;

 private:
  void Push(double t, Ev type, uint32_t a) { queue_.push({t, seq_++, a, type}); }

  bool Done() const { return generator_done_ && live_ == 0; }

  // ---- A request at the router (simulator_requests.cc) ----

  void FetchNext();
  uint32_t AllocSlot();
  void Arrival(double t);
  void TrySend(uint32_t s, double t);
  void Send(uint32_t s, double t);

  // A request waiting in the gate: released (picked now) or expired.
  class Waiter;

  // Which tenant sends request `id`: a draw seeded by the scenario seed and the id, so
  // the split is the same under every policy.
  int32_t TenantOf(uint64_t id) const;

  // Capacity may have freed (a completion on `freed`, a scrape) or a TTL ran out: the
  // gate expires what is due and releases what fits (flow::FlowGate::Pump).
  void Pump(uint32_t freed = kNoEndpoint);
  void ArmFlowTimer();

  // The core picks for the request in slot `s` and it is sent to the best endpoint; fails
  // it with no_endpoint (503 in serve) when the core has nowhere to send it.
  void Dispatch(uint32_t s, double t);

  // The request as the core's scheduler sees it (text_ holds its rendered prompt).
  void FillSchedRequest(Live& l, sched::SchedRequest* req);

  // ---- P/D: the prefill leg of a disaggregated pick, as serve runs it (simulator_pd.cc) ----

  // The prefill leg (max_tokens 1, blocks held for the lease) leaves for l.prefill.
  void SendPrefill(uint32_t s, double t);
  void PrefillReach(uint32_t s, double t);

  // A step of replica `ri` produced the prefill leg's token: the leg is done (its length
  // cap is 1), and its answer, with the blocks it holds, reaches the router `visible`.
  void PrefillOutput(uint32_t s, uint32_t ri, const engine::RequestOutput& o, double visible);

  // The prefill leg's charge on its replica ends (answered, failed or given up).
  // `answered`: the leg's answer reached the router (the latency model learns its TTFT).
  void PrefillEnded(Live& l, bool answered);
  void PrefillDoneCall(const Live& l, uint32_t prefill, double tokens,
                       sched::RequestHandle handle = sched::kNoHandle, bool answered = false);

  // The prefill answer reached the router: the decode leg leaves with it (none: the
  // decode replica prefills alone).
  void PrefillDone(uint32_t s, double t);

  // The prefill leg failed before answering: as serve, a replica's fault moves it to
  // another prefill replica within the retry budget; else (or for a 4xx) the decode
  // replica prefills locally. Nothing is lost either way.
  void PrefillFail(uint32_t s, double t);

  // The decode leg reached replica `r` with the prefill's answer: it pulls the prompt's
  // full blocks it lacks (engine::PlanKvPull, as `kvroute sim` does) and waits for them in
  // its engine; the prefill replica's hold ends when the pull completes. Too little to
  // pull: recomputed, and the hold is dropped now. The prefill replica down or its lease
  // gone: recomputed (kv_load_failure_policy recompute).
  void PlanPull(Live& l, Replica& r, uint32_t ri, engine::EngineRequest* er, double t);

  // ---- An attempt on a replica (simulator_attempts.cc; Render and Complete:
  // simulator_requests.cc) ----

  // Attempt `attempt` of slot `s` goes to ranked[attempt] (the first was recorded with
  // the pick; a fallback is recorded now, as serve does).
  void SendAttempt(uint32_t s, uint32_t attempt, double t);

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
  void Render(const workload::RequestSpec& spec);
  void Reach(uint32_t s, double t);
  void StartStep(uint32_t ri, double t);
  void StepDone(uint32_t ri, double t);
  void Complete(uint32_t s, double t);

  // The first token reached the router: the attempt succeeded (a response head below
  // 500 in serve), and the request is no longer queued there.
  void FirstToken(uint32_t s, double t);

  // The request's answer reached the client: the core releases its handle and counts it
  // under the endpoint and the HTTP status serve would answer. Returns the endpoint that
  // freed a slot (kNoEndpoint when none did).
  uint32_t Finish(uint32_t s, double t);

  // An attempt failed before or after its first token: an upstream failure for the core
  // (a refused connection marks the endpoint down until its next good scrape; every
  // failure counts toward outlier ejection). Before the first token the request goes to
  // the pick's next-ranked endpoint when serve's attempt limit and the core's retry
  // budget allow (a refused connection never reached an engine: a free retry); else, or
  // after the first token (the client already has part of a stream, as with serve's SSE
  // error frame), it ends with an upstream error.
  void Retry(uint32_t s, double t);

  // ---- Faults (simulator_faults.cc) ----

  // Every request at or heading to replica `ri` fails now (the router hears of it a
  // network delay later). With `abort_engine`, their engine requests are aborted (a
  // crash keeps the engine; a restart replaces it).
  void DropRequestsOn(uint32_t ri, double t, bool abort_engine);
  void FaultStart(const config::ScenarioFault& f, double t);
  void FaultEnd(const config::ScenarioFault& f);

  // ---- Scrapes (simulator_scrape.cc) ----

  // The router scrapes every replica: what its engine reports reaches the core as a
  // scrape result, as vLLM's /metrics would carry it; a replica that is down refuses it.
  void Scrape(double t);
  // ---- Shared by the above ----

  routing::RoutingCore& Core(const Live& l) { return *cores_[l.core]; }

  // LoRA: the model a request names (its adapter's name, else the base model's), as a
  // client sends it and the router reads it.
  std::string_view ModelOf(const Live& l) const {
    return l.spec.adapter >= 0 ? std::string_view(adapter_names_[static_cast<size_t>(l.spec.adapter)])
                               : std::string_view(model_);
  }
  // The engine request names the adapter; the replica remembers it served it
  // (simulator_attempts.cc).
  void SetAdapter(const Live& l, Replica& r, engine::EngineRequest* er);

  // LoRA: what a scrape of vllm:lora_requests_info gives (its newest series: max_lora and
  // the adapters with running and with waiting requests), as the metrics parser fills it
  // (simulator_scrape.cc).
  void FillLora(const Replica& r, metrics::EngineMetrics* m);

  // ---- KV events (simulator_kv_events.cc) ----

  // The events replica `ri`'s engine recorded during the step that just ended: one batch
  // (when there are any), numbered by its publisher and sent to every router replica,
  // each delivery lost with probability kv_events.loss (its own draw).
  void PublishKvEvents(uint32_t ri, double t);

  // The oldest batch in transit reaches its router replica (every batch travels one
  // delay, so transit is first in, first out).
  void KvArrive(double t);
  void KvReplay(uint32_t a, double t);
  void Deliver(uint32_t router, uint32_t source, double t);
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

// The report of a finished run of `sim` on `scenario` under `label`: the summary of its
// records (with `oracle_hit_rate`), then its flow-control, tenant, region, P/D,
// latency-model, LoRA and KV-event blocks. Sorts sim.router_waits() (simulator_report.cc).
report::PolicyReport AssembleReport(const config::Scenario& scenario, const std::string& label,
                                    bool flow, double oracle_hit_rate, Simulation& sim);

}  // namespace kvroute::simulate::detail
