// ObjectiveWatchState: the InferenceObjectives of one namespace and one API group, as the
// list and watch responses of the Kubernetes API report them, and the priority table that
// follows from them for one InferencePool (REFERENCE.md 12). Pure: the adapter does the
// HTTP, decodes with objects.h, hands the results here, and republishes the priorities
// (merged with MergePriorities) when changed() says they moved.
//
// One state per API group followed (llm-d.ai and the older inference.networking.x-k8s.io
// are separate resources with separate resourceVersions); the adapter never mixes their
// events. Objectives are known by name (names are unique within a namespace).
//
// The priority table: name -> priority for every known objective whose poolRef names this
// state's pool, or that has no poolRef (it applies to whichever pool reads it). An
// objective without spec.priority is in the table with 0 (the API's default). Objectives
// that reference another pool are kept (a later MODIFIED may point them here) but are not
// in the table.
//
// Thread: not thread-safe; one owner (the discovery adapter's strand).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "core/common/status.h"
#include "adapters/k8s/objects/objects.h"

namespace kvroute::k8s {

// Objective name -> priority; the transparent comparator lets callers look up a
// string_view (the request's objective header) without a copy.
using ObjectivePriorities = std::map<std::string, int64_t, std::less<>>;

class ObjectiveWatchState {
 public:
  // `pool_name`: the InferencePool whose objectives make the priority table.
  explicit ObjectiveWatchState(std::string pool_name);

  // The result of GET .../inferenceobjectives: replaces every objective known, resumes the
  // watch from list.resource_version, clears the relist flag.
  void ApplyList(const ObjectiveList& list);
  // One watch event. ADDED/MODIFIED insert or replace the objective (by name); DELETED
  // removes it (unknown: nothing happens); either advances the resourceVersion to the
  // object's (when it has one). BOOKMARK only advances the resourceVersion. ERROR: 410
  // Gone returns FailedPrecondition and sets relist_needed; any other ERROR returns
  // Unavailable with the Status's code and message. An ERROR leaves the state unchanged
  // (apart from the relist flag).
  Status ApplyEvent(const ObjectiveEvent& event);
  // The list answered 404: the group's CRD is not installed. No objectives (the table
  // empties), no resourceVersion; relist_needed stays set so the adapter lists again
  // later (the CRD may be installed meanwhile).
  void ApplyMissing();

  const std::string& pool_name() const { return pool_name_; }
  // Where the next watch resumes; "" before the first list and after ApplyMissing.
  const std::string& resource_version() const { return rv_; }
  // List instead of watch: true at first, after a 410 and after ApplyMissing.
  bool relist_needed() const { return relist_; }
  std::size_t objective_count() const { return objectives_.size(); }

  // The priority table (see the header comment).
  const ObjectivePriorities& priorities() const { return priorities_; }
  // Whether priorities() differs from what TakePriorities last returned (true before the
  // first take, even when empty, so the first publication happens).
  bool changed() const { return changed_; }
  // A copy of priorities(); clears changed().
  ObjectivePriorities TakePriorities();

 private:
  void Recompute();

  std::string pool_name_;
  std::map<std::string, InferenceObjective, std::less<>> objectives_;  // by name
  std::string rv_;
  bool relist_ = true;
  ObjectivePriorities priorities_;
  bool changed_ = true;
};

// One table from the three sources, a later argument winning on the same name: the
// llm-d.ai objectives over the older group's, and both over the configured table (the
// router config's fallback when the cluster has no objectives).
ObjectivePriorities MergePriorities(const ObjectivePriorities& configured,
                                    const ObjectivePriorities& old_group,
                                    const ObjectivePriorities& llm_d);

}  // namespace kvroute::k8s
