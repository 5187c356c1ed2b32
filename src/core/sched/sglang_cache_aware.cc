#include "core/sched/sglang_cache_aware.h"

#include <algorithm>
#include <cstring>
#include <queue>

namespace kvroute::sched {

namespace {
// Length of the common prefix of a[0..n) and b[0..n), eight bytes at a time: long prompts
// (100k tokens = 400 KB) make the byte loop the policy's main cost.
size_t CommonPrefix(const char* a, const char* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    if (x != y) return i + static_cast<size_t>(__builtin_ctzll(x ^ y) / 8);
  }
  while (i < n && a[i] == b[i]) ++i;
  return i;
}
}  // namespace

// ---- CharRadixTree ----

CharRadixTree::CharRadixTree() { nodes_.emplace_back(); }

uint32_t CharRadixTree::NewNode() {
  if (!free_.empty()) {
    const uint32_t n = free_.back();
    free_.pop_back();
    return n;
  }
  nodes_.emplace_back();
  return static_cast<uint32_t>(nodes_.size() - 1);
}

uint32_t CharRadixTree::FindChild(uint32_t node, char c) const {
  for (uint32_t ch : nodes_[node].children) {
    if (nodes_[ch].edge[0] == c) return ch;
  }
  return kNil;
}

bool CharRadixTree::HasTenant(uint32_t node, uint32_t worker) const {
  for (const auto& t : nodes_[node].tenants) {
    if (t.first == worker) return true;
  }
  return false;
}

void CharRadixTree::Touch(uint32_t node, uint32_t worker, uint64_t tick) {
  for (auto& t : nodes_[node].tenants) {
    if (t.first == worker) {
      t.second = tick;
      return;
    }
  }
  nodes_[node].tenants.emplace_back(worker, tick);
  if (worker >= chars_.size()) chars_.resize(worker + 1, 0);
  chars_[worker] += nodes_[node].edge.size();
}

void CharRadixTree::Insert(std::string_view text, uint32_t worker, uint64_t tick) {
  uint32_t cur = 0;
  Touch(0, worker, tick);
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t child = FindChild(cur, text[pos]);
    if (child == kNil) {
      const uint32_t leaf = NewNode();
      Node& n = nodes_[leaf];
      n.edge.assign(text.substr(pos));
      n.parent = cur;
      n.children.clear();
      n.tenants.clear();
      nodes_[cur].children.push_back(leaf);
      Touch(leaf, worker, tick);
      return;
    }
    const std::string& edge = nodes_[child].edge;
    const size_t limit = std::min(edge.size(), text.size() - pos);
    const size_t common = CommonPrefix(edge.data(), text.data() + pos, limit);
    if (common < edge.size()) {
      // Split: a middle node takes the shared part and inherits the child's tenants (they
      // all hold that part); the child keeps the rest.
      const uint32_t mid = NewNode();
      Node& m = nodes_[mid];
      Node& c = nodes_[child];
      m.edge.assign(c.edge, 0, common);
      m.parent = cur;
      m.children.assign(1, child);
      m.tenants = c.tenants;
      c.edge.erase(0, common);
      c.parent = mid;
      std::replace(nodes_[cur].children.begin(), nodes_[cur].children.end(), child, mid);
      child = mid;
    }
    Touch(child, worker, tick);
    pos += common;
    cur = child;
  }
}

size_t CharRadixTree::Match(std::string_view text, std::vector<uint32_t>& match_by_worker) const {
  if (match_by_worker.size() < chars_.size()) match_by_worker.resize(chars_.size());
  std::fill(match_by_worker.begin(), match_by_worker.end(), 0u);
  uint32_t cur = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const uint32_t child = FindChild(cur, text[pos]);
    if (child == kNil) break;
    const std::string& edge = nodes_[child].edge;
    const size_t limit = std::min(edge.size(), text.size() - pos);
    const size_t common = CommonPrefix(edge.data(), text.data() + pos, limit);
    pos += common;
    // Tenants of a deeper node are tenants of every ancestor, so the last write wins.
    for (const auto& t : nodes_[child].tenants) match_by_worker[t.first] = static_cast<uint32_t>(pos);
    if (common < edge.size()) break;
    cur = child;
  }
  return pos;
}

size_t CharRadixTree::WorkerChars(uint32_t worker) const {
  return worker < chars_.size() ? chars_[worker] : 0;
}

bool CharRadixTree::ChildHolds(uint32_t node, uint32_t worker) const {
  for (uint32_t ch : nodes_[node].children) {
    if (HasTenant(ch, worker)) return true;
  }
  return false;
}

void CharRadixTree::DropTenant(uint32_t node, uint32_t worker) {
  auto& ts = nodes_[node].tenants;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].first == worker) {
      ts[i] = ts.back();
      ts.pop_back();
      chars_[worker] -= nodes_[node].edge.size();
      break;
    }
  }
  if (node != 0 && ts.empty() && nodes_[node].children.empty()) {
    auto& siblings = nodes_[nodes_[node].parent].children;
    siblings.erase(std::find(siblings.begin(), siblings.end(), node));
    Node& n = nodes_[node];
    n.edge.clear();
    n.parent = kNil;
    free_.push_back(node);
  }
}

void CharRadixTree::EvictWorker(uint32_t worker, size_t target_chars) {
  if (WorkerChars(worker) <= target_chars) return;
  using Item = std::pair<uint64_t, uint32_t>;  // tick, node
  std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
  auto tick_of = [&](uint32_t node) {
    for (const auto& t : nodes_[node].tenants) {
      if (t.first == worker) return t.second;
    }
    return uint64_t{0};
  };
  // Leaves for this worker: it holds the node but none of its children.
  for (uint32_t i = 1; i < nodes_.size(); ++i) {
    if (nodes_[i].parent == kNil) continue;  // free
    if (HasTenant(i, worker) && !ChildHolds(i, worker)) heap.emplace(tick_of(i), i);
  }
  while (WorkerChars(worker) > target_chars && !heap.empty()) {
    const uint32_t node = heap.top().second;
    heap.pop();
    const uint32_t parent = nodes_[node].parent;
    DropTenant(node, worker);
    if (parent != 0 && HasTenant(parent, worker) && !ChildHolds(parent, worker)) {
      heap.emplace(tick_of(parent), parent);
    }
  }
}

void CharRadixTree::RemoveWorker(uint32_t worker) {
  EvictWorker(worker, 0);
  // The root holds no characters; drop the tag too.
  auto& ts = nodes_[0].tenants;
  std::erase_if(ts, [&](const auto& t) { return t.first == worker; });
}

// ---- SglangCacheAwareScheduler ----

SglangCacheAwareScheduler::SglangCacheAwareScheduler(const Config& config,
                                                     const SchedulerOptions& options)
    : SchedulerBase(options, 0), config_(config) {
  scorer_names_.push_back("prefix-match");
  weights_.push_back(1.0);
  scorer_roles_.push_back(ScorerRole::kPrefix);
}

int64_t SglangCacheAwareScheduler::PrefixEntries(uint32_t endpoint_id) const {
  size_t chars = 0;
  for (const auto& [model, tree] : trees_) chars += tree.WorkerChars(endpoint_id);
  return static_cast<int64_t>((chars + 63) / 64);
}

void SglangCacheAwareScheduler::AdoptPolicyState(SchedulerBase& previous) {
  auto* prev = dynamic_cast<SglangCacheAwareScheduler*>(&previous);
  if (prev == nullptr) return;
  trees_ = std::move(prev->trees_);
  prev->trees_.clear();
  tick_ = prev->tick_;
}

const CharRadixTree* SglangCacheAwareScheduler::TreeFor(std::string_view model) const {
  auto it = trees_.find(model);
  return it == trees_.end() ? nullptr : &it->second;
}

PickResult SglangCacheAwareScheduler::Pick(const SchedRequest& req,
                                           std::span<const EndpointState> endpoints,
                                           double now_s) {
  if (!HealthyCandidates(endpoints)) return Fail(PickStatus::kNoHealthyEndpoint);
  PendingRequest& pending = NewRequest(req);
  const size_t n = candidates_.size();

  auto it = trees_.find(req.model);
  if (it == trees_.end()) it = trees_.emplace(std::string(req.model), CharRadixTree()).first;
  CharRadixTree& tree = it->second;

  double lo = 1e300, hi = -1e300;
  for (uint32_t pos : candidates_) {
    const double load = tracker_.InFlight(endpoints[pos].id);
    lo = std::min(lo, load);
    hi = std::max(hi, load);
  }
  uint32_t max_id = 0;
  for (uint32_t pos : candidates_) max_id = std::max(max_id, endpoints[pos].id);
  if (match_.size() <= max_id) match_.resize(max_id + 1);
  tree.Match(req.prompt, match_);
  const double len = static_cast<double>(req.prompt.size());
  scores_.resize(n);
  totals_.resize(n);
  for (size_t c = 0; c < n; ++c) {
    const double ratio = len > 0 ? match_[endpoints[candidates_[c]].id] / len : 0.0;
    scores_[c] = ratio;
    totals_[c] = ratio;
  }

  // Decide with a lexicographic key per candidate, larger is better; the shared max-score
  // ranking breaks exact ties at random.
  keys_.resize(n);
  const bool imbalanced =
      hi - lo > config_.balance_abs_threshold && hi > config_.balance_rel_threshold * lo;
  bool by_match = false;
  if (!imbalanced) {
    double best = 0;
    for (size_t c = 0; c < n; ++c) best = std::max(best, scores_[c]);
    by_match = best > config_.cache_threshold;
  }
  for (size_t c = 0; c < n; ++c) {
    const uint32_t id = endpoints[candidates_[c]].id;
    const double load = tracker_.InFlight(id);
    if (imbalanced) {
      keys_[c] = -load;
    } else if (by_match) {
      // Best match; among equal matches the less loaded.
      keys_[c] = scores_[c] * 1e9 - load;
    } else {
      // Smallest tree (most room for new text), then least loaded.
      keys_[c] = -static_cast<double>(tree.WorkerChars(id)) * 1e6 - load;
    }
  }
  RankByMaxScore(keys_, 1, rng_, scratch_, tiebreak_, order_);
  const uint32_t chosen = order_[0];
  // Fallbacks: the rest by load.
  if (options_.max_ranked != 1) {
    for (size_t c = 0; c < n; ++c) keys_[c] = -static_cast<double>(tracker_.InFlight(endpoints[candidates_[c]].id));
    keys_[chosen] = 1e300;
    RankByMaxScore(keys_, options_.max_ranked, rng_, scratch_, tiebreak_, order_);
  }

  const uint32_t chosen_id = endpoints[candidates_[chosen]].id;
  tree.Insert(req.prompt, chosen_id, ++tick_);
  if (tree.WorkerChars(chosen_id) > config_.max_tree_size) {
    tree.EvictWorker(chosen_id,
                     static_cast<size_t>(config_.max_tree_size * config_.evict_to_fraction));
  }
  return Finish(HandleOf(pending), endpoints, order_);
}

void SglangCacheAwareScheduler::OnEndpointRemoved(uint32_t endpoint_id) {
  for (auto& [model, tree] : trees_) tree.RemoveWorker(endpoint_id);
  tracker_.ResetEndpoint(endpoint_id);
}

}  // namespace kvroute::sched
