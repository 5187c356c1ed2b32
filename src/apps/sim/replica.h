// One simulated vLLM replica: an Engine driven in (scaled) real time by Asio timers, and
// the OpenAI-compatible HTTP API and /metrics in front of it.
//
// Event-driven: no thread per request. While the engine has work, the replica runs
// Step(now) -> duration d -> timer of d * time_scale wall seconds -> delivers that step's
// outputs (one SSE chunk per step per streaming request) -> next step. An idle engine
// has no timer armed; a new request starts the loop again.
//
// Faults (simkit/fault/fault.h, docs/FAULTS.md): the config's schedule is armed at
// construction (times in wall seconds after it), and `POST/GET/DELETE /admin/fault` on the
// replica's own port starts, lists and clears faults at run time. The admin endpoint keeps
// answering under every fault but crash and restart downtime.
//
// Thread: everything (Handle, timers, metrics) runs on the io_context given to the
// constructor; the replica takes no locks.
//
// Written in replica.cc (life and dispatch) and replica_*.cc by concern: openai (the
// generation endpoints and their answers), loop (the engine-driving loop), pd, faults,
// kv_events, lora and metrics.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/api/openai.h"
#include "core/engine/engine.h"
#include "apps/sim/answers.h"
#include "simkit/fault/fault.h"
#include "adapters/http/server.h"
#include "config/fleet_config.h"
#include "apps/sim/kv_publisher.h"
#include "apps/sim/tokenize_api.h"

namespace kvroute::sim {

// The sim reads its replicas from config/fleet_config.h; the name is the sim's too.
using config::ReplicaConfig;

// A Prometheus histogram with fixed upper bounds (per-bucket counts, last = overflow).
struct Histogram {
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}
  void Observe(double v);
  void Reset();
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  double sum = 0.0;
  uint64_t count = 0;
};

// vLLM's bucket bounds (REFERENCE.md section 1).
const std::vector<double>& TtftBuckets();
const std::vector<double>& InterTokenBuckets();
const std::vector<double>& RequestLatencyBuckets();
// vllm:request_prompt_tokens / request_generation_tokens: 1, 2, 5, 10, 20, 50, ... up to
// max_model_len (vLLM's build_1_2_5_buckets).
std::vector<double> RequestTokenBuckets(int max_model_len);

class Replica;

// P/D (docs/SIM_API.md, "Prefill/decode disaggregation"): the outcome of a decode leg's
// claim on the blocks a prefill leg holds.
enum class KvClaimOutcome { kOk, kUnknownEngine, kPrefillDown, kLeaseExpired };
// "ok", "unknown_engine", "prefill_down", "lease_expired" (the metrics' reason label).
std::string_view KvClaimOutcomeName(KvClaimOutcome o);

// The replicas of one process that a decode leg can pull from, by remote_engine_id: the
// only transport the sim has (a decode leg cannot pull from another process). Filled
// before the event loops run and read-only afterwards, so any thread may read it
// without locks; a replica is reached by posting to its io_context.
class KvPeerDirectory {
 public:
  struct Peer {
    std::string engine_id;
    Replica* replica = nullptr;
    boost::asio::io_context* ctx = nullptr;
  };
  void Add(Peer p) { peers_.push_back(std::move(p)); }
  // nullptr when no replica has `engine_id`.
  const Peer* Find(std::string_view engine_id) const {
    for (const Peer& p : peers_) {
      if (p.engine_id == engine_id) return &p;
    }
    return nullptr;
  }

 private:
  std::vector<Peer> peers_;
};

// One LoRA adapter a replica serves.
struct Adapter {
  std::string name;
  std::string path;
  std::string name_json;  // the name as a JSON string literal
  int64_t created = 0;    // Unix seconds it was added
};

class Replica {
 public:
  // `index` tags response ids. The config must be valid (ValidateReplica).
  Replica(boost::asio::io_context& ctx, ReplicaConfig config, int index);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // The HTTP handler for this replica's server.
  void Handle(std::shared_ptr<http::Exchange> ex);

  // The /metrics exposition (vLLM's names and format).
  std::string MetricsText() const;

  // The wall clock of vllm:lora_requests_info's values: Unix seconds (default: the system
  // clock). Tests inject a virtual one. Call before the io_context runs; restarts the
  // metric's series at the new clock's now.
  void SetUnixClock(std::function<double()> clock);
  engine::EngineStats Stats() const { return engine_.Stats(); }
  // Requests accepted and not yet finished (including those still in network delay).
  int live_requests() const { return static_cast<int>(live_.size()); }
  const ReplicaConfig& config() const { return config_; }
  // Tokens of `ids` a request starting now would find in the engine's prefix cache
  // (engine::Engine::PeekCachedTokens). Thread: the replica's.
  int PeekCachedTokens(std::span<const uint32_t> ids) const { return engine_.PeekCachedTokens(ids); }

  // KV events (config.kv_events.port set; docs/KV_EVENTS.md): binds the publisher. Call
  // once, before the io_context runs. Ok and nothing bound when events are off.
  Status StartKvEvents();
  // The bound endpoints ("" when off / no replay). Thread: the replica's, or before run.
  std::string kv_events_endpoint() const { return kv_ ? kv_->endpoint() : ""; }
  std::string kv_events_replay_endpoint() const { return kv_ ? kv_->replay_endpoint() : ""; }

  // P/D: the directory of this process's replicas, this replica's remote_engine_id and the
  // address it announces as remote_host/remote_port (its HTTP address: the sim has no
  // NIXL side channel). Call before the io_context runs; `peers` outlives the replica's
  // loop. Without a directory, decode legs fail with unknown_engine.
  void SetPd(const KvPeerDirectory* peers, std::string engine_id) {
    peers_ = peers;
    engine_id_ = std::move(engine_id);
  }
  void SetAddress(std::string host, uint16_t port) {
    announce_host_ = std::move(host);
    announce_port_ = port;
  }
  const std::string& engine_id() const { return engine_id_; }
  // A decode leg's claim on the hold of `remote_request_id` (this replica's prefill leg):
  // on success the hold is released (the blocks are the decode's now) and `*blocks` is
  // its block count. Thread: the replica's.
  KvClaimOutcome ClaimKv(const std::string& remote_request_id, int* blocks);

  // Stops timers and drops every in-flight exchange (their clients see the connection
  // close). Call on the replica's thread, or after its io_context stopped.
  void Shutdown();

  // How the replica opens and closes its listening socket for crash and restart
  // downtime: `listen(false)` closes it, `listen(true)` opens it again on the same port
  // and returns false if that failed (the replica retries every 50 ms). Called on the
  // replica's thread. Set before the io_context runs; without one, downtime only drops
  // requests that arrive.
  void SetListenControl(std::function<bool(bool listen)> listen) { listen_ = std::move(listen); }
  // Cancels the fault schedule and never reopens the port again (the fleet is stopping).
  // Call on the replica's thread.
  void StopFaults();
  // The faults in force now (for tests). Thread: the replica's.
  const fault::FaultSet& faults() const { return faults_; }

 private:
  struct Live;
  using Clock = std::chrono::steady_clock;

  // completions, chat, embeddings (a prefill of the inputs) and responses (chat answered
  // as a Responses object or event stream).
  void HandleGenerate(const std::shared_ptr<http::Exchange>& ex, api::Endpoint endpoint);
  answers::Response ResponseOf(const Live& l, const engine::RequestOutput& o) const;
  void Admit(const std::shared_ptr<Live>& live);
  void OnClientGone(uint64_t id);
  void Kick();
  void RunStep();
  void Deliver();
  void Finish(Live& l, const engine::RequestOutput& o);
  // P/D decode leg: settles the pull (or local recompute) before admission; calls Admit
  // again when done, or answers the error (policy fail).
  void StartPull(const std::shared_ptr<Live>& live);
  void OnPulled(const std::shared_ptr<Live>& live, KvClaimOutcome outcome, int blocks,
                int pullable, int local);
  void ArmLeaseTimer();
  void PruneHolds();  // drops the names of holds the engine no longer has
  void AppendKvTransferParams(std::string& out, const Live& l, const engine::RequestOutput& o);
  double EngineNow() const;
  // The response path of latency_ms: `send(*ex)` runs latency_ms after this call (at once
  // without latency), in call order. Every byte a generation request gets back after its
  // admission (stream headers, each chunk, the end, the whole body) goes through here.
  void Reply(std::shared_ptr<http::Exchange> ex, std::function<void(http::Exchange&)> send);
  void ArmOutbox();
  void FlushOutbox();

  // Faults (replica_faults.cc).
  double FaultNow() const;  // wall seconds since start_
  void HandleAdmin(std::shared_ptr<http::Exchange> ex);
  void HandleMetrics(const std::shared_ptr<http::Exchange>& ex);
  std::string MetricsBody() const;  // MetricsText, or the frozen text under metrics_stale
  // Starts `spec` (its FaultSet entry) and then its effects on requests in flight.
  void ActivateFault(const fault::FaultSpec& spec);
  void ApplyFaultStart(fault::FaultKind kind);
  void ApplyFaultEnd(fault::FaultKind kind);
  void ArmExpiry();
  void OnExpiry();
  // Holds `ex` silently (hang, stall) until `kind` ends, then closes its connection.
  void Hold(std::shared_ptr<http::Exchange> ex, fault::FaultKind kind);
  void ReleaseHeld(fault::FaultKind kind);
  // Closes every in-flight, held and waiting exchange's connection; with `abort_engine`
  // also aborts their engine requests (crash keeps the engine; restart replaces it).
  void DropAll(bool abort_engine);
  void SetDown(bool down);
  void TryListen();
  void RestartEngine();
  // A new engine in place of the old one (generation and epoch moved on, nothing held for
  // decode legs) and, with KV events on, a restarted publisher.
  void ReplaceEngine();
  // KV events (replica_kv_events.cc): publishes what the engine recorded (one batch), if
  // anything.
  void PublishKvEvents();
  void HandleResetPrefixCache(const std::shared_ptr<http::Exchange>& ex);
  // The engine config for the current process generation: a restarted process draws a
  // new hash seed, so every block hash changes (vLLM without PYTHONHASHSEED).
  engine::EngineConfig GenerationEngineConfig() const;

  // JSON pieces.
  // `{"id":..,"object":..,"created":..,"model":..` of a completion or chat object (`chat_object`
  // for a chat request, else text_completion), without the closing brace.
  void AppendObjectHead(std::string& out, const Live& l, std::string_view chat_object) const;
  void AppendChunkHead(std::string& out, const Live& l) const;
  void AppendUsage(std::string& out, const engine::RequestOutput& o) const;
  std::string ModelsBody() const;

  // LoRA (docs/SIM_API.md, "LoRA adapters"; replica_lora.cc).
  void HandleLoraAdapter(const std::shared_ptr<http::Exchange>& ex, bool unload);
  // nullptr when no adapter is called `name`.
  const Adapter* FindAdapter(std::string_view name) const;
  void AddAdapter(std::string name, std::string path);
  // Records the engine's running/waiting adapters as the newest series of
  // vllm:lora_requests_info (timestamped now by the Unix clock).
  void UpdateLoraInfo();

  // /metrics sections that read the replica's own state (replica_metrics.cc).
  void AppendLoraInfo(std::string& out) const;  // vllm:lora_requests_info, when LoRA is on
  void AppendPdMetrics(std::string& out, const engine::EngineStats& s) const;  // kvroute_sim_pd_*

  boost::asio::io_context& ctx_;
  ReplicaConfig config_;
  int index_;
  engine::Engine engine_;
  std::string model_json_;  // the served model name as a JSON string literal
  boost::asio::steady_timer step_timer_;
  Clock::time_point start_;
  double last_step_end_ = 0.0;  // engine seconds
  bool stepping_ = false;       // a step is in flight (timer armed or posted)
  bool kv_wait_ = false;        // the step timer sleeps until a decode leg's KV arrives
  uint64_t kv_wait_seq_ = 0;    // which of those sleeps is current
  bool shut_down_ = false;
  engine::StepResult step_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<Live>> live_;
  // Replies on their way back (latency_ms > 0), due times in order: one timer for all.
  struct Outgoing {
    Clock::time_point due;
    std::shared_ptr<http::Exchange> ex;
    std::function<void(http::Exchange&)> send;
  };
  std::deque<Outgoing> outbox_;
  boost::asio::steady_timer outbox_timer_;

  // Faults.
  struct Held {
    std::shared_ptr<http::Exchange> ex;
    fault::FaultKind kind;
  };
  struct MetricsWait {
    std::shared_ptr<http::Exchange> ex;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  fault::FaultSet faults_;
  std::vector<std::unique_ptr<boost::asio::steady_timer>> schedule_timers_;
  boost::asio::steady_timer expiry_timer_;
  boost::asio::steady_timer relisten_timer_;
  std::function<bool(bool)> listen_;
  bool down_ = false;           // crash or restart downtime: the port is closed
  bool faults_stopped_ = false;
  uint64_t epoch_ = 0;          // engine generation: a restart makes pending steps stale
  uint64_t next_hold_ = 1;
  std::unordered_map<uint64_t, Held> held_;
  std::unordered_map<uint64_t, MetricsWait> metrics_waits_;
  std::string frozen_metrics_;  // metrics_stale: the text when it began

  // KV events.
  std::unique_ptr<KvPublisher> kv_;
  std::vector<kvevents::KvEvent> kv_scratch_;
  uint64_t generation_ = 0;  // process restarts so far (restart, and crash with events)
  TokenizeApi tokenize_api_;  // POST /tokenize, /detokenize (apps/sim/tokenize_api.h)

  // P/D.
  const KvPeerDirectory* peers_ = nullptr;
  std::string engine_id_;
  std::string announce_host_;
  uint16_t announce_port_ = 0;
  std::unordered_map<std::string, uint64_t> pd_holds_;  // remote_request_id -> engine id
  boost::asio::steady_timer lease_timer_;
  struct PdCounters {
    uint64_t prefill_legs = 0;       // answered with kv_transfer_params
    uint64_t decode_pulled = 0;      // decode legs by path
    uint64_t decode_local = 0;
    uint64_t decode_recomputed = 0;  // after a failed pull, policy recompute
    uint64_t decode_failed = 0;      // after a failed pull, policy fail
    uint64_t pulled_tokens = 0;
    double transfer_seconds = 0.0;   // engine seconds
    uint64_t failures[4] = {0, 0, 0, 0};  // by KvClaimOutcome
  } pd_;

  // LoRA adapters served (engine.lora.enabled): --lora-modules, then runtime loads.
  std::vector<Adapter> adapters_;
  std::function<double()> unix_clock_;
  // vllm:lora_requests_info: vLLM's gauge keeps one series per label combination it ever
  // set, each with the time it was last set; kept here newest last, at most
  // kMaxLoraSeries (the oldest combination is dropped first).
  static constexpr std::size_t kMaxLoraSeries = 64;
  struct LoraSeries {
    std::string running;  // comma-joined adapter names
    std::string waiting;
    double unix_s = 0.0;
  };
  std::vector<LoraSeries> lora_series_;
  std::vector<std::string> lora_running_scratch_, lora_waiting_scratch_;
  std::string lora_join_running_, lora_join_waiting_;

  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  Histogram queue_;
  Histogram prompt_len_;  // tokens per finished request's prompt
  Histogram output_len_;  // and per its output
};

}  // namespace kvroute::sim
