#include "adapters/k8s/objects/objective_watch_state.h"

#include <utility>

namespace kvroute::k8s {

ObjectiveWatchState::ObjectiveWatchState(std::string pool_name)
    : pool_name_(std::move(pool_name)) {}

void ObjectiveWatchState::ApplyList(const ObjectiveList& list) {
  ApplyWatchList(list, objectives_, rv_, relist_);
  Recompute();
}

Status ObjectiveWatchState::ApplyEvent(const ObjectiveEvent& event) {
  bool changed = false;
  Status s = ApplyWatchEvent("inferenceobjectives", event.type, event.status, event.objective,
                             objectives_, rv_, relist_, changed);
  if (changed) Recompute();
  return s;
}

void ObjectiveWatchState::ApplyMissing() {
  objectives_.clear();
  rv_.clear();
  relist_ = true;
  Recompute();
}

ObjectivePriorities ObjectiveWatchState::TakePriorities() {
  changed_ = false;
  return priorities_;
}

void ObjectiveWatchState::Recompute() {
  ObjectivePriorities next;
  for (const auto& [name, o] : objectives_) {
    if (o.pool_ref_name.empty() || o.pool_ref_name == pool_name_) next.emplace(name, o.priority);
  }
  if (next != priorities_) {
    priorities_ = std::move(next);
    changed_ = true;
  }
}

ObjectivePriorities MergePriorities(const ObjectivePriorities& configured,
                                    const ObjectivePriorities& old_group,
                                    const ObjectivePriorities& llm_d) {
  ObjectivePriorities out = configured;
  for (const auto& [name, priority] : old_group) out.insert_or_assign(name, priority);
  for (const auto& [name, priority] : llm_d) out.insert_or_assign(name, priority);
  return out;
}

}  // namespace kvroute::k8s
