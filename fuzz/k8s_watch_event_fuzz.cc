// Fuzz target: one line of a Kubernetes watch response through DecodePodEvent and
// DecodePoolEvent, and what decodes into a PoolWatchState (issue 9). The bytes come from
// the API server, or whatever sits between it and us.
//
// Invariants: an error is InvalidArgument with a message; a decoded event meets the
// decoder's contract (labels and selectors sorted with unique keys, a pool with at least
// one port, all nonzero and distinct, a bookmark with a resourceVersion); applying it to a
// state holding a pool and pods yields endpoints with unique addresses, each on one of
// the pool's ports and a Ready, not-deleting, selected pod's IP.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "core/k8s/objects.h"
#include "core/k8s/pool_watch_state.h"
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
  Check(!pool.selector.empty(), "pool with an empty selector");
  CheckLabels(pool.selector);
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
  }
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
  return 0;
}
