#include "adapters/k8s/objects/pool_watch_state.h"

#include <algorithm>
#include <set>
#include <utility>

namespace kvroute::k8s {
namespace {

bool SameEndpoint(const routing::EndpointSpec& a, const routing::EndpointSpec& b) {
  return a.address == b.address && a.name == b.name && a.host == b.host && a.port == b.port &&
         a.labels == b.labels;
}

bool SameSet(const std::vector<routing::EndpointSpec>& a,
             const std::vector<routing::EndpointSpec>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), SameEndpoint);
}

// The value of `key` in `labels` (sorted by key), or nullptr when the key is absent.
const std::string* FindLabel(const Labels& labels, const std::string& key) {
  const auto it = std::lower_bound(
      labels.begin(), labels.end(), key,
      [](const std::pair<std::string, std::string>& l, const std::string& k) {
        return l.first < k;
      });
  if (it == labels.end() || it->first != key) return nullptr;
  return &it->second;
}

}  // namespace

bool MatchesSelector(const Labels& selector, const Labels& labels) {
  for (const auto& [key, value] : selector) {
    const std::string* found = FindLabel(labels, key);
    if (found == nullptr || *found != value) return false;
  }
  return true;
}

bool Matches(const SelectorRequirement& requirement, const Labels& labels) {
  const std::string* found = FindLabel(labels, requirement.key);
  // A linear scan, not a binary search: the lists are a handful long, and a hand-built
  // requirement with unsorted values still matches right.
  const auto in_values = [&] {
    return std::find(requirement.values.begin(), requirement.values.end(), *found) !=
           requirement.values.end();
  };
  switch (requirement.op) {
    case SelectorRequirement::Op::kIn: return found != nullptr && in_values();
    case SelectorRequirement::Op::kNotIn: return found == nullptr || !in_values();
    case SelectorRequirement::Op::kExists: return found != nullptr;
    case SelectorRequirement::Op::kDoesNotExist: return found == nullptr;
  }
  return false;
}

bool Matches(const InferencePool& pool, const Labels& labels) {
  if (!MatchesSelector(pool.selector, labels)) return false;
  for (const SelectorRequirement& r : pool.selector_expressions) {
    if (!Matches(r, labels)) return false;
  }
  return true;
}

PoolWatchState::PoolWatchState(std::string pool_name) : pool_name_(std::move(pool_name)) {}

void PoolWatchState::ApplyPool(InferencePool pool) {
  if (!pool_ || pool_->selector != pool.selector ||
      pool_->selector_expressions != pool.selector_expressions) {
    pods_relist_ = true;
  }
  pool_rv_ = pool.meta.resource_version;
  pool_ = std::move(pool);
  pool_relist_ = false;
  Recompute();
}

void PoolWatchState::ApplyPoolMissing() {
  pool_.reset();
  pool_rv_.clear();
  pool_relist_ = true;
  pods_.clear();
  pods_rv_.clear();
  pods_relist_ = true;
  Recompute();
}

void PoolWatchState::ApplyPoolList(std::optional<InferencePool> pool, std::string list_resource_version) {
  if (pool) {
    ApplyPool(std::move(*pool));
  } else {
    ApplyPoolMissing();
  }
  pool_rv_ = std::move(list_resource_version);
  pool_relist_ = false;
}

Status PoolWatchState::ApplyPoolEvent(const PoolEvent& event) {
  switch (event.type) {
    case WatchEventType::kError:
      return WatchErrorStatus("inferencepool", event.status, pool_relist_);
    case WatchEventType::kBookmark:
      pool_rv_ = event.pool.meta.resource_version;
      return Status::Ok();
    default:
      break;
  }
  if (event.pool.meta.name != pool_name_) return Status::Ok();
  if (event.type == WatchEventType::kDeleted) {
    ApplyPoolMissing();
    return Status::Ok();
  }
  const bool relist = pool_relist_;
  ApplyPool(event.pool);
  pool_relist_ = relist;
  return Status::Ok();
}

void PoolWatchState::ApplyPodList(const PodList& list) {
  ApplyWatchList(list, pods_, pods_rv_, pods_relist_);
  Recompute();
}

Status PoolWatchState::ApplyPodEvent(const PodEvent& event) {
  bool changed = false;
  Status s = ApplyWatchEvent("pods", event.type, event.status, event.pod, pods_, pods_rv_,
                             pods_relist_, changed);
  if (changed) Recompute();
  return s;
}

std::string PoolWatchState::PodLabelSelector() const {
  std::string out;
  if (!pool_) return out;
  for (const auto& [key, value] : pool_->selector) {
    if (!out.empty()) out += ',';
    out += key;
    out += '=';
    out += value;
  }
  for (const SelectorRequirement& r : pool_->selector_expressions) {
    if (!out.empty()) out += ',';
    switch (r.op) {
      case SelectorRequirement::Op::kIn:
      case SelectorRequirement::Op::kNotIn:
        out += r.key;
        out += r.op == SelectorRequirement::Op::kIn ? " in (" : " notin (";
        for (std::size_t i = 0; i < r.values.size(); ++i) {
          if (i > 0) out += ',';
          out += r.values[i];
        }
        out += ')';
        break;
      case SelectorRequirement::Op::kExists:
        out += r.key;
        break;
      case SelectorRequirement::Op::kDoesNotExist:
        out += '!';
        out += r.key;
        break;
    }
  }
  return out;
}

std::vector<routing::EndpointSpec> PoolWatchState::TakeEndpoints() {
  changed_ = false;
  return endpoints_;
}

bool PoolWatchState::Selected(const Pod& pod) const {
  return pod.ready && !pod.meta.being_deleted && !pod.ip.empty() &&
         Matches(*pool_, pod.meta.labels);
}

void PoolWatchState::Recompute() {
  std::vector<routing::EndpointSpec> next;
  if (pool_) {
    std::set<std::string> addresses;
    const bool one_port = pool_->target_ports.size() == 1;
    for (const auto& [name, pod] : pods_) {
      if (!Selected(pod)) continue;
      const bool v6 = pod.ip.find(':') != std::string::npos;
      for (uint16_t port : pool_->target_ports) {
        // A pod that names its active ports (data-parallel ranks) serves those only.
        if (pod.active_ports &&
            std::find(pod.active_ports->begin(), pod.active_ports->end(), port) == pod.active_ports->end()) {
          continue;
        }
        routing::EndpointSpec e;
        e.address = v6 ? "[" + pod.ip + "]:" : pod.ip + ":";
        e.address += std::to_string(port);
        if (!addresses.insert(e.address).second) continue;
        e.name = one_port ? name : name + ":" + std::to_string(port);
        e.host = pod.ip;
        e.port = port;
        e.labels = pod.meta.labels;
        next.push_back(std::move(e));
      }
    }
  }
  if (!SameSet(next, endpoints_)) {
    endpoints_ = std::move(next);
    changed_ = true;
  }
}

}  // namespace kvroute::k8s
