// The precise prefix index: which endpoint holds which prefix blocks, by what the engines
// report they cache (KV-cache events), not by what this router sent where.
//
// Keys. The index never uses the engines' block hashes as keys: their algorithm and seed
// (vLLM's PYTHONHASHSEED) are the engine's business and change on every restart. It keys
// blocks by its own chain over token ids, in blocks of `block_tokens` tokens, rooted in
// the LoRA name (RequestKeys): a request whose token ids are known gets the same keys the
// events' token_ids produce. Per endpoint it remembers engine hash -> keys, so a removal
// (which names only engine hashes) and a stored run's parent resolve. An engine block
// size that is a multiple of block_tokens is cut into that many keys; any other is a
// block-size mismatch (counted; that endpoint is not usable).
//
// Tiers. A block may be held on the GPU, or offloaded (CPU, disk). Match weighs each
// leading block by its best tier (GPU 1, CPU cpu_weight, disk disk_weight).
//
// Speculative entries. A dispatch is visible in the events only after the engine has
// scheduled it; AddSpeculative records the chain for that endpoint for
// speculative_ttl_s, so a burst of same-prefix requests does not scatter meanwhile.
//
// Unknown is not zero. Each endpoint whose events are expected has a state:
//   unknown   never heard from (no batch yet)
//   live      batches arrive: Match is trusted
//   stale     the router dispatched work that must store blocks, and no batch came for
//             stale_after_s since
//   resync    an unrepaired gap, an undecodable batch or an overflow of the bound: the
//             entries were dropped and the endpoint is not trusted for resync_s
//   mismatch  the events' block size is not a multiple of block_tokens
// Only a live endpoint is Usable; for every other, policies use their approximate model.
// A publisher restart (the sequence going back) clears the endpoint's entries (the
// engine's cache restarted empty too) and keeps it live.
//
// Memory: at most max_blocks_per_endpoint engine blocks per endpoint (beyond it, the
// endpoint's entries are dropped and it resyncs), 4,096 recently removed blocks per
// endpoint kept for parent resolution, and max_speculative speculative entries overall.
// About 120 bytes per indexed block at block_tokens = the engine's block size.
//
// Pure logic, no clock (times passed in), no locks: the owner serialises writers and may
// let readers (Match, State, Stats) run concurrently with each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/kvevents/kv_event.h"

namespace kvroute::kvevents {

struct IndexOptions {
  int32_t block_tokens = 16;  // tokens per key; engines' block sizes must be multiples
  size_t max_blocks_per_endpoint = size_t{1} << 21;
  size_t max_speculative = size_t{1} << 20;
  size_t max_request_keys = 8192;  // longest chain RequestKeys builds (131,072 tokens at 16)
  double speculative_ttl_s = 2.0;
  double stale_after_s = 10.0;
  double resync_s = 10.0;
  double cpu_weight = 0.8;
  double disk_weight = 0.25;
};

// How Match weighs a held block by its best tier; a policy that models a peer passes the
// peer's weights. `speculative`: the weight of a block held only by a speculative entry
// (0: not held, so a peer without speculative entries sees only what the engines report).
struct TierWeights {
  double gpu = 1.0;
  double cpu = 0.8;
  double disk = 0.25;
  double speculative = 1.0;
};

enum class SourceState : uint8_t { kOff, kUnknown, kLive, kStale, kResync, kMismatch };
inline constexpr size_t kSourceStates = 6;
// "off", "unknown", "live", "stale", "resync", "mismatch".
std::string_view SourceStateName(SourceState s);

struct EndpointEventStats {
  SourceState state = SourceState::kOff;
  uint64_t batches = 0;
  uint64_t stored = 0;   // BlockStored events applied
  uint64_t removed = 0;  // BlockRemoved events applied
  uint64_t cleared = 0;  // AllBlocksCleared events
  uint64_t gaps = 0;            // every gap the transport found
  uint64_t gaps_unrepaired = 0; // those replay could not fill
  uint64_t restarts = 0;
  uint64_t decode_errors = 0;
  uint64_t orphans = 0;         // stored runs whose parent was unknown (dropped)
  uint64_t mismatches = 0;      // stored runs with a block size not a multiple of ours
  uint64_t overflows = 0;       // times the per-endpoint bound dropped the entries
  size_t blocks = 0;            // engine blocks indexed now
  int32_t block_size = 0;       // the engines' block size in the last stored run; 0 none
  double last_batch_s = -1.0;   // when the last batch was applied; < 0 never
};

struct StateTransition {
  uint32_t endpoint = 0;
  SourceState from = SourceState::kOff;
  SourceState to = SourceState::kOff;
  std::string_view reason;  // static text
};

class EventIndex {
 public:
  explicit EventIndex(IndexOptions options = {});
  ~EventIndex();
  EventIndex(const EventIndex&) = delete;
  EventIndex& operator=(const EventIndex&) = delete;

  const IndexOptions& options() const { return options_; }
  // New options; a different block_tokens drops every entry (keys change) and sends live
  // endpoints to unknown until their next batch.
  void SetOptions(const IndexOptions& options);

  // The router's keys for a prompt's token ids: one per full block of block_tokens tokens,
  // each chained over the one before, the first rooted in `lora_name` ("" for the base
  // model). At most max_request_keys keys. Clears `out` first.
  void RequestKeys(std::string_view lora_name, std::span<const uint32_t> tokens,
                   std::vector<uint64_t>* out) const;
  static void ChainKeys(std::string_view lora_name, std::span<const uint32_t> tokens,
                        int32_t block_tokens, size_t max_keys, std::vector<uint64_t>* out);

  // ---- endpoints ----
  // Events are expected from `endpoint` (configured): unknown until its first batch. A no-op
  // when already expected.
  void Expect(uint32_t endpoint, double now_s);
  // Not expected any more (removed from the pool, or its events unconfigured): entries and
  // counters dropped, state off.
  void Forget(uint32_t endpoint);
  // True when any endpoint is expected.
  bool active() const { return expected_ > 0; }

  // ---- what the transport reports ----
  void ApplyBatch(uint32_t endpoint, const KvEventBatch& batch, double now_s);
  // A gap in the sequence; `repaired` when replay filled it.
  void OnGap(uint32_t endpoint, bool repaired, double now_s);
  // The publisher restarted (its sequence went back).
  void OnRestart(uint32_t endpoint, double now_s);
  // A batch could not be decoded: its events are lost, as with an unrepaired gap.
  void OnDecodeError(uint32_t endpoint, double now_s);

  // ---- what the router did ----
  // A request was sent to `endpoint` that must store blocks there (its uncached tokens
  // span at least one block): starts the staleness clock when none is running.
  void OnWorkDispatched(uint32_t endpoint, double now_s);
  // Records `keys` as held by `endpoint` until now + speculative_ttl_s.
  void AddSpeculative(uint32_t endpoint, std::span<const uint64_t> keys, double now_s);
  // Evaluates time-based states (stale, end of resync), recording transitions, and drops
  // expired speculative entries.
  void Tick(double now_s);

  // ---- reads ----
  // The state at `now_s` (time-based transitions included, whether or not Tick ran).
  SourceState State(uint32_t endpoint, double now_s) const;
  bool Usable(uint32_t endpoint, double now_s) const {
    return State(endpoint, now_s) == SourceState::kLive;
  }
  // For every endpoint id, the tier-weighted number of leading `keys` it holds (a run from
  // key 0; speculative entries count as GPU while they last), and the length of that run.
  // Both vectors are resized to at least the largest endpoint id + 1 and zeroed first.
  // Endpoints that are not Usable are matched too; callers decide what to trust.
  void Match(std::span<const uint64_t> keys, double now_s, std::vector<double>& weighted,
             std::vector<uint32_t>& run) const;
  // The same with explicit tier weights (the options' cpu_weight and disk_weight above).
  void Match(std::span<const uint64_t> keys, double now_s, const TierWeights& tiers,
             std::vector<double>& weighted, std::vector<uint32_t>& run) const;
  // The same for one endpoint: the run length (weighted into `*weighted` when not null).
  uint32_t MatchOne(std::span<const uint64_t> keys, uint32_t endpoint, double now_s,
                    double* weighted = nullptr) const;
  EndpointEventStats Stats(uint32_t endpoint, double now_s) const;
  size_t TotalBlocks() const;
  size_t SpeculativeEntries() const { return spec_fifo_.size(); }
  // Moves the state transitions recorded since the last call into `*out` (appended).
  void DrainTransitions(std::vector<StateTransition>* out);

 private:
  struct Holder;
  struct Source;
  struct SpecEntry {
    double until;
    uint32_t endpoint;
    uint64_t key;
  };

  Source* Find(uint32_t endpoint);
  const Source* Find(uint32_t endpoint) const;
  void SetState(Source& s, uint32_t endpoint, SourceState to, std::string_view reason);
  void Clear(Source& s, uint32_t endpoint);
  void ClearAll(Source& s, uint32_t endpoint, SourceState to, std::string_view reason, double now_s);
  void ApplyStored(Source& s, uint32_t endpoint, const KvEvent& e, double now_s);
  void ApplyRemoved(Source& s, uint32_t endpoint, const KvEvent& e);
  // Ends `e` unless its holder's speculative entry lasts beyond `cutoff` (a later one).
  void EndSpeculative(const SpecEntry& e, double cutoff);
  void AddHolder(uint64_t key, uint32_t endpoint, Medium m);
  void DropHolder(uint64_t key, uint32_t endpoint, Medium m);
  static SourceState Effective(const Source& s, double now_s, const IndexOptions& o);
  static double Weight(const Holder& h, double now_s, const TierWeights& w);
  TierWeights OwnTiers() const {
    return TierWeights{1.0, options_.cpu_weight, options_.disk_weight, 1.0};
  }

  IndexOptions options_;
  std::vector<std::unique_ptr<Source>> sources_;  // by endpoint id
  size_t expected_ = 0;
  std::unordered_map<uint64_t, std::vector<Holder>> keys_;
  std::deque<SpecEntry> spec_fifo_;
  std::vector<StateTransition> transitions_;
};

}  // namespace kvroute::kvevents
