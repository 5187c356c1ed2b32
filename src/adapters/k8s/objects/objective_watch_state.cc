#include "adapters/k8s/objects/objective_watch_state.h"

#include <utility>

namespace kvroute::k8s {
namespace {

Status ObjectiveWatchError(const ApiStatus& status, bool& relist) {
  std::string m = "inferenceobjectives watch: ERROR ";
  m += std::to_string(status.code);
  if (!status.reason.empty()) m += " " + status.reason;
  if (!status.message.empty()) m += ": " + status.message;
  if (status.gone()) {
    relist = true;
    m += " (resourceVersion expired: relist)";
    return Status::FailedPrecondition(std::move(m));
  }
  return Status::Unavailable(std::move(m));
}

}  // namespace

ObjectiveWatchState::ObjectiveWatchState(std::string pool_name)
    : pool_name_(std::move(pool_name)) {}

void ObjectiveWatchState::ApplyList(const ObjectiveList& list) {
  objectives_.clear();
  for (const InferenceObjective& o : list.items) objectives_[o.meta.name] = o;
  rv_ = list.resource_version;
  relist_ = false;
  Recompute();
}

Status ObjectiveWatchState::ApplyEvent(const ObjectiveEvent& event) {
  const InferenceObjective& o = event.objective;
  switch (event.type) {
    case WatchEventType::kError:
      return ObjectiveWatchError(event.status, relist_);
    case WatchEventType::kBookmark:
      rv_ = o.meta.resource_version;
      return Status::Ok();
    case WatchEventType::kDeleted:
      objectives_.erase(o.meta.name);
      break;
    case WatchEventType::kAdded:
    case WatchEventType::kModified:
      objectives_[o.meta.name] = o;
      break;
  }
  // An object without a resourceVersion (a hand-written stand-in server) keeps the last.
  if (!o.meta.resource_version.empty()) rv_ = o.meta.resource_version;
  Recompute();
  return Status::Ok();
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
