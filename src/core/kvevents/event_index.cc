#include "core/kvevents/event_index.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>

namespace kvroute::kvevents {

namespace {

constexpr double kNoSpec = -std::numeric_limits<double>::infinity();
constexpr uint64_t kRootSeed = 0x6b76726f75746531ull;
constexpr size_t kDeadKept = 4096;

int MediumSlot(Medium m) {
  switch (m) {
    case Medium::kGpu: return 0;
    case Medium::kCpu: return 1;
    case Medium::kDisk:
    case Medium::kOther: break;
  }
  return 2;
}

uint64_t RootKey(std::string_view lora_name) {
  return XXH3_64bits_withSeed(lora_name.data(), lora_name.size(), kRootSeed);
}

uint64_t NextKey(uint64_t chain, const uint32_t* tokens, size_t n) {
  return XXH3_64bits_withSeed(tokens, n * sizeof(uint32_t), chain);
}

}  // namespace

std::string_view SourceStateName(SourceState s) {
  switch (s) {
    case SourceState::kOff: return "off";
    case SourceState::kUnknown: return "unknown";
    case SourceState::kLive: return "live";
    case SourceState::kStale: return "stale";
    case SourceState::kResync: return "resync";
    case SourceState::kMismatch: return "mismatch";
  }
  return "off";
}

struct EventIndex::Holder {
  uint32_t endpoint = 0;
  uint16_t count[3] = {0, 0, 0};  // engine blocks holding the key, by tier (GPU, CPU, disk)
  double spec_until = kNoSpec;
  bool empty() const { return count[0] == 0 && count[1] == 0 && count[2] == 0; }
};

namespace {
// One engine block of one endpoint: the router keys its tokens make, and how many
// physical copies of it the engine reported per tier.
struct BlockRef {
  uint64_t key = 0;            // first key
  std::vector<uint64_t> more;  // further keys when the engine block spans several of ours
  uint16_t refs[3] = {0, 0, 0};
  uint64_t last() const { return more.empty() ? key : more.back(); }
  bool held() const { return refs[0] != 0 || refs[1] != 0 || refs[2] != 0; }
  template <typename F>
  void ForEachKey(F&& f) const {
    f(key);
    for (uint64_t k : more) f(k);
  }
};
}  // namespace

struct EventIndex::Source {
  SourceState state = SourceState::kOff;     // the base state
  SourceState reported = SourceState::kOff;  // the last state a transition announced
  EndpointEventStats stats;
  std::unordered_map<uint64_t, BlockRef> blocks;  // engine hash -> keys
  std::deque<uint64_t> dead;  // engine hashes no longer held, kept to resolve parents
  double work_since = -1.0;   // first dispatch that must store blocks since the last batch
  double resync_until = 0.0;
};

EventIndex::EventIndex(IndexOptions options) : options_(options) {
  options_.block_tokens = std::max<int32_t>(1, options_.block_tokens);
}

EventIndex::~EventIndex() = default;

void EventIndex::SetOptions(const IndexOptions& options) {
  const int32_t old_tokens = options_.block_tokens;
  options_ = options;
  options_.block_tokens = std::max<int32_t>(1, options_.block_tokens);
  if (options_.block_tokens == old_tokens) return;
  for (uint32_t id = 0; id < sources_.size(); ++id) {
    Source* s = sources_[id].get();
    if (s == nullptr || s->state == SourceState::kOff) continue;
    Clear(*s, id);
    SetState(*s, id, SourceState::kUnknown, "block size of the index changed");
  }
  keys_.clear();
  spec_fifo_.clear();
}

void EventIndex::ChainKeys(std::string_view lora_name, std::span<const uint32_t> tokens,
                           int32_t block_tokens, size_t max_keys, std::vector<uint64_t>* out) {
  out->clear();
  if (block_tokens <= 0) return;
  const size_t bt = static_cast<size_t>(block_tokens);
  const size_t n = std::min(tokens.size() / bt, max_keys);
  out->reserve(n);
  uint64_t chain = RootKey(lora_name);
  for (size_t i = 0; i < n; ++i) {
    chain = NextKey(chain, tokens.data() + i * bt, bt);
    out->push_back(chain);
  }
}

void EventIndex::RequestKeys(std::string_view lora_name, std::span<const uint32_t> tokens,
                             std::vector<uint64_t>* out) const {
  ChainKeys(lora_name, tokens, options_.block_tokens, options_.max_request_keys, out);
}

EventIndex::Source* EventIndex::Find(uint32_t endpoint) {
  return endpoint < sources_.size() ? sources_[endpoint].get() : nullptr;
}
const EventIndex::Source* EventIndex::Find(uint32_t endpoint) const {
  return endpoint < sources_.size() ? sources_[endpoint].get() : nullptr;
}

void EventIndex::SetState(Source& s, uint32_t endpoint, SourceState to, std::string_view reason) {
  s.state = to;
  if (s.reported == to) return;
  transitions_.push_back({endpoint, s.reported, to, reason});
  s.reported = to;
}

void EventIndex::Expect(uint32_t endpoint, double now_s) {
  if (endpoint >= sources_.size()) sources_.resize(endpoint + 1);
  auto& slot = sources_[endpoint];
  if (slot == nullptr) slot = std::make_unique<Source>();
  if (slot->state != SourceState::kOff) return;
  ++expected_;
  slot->stats = EndpointEventStats{};
  SetState(*slot, endpoint, SourceState::kUnknown, "events configured");
}

void EventIndex::Forget(uint32_t endpoint) {
  Source* s = Find(endpoint);
  if (s == nullptr || s->state == SourceState::kOff) return;
  Clear(*s, endpoint);
  --expected_;
  SetState(*s, endpoint, SourceState::kOff, "events no longer configured");
  s->stats = EndpointEventStats{};
  s->work_since = -1.0;
}

void EventIndex::AddHolder(uint64_t key, uint32_t endpoint, Medium m) {
  std::vector<Holder>& hs = keys_[key];
  for (Holder& h : hs) {
    if (h.endpoint == endpoint) {
      ++h.count[MediumSlot(m)];
      return;
    }
  }
  Holder& h = hs.emplace_back();
  h.endpoint = endpoint;
  h.count[MediumSlot(m)] = 1;
}

void EventIndex::DropHolder(uint64_t key, uint32_t endpoint, Medium m) {
  auto it = keys_.find(key);
  if (it == keys_.end()) return;
  std::vector<Holder>& hs = it->second;
  for (size_t i = 0; i < hs.size(); ++i) {
    Holder& h = hs[i];
    if (h.endpoint != endpoint) continue;
    uint16_t& c = h.count[MediumSlot(m)];
    if (c > 0) --c;
    if (h.empty() && h.spec_until == kNoSpec) {
      hs[i] = hs.back();
      hs.pop_back();
      if (hs.empty()) keys_.erase(it);
    }
    return;
  }
}

void EventIndex::Clear(Source& s, uint32_t endpoint) {
  for (const auto& [hash, b] : s.blocks) {
    for (int t = 0; t < 3; ++t) {
      if (b.refs[t] == 0) continue;
      const Medium m = t == 0 ? Medium::kGpu : t == 1 ? Medium::kCpu : Medium::kDisk;
      b.ForEachKey([&](uint64_t k) { DropHolder(k, endpoint, m); });
    }
  }
  s.blocks.clear();
  s.dead.clear();
  s.stats.blocks = 0;
}

void EventIndex::ClearAll(Source& s, uint32_t endpoint, SourceState to, std::string_view reason,
                          double now_s) {
  Clear(s, endpoint);
  s.work_since = -1.0;
  if (to == SourceState::kResync) s.resync_until = now_s + options_.resync_s;
  SetState(s, endpoint, to, reason);
}

void EventIndex::ApplyStored(Source& s, uint32_t endpoint, const KvEvent& e, double now_s) {
  const int32_t bt = options_.block_tokens;
  if (e.block_hashes.empty()) return;
  const int slot = MediumSlot(e.medium);
  if (e.token_ids.empty()) {
    // A copy on another tier of blocks the engine already named (offloading connectors
    // send no tokens): the keys are those of the same engine hashes.
    for (uint64_t h : e.block_hashes) {
      auto it = s.blocks.find(h);
      if (it == s.blocks.end()) {
        ++s.stats.orphans;
        continue;
      }
      BlockRef& b = it->second;
      const bool was_held = b.held();
      if (b.refs[slot]++ == 0) b.ForEachKey([&](uint64_t k) { AddHolder(k, endpoint, e.medium); });
      if (!was_held) ++s.stats.blocks;
    }
    return;
  }
  if (e.block_size <= 0 || e.block_size % bt != 0) {
    ++s.stats.mismatches;
    s.stats.block_size = e.block_size;
    if (s.state != SourceState::kMismatch) {
      ClearAll(s, endpoint, SourceState::kMismatch, "engine block size is not a multiple of the index's",
               now_s);
    }
    return;
  }
  if (e.token_ids.size() != e.block_hashes.size() * static_cast<size_t>(e.block_size)) {
    ++s.stats.decode_errors;  // malformed: tokens do not cover the blocks
    return;
  }
  s.stats.block_size = e.block_size;
  if (s.state == SourceState::kMismatch) SetState(s, endpoint, SourceState::kLive, "engine block size fits");
  uint64_t chain = 0;
  if (e.parent_hash.has_value()) {
    auto it = s.blocks.find(*e.parent_hash);
    if (it == s.blocks.end()) {
      ++s.stats.orphans;  // a parent we never saw: the chain cannot be keyed
      return;
    }
    chain = it->second.last();
  } else {
    chain = RootKey(e.lora_name);
  }
  const size_t per = static_cast<size_t>(e.block_size / bt);
  for (size_t j = 0; j < e.block_hashes.size(); ++j) {
    const uint32_t* toks = e.token_ids.data() + j * static_cast<size_t>(e.block_size);
    auto [it, inserted] = s.blocks.try_emplace(e.block_hashes[j]);
    BlockRef& b = it->second;
    if (inserted || !b.held()) {
      // (Re)key the block from its tokens: a block no longer held may come back under the
      // same engine hash after a restart with another content.
      b.more.clear();
      uint64_t k = chain;
      for (size_t q = 0; q < per; ++q) {
        k = NextKey(k, toks + q * static_cast<size_t>(bt), static_cast<size_t>(bt));
        if (q == 0) {
          b.key = k;
        } else {
          b.more.push_back(k);
        }
      }
    }
    const bool was_held = b.held();
    if (b.refs[slot]++ == 0) b.ForEachKey([&](uint64_t k) { AddHolder(k, endpoint, e.medium); });
    if (!was_held) ++s.stats.blocks;
    chain = b.last();
  }
  if (s.blocks.size() > options_.max_blocks_per_endpoint) {
    ++s.stats.overflows;
    ClearAll(s, endpoint, SourceState::kResync, "more blocks than the index's bound", now_s);
  }
}

void EventIndex::ApplyRemoved(Source& s, uint32_t endpoint, const KvEvent& e) {
  const int slot = MediumSlot(e.medium);
  for (uint64_t h : e.block_hashes) {
    auto it = s.blocks.find(h);
    if (it == s.blocks.end()) continue;
    BlockRef& b = it->second;
    if (b.refs[slot] == 0) continue;
    if (--b.refs[slot] == 0) b.ForEachKey([&](uint64_t k) { DropHolder(k, endpoint, e.medium); });
    if (b.held()) continue;
    --s.stats.blocks;
    s.dead.push_back(h);
    if (s.dead.size() > kDeadKept) {
      auto old = s.blocks.find(s.dead.front());
      if (old != s.blocks.end() && !old->second.held()) s.blocks.erase(old);
      s.dead.pop_front();
    }
  }
}

void EventIndex::ApplyBatch(uint32_t endpoint, const KvEventBatch& batch, double now_s) {
  Source* s = Find(endpoint);
  if (s == nullptr || s->state == SourceState::kOff) return;
  ++s->stats.batches;
  s->stats.last_batch_s = now_s;
  s->work_since = -1.0;
  if (s->state == SourceState::kUnknown || s->state == SourceState::kStale ||
      s->reported == SourceState::kStale) {
    SetState(*s, endpoint, SourceState::kLive, "events arrive");
  }
  for (const KvEvent& e : batch.events) {
    switch (e.kind) {
      case EventKind::kBlockStored:
        ++s->stats.stored;
        ApplyStored(*s, endpoint, e, now_s);
        break;
      case EventKind::kBlockRemoved:
        ++s->stats.removed;
        ApplyRemoved(*s, endpoint, e);
        break;
      case EventKind::kAllBlocksCleared:
        ++s->stats.cleared;
        Clear(*s, endpoint);
        break;
    }
  }
}

void EventIndex::OnGap(uint32_t endpoint, bool repaired, double now_s) {
  Source* s = Find(endpoint);
  if (s == nullptr || s->state == SourceState::kOff) return;
  ++s->stats.gaps;
  if (repaired) return;
  ++s->stats.gaps_unrepaired;
  ClearAll(*s, endpoint, SourceState::kResync, "gap in the events that replay did not fill", now_s);
}

void EventIndex::OnRestart(uint32_t endpoint, double now_s) {
  Source* s = Find(endpoint);
  if (s == nullptr || s->state == SourceState::kOff) return;
  ++s->stats.restarts;
  // The engine's cache restarted empty: an empty index is exactly right again.
  ClearAll(*s, endpoint, SourceState::kLive, "publisher restarted", now_s);
}

void EventIndex::OnDecodeError(uint32_t endpoint, double now_s) {
  Source* s = Find(endpoint);
  if (s == nullptr || s->state == SourceState::kOff) return;
  ++s->stats.decode_errors;
  ClearAll(*s, endpoint, SourceState::kResync, "a batch could not be decoded", now_s);
}

void EventIndex::OnWorkDispatched(uint32_t endpoint, double now_s) {
  Source* s = Find(endpoint);
  if (s == nullptr || s->state != SourceState::kLive || s->work_since >= 0) return;
  s->work_since = now_s;
}

void EventIndex::AddSpeculative(uint32_t endpoint, std::span<const uint64_t> keys, double now_s) {
  const Source* s = Find(endpoint);
  if (s == nullptr || s->state == SourceState::kOff || options_.speculative_ttl_s <= 0) return;
  const double until = now_s + options_.speculative_ttl_s;
  for (uint64_t key : keys) {
    std::vector<Holder>& hs = keys_[key];
    Holder* h = nullptr;
    for (Holder& x : hs) {
      if (x.endpoint == endpoint) h = &x;
    }
    if (h == nullptr) {
      h = &hs.emplace_back();
      h->endpoint = endpoint;
    }
    h->spec_until = until;
    spec_fifo_.push_back({until, endpoint, key});
  }
  // Bounded: the oldest entries end early.
  while (spec_fifo_.size() > options_.max_speculative) {
    const SpecEntry e = spec_fifo_.front();
    spec_fifo_.pop_front();
    EndSpeculative(e, e.until);
  }
}

void EventIndex::EndSpeculative(const SpecEntry& e, double cutoff) {
  auto it = keys_.find(e.key);
  if (it == keys_.end()) return;
  auto& hs = it->second;
  for (size_t i = 0; i < hs.size(); ++i) {
    // A later AddSpeculative extended it: its own entry ends it.
    if (hs[i].endpoint != e.endpoint || hs[i].spec_until > cutoff) continue;
    hs[i].spec_until = kNoSpec;
    if (hs[i].empty()) {
      hs[i] = hs.back();
      hs.pop_back();
      if (hs.empty()) keys_.erase(it);
    }
    return;
  }
}

void EventIndex::Tick(double now_s) {
  while (!spec_fifo_.empty() && spec_fifo_.front().until <= now_s) {
    const SpecEntry e = spec_fifo_.front();
    spec_fifo_.pop_front();
    EndSpeculative(e, now_s);
  }
  for (uint32_t id = 0; id < sources_.size(); ++id) {
    Source* s = sources_[id].get();
    if (s == nullptr || s->state == SourceState::kOff) continue;
    if (s->state == SourceState::kResync && now_s >= s->resync_until) {
      SetState(*s, id, SourceState::kLive, "resync period over");
    }
    const SourceState eff = Effective(*s, now_s, options_);
    if (eff != s->reported) {
      transitions_.push_back({id, s->reported, eff,
                              eff == SourceState::kStale ? "no events since work was dispatched"
                                                         : "events arrive"});
      s->reported = eff;
    }
  }
}

SourceState EventIndex::Effective(const Source& s, double now_s, const IndexOptions& o) {
  switch (s.state) {
    case SourceState::kResync:
      return now_s >= s.resync_until ? SourceState::kLive : SourceState::kResync;
    case SourceState::kLive:
      if (s.work_since >= 0 && now_s - s.work_since > o.stale_after_s) return SourceState::kStale;
      return SourceState::kLive;
    default:
      return s.state;
  }
}

SourceState EventIndex::State(uint32_t endpoint, double now_s) const {
  const Source* s = Find(endpoint);
  return s == nullptr ? SourceState::kOff : Effective(*s, now_s, options_);
}

double EventIndex::Weight(const Holder& h, double now_s, const TierWeights& w) {
  double best = 0.0;
  if (h.count[0] > 0) best = w.gpu;
  else if (h.count[1] > 0) best = w.cpu;
  else if (h.count[2] > 0) best = w.disk;
  if (h.spec_until > now_s) best = std::max(best, w.speculative);
  return best;
}

void EventIndex::Match(std::span<const uint64_t> keys, double now_s, std::vector<double>& weighted,
                       std::vector<uint32_t>& run) const {
  Match(keys, now_s, OwnTiers(), weighted, run);
}

void EventIndex::Match(std::span<const uint64_t> keys, double now_s, const TierWeights& tiers,
                       std::vector<double>& weighted, std::vector<uint32_t>& run) const {
  const size_t n = sources_.size();
  if (weighted.size() < n) weighted.resize(n);
  if (run.size() < n) run.resize(n);
  std::fill(weighted.begin(), weighted.end(), 0.0);
  std::fill(run.begin(), run.end(), 0u);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = keys_.find(keys[i]);
    if (it == keys_.end()) return;
    bool any = false;
    for (const Holder& h : it->second) {
      if (h.endpoint >= n || run[h.endpoint] != i) continue;
      const double w = Weight(h, now_s, tiers);
      if (w <= 0) continue;
      run[h.endpoint] = static_cast<uint32_t>(i + 1);
      weighted[h.endpoint] += w;
      any = true;
    }
    if (!any) return;
  }
}

uint32_t EventIndex::MatchOne(std::span<const uint64_t> keys, uint32_t endpoint, double now_s,
                              double* weighted) const {
  double sum = 0.0;
  uint32_t i = 0;
  for (; i < keys.size(); ++i) {
    auto it = keys_.find(keys[i]);
    if (it == keys_.end()) break;
    double w = 0.0;
    for (const Holder& h : it->second) {
      if (h.endpoint == endpoint) w = Weight(h, now_s, OwnTiers());
    }
    if (w <= 0) break;
    sum += w;
  }
  if (weighted != nullptr) *weighted = sum;
  return i;
}

EndpointEventStats EventIndex::Stats(uint32_t endpoint, double now_s) const {
  const Source* s = Find(endpoint);
  if (s == nullptr) return {};
  EndpointEventStats st = s->stats;
  st.state = Effective(*s, now_s, options_);
  return st;
}

size_t EventIndex::TotalBlocks() const {
  size_t n = 0;
  for (const auto& s : sources_) {
    if (s) n += s->stats.blocks;
  }
  return n;
}

void EventIndex::DrainTransitions(std::vector<StateTransition>* out) {
  out->insert(out->end(), transitions_.begin(), transitions_.end());
  transitions_.clear();
}

}  // namespace kvroute::kvevents
