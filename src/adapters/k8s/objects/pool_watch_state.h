// PoolWatchState: what kvroute knows about one InferencePool and the pods it selects, fed
// by the list and watch responses of the Kubernetes API, and the endpoint set that follows
// from it (REFERENCE.md 12). Pure: the adapter does the HTTP, decodes with objects.h, hands
// the results here, and calls RoutingCore::Configure when TakeEndpoints says the set moved.
//
// Two resources are followed, each with its own resourceVersion (where its next watch
// resumes) and its own "relist needed" flag:
//   pool  GET .../inferencepools/NAME, then a watch of it
//   pods  GET /api/v1/namespaces/NS/pods?labelSelector=PodLabelSelector(), then a watch
//
// The endpoint set: for every known pod that the pool's selector matches (matchLabels and
// matchExpressions: Matches below), that is Ready, has no deletionTimestamp and has an IP,
// one EndpointSpec per target port:
//   address "ip:port" ("[ip]:port" for IPv6), host ip, port,
//   name "<pod>:<port>" (or "<pod>" when the pool has one port), labels = the pod's labels.
// Ordered by pod name, then by the pool's port order. Two pods claiming the same IP (a pod
// replaced by one that reused its address before the old one's DELETED arrived) give one
// endpoint, the first pod's by name: the address is the routing core's identity.
// No pool (never seen, deleted or reported missing): no endpoints.
//
// Thread: not thread-safe; one owner (the discovery adapter's strand).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/common/status.h"
#include "adapters/k8s/objects/objects.h"
#include "core/routing/routing_core.h"

namespace kvroute::k8s {

class PoolWatchState {
 public:
  // `pool_name`: the InferencePool followed; events about other pools are ignored.
  explicit PoolWatchState(std::string pool_name);

  // ---- The pool.
  // The result of GET .../inferencepools/NAME. Replaces the pool; resumes its watch from
  // pool.meta.resource_version; clears the pool's relist flag. When the selector (its
  // labels or its expressions) differs from the previous pool's (or there was none), the
  // pods relist flag is set (the pods known were listed with the old selector) and pods
  // the new selector does not match leave the set at once.
  void ApplyPool(InferencePool pool);
  // GET answered 404, or the pool's watch said DELETED: no pool, no endpoints. The pool
  // must be fetched again (pool_relist_needed) until it exists. The pods known are
  // dropped too (they were selected by a pool that is gone; the pod watch should stop).
  void ApplyPoolMissing();
  // The result of a LIST of the pool collection by name (fieldSelector metadata.name):
  // `pool` is the item of that name, nullopt when the list had none. Present: as
  // ApplyPool. Absent: as ApplyPoolMissing, except that the pool is then not to be
  // fetched again: its watch resumes from `list_resource_version` and reports the pool's
  // creation as ADDED. Either way the pool's watch resumes from `list_resource_version`.
  void ApplyPoolList(std::optional<InferencePool> pool, std::string list_resource_version);
  // One pool watch event. ADDED/MODIFIED as ApplyPool (without touching the relist flag
  // unless the selector moved); DELETED as ApplyPoolMissing; BOOKMARK advances the
  // resourceVersion. ERROR: returns FailedPrecondition and sets pool_relist_needed when
  // 410 Gone, Unavailable otherwise (resume the watch from pool_resource_version()).
  // Events naming another pool are ignored (ok).
  Status ApplyPoolEvent(const PoolEvent& event);

  // ---- The pods.
  // A PodList: replaces every pod known, resumes the pod watch from its resourceVersion,
  // clears the pods relist flag.
  void ApplyPodList(const PodList& list);
  // One pod watch event. ADDED/MODIFIED insert or replace the pod (by name); DELETED
  // removes it (unknown: nothing happens); BOOKMARK only advances the resourceVersion.
  // ERROR: 410 Gone returns FailedPrecondition and sets pods_relist_needed; any other
  // ERROR returns Unavailable with the Status's code and message, state unchanged.
  Status ApplyPodEvent(const PodEvent& event);

  // ---- What the adapter reads.
  const std::string& pool_name() const { return pool_name_; }
  const std::optional<InferencePool>& pool() const { return pool_; }
  const std::string& pool_resource_version() const { return pool_rv_; }
  const std::string& pods_resource_version() const { return pods_rv_; }
  // Start (or restart) the resource with a fresh GET/list instead of a watch. True at
  // first (nothing listed yet), after a 410, and, for pods, after a selector change.
  bool pool_relist_needed() const { return pool_relist_; }
  bool pods_relist_needed() const { return pods_relist_; }
  // The pods list's labelSelector value, unescaped, in the API's selector syntax: "k=v"
  // per matchLabels entry in key order, then per expression in the pool's order
  // "k in (a,b)", "k notin (a,b)" (values sorted), "k" (Exists), "!k" (DoesNotExist); all
  // comma-joined: "app=vllm,zone in (a,b),!canary". "" when there is no pool (do not list
  // pods then). The adapter percent-encodes it.
  std::string PodLabelSelector() const;

  // The current endpoint set (see the header comment).
  const std::vector<routing::EndpointSpec>& endpoints() const { return endpoints_; }
  // Whether endpoints() differs from what TakeEndpoints last returned (true before the
  // first take, even when empty, so the first Configure happens).
  bool endpoints_changed() const { return changed_; }
  // A copy of endpoints(); clears endpoints_changed().
  std::vector<routing::EndpointSpec> TakeEndpoints();

  std::size_t pod_count() const { return pods_.size(); }

 private:
  void Recompute();
  bool Selected(const Pod& pod) const;

  std::string pool_name_;
  std::optional<InferencePool> pool_;
  std::map<std::string, Pod> pods_;  // by name: ordered, so the set comes out ordered
  std::string pool_rv_;
  std::string pods_rv_;
  bool pool_relist_ = true;
  bool pods_relist_ = true;
  std::vector<routing::EndpointSpec> endpoints_;
  bool changed_ = true;
};

// `labels` has every key of `selector` with the same value (matchLabels semantics).
// `labels` sorted by key, as ObjectMeta's are.
bool MatchesSelector(const Labels& selector, const Labels& labels);

// `labels` (sorted by key) satisfy `requirement` (see SelectorRequirement's operators).
bool Matches(const SelectorRequirement& requirement, const Labels& labels);

// The pool selects a pod with `labels` (sorted by key): MatchesSelector(pool.selector)
// and every requirement of pool.selector_expressions (Kubernetes ANDs them all).
bool Matches(const InferencePool& pool, const Labels& labels);

}  // namespace kvroute::k8s
