// A re-implementation of the SGLang model gateway's cache_aware policy from its public
// description (REFERENCE.md section 7): a character radix tree per model, each node tagged
// with the workers that were sent text through it, plus a load-balance override.
// The tree is private on purpose: it is part of the policy being compared, so this
// scheduler holds no PrefixModel and reads no CacheView (nor the KV-event index), unlike
// every other policy that scores cache overlap (cache_view.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/sched/scheduler_base.h"

namespace kvroute::sched {

// Character radix tree (compressed edges). Each node lists its tenants (workers) with the
// tick they last touched it; a worker tagged on a node is tagged on all its ancestors.
// Single-threaded.
class CharRadixTree {
 public:
  CharRadixTree();

  // Adds `text` under `worker`, stamping every node on its path with `tick`.
  void Insert(std::string_view text, uint32_t worker, uint64_t tick);

  // For each worker, how many leading characters of `text` the tree holds under it
  // (partial edge matches count). `match_by_worker` is resized to cover every worker seen
  // and zeroed first. Returns the longest match.
  size_t Match(std::string_view text, std::vector<uint32_t>& match_by_worker) const;

  // Characters held under `worker` (sum of the edge lengths of its nodes).
  size_t WorkerChars(uint32_t worker) const;

  // Removes `worker` from its least recently touched leaves (nodes where no child holds it)
  // until it holds at most `target_chars`. Nodes left without tenants are deleted.
  void EvictWorker(uint32_t worker, size_t target_chars);

  void RemoveWorker(uint32_t worker);
  size_t NodeCount() const { return nodes_.size() - free_.size(); }

 private:
  static constexpr uint32_t kNil = 0xffffffffu;
  struct Node {
    std::string edge;
    uint32_t parent = kNil;
    std::vector<uint32_t> children;
    std::vector<std::pair<uint32_t, uint64_t>> tenants;  // worker, last tick
  };
  uint32_t NewNode();
  uint32_t FindChild(uint32_t node, char c) const;
  void Touch(uint32_t node, uint32_t worker, uint64_t tick);
  bool HasTenant(uint32_t node, uint32_t worker) const;
  bool ChildHolds(uint32_t node, uint32_t worker) const;
  void DropTenant(uint32_t node, uint32_t worker);

  std::vector<Node> nodes_;  // nodes_[0] is the root (empty edge, never removed)
  std::vector<uint32_t> free_;
  std::vector<size_t> chars_;  // by worker
};

class SglangCacheAwareScheduler : public SchedulerBase {
 public:
  struct Config {
    // Defaults: the router launcher's (sgl-router/py_src/sglang_router/router_args.py,
    // docs/POLICIES.md), which is what a deployed router runs with.
    double cache_threshold = 0.3;        // route to the best match above this match ratio
    double balance_abs_threshold = 64;   // imbalance: max - min load above this ...
    double balance_rel_threshold = 1.5;  // ... and max above min times this
    size_t max_tree_size = size_t{1} << 26;  // characters per worker before eviction
    // Eviction runs once a worker exceeds max_tree_size and brings it down to this
    // fraction of it (amortises the tree walk eviction needs).
    double evict_to_fraction = 0.9;
  };
  SglangCacheAwareScheduler(const Config& config, const SchedulerOptions& options);

  std::string_view policy() const override { return "sglang-cache-aware"; }
  // Its radix trees and the router's in-flight counts: nothing from EndpointState::engine.
  uint32_t consumed_fields() const override { return 0; }
  // Scores reported: row "prefix-match" (matched characters / prompt characters).
  // The text is inserted under ranked[0] during Pick, as SGLang does at selection time.
  PickResult Pick(const SchedRequest& req, std::span<const EndpointState> endpoints,
                  double now_s) override;
  void OnEndpointRemoved(uint32_t endpoint_id) override;
  // Characters the worker holds in the radix trees, in 64-character blocks (rounded up),
  // comparable with the block indexes' counts.
  int64_t PrefixEntries(uint32_t endpoint_id) const override;

  // The tree of `model` (nullptr if none yet).
  const CharRadixTree* TreeFor(std::string_view model) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Takes the previous sglang-cache-aware scheduler's trees (any config).
  void AdoptPolicyState(SchedulerBase& previous) override;

  Config config_;
  std::unordered_map<std::string, CharRadixTree, StringHash, std::equal_to<>> trees_;
  uint64_t tick_ = 0;
  std::vector<uint32_t> match_;
  std::vector<double> keys_;
  std::vector<uint32_t> scratch_;
  std::vector<uint64_t> tiebreak_;
};

}  // namespace kvroute::sched
