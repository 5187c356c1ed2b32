// Fuzz target: one line of a Kubernetes watch response through DecodePodEvent,
// DecodePoolEvent and DecodeObjectiveEvent, the same bytes as a PodList, an
// InferencePoolList, an InferenceObjectiveList and one InferenceObjective, and what decodes into a PoolWatchState
// or an ObjectiveWatchState (issue 9). The bytes come from the API server, or whatever
// sits between it and us.
//
// Invariants: an error is InvalidArgument with a message; a decoded event meets the
// decoder's contract (labels and selectors sorted with unique keys, a pool with at least
// one port, all nonzero and distinct, a non-empty selector whose expressions have a key
// and values as their operator needs, a bookmark with a resourceVersion, an objective's
// priority within int32 and 0 when absent); applying it to a state holding a pool and
// pods yields endpoints with unique addresses, each on one of the pool's ports and a
// Ready, not-deleting, selected pod's IP; applying an objective event or list yields a
// priority table of exactly the objectives that reference the state's pool (or none).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>

#include "adapters/k8s/objects/objective_watch_state.h"
#include "adapters/k8s/objects/objects.h"
#include "adapters/k8s/objects/pool_watch_state.h"
#include "fuzz_check.h"

namespace {

using namespace kvroute;
using fuzz::Check;

void CheckLabels(const k8s::Labels& labels) {
  for (std::size_t i = 1; i < labels.size(); ++i) {
    Check(labels[i - 1].first < labels[i].first, "labels not sorted by unique key");
  }
}

void CheckError(const Status& s) {
  Check(!s.ok(), "error Result with an ok status");
  Check(s.code() == StatusCode::kInvalidArgument, "decode error is not InvalidArgument");
  Check(!s.message().empty(), "decode error without a message");
}

void CheckPool(const k8s::InferencePool& pool) {
  Check(!pool.meta.name.empty(), "pool without a name");
  Check(!pool.selector.empty() || !pool.selector_expressions.empty(),
        "pool with an empty selector");
  CheckLabels(pool.selector);
  for (const k8s::SelectorRequirement& r : pool.selector_expressions) {
    Check(!r.key.empty(), "selector expression without a key");
    for (std::size_t i = 1; i < r.values.size(); ++i) {
      Check(r.values[i - 1] < r.values[i], "expression values not sorted and unique");
    }
    const bool wants_values = r.op == k8s::SelectorRequirement::Op::kIn ||
                              r.op == k8s::SelectorRequirement::Op::kNotIn;
    Check(wants_values == !r.values.empty(), "expression values do not fit its operator");
  }
  Check(pool.api_version == k8s::PoolApiVersion::kV1 || pool.selector_expressions.empty(),
        "v1alpha2 pool with expressions");
  CheckLabels(pool.meta.labels);
  Check(!pool.target_ports.empty(), "pool without a target port");
  std::set<uint16_t> seen;
  for (uint16_t p : pool.target_ports) {
    Check(p != 0, "target port 0");
    Check(seen.insert(p).second, "repeated target port");
  }
}

void CheckEndpoints(const k8s::PoolWatchState& state) {
  std::set<std::string> addresses;
  for (const routing::EndpointSpec& e : state.endpoints()) {
    Check(addresses.insert(e.address).second, "two endpoints share an address");
    Check(state.pool().has_value(), "endpoints without a pool");
    const auto& ports = state.pool()->target_ports;
    Check(std::find(ports.begin(), ports.end(), e.port) != ports.end(),
          "endpoint on a port the pool does not name");
    Check(!e.host.empty() && !e.name.empty(), "endpoint without a host or name");
    Check(k8s::Matches(*state.pool(), e.labels), "endpoint of a pod the selector rejects");
  }
}

void CheckObjective(const k8s::InferenceObjective& o) {
  Check(!o.meta.name.empty(), "objective without a name");
  CheckLabels(o.meta.labels);
  Check(o.priority >= std::numeric_limits<int32_t>::min() &&
            o.priority <= std::numeric_limits<int32_t>::max(),
        "priority outside int32");
  Check(o.has_priority || o.priority == 0, "absent priority is not 0");
  Check(o.pool_ref_group.empty() || !o.pool_ref_name.empty(), "poolRef group without a name");
}

bool ForPool(const k8s::InferenceObjective& o) {
  return o.pool_ref_name.empty() || o.pool_ref_name == "pool";
}

// Pool "pool", listed: a (1, this pool), b (2, another pool), c (3, no poolRef).
k8s::ObjectiveWatchState SeededObjectives() {
  k8s::ObjectiveWatchState state("pool");
  k8s::ObjectiveList list;
  list.resource_version = "1";
  for (const auto& [name, priority, ref] :
       {std::tuple{"a", 1, "pool"}, std::tuple{"b", 2, "other"}, std::tuple{"c", 3, ""}}) {
    k8s::InferenceObjective o;
    o.meta.name = name;
    o.priority = priority;
    o.has_priority = true;
    o.pool_ref_name = ref;
    list.items.push_back(o);
  }
  state.ApplyList(list);
  state.TakePriorities();
  return state;
}

void CheckObjectiveEvent(const k8s::ObjectiveEvent& e) {
  if (e.type == k8s::WatchEventType::kBookmark) {
    Check(!e.objective.meta.resource_version.empty(), "bookmark without a resourceVersion");
  } else if (e.type != k8s::WatchEventType::kError) {
    CheckObjective(e.objective);
  }
  k8s::ObjectiveWatchState state = SeededObjectives();
  const k8s::ObjectivePriorities before = state.priorities();
  const Status applied = state.ApplyEvent(e);
  Check(applied.ok() == (e.type != k8s::WatchEventType::kError),
        "only an ERROR event fails to apply");
  const k8s::ObjectivePriorities& after = state.priorities();
  const std::string& name = e.objective.meta.name;
  switch (e.type) {
    case k8s::WatchEventType::kError:
    case k8s::WatchEventType::kBookmark:
      Check(after == before && !state.changed(), "ERROR or BOOKMARK moved the priorities");
      break;
    case k8s::WatchEventType::kDeleted:
      Check(after.find(name) == after.end(), "a DELETED objective keeps its priority");
      break;
    case k8s::WatchEventType::kAdded:
    case k8s::WatchEventType::kModified: {
      const auto it = after.find(name);
      if (ForPool(e.objective)) {
        Check(it != after.end() && it->second == e.objective.priority,
              "an objective for the pool is not in the table with its priority");
      } else {
        Check(it == after.end(), "an objective for another pool is in the table");
      }
      break;
    }
  }
  Check(state.changed() == (after != before), "changed() disagrees with the table");
}

k8s::PoolWatchState SeededState() {
  k8s::PoolWatchState state("pool");
  k8s::InferencePool pool;
  pool.meta.name = "pool";
  pool.selector = {{"app", "vllm"}};
  pool.target_ports = {8000, 8001};
  state.ApplyPool(pool);
  k8s::PodList list;
  list.resource_version = "1";
  k8s::Pod pod;
  pod.meta.name = "a";
  pod.meta.labels = {{"app", "vllm"}};
  pod.ip = "10.0.0.1";
  pod.ready = true;
  list.items.push_back(pod);
  state.ApplyPodList(list);
  return state;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);

  const Result<k8s::PodEvent> pod_event = k8s::DecodePodEvent(line);
  if (!pod_event.ok()) {
    CheckError(pod_event.status());
  } else {
    const k8s::PodEvent& e = *pod_event;
    if (e.type == k8s::WatchEventType::kBookmark) {
      Check(!e.pod.meta.resource_version.empty(), "bookmark without a resourceVersion");
    } else if (e.type != k8s::WatchEventType::kError) {
      Check(!e.pod.meta.name.empty(), "pod without a name");
      CheckLabels(e.pod.meta.labels);
    }
    k8s::PoolWatchState state = SeededState();
    const Status applied = state.ApplyPodEvent(e);
    Check(applied.ok() == (e.type != k8s::WatchEventType::kError),
          "only an ERROR event fails to apply");
    CheckEndpoints(state);
  }

  const Result<k8s::PoolEvent> pool_event = k8s::DecodePoolEvent(line);
  if (!pool_event.ok()) {
    CheckError(pool_event.status());
  } else {
    const k8s::PoolEvent& e = *pool_event;
    if (e.type == k8s::WatchEventType::kBookmark) {
      Check(!e.pool.meta.resource_version.empty(), "bookmark without a resourceVersion");
    } else if (e.type != k8s::WatchEventType::kError) {
      CheckPool(e.pool);
    }
    k8s::PoolWatchState state = SeededState();
    state.ApplyPoolEvent(e);
    CheckEndpoints(state);
  }

  // The same bytes as a list response: the list decoder shares the object readers.
  const Result<k8s::PodList> list = k8s::DecodePodList(line);
  if (!list.ok()) {
    CheckError(list.status());
  } else {
    for (const k8s::Pod& p : list->items) CheckLabels(p.meta.labels);
    k8s::PoolWatchState state = SeededState();
    state.ApplyPodList(*list);
    CheckEndpoints(state);
  }

  // As an InferencePoolList (the discovery lists its pool by name): every item meets the
  // pool contract, and the one named like the seeded pool replaces it.
  const Result<k8s::InferencePoolList> pools = k8s::DecodeInferencePoolList(line);
  if (!pools.ok()) {
    CheckError(pools.status());
  } else {
    std::optional<k8s::InferencePool> mine;
    for (const k8s::InferencePool& p : pools->items) {
      CheckPool(p);
      if (p.meta.name == "pool") mine = p;
    }
    k8s::PoolWatchState state = SeededState();
    const bool found = mine.has_value();
    state.ApplyPoolList(std::move(mine), pools->resource_version);
    Check(state.pool().has_value() == found, "pool list applied to the wrong pool");
    Check(!state.pool_relist_needed(), "relist needed after a pool list");
    Check(state.pool_resource_version() == pools->resource_version, "pool list resourceVersion lost");
    CheckEndpoints(state);
  }

  const Result<k8s::ObjectiveEvent> objective_event = k8s::DecodeObjectiveEvent(line);
  if (!objective_event.ok()) {
    CheckError(objective_event.status());
  } else {
    CheckObjectiveEvent(*objective_event);
  }

  const Result<k8s::ObjectiveList> objectives = k8s::DecodeObjectiveList(line);
  if (!objectives.ok()) {
    CheckError(objectives.status());
  } else {
    // A name listed twice: the later item is the one kept.
    k8s::ObjectivePriorities expected;
    for (const k8s::InferenceObjective& o : objectives->items) {
      CheckObjective(o);
      expected.erase(o.meta.name);
      if (ForPool(o)) expected.emplace(o.meta.name, o.priority);
    }
    k8s::ObjectiveWatchState state = SeededObjectives();
    state.ApplyList(*objectives);
    Check(!state.relist_needed(), "relist needed after a list");
    Check(state.resource_version() == objectives->resource_version, "list resourceVersion lost");
    Check(state.priorities() == expected, "priority table is not the pool's objectives");
  }

  const Result<k8s::InferenceObjective> objective = k8s::DecodeInferenceObjective(line);
  if (!objective.ok()) {
    CheckError(objective.status());
  } else {
    CheckObjective(*objective);
  }
  return 0;
}
