#include "core/engine/engine.h"

#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <deque>
#include <unordered_map>

#include "core/engine/tokenizer.h"
#include "core/common/enum_names.h"

namespace kvroute::engine {
namespace {

constexpr int32_t kNone = -1;

// Distinct seeds for the extra keys so a salt can never be confused with a LoRA name.
constexpr uint64_t kSaltKey = 0x73616c7400000001ULL;
constexpr uint64_t kLoraKey = 0x6c6f726100000002ULL;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

double StepModel::StepSeconds(int prefill_tokens, int decode_seqs,
                              int64_t resident_context_tokens) const {
  if (prefill_tokens == 0 && decode_seqs == 0) return 0.0;
  const double us = base_us + per_prefill_token_us * prefill_tokens +
                    per_decode_seq_us * decode_seqs +
                    per_context_token_us * static_cast<double>(resident_context_tokens);
  return us * 1e-6;
}

std::optional<EngineConfig> PresetConfig(std::string_view name) {
  EngineConfig c;  // the defaults are the H100 preset
  if (name == "llama3-8b-h100") return c;
  if (name == "small-kv") {
    c.num_gpu_blocks = 2048;
    return c;
  }
  if (name == "qwen3-32b-tp2-h100") {
    c.model_name = "Qwen/Qwen3-32B";
    c.num_gpu_blocks = 17920;
    c.step.base_us = 11500.0;
    c.step.per_prefill_token_us = 62.8;
    c.step.per_decode_seq_us = 12.0;
    c.step.per_context_token_us = 0.05;
    c.kv_bytes_per_token = 262144;
    c.tensor_parallel_size = 2;
    return c;
  }
  return std::nullopt;
}

std::vector<std::string> PresetNames() {
  return {"llama3-8b-h100", "small-kv", "qwen3-32b-tp2-h100"};
}

std::string_view FinishReasonName(FinishReason r) {
  static constexpr EnumName<FinishReason> kNames[] = {{FinishReason::kStop, "stop"},
                                                      {FinishReason::kLength, "length"},
                                                      {FinishReason::kAbort, "abort"}};
  return NameOf(kNames, r, "");
}

uint64_t BlockHash(uint64_t parent_or_seed, std::span<const uint32_t> tokens,
                   std::string_view cache_salt, std::string_view lora_name) {
  uint64_t h = XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent_or_seed);
  if (!cache_salt.empty()) {
    h = XXH3_64bits_withSeed(cache_salt.data(), cache_salt.size(), h ^ kSaltKey);
  }
  if (!lora_name.empty()) {
    h = XXH3_64bits_withSeed(lora_name.data(), lora_name.size(), h ^ kLoraKey);
  }
  return h;
}

// ---------------------------------------------------------------------------------------

struct Engine::Impl {
  struct Block {
    int32_t ref = 0;
    int32_t prev = kNone;  // free-list links, valid while in_free
    int32_t next = kNone;
    bool in_free = false;
    bool has_hash = false;
    uint64_t hash = 0;
  };

  struct Request {
    uint64_t id = 0;
    std::vector<uint32_t> tokens;        // prompt, then generated tokens
    std::vector<uint64_t> block_hashes;  // chain over full blocks of `tokens`, grown lazily
    std::vector<int32_t> blocks;         // held blocks, in token order
    std::string cache_salt;
    std::string lora_name;
    int prompt_len = 0;
    int max_tokens = 0;
    int stop_at = 0;  // stop (kStop) after this many tokens; 0 = run to max_tokens
    int64_t priority = 0;
    double arrival_s = 0.0;
    int computed = 0;    // tokens whose KV is in `blocks`
    int registered = 0;  // leading blocks already offered to the prefix cache
    int generated = 0;
    int cached_tokens = 0;
    int preemptions = 0;
    int scheduled = 0;  // tokens scheduled in the current step, 0 otherwise
    bool running = false;
    bool finished = false;
    double first_scheduled_s = -1.0;
    double first_token_s = 0.0;
    double kv_hold_s = 0.0;    // P/D prefill leg: lease after a kLength finish
    int kv_load_tokens = 0;    // P/D decode leg: loaded prompt tokens, until admitted
    double kv_ready_s = 0.0;   // when the load completes
  };

  // A finished prefill leg's blocks, kept for the decode leg (EngineRequest::kv_hold_s).
  struct Hold {
    std::vector<int32_t> blocks;  // token order
    double expires_s = 0.0;
  };

  explicit Impl(EngineConfig c) : config(std::move(c)) {
    assert(config.block_size >= 1);
    assert(config.num_gpu_blocks >= 2);
    assert(config.max_num_seqs >= 1);
    assert(config.max_num_batched_tokens >= 1);
    assert(config.max_model_len >= 2);
    blocks.resize(config.num_gpu_blocks);
    // Block 0 stays out of circulation, like vLLM's null block, so usage is measured
    // against num_gpu_blocks - 1 exactly as vLLM reports it.
    for (int32_t b = 1; b < config.num_gpu_blocks; ++b) FreeAppend(b);
    if (config.enable_prefix_caching) cache.reserve(config.num_gpu_blocks);
    running.reserve(config.max_num_seqs);
    scheduled.reserve(config.max_num_seqs);
    if (config.lora.enabled) {
      assert(config.lora.max_loras >= 1);
      assert(config.lora.cache_capacity() >= config.lora.max_loras);
      step_loras.reserve(config.max_num_seqs);
      lora_cache.reserve(config.lora.cache_capacity());
    }
  }

  // ---- free list (LRU: head is evicted first) ----------------------------------------

  void FreeAppend(int32_t b) {
    Block& blk = blocks[b];
    blk.prev = free_tail;
    blk.next = kNone;
    blk.in_free = true;
    if (free_tail != kNone) {
      blocks[free_tail].next = b;
    } else {
      free_head = b;
    }
    free_tail = b;
    ++num_free;
  }

  void FreeRemove(int32_t b) {
    Block& blk = blocks[b];
    assert(blk.in_free);
    if (blk.prev != kNone) {
      blocks[blk.prev].next = blk.next;
    } else {
      free_head = blk.next;
    }
    if (blk.next != kNone) {
      blocks[blk.next].prev = blk.prev;
    } else {
      free_tail = blk.prev;
    }
    blk.prev = blk.next = kNone;
    blk.in_free = false;
    --num_free;
  }

  // Takes the LRU head for reuse; a cached block loses its hash (eviction).
  int32_t PopFree() {
    const int32_t b = free_head;
    assert(b != kNone);
    FreeRemove(b);
    Block& blk = blocks[b];
    if (blk.has_hash) {
      auto it = cache.find(blk.hash);
      if (it != cache.end() && it->second == b) cache.erase(it);
      if (config.record_kv_events) {
        KvEvent& e = events.emplace_back();
        e.kind = KvEventKind::kBlockRemoved;
        e.block_hashes.push_back(blk.hash);
      }
      blk.has_hash = false;
    }
    blk.ref = 1;
    return b;
  }

  // vLLM frees a request's blocks tail-first, so its chain's last block sits nearest
  // the LRU head and is evicted first, keeping the shareable prefix longest.
  void FreeRequestBlocks(Request* r) {
    for (auto it = r->blocks.rbegin(); it != r->blocks.rend(); ++it) {
      Block& blk = blocks[*it];
      assert(blk.ref > 0);
      if (--blk.ref == 0) FreeAppend(*it);
    }
    r->blocks.clear();
    r->registered = 0;
  }

  // Keeps the first floor(computed / block_size) blocks of finished `r` as a hold until
  // `expires_s`, frees the rest tail-first.
  void HoldRequestBlocks(Request* r, double expires_s) {
    const size_t keep = std::min(r->blocks.size(),
                                 static_cast<size_t>(r->computed / config.block_size));
    if (keep == 0) return FreeRequestBlocks(r);
    for (size_t i = r->blocks.size(); i-- > keep;) {
      Block& blk = blocks[r->blocks[i]];
      assert(blk.ref > 0);
      if (--blk.ref == 0) FreeAppend(r->blocks[i]);
    }
    r->blocks.resize(keep);
    // Ids are unique among live requests only: a new hold under an old one's id wins.
    if (auto old = holds.find(r->id); old != holds.end()) EndHold(old);
    Hold& h = holds[r->id];
    h.blocks.swap(r->blocks);
    h.expires_s = expires_s;
    held_blocks += static_cast<int>(h.blocks.size());
    r->blocks.clear();
    r->registered = 0;
  }

  std::unordered_map<uint64_t, Hold>::iterator EndHold(
      std::unordered_map<uint64_t, Hold>::iterator it) {
    const std::vector<int32_t>& held = it->second.blocks;
    for (auto b = held.rbegin(); b != held.rend(); ++b) {
      Block& blk = blocks[*b];
      assert(blk.ref > 0);
      if (--blk.ref == 0) FreeAppend(*b);
    }
    held_blocks -= static_cast<int>(held.size());
    return holds.erase(it);
  }

  int ExpireHolds(double now) {
    int n = 0;
    for (auto it = holds.begin(); it != holds.end();) {
      if (it->second.expires_s <= now) {
        it = EndHold(it);
        ++n;
      } else {
        ++it;
      }
    }
    stats.kv_holds_expired += n;
    return n;
  }

  // ---- prefix cache -------------------------------------------------------------------

  // Extends r->block_hashes to cover the first `n` full blocks of r->tokens.
  void EnsureHashes(Request* r, int n) {
    const int bs = config.block_size;
    for (int i = static_cast<int>(r->block_hashes.size()); i < n; ++i) {
      const uint64_t parent = i == 0 ? config.hash_seed : r->block_hashes[i - 1];
      std::span<const uint32_t> toks(r->tokens.data() + static_cast<size_t>(i) * bs, bs);
      r->block_hashes.push_back(BlockHash(parent, toks, i == 0 ? r->cache_salt : "",
                                          r->lora_name));
    }
  }

  // Collects into `hits` the cached blocks of r's longest cached prefix, capped so the
  // last token is always computed.
  void FindCachedPrefix(Request* r, std::vector<int32_t>* hits) {
    hits->clear();
    if (!config.enable_prefix_caching) return;
    const int max_blocks = (static_cast<int>(r->tokens.size()) - 1) / config.block_size;
    EnsureHashes(r, max_blocks);
    for (int i = 0; i < max_blocks; ++i) {
      auto it = cache.find(r->block_hashes[i]);
      if (it == cache.end()) break;
      hits->push_back(it->second);
    }
  }

  // Gives r (whose first r->computed tokens are covered by r->blocks plus `hits`) the
  // blocks for `num_new` more tokens, all or nothing. On success, takes the hits, and
  // offers every block that becomes full to the prefix cache (as vLLM does at allocation
  // time, so a request admitted later in the same step can already share them).
  bool AllocateSlots(Request* r, int num_new, std::span<const int32_t> hits) {
    const int bs = config.block_size;
    const int total = r->computed + num_new;
    const int needed = (total + bs - 1) / bs;
    const int have = static_cast<int>(r->blocks.size() + hits.size());
    const int to_alloc = std::max(0, needed - have);
    int evictable_hits = 0;
    for (int32_t b : hits) evictable_hits += blocks[b].ref == 0 ? 1 : 0;
    if (to_alloc + evictable_hits > num_free) return false;

    for (int32_t b : hits) {
      Block& blk = blocks[b];
      if (blk.ref == 0) FreeRemove(b);
      ++blk.ref;
      r->blocks.push_back(b);
    }
    // Hit blocks are cached already (only admission passes hits, with no blocks held).
    if (!hits.empty()) r->registered = static_cast<int>(r->blocks.size());
    for (int i = 0; i < to_alloc; ++i) r->blocks.push_back(PopFree());

    if (config.enable_prefix_caching) RegisterFullBlocks(r, total / bs);
    return true;
  }

  void RegisterFullBlocks(Request* r, int full) {
    if (full <= r->registered) return;
    EnsureHashes(r, full);
    KvEvent* ev = nullptr;
    for (int i = r->registered; i < full; ++i) {
      const uint64_t h = r->block_hashes[i];
      const int32_t b = r->blocks[i];
      // A block whose content is already cached elsewhere (two requests computed the
      // same prefix concurrently) stays unhashed: one owner per hash keeps the map flat.
      auto [it, inserted] = cache.try_emplace(h, b);
      if (!inserted) {
        ev = nullptr;  // a run of newly cached blocks ends here: the next starts a new event
        continue;
      }
      blocks[b].has_hash = true;
      blocks[b].hash = h;
      if (config.record_kv_events) {
        if (ev == nullptr) {
          ev = &events.emplace_back();
          ev->kind = KvEventKind::kBlockStored;
          if (i > 0) ev->parent_hash = r->block_hashes[i - 1];
          ev->block_size = config.block_size;
          ev->lora_name = r->lora_name;
        }
        ev->block_hashes.push_back(h);
        const auto first = r->tokens.begin() + static_cast<ptrdiff_t>(i) * config.block_size;
        ev->token_ids.insert(ev->token_ids.end(), first, first + config.block_size);
      }
    }
    r->registered = full;
  }

  // ---- queues --------------------------------------------------------------------------

  static bool Before(const Request* a, const Request* b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    if (a->arrival_s != b->arrival_s) return a->arrival_s < b->arrival_s;
    return a->id < b->id;
  }

  void EnqueueWaiting(Request* r, bool preempted) {
    r->running = false;
    if (config.priority_scheduling) {
      waiting.insert(std::upper_bound(waiting.begin(), waiting.end(), r, Before), r);
    } else if (preempted) {
      waiting.push_front(r);
    } else {
      waiting.push_back(r);
    }
  }

  // FCFS: the most recently admitted; priority: the least important, latest arrival.
  size_t PickVictim() const {
    if (!config.priority_scheduling) return running.size() - 1;
    size_t v = 0;
    for (size_t i = 1; i < running.size(); ++i) {
      const Request* a = running[i];
      const Request* b = running[v];
      if (a->priority > b->priority ||
          (a->priority == b->priority && a->arrival_s >= b->arrival_s)) {
        v = i;
      }
    }
    return v;
  }

  Request* NewRequest() {
    if (!spare.empty()) {
      Request* r = spare.back().release();
      spare.pop_back();
      return r;
    }
    return new Request();
  }

  void Release(Request* r) {
    live.erase(r->id);
    r->tokens.clear();
    r->block_hashes.clear();
    r->blocks.clear();
    spare.emplace_back(r);
  }

  // ---- LoRA ----------------------------------------------------------------------------

  bool StepHasLora(const std::string& name) const {
    for (const std::string* n : step_loras) {
      if (*n == name) return true;
    }
    return false;
  }

  void AddStepLora(const std::string& name) {
    if (!name.empty() && !StepHasLora(name)) step_loras.push_back(&name);
  }

  // Makes every adapter of this step's batch cached and most recently used; returns how
  // many had to be loaded. The victim of a full cache is the least recently used adapter
  // outside the batch (capacity >= max_loras leaves one, unless the running set already
  // exceeded max_loras, which admission prevents; then the cache grows past capacity
  // until the next eviction rather than unloading an adapter the batch uses).
  int LoadStepLoras() {
    int loads = 0;
    for (const std::string* name : step_loras) {
      ++lora_clock;
      auto it = std::find_if(lora_cache.begin(), lora_cache.end(),
                             [&](const CachedLora& c) { return c.name == *name; });
      if (it != lora_cache.end()) {
        it->last_used = lora_clock;
        continue;
      }
      ++loads;
      CachedLora* slot = nullptr;
      if (static_cast<int>(lora_cache.size()) >= config.lora.cache_capacity()) {
        for (CachedLora& c : lora_cache) {
          if (StepHasLora(c.name)) continue;
          if (slot == nullptr || c.last_used < slot->last_used) slot = &c;
        }
        if (slot != nullptr) ++stats.lora_evictions;
      }
      if (slot == nullptr) slot = &lora_cache.emplace_back();
      slot->name = *name;
      slot->last_used = lora_clock;
    }
    stats.lora_loads += loads;
    return loads;
  }

  // ---- the step ------------------------------------------------------------------------

  // One scheduler step at `now`: schedule running requests, admit waiting ones, "execute"
  // the batch and write what it produced into `out`. The pieces below are its steps, in
  // order; none allocates beyond what the step did before (the member scratch vectors).
  void Step(double now, StepResult* out) {
    BeginStep(out);
    const bool lora = config.lora.enabled;

    if (!holds.empty()) ExpireHolds(now);

    int budget = config.max_num_batched_tokens;
    const bool preempted_any = ScheduleRunning(budget, out);

    // The adapters the running requests bring into this step's batch.
    if (lora) {
      for (const Request* r : scheduled) AddStepLora(r->lora_name);
    }

    // Then waiting requests, unless this step had to preempt.
    if (!preempted_any) AdmitWaiting(now, budget);

    if (scheduled.empty()) return;

    ExecuteBatch(now, out);
    const double end = now + out->duration_s;

    if (EmitOutputs(end, out)) ReleaseFinished();
  }

  // Zeroes `out` (its outputs' capacity kept) and the step's scratch lists.
  void BeginStep(StepResult* out) {
    out->duration_s = 0.0;
    out->prefill_tokens = 0;
    out->decode_seqs = 0;
    out->num_scheduled = 0;
    out->resident_context_tokens = 0;
    out->num_preempted = 0;
    out->lora_loads = 0;
    out->outputs.clear();
    scheduled.clear();
    step_loras.clear();
  }

  // Running requests first, in admission order: each gets min(its remaining tokens,
  // `budget`) slots, preempting victims (PickVictim) until they fit; a request that is
  // itself the victim ends the pass. Takes the scheduled tokens from `budget`. Returns
  // whether anything was preempted.
  bool ScheduleRunning(int& budget, StepResult* out) {
    bool preempted_any = false;
    size_t i = 0;
    while (i < running.size() && budget > 0) {
      Request* r = running[i];
      const int num_new = std::min(static_cast<int>(r->tokens.size()) - r->computed, budget);
      assert(num_new > 0);
      bool ok = true;
      while (!AllocateSlots(r, num_new, {})) {
        const size_t v = PickVictim();
        Request* victim = running[v];
        running.erase(running.begin() + static_cast<ptrdiff_t>(v));
        if (victim->scheduled > 0) {
          // Only with priority scheduling can the victim be one already scheduled this
          // step; give its tokens back.
          budget += victim->scheduled;
          victim->scheduled = 0;
          scheduled.erase(std::find(scheduled.begin(), scheduled.end(), victim));
        }
        if (v < i) --i;
        Preempt(victim);
        preempted_any = true;
        ++out->num_preempted;
        if (victim == r) {
          ok = false;
          break;
        }
      }
      if (!ok) break;
      r->scheduled = num_new;
      scheduled.push_back(r);
      budget -= num_new;
      ++i;
    }
    return preempted_any;
  }

  // Admits waiting requests while `budget`, max_num_seqs and the KV cache allow. A decode
  // leg whose KV is still on its way, and a request whose adapter would exceed max_loras
  // distinct adapters in the batch, are skipped (j moves past them; they keep their
  // place); with none, j stays 0 and this is plain head-of-line FCFS / priority admission.
  void AdmitWaiting(double now, int& budget) {
    const bool lora = config.lora.enabled;
    size_t j = 0;
    while (j < waiting.size() && budget > 0 &&
           static_cast<int>(running.size()) < config.max_num_seqs) {
      Request* r = waiting[j];
      if (r->kv_load_tokens > 0 && r->kv_ready_s > now) {
        ++j;
        continue;
      }
      if (lora && !r->lora_name.empty() &&
          static_cast<int>(step_loras.size()) >= config.lora.max_loras &&
          !StepHasLora(r->lora_name)) {
        ++stats.lora_skips;
        ++j;
        continue;
      }
      assert(r->computed == 0 && r->blocks.empty());
      FindCachedPrefix(r, &hit_scratch);
      const int cached = static_cast<int>(hit_scratch.size()) * config.block_size;
      // Loaded tokens count as computed; the last token is always computed here.
      const int start = r->kv_load_tokens > 0
                            ? std::max(cached, std::min(r->kv_load_tokens,
                                                        static_cast<int>(r->tokens.size()) - 1))
                            : cached;
      const int num_new = std::min(static_cast<int>(r->tokens.size()) - start, budget);
      r->computed = start;
      if (!AllocateSlots(r, num_new, hit_scratch)) {
        r->computed = 0;
        break;  // head-of-line: a waiting request never preempts
      }
      if (config.enable_prefix_caching) {
        stats.prefix_queries_tokens += static_cast<int64_t>(r->tokens.size());
        stats.prefix_hits_tokens += cached;
      }
      r->cached_tokens = start;
      if (r->kv_load_tokens > 0) {
        r->kv_load_tokens = 0;  // a preempted decode leg recomputes
        --pending_loads;
      }
      r->kv_ready_s = 0.0;
      waiting.erase(waiting.begin() + static_cast<ptrdiff_t>(j));
      r->running = true;
      running.push_back(r);
      r->scheduled = num_new;
      scheduled.push_back(r);
      budget -= num_new;
      if (lora) AddStepLora(r->lora_name);
    }
  }

  // "Execute": accounts the batch into `out` (prefill tokens, decode sequences, resident
  // context, duration with the adapter loads), then advances every scheduled request.
  void ExecuteBatch(double now, StepResult* out) {
    for (Request* r : scheduled) {
      const bool decode = r->generated > 0 && r->scheduled == 1 &&
                          r->computed + 1 == static_cast<int>(r->tokens.size());
      if (decode) {
        ++out->decode_seqs;
      } else {
        out->prefill_tokens += r->scheduled;
      }
      out->resident_context_tokens += r->computed + r->scheduled;
      if (r->first_scheduled_s < 0) r->first_scheduled_s = now;
      r->computed += r->scheduled;
      r->scheduled = 0;
    }
    out->num_scheduled = static_cast<int>(scheduled.size());
    out->duration_s =
        config.step.StepSeconds(out->prefill_tokens, out->decode_seqs,
                                out->resident_context_tokens);
    if (config.lora.enabled && !step_loras.empty()) {
      out->lora_loads = LoadStepLoras();
      out->duration_s += out->lora_loads * config.lora.load_s;
    }
  }

  // One output per scheduled request, visible at `end`: a request whose whole context is
  // computed samples a token and may finish (its blocks freed, or held for a P/D decode
  // leg). Returns whether any finished.
  bool EmitOutputs(double end, StepResult* out) {
    bool any_finished = false;
    for (Request* r : scheduled) {
      RequestOutput& o = out->outputs.emplace_back();
      o.id = r->id;
      if (r->computed == static_cast<int>(r->tokens.size())) {
        // The whole context is computed: the model samples one token.
        r->tokens.push_back(OutputTokenId(r->id, r->generated));
        ++r->generated;
        ++stats.generation_tokens;
        o.new_tokens = 1;
        if (r->generated == 1) {
          o.first_token = true;
          r->first_token_s = end;
        }
        if (r->stop_at > 0 && r->generated >= r->stop_at) {
          o.reason = FinishReason::kStop;
        } else if (r->generated >= r->max_tokens) {
          o.reason = FinishReason::kLength;
        }
        if (o.reason != FinishReason::kNone) {
          o.finished = true;
          o.finish_s = end;
          r->finished = true;
          any_finished = true;
          ++(o.reason == FinishReason::kStop ? stats.finished_stop : stats.finished_length);
          if (o.reason == FinishReason::kLength && r->kv_hold_s > 0) {
            HoldRequestBlocks(r, end + r->kv_hold_s);
          } else {
            FreeRequestBlocks(r);
          }
        }
      }
      o.prompt_tokens = r->prompt_len;
      o.cached_tokens = r->cached_tokens;
      o.completion_tokens = r->generated;
      o.num_preemptions = r->preemptions;
      o.arrival_s = r->arrival_s;
      o.first_scheduled_s = r->first_scheduled_s;
      o.first_token_s = r->first_token_s;
    }
    return any_finished;
  }

  // Takes the finished requests out of `running` and recycles them.
  void ReleaseFinished() {
    running.erase(std::remove_if(running.begin(), running.end(),
                                 [](const Request* r) { return r->finished; }),
                  running.end());
    for (Request* r : scheduled) {
      if (r->finished) Release(r);
    }
  }

  // Recompute preemption: the request keeps its tokens (prompt and generated) and will
  // recompute them all; its blocks go back to the free list with their hashes, so on
  // resume it usually hits its own prefix.
  void Preempt(Request* r) {
    FreeRequestBlocks(r);
    r->computed = 0;
    ++r->preemptions;
    ++stats.preemptions;
    EnqueueWaiting(r, /*preempted=*/true);
  }

  EngineConfig config;
  std::vector<Block> blocks;
  int32_t free_head = kNone;
  int32_t free_tail = kNone;
  int num_free = 0;
  std::unordered_map<uint64_t, int32_t> cache;  // block hash -> block holding it

  std::unordered_map<uint64_t, Request*> live;  // id -> waiting or running request
  std::deque<Request*> waiting;
  std::vector<Request*> running;  // admission order
  std::vector<Request*> scheduled;
  std::vector<int32_t> hit_scratch;
  std::vector<std::unique_ptr<Request>> spare;  // recycled requests (keep capacity)
  std::vector<KvEvent> events;
  EngineStats stats;
  std::unordered_map<uint64_t, Hold> holds;  // P/D prefill legs' held blocks, by request id
  int held_blocks = 0;
  int pending_loads = 0;  // waiting requests with kv_load_tokens > 0

  // LoRA (config.lora.enabled).
  struct CachedLora {
    std::string name;
    uint64_t last_used = 0;  // lora_clock at the last step that scheduled it
  };
  std::vector<CachedLora> lora_cache;      // at most cache_capacity() entries
  uint64_t lora_clock = 0;
  std::vector<const std::string*> step_loras;  // distinct adapters of this step's batch
};

// ---------------------------------------------------------------------------------------

Engine::Engine(EngineConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}

Engine::~Engine() {
  if (!impl_) return;
  for (auto& [id, r] : impl_->live) delete r;
}

Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&& other) noexcept {
  if (this != &other) {
    if (impl_) {
      for (auto& [id, r] : impl_->live) delete r;
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}

std::optional<std::string> Engine::AddRequest(EngineRequest req) {
  Impl& m = *impl_;
  const EngineConfig& c = m.config;
  if (req.prompt_tokens.empty()) return "prompt is empty";
  if (req.max_tokens < 1) return "max_tokens must be at least 1";
  const int64_t prompt = static_cast<int64_t>(req.prompt_tokens.size());
  const int64_t total = prompt + req.max_tokens;
  if (total > c.max_model_len) {
    return "This model's maximum context length is " + std::to_string(c.max_model_len) +
           " tokens. However, you requested " + std::to_string(total) + " tokens (" +
           std::to_string(prompt) + " in the messages, " + std::to_string(req.max_tokens) +
           " in the completion).";
  }
  const int64_t blocks_needed = (total + c.block_size - 1) / c.block_size;
  if (blocks_needed > c.num_gpu_blocks - 1) {
    return "request needs " + std::to_string(blocks_needed) + " KV blocks but the cache has " +
           std::to_string(c.num_gpu_blocks - 1);
  }
  if (m.live.contains(req.id)) return "request id " + std::to_string(req.id) + " is live";
  if (req.kv_load_tokens < 0 || req.kv_load_tokens > prompt) {
    return "kv_load_tokens must be between 0 and the prompt length";
  }
  if (!std::isfinite(req.kv_ready_s) || !std::isfinite(req.kv_hold_s) || req.kv_hold_s < 0) {
    return "kv_ready_s and kv_hold_s must be finite, kv_hold_s >= 0";
  }

  Impl::Request* r = m.NewRequest();
  r->id = req.id;
  r->tokens = std::move(req.prompt_tokens);
  r->tokens.reserve(static_cast<size_t>(total));
  r->block_hashes.clear();
  r->blocks.clear();
  r->cache_salt = std::move(req.cache_salt);
  r->lora_name = std::move(req.lora_name);
  r->prompt_len = static_cast<int>(prompt);
  r->max_tokens = req.max_tokens;
  r->priority = req.priority;
  r->arrival_s = req.arrival_s;
  r->computed = 0;
  r->registered = 0;
  r->generated = 0;
  r->cached_tokens = 0;
  r->preemptions = 0;
  r->scheduled = 0;
  r->running = false;
  r->finished = false;
  r->first_scheduled_s = -1.0;
  r->first_token_s = 0.0;
  r->kv_hold_s = req.kv_hold_s;
  r->kv_load_tokens = req.kv_load_tokens;
  r->kv_ready_s = req.kv_load_tokens > 0 ? req.kv_ready_s : 0.0;
  if (r->kv_load_tokens > 0) ++m.pending_loads;

  int stop_at = 0;
  if (req.stop_after_tokens > 0) {
    stop_at = req.stop_after_tokens;
  } else if (c.fixed_output_tokens > 0) {
    stop_at = c.fixed_output_tokens;
  } else if (c.mean_output_tokens > 0) {
    // Exponential via inversion of a uniform drawn from (seed, id): deterministic per
    // request, independent of arrival order.
    const uint64_t bits = SplitMix64(c.output_seed ^ SplitMix64(req.id));
    const double u = (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
    stop_at = std::max(1, static_cast<int>(std::lround(-c.mean_output_tokens * std::log(u))));
  }
  r->stop_at = stop_at <= r->max_tokens ? stop_at : 0;

  m.live.emplace(r->id, r);
  m.stats.prompt_tokens += prompt;
  m.EnqueueWaiting(r, /*preempted=*/false);
  return std::nullopt;
}

bool Engine::Abort(uint64_t id) {
  Impl& m = *impl_;
  auto it = m.live.find(id);
  if (it == m.live.end()) return false;
  Impl::Request* r = it->second;
  if (r->running) {
    m.running.erase(std::find(m.running.begin(), m.running.end(), r));
  } else {
    m.waiting.erase(std::find(m.waiting.begin(), m.waiting.end(), r));
  }
  m.FreeRequestBlocks(r);
  if (r->kv_load_tokens > 0) --m.pending_loads;
  ++m.stats.finished_abort;
  m.Release(r);
  return true;
}

bool Engine::HasWork() const { return !impl_->running.empty() || !impl_->waiting.empty(); }

StepResult Engine::Step(double now_s) {
  StepResult out;
  impl_->Step(now_s, &out);
  return out;
}

void Engine::Step(double now_s, StepResult* out) { impl_->Step(now_s, out); }

EngineStats Engine::Stats() const {
  const Impl& m = *impl_;
  EngineStats s = m.stats;
  s.running = static_cast<int>(m.running.size());
  s.waiting = static_cast<int>(m.waiting.size());
  const int usable = m.config.num_gpu_blocks - 1;
  s.kv_cache_usage = 1.0 - static_cast<double>(m.num_free) / usable;
  s.num_free_blocks = m.num_free;
  s.num_cached_blocks = static_cast<int>(m.cache.size());
  s.kv_holds = static_cast<int>(m.holds.size());
  s.kv_held_blocks = m.held_blocks;
  s.waiting_for_remote_kvs = m.pending_loads;
  s.loras_cached = static_cast<int>(m.lora_cache.size());
  return s;
}

const EngineConfig& Engine::config() const { return impl_->config; }

int Engine::PeekCachedTokens(std::span<const uint32_t> tokens, std::string_view cache_salt,
                             std::string_view lora_name) const {
  const Impl& m = *impl_;
  if (!m.config.enable_prefix_caching || tokens.empty()) return 0;
  const int bs = m.config.block_size;
  const int max_blocks = (static_cast<int>(tokens.size()) - 1) / bs;
  uint64_t parent = m.config.hash_seed;
  for (int i = 0; i < max_blocks; ++i) {
    parent = BlockHash(parent, tokens.subspan(static_cast<size_t>(i) * bs, bs),
                       i == 0 ? cache_salt : std::string_view(), lora_name);
    if (!m.cache.contains(parent)) return i * bs;
  }
  return max_blocks * bs;
}

bool Engine::ResetPrefixCache() {
  Impl& m = *impl_;
  if (m.num_free != m.config.num_gpu_blocks - 1) return false;  // blocks in use
  m.cache.clear();
  for (Impl::Block& b : m.blocks) b.has_hash = false;
  // Requests that kept their hash chains (preempted, waiting) recompute against an empty
  // cache: their chains stay valid, only the lookup misses.
  if (m.config.record_kv_events) {
    KvEvent& e = m.events.emplace_back();
    e.kind = KvEventKind::kAllBlocksCleared;
  }
  return true;
}

std::span<const int32_t> Engine::HeldBlocks(uint64_t id) const {
  auto it = impl_->holds.find(id);
  if (it == impl_->holds.end()) return {};
  return it->second.blocks;
}

bool Engine::ReleaseHold(uint64_t id) {
  Impl& m = *impl_;
  auto it = m.holds.find(id);
  if (it == m.holds.end()) return false;
  m.EndHold(it);
  ++m.stats.kv_holds_released;
  return true;
}

int Engine::ExpireHolds(double now_s) {
  return impl_->holds.empty() ? 0 : impl_->ExpireHolds(now_s);
}

std::optional<double> Engine::NextHoldExpiryS() const {
  std::optional<double> next;
  for (const auto& [id, h] : impl_->holds) {
    if (!next || h.expires_s < *next) next = h.expires_s;
  }
  return next;
}

std::optional<double> Engine::NextKvReadyS() const {
  const Impl& m = *impl_;
  std::optional<double> next;
  if (m.pending_loads == 0) return next;
  for (const Impl::Request* r : m.waiting) {
    if (r->kv_load_tokens > 0 && (!next || r->kv_ready_s < *next)) next = r->kv_ready_s;
  }
  return next;
}

void Engine::LoraActivity(std::vector<std::string>* running,
                          std::vector<std::string>* waiting) const {
  const Impl& m = *impl_;
  auto collect = [](const auto& queue, std::vector<std::string>* out) {
    out->clear();
    for (const Impl::Request* r : queue) {
      if (r->lora_name.empty()) continue;
      if (std::find(out->begin(), out->end(), r->lora_name) == out->end()) {
        out->push_back(r->lora_name);
      }
    }
  };
  collect(m.running, running);
  collect(m.waiting, waiting);
}

bool Engine::LoraCached(std::string_view name) const {
  for (const auto& c : impl_->lora_cache) {
    if (c.name == name) return true;
  }
  return false;
}

bool Engine::EvictLora(std::string_view name) {
  auto& cache = impl_->lora_cache;
  auto it = std::find_if(cache.begin(), cache.end(),
                         [&](const auto& c) { return c.name == name; });
  if (it == cache.end()) return false;
  cache.erase(it);
  return true;
}

void Engine::DrainKvEvents(std::vector<KvEvent>* out) {
  auto& ev = impl_->events;
  out->insert(out->end(), std::make_move_iterator(ev.begin()),
              std::make_move_iterator(ev.end()));
  ev.clear();
}

}  // namespace kvroute::engine
