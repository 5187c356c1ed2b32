// The simulated LLM engine: a model of one vLLM V1 replica's scheduler and paged KV
// cache with automatic prefix caching (see REFERENCE.md sections 2, 3 and 9). No model
// runs; a step's duration comes from a fitted cost model (StepModel).
//
// Pure logic: no clocks, no threads, no I/O. The caller owns time: it calls Step(now),
// and the step's outputs become visible at now + duration. Drivers: the live simulator
// (`kvroute sim`, real timers) and the discrete-event simulator (`kvroute simulate`).
//
// Thread: an Engine is not thread-safe; use each from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/kvevents/kv_event.h"

namespace kvroute::engine {

// Cost of one engine step (one forward pass over the scheduled batch), in microseconds:
//   base_us + per_prefill_token_us * prefill_tokens + per_decode_seq_us * decode_seqs
//           + per_context_token_us * resident_context_tokens
// where resident_context_tokens is the KV the step reads: for each scheduled request,
// its tokens already computed plus the ones computed this step.
struct StepModel {
  double base_us = 5753.0;
  double per_prefill_token_us = 17.25;
  double per_decode_seq_us = 6.0;
  double per_context_token_us = 0.05;

  // The formula above in seconds. Returns 0 when nothing is scheduled
  // (prefill_tokens == 0 and decode_seqs == 0).
  double StepSeconds(int prefill_tokens, int decode_seqs,
                     int64_t resident_context_tokens) const;
};

// LoRA adapters (REFERENCE.md section 19), as vLLM's --enable-lora serves them. A request
// names its adapter in EngineRequest::lora_name ("" = the base model).
//  - Batch rule (vLLM V1's scheduler): admitting waiting requests in order, a request whose
//    adapter is not among the adapters of the requests already scheduled in this step,
//    when those are max_loras distinct adapters already, is skipped for this step: it keeps
//    its place in the queue and admission goes on with the requests behind it. Running
//    requests are never held back. Base-model requests count no adapter.
//  - Adapter cache: an LRU of max_cpu_loras adapters. A step that schedules a request whose
//    adapter is not cached loads it (evicting the least recently used adapter not in this
//    step's batch when the cache is full) and takes load_s longer per adapter loaded: vLLM
//    loads adapters synchronously in the worker before the forward pass, so the whole
//    batch waits for the load. Every adapter a step schedules becomes most recently used.
//  - load_s default 0.05 s: reading a rank-16 adapter of an 8B model (~20-80 MB of
//    safetensors, all projections) from local disk or page cache and copying it to the GPU;
//    an assumption, not a measurement. Set it to what your storage gives.
// Disabled (the default): lora_name only keys the prefix cache; no rule, no cache, no cost.
struct LoraConfig {
  bool enabled = false;
  int max_loras = 1;      // distinct adapters in one batch, >= 1
  int max_cpu_loras = 0;  // adapters cached; 0 = max_loras; else >= max_loras
  double load_s = 0.05;   // engine seconds per adapter load, >= 0

  int cache_capacity() const { return max_cpu_loras > 0 ? max_cpu_loras : max_loras; }
};

struct EngineConfig {
  std::string model_name = "meta-llama/Llama-3.1-8B-Instruct";
  int block_size = 16;           // tokens per KV block
  int num_gpu_blocks = 26304;    // block 0 is reserved (vLLM's null block): usable = n-1
  int max_num_seqs = 256;        // running batch limit
  int max_num_batched_tokens = 8192;  // per-step token budget (chunked prefill)
  int max_model_len = 131072;    // prompt + max_tokens limit
  bool enable_prefix_caching = true;
  bool priority_scheduling = false;  // waiting order (priority, arrival, id), else FCFS
  StepModel step;

  // Output length when the request does not set its own stop point (EngineRequest::
  // stop_after_tokens). Precedence: fixed_output_tokens > 0 stops after exactly that
  // many tokens; else mean_output_tokens > 0 draws a length from an exponential
  // distribution with that mean (at least 1), deterministic per (output_seed, request
  // id); else the request runs to max_tokens (as with ignore_eos). A request that
  // reaches its stop point finishes with kStop; one that reaches max_tokens first
  // finishes with kLength.
  int fixed_output_tokens = 0;
  double mean_output_tokens = 0.0;
  uint64_t output_seed = 0;

  // Seed of the block hash chain (vLLM derives it from PYTHONHASHSEED).
  uint64_t hash_seed = 0;

  // Record KV-cache events (REFERENCE.md section 5) for DrainKvEvents. Off by default.
  bool record_kv_events = false;

  // The model's KV bytes per token (all layers, K and V, across its tensor-parallel ranks)
  // and its tensor-parallel size. The engine does not use them; a P/D driver does (the
  // transfer time of a pull, and tp_size in kv_transfer_params).
  int64_t kv_bytes_per_token = 131072;  // Llama-3.1-8B bf16: 128 KiB
  int tensor_parallel_size = 1;

  LoraConfig lora;
};

// Built-in configurations.
//   "llama3-8b-h100": Llama-3.1-8B bf16 on one H100 80 GB: 128 KiB of KV per token,
//       26304 blocks of 16 tokens (~420k tokens), max_num_seqs 256,
//       max_num_batched_tokens 8192, max_model_len 131072. Step model fitted to public
//       simulators: 5753 us + 17.25 us/prefill token + 6.0 us/decode seq + 0.05 us per
//       resident context token, so a batch-1 decode step is ~5.8-6.2 ms (1k-8k context)
//       and prefill runs ~50k tokens/s (an 8192-token chunk ~0.15 s).
//   "small-kv": same speed and limits but 2048 blocks (~32k tokens), so KV pressure,
//       eviction and preemption are easy to reach.
//   "qwen3-32b-tp2-h100": Qwen3-32B bf16, tensor-parallel on two H100 80 GB (the llm-d
//       guides' replica): 256 KiB of KV per token, half on each GPU; at 0.9 memory
//       utilisation each GPU keeps ~35 GiB for KV after its half of the 65.5 GB of
//       weights: 17920 blocks of 16 tokens (~287k tokens). Step model: 11.5 ms + 62.8
//       us/prefill token (15,928 tokens/s, the prefill throughput llm-d's guide calibrates
//       its release to) + 12 us/decode seq + 0.05 us per resident context token.
// Returns nullopt for an unknown name.
std::optional<EngineConfig> PresetConfig(std::string_view name);
std::vector<std::string> PresetNames();

struct EngineRequest {
  uint64_t id = 0;                      // unique among the engine's live requests
  std::vector<uint32_t> prompt_tokens;  // non-empty
  int max_tokens = 16;                  // >= 1
  int64_t priority = 0;                 // lower is more important (priority scheduling)
  std::string cache_salt;               // extra key of the first block's hash
  std::string lora_name;                // extra key of every block's hash
  double arrival_s = 0.0;               // engine time of arrival
  // When > 0, the request stops (kStop) after this many tokens if that is <= max_tokens;
  // overrides the EngineConfig output length settings.
  int stop_after_tokens = 0;

  // Prefill/decode disaggregation (REFERENCE.md section 20; docs/SIM_API.md, "P/D").
  // All zero: an ordinary request, scheduled exactly as without these fields.
  //
  // Prefill leg (vLLM's do_remote_decode): when kv_hold_s > 0 and the request finishes by
  // its length cap (kLength), the blocks of its computed full blocks (floor(computed /
  // block_size) of them, the prompt's full blocks for a max_tokens 1 leg) stay referenced
  // after the finish, as a hold keyed by the request id, until ReleaseHold(id) or until
  // engine time finish_s + kv_hold_s (the lease; ExpireHolds, and every Step, drop it).
  // Its other blocks are freed as usual. A request that finishes otherwise (kStop, abort)
  // holds nothing. Held blocks count as used in kv_cache_usage and stay in the prefix
  // cache, so local requests can hit them.
  double kv_hold_s = 0.0;
  // Decode leg (do_remote_prefill): the KV of the first kv_load_tokens prompt tokens is
  // loaded from another engine, not computed; the load completes at engine time
  // kv_ready_s. Until then the request waits (counted in EngineStats::waiting and
  // waiting_for_remote_kvs) and is skipped by admission without blocking the requests
  // behind it (vLLM's WAITING_FOR_REMOTE_KVS). Once admitted at or after kv_ready_s, its
  // first max(local prefix hit, min(kv_load_tokens, prompt - 1)) tokens count as computed:
  // their blocks are allocated (the loaded ones fresh) and hashed into the prefix cache as
  // computed blocks are, and only the rest (at least the last prompt token) is prefilled
  // locally. RequestOutput::cached_tokens reports that start (local hits plus loaded
  // tokens, as vLLM's num_cached_tokens does); the prefix-cache counters count local hits
  // only. The load applies to the first admission only: a preempted decode leg
  // recomputes (usually hitting its own blocks). 0 <= kv_load_tokens <= prompt length.
  // Simplification: vLLM allocates the blocks before the pull starts; here they are
  // allocated when the request is admitted after the load.
  int kv_load_tokens = 0;
  double kv_ready_s = 0.0;
};

enum class FinishReason { kNone, kStop, kLength, kAbort };

// "stop", "length", "abort" (vLLM's finished_reason label); "" for kNone.
std::string_view FinishReasonName(FinishReason r);

// What happened to one request in a step. Times are engine seconds.
struct RequestOutput {
  uint64_t id = 0;
  int new_tokens = 0;        // tokens produced this step: 0 (prefill chunk) or 1
  bool first_token = false;  // this step produced the request's first token
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  int prompt_tokens = 0;
  int cached_tokens = 0;     // prefix-cache hit tokens at the (last) admission
  int completion_tokens = 0; // tokens generated so far, including this step's
  int num_preemptions = 0;   // times this request was preempted so far
  double arrival_s = 0.0;
  double first_scheduled_s = 0.0;  // start of the first step that scheduled it
  double first_token_s = 0.0;      // valid when completion_tokens > 0
  double finish_s = 0.0;           // valid when finished
};

struct StepResult {
  double duration_s = 0.0;   // 0 when nothing was scheduled; includes lora_loads * load_s
  int prefill_tokens = 0;
  int decode_seqs = 0;
  int num_scheduled = 0;     // requests scheduled this step
  int64_t resident_context_tokens = 0;
  int num_preempted = 0;     // preemptions during this step's scheduling
  int lora_loads = 0;        // adapters loaded for this step (EngineConfig::lora)
  // One entry per scheduled request, in schedule order. Visible at now + duration_s.
  std::vector<RequestOutput> outputs;
};

struct EngineStats {
  int running = 0;
  int waiting = 0;             // including preempted requests
  double kv_cache_usage = 0.0; // 1 - free/(num_gpu_blocks-1); cached-but-free is free
  int64_t prefix_queries_tokens = 0;
  int64_t prefix_hits_tokens = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;       // prompt tokens of requests added (accepted)
  int64_t generation_tokens = 0;   // tokens generated
  int64_t finished_stop = 0;
  int64_t finished_length = 0;
  int64_t finished_abort = 0;
  int num_free_blocks = 0;     // unreferenced blocks (cached or not), excluding block 0
  int num_cached_blocks = 0;   // blocks currently holding a hash (referenced or free)
  // P/D (EngineRequest::kv_hold_s, kv_load_tokens).
  int kv_holds = 0;                 // finished prefill legs whose blocks are held now
  int kv_held_blocks = 0;           // blocks those holds reference (may be shared)
  int waiting_for_remote_kvs = 0;   // waiting requests whose KV load is not applied yet
  int64_t kv_holds_released = 0;    // holds ended by ReleaseHold
  int64_t kv_holds_expired = 0;     // holds ended by their lease
  // LoRA (EngineConfig::lora enabled).
  int loras_cached = 0;             // adapters in the cache now
  int64_t lora_loads = 0;           // adapter loads (each cost lora.load_s)
  int64_t lora_evictions = 0;       // adapters dropped from the full cache (LRU)
  int64_t lora_skips = 0;           // admissions skipped by the max_loras rule, per step
};

// A KV-cache event as vLLM publishes it (REFERENCE.md section 5): the core's one type.
using KvEvent = kvevents::KvEvent;
using KvEventKind = kvevents::EventKind;

// The block hash chain: hash of one full block given its parent's hash (or the seed for
// the first block), its token ids, the cache salt (pass it for the first block only)
// and the LoRA name (every block; empty when none). XXH3-64 based; deterministic.
uint64_t BlockHash(uint64_t parent_or_seed, std::span<const uint32_t> tokens,
                   std::string_view cache_salt, std::string_view lora_name);

class Engine {
 public:
  // `config` must be valid: block_size >= 1, num_gpu_blocks >= 2, max_num_seqs >= 1,
  // max_num_batched_tokens >= 1, max_model_len >= 2 (asserted).
  explicit Engine(EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  // Queues `req` (arrival at req.arrival_s). Returns nullopt on success, or an error
  // message (and leaves the engine unchanged) when the prompt is empty, max_tokens < 1,
  // prompt + max_tokens > max_model_len, prompt + max_tokens needs more blocks than the
  // whole cache (it could never finish), or the id is already live.
  std::optional<std::string> AddRequest(EngineRequest req);

  // Aborts a live (waiting or running) request: frees its blocks now (hashes kept),
  // counts finished_abort, produces no output. Returns false if `id` is not live.
  bool Abort(uint64_t id);

  // True while any request is waiting or running.
  bool HasWork() const;

  // Schedules and "executes" one step starting at `now_s`, as vLLM V1 does:
  //  1. running requests in admission order, each min(remaining, budget) tokens (a decode
  //     needs 1); when its KV slots cannot be allocated, preempt (recompute) the most
  //     recently admitted running request (priority mode: the least important, latest
  //     arrival), repeatedly; if the victim is the request itself, stop scheduling.
  //  2. waiting requests (FCFS, or by (priority, arrival, id)), only if nothing was
  //     preempted in 1., while running < max_num_seqs, budget remains and the head's
  //     blocks can be allocated (head-of-line: a head that does not fit stops admission).
  //     Admission looks up the prefix cache and counts prefix_queries/hits_tokens (only
  //     on successful admission, over the request's whole token count, which includes
  //     tokens generated before a preemption).
  // Full blocks are hashed and cached when allocated, so a request admitted later in the
  // same step can already share them. A request whose whole context is computed samples
  // one token; it finishes at its stop point (kStop) or max_tokens (kLength) and frees its
  // blocks tail-first (hashes kept) at the end of the step.
  // A step with nothing scheduled returns duration 0 and no outputs; this can happen
  // with HasWork() true when the only schedulable request preempted itself, and then
  // the next Step makes progress. The caller should not call Step again before
  // now_s + duration (the engine does not check).
  StepResult Step(double now_s);
  // Same, reusing `out` (its outputs vector keeps its capacity): no allocation in steady
  // state.
  void Step(double now_s, StepResult* out);

  EngineStats Stats() const;
  const EngineConfig& config() const;

  // Number of tokens of `tokens` (with the given salt/LoRA) that a request starting now
  // would find in the prefix cache (same cap as admission). Read-only; for tests and
  // for drivers that report "what would hit".
  int PeekCachedTokens(std::span<const uint32_t> tokens, std::string_view cache_salt = {},
                       std::string_view lora_name = {}) const;

  // vLLM's POST /reset_prefix_cache (BlockPool.reset_prefix_cache): when no block is in
  // use by a request, forgets every cached hash (no later request hits; no BlockRemoved
  // is recorded for them), records one AllBlocksCleared event and returns true. When some
  // block is still held by a running or preempted-but-holding request, vLLM refuses ("some
  // blocks are not freed yet"): nothing changes and this returns false. Counters are kept.
  bool ResetPrefixCache();

  // P/D holds (EngineRequest::kv_hold_s). The block ids held for request `id` (the
  // prefill leg's remote_block_ids), in token order; empty when it holds none. Valid until
  // the next non-const call.
  std::span<const int32_t> HeldBlocks(uint64_t id) const;
  // Ends the hold of `id` now: its blocks are freed tail-first (hashes kept). Returns false
  // when `id` holds nothing (never held, released, or expired).
  bool ReleaseHold(uint64_t id);
  // Ends every hold whose lease ends at or before `now_s`; returns how many. Step calls it
  // first; a driver calls it while the engine is idle (NextHoldExpiryS says when).
  int ExpireHolds(double now_s);
  // The earliest lease end among the holds; nullopt when there is none.
  std::optional<double> NextHoldExpiryS() const;
  // The earliest kv_ready_s among waiting decode legs whose load is not applied yet;
  // nullopt when there is none. A Step that schedules nothing while HasWork() can be
  // waiting for this time.
  std::optional<double> NextKvReadyS() const;

  // LoRA (EngineConfig::lora). The adapters of the running requests (in admission order)
  // and of the waiting ones (in queue order), each listed once, replacing the vectors'
  // contents; vLLM's running_lora_adapters / waiting_lora_adapters (an adapter with
  // requests in both states is in both). Base-model requests are not listed.
  void LoraActivity(std::vector<std::string>* running, std::vector<std::string>* waiting) const;
  // True when `name` is in the adapter cache now.
  bool LoraCached(std::string_view name) const;
  // Drops `name` from the adapter cache (vLLM's unload); a later use loads it again.
  // Returns false when it was not cached.
  bool EvictLora(std::string_view name);

  // Moves the recorded KV events (config.record_kv_events) into `*out` (appended).
  void DrainKvEvents(std::vector<KvEvent>* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute::engine
