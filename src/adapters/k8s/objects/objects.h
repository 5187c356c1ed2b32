// The Kubernetes API objects kvroute's discovery reads (Pod, InferencePool,
// InferenceObjective, Status) and their decoding from the API server's JSON: a PodList, one
// InferencePool, InferenceObjectives (one or a list), and watch events (one JSON object per
// line of a `watch=1` response). REFERENCE.md 12.
//
// Pure: bytes in, typed values or an error out. No sockets, no clock, no files; the
// HTTPS client that fetches the bytes lives outside src/core.
//
// Decoding keeps only the fields discovery needs and ignores every other field, so newer
// API servers (more fields) decode the same. A field that is present with the wrong type,
// or a required field that is missing, is an InvalidArgument error naming the field path
// ("items[3].metadata.labels.app: not a string"). Nothing here throws or aborts on input.
//
// Thread: every function may be called from any thread (each thread has its own parser).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/common/status.h"

namespace kvroute::k8s {

// Label key/value pairs, sorted by key (keys are unique in Kubernetes).
using Labels = std::vector<std::pair<std::string, std::string>>;

struct ObjectMeta {
  std::string name;
  std::string namespace_name;     // metadata.namespace; "" when absent
  std::string resource_version;   // metadata.resourceVersion; "" when absent
  Labels labels;
  bool being_deleted = false;     // metadata.deletionTimestamp is set (not null)
};

// Data-parallel engines (REFERENCE.md 17): a pod's annotation naming the ports (pool
// target ports) it serves, comma separated ("8000,8001"); the older key is read when the
// new one is absent.
inline constexpr std::string_view kActivePortsAnnotation = "llm-d.ai/active-ports";
inline constexpr std::string_view kActivePortsAnnotationOld = "inference.networking.k8s.io/active-ports";

struct Pod {
  ObjectMeta meta;
  std::string ip;       // status.podIP; "" when not yet assigned
  bool ready = false;   // status.conditions[type=Ready].status == "True"
  std::string phase;    // status.phase ("Pending", "Running", ...); "" when absent
  // The active-ports annotation's port numbers (entries that are not a port 1-65535 are
  // left out); nullopt without the annotation (then every target port is served).
  std::optional<std::vector<uint16_t>> active_ports;
};

struct PodList {
  std::string resource_version;  // the list's metadata.resourceVersion: where a watch resumes
  std::vector<Pod> items;
};

enum class PoolApiVersion {
  kV1,        // inference.networking.k8s.io/v1
  kV1Alpha2,  // inference.networking.x-k8s.io/v1alpha2 (the seed's)
};

inline constexpr std::string_view kPoolApiV1 = "inference.networking.k8s.io/v1";
inline constexpr std::string_view kPoolApiV1Alpha2 = "inference.networking.x-k8s.io/v1alpha2";

// One entry of a v1 selector's spec.selector.matchExpressions, with Kubernetes
// LabelSelector semantics against a pod's labels:
//   kIn            the key is there and its value is one of `values`
//   kNotIn         the key is absent, or its value is none of `values`
//   kExists        the key is there (any value)
//   kDoesNotExist  the key is absent
struct SelectorRequirement {
  enum class Op { kIn, kNotIn, kExists, kDoesNotExist };

  std::string key;                  // never empty
  Op op = Op::kIn;
  // Sorted, unique (the API treats them as a set). Non-empty for kIn/kNotIn, empty for
  // kExists/kDoesNotExist.
  std::vector<std::string> values;

  bool operator==(const SelectorRequirement&) const = default;
};

// "In", "NotIn", "Exists", "DoesNotExist": the operator's name in the API.
std::string_view SelectorOpName(SelectorRequirement::Op op);

// An InferencePool, both API versions mapped onto one shape.
struct InferencePool {
  ObjectMeta meta;
  PoolApiVersion api_version = PoolApiVersion::kV1;
  // v1: spec.selector.matchLabels; v1alpha2: spec.selector (a plain map).
  Labels selector;
  // v1: spec.selector.matchExpressions, in the order given; always empty for v1alpha2.
  // A pod is selected when it matches every label of `selector` and every requirement
  // here. `selector` and `selector_expressions` are never both empty.
  std::vector<SelectorRequirement> selector_expressions;
  // v1: spec.targetPorts[].number (1-8 of them); v1alpha2: [spec.targetPortNumber].
  // Never empty; each 1..65535; no duplicates; in the order given.
  std::vector<uint16_t> target_ports;
  // v1: spec.endpointPickerRef; v1alpha2: spec.extensionRef. "" / 0 when absent.
  std::string picker_name;
  uint16_t picker_port = 0;   // v1: endpointPickerRef.port.number; v1alpha2: portNumber
  std::string failure_mode;   // "FailOpen" / "FailClose" as given
};

// `GET .../inferencepools[?fieldSelector=metadata.name%3DNAME]`: an InferencePoolList.
struct InferencePoolList {
  std::string resource_version;  // where a watch of the collection resumes
  std::vector<InferencePool> items;
};

// A Kubernetes Status object (the body of an ERROR watch event, or of a failed request).
struct ApiStatus {
  int64_t code = 0;     // HTTP-like: 410 = Gone (the resourceVersion expired)
  std::string reason;   // "Expired", "Gone", "NotFound", ...
  std::string message;

  bool gone() const { return code == 410; }
};

enum class ObjectiveApiGroup {
  kLlmD,  // llm-d.ai/v1alpha2 (current)
  kXK8s,  // inference.networking.x-k8s.io/v1alpha2 (older, still served)
};

inline constexpr std::string_view kObjectiveGroupLlmD = "llm-d.ai";
inline constexpr std::string_view kObjectiveGroupXK8s = "inference.networking.x-k8s.io";
inline constexpr std::string_view kObjectiveApiLlmD = "llm-d.ai/v1alpha2";
inline constexpr std::string_view kObjectiveApiXK8s = "inference.networking.x-k8s.io/v1alpha2";

// An InferenceObjective of either group, mapped onto one shape.
struct InferenceObjective {
  ObjectMeta meta;
  ObjectiveApiGroup group = ObjectiveApiGroup::kLlmD;  // from apiVersion
  // spec.priority: within int32 (the API's type). 0 and has_priority false when absent.
  int64_t priority = 0;
  bool has_priority = false;
  // spec.poolRef.name and .group as given; both "" when there is no poolRef (a poolRef
  // without a name is an error). poolRef.kind is checked to be a string and not kept.
  std::string pool_ref_name;
  std::string pool_ref_group;
};

struct ObjectiveList {
  std::string resource_version;  // the list's metadata.resourceVersion
  std::vector<InferenceObjective> items;
};

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark, kError };

std::string_view WatchEventTypeName(WatchEventType type);

// One line of a pods watch. Which member is meaningful depends on `type`:
//   kAdded/kModified/kDeleted  pod (fully decoded)
//   kBookmark                  pod.meta.resource_version only (the rest is empty)
//   kError                     status
struct PodEvent {
  WatchEventType type = WatchEventType::kAdded;
  Pod pod;
  ApiStatus status;
};

// One line of an InferencePool watch; same rules as PodEvent, with `pool`.
struct PoolEvent {
  WatchEventType type = WatchEventType::kAdded;
  InferencePool pool;
  ApiStatus status;
};

// One line of an InferenceObjective watch; same rules as PodEvent, with `objective`.
struct ObjectiveEvent {
  WatchEventType type = WatchEventType::kAdded;
  InferenceObjective objective;
  ApiStatus status;
};

// A watch's ERROR event on `resource` ("pods", "inferencepool", ...) as a Status:
// FailedPrecondition when the resourceVersion expired (410; sets `relist`), else
// Unavailable. The message names the resource, code, reason and message.
Status WatchErrorStatus(std::string_view resource, const ApiStatus& status, bool& relist);

// A fresh listing of objects kept by name: `objects` becomes the list's items, `rv` its
// resourceVersion, and no relist is needed any more.
template <class Map, class List>
void ApplyWatchList(const List& list, Map& objects, std::string& rv, bool& relist) {
  objects.clear();
  for (const auto& o : list.items) objects[o.meta.name] = o;
  rv = list.resource_version;
  relist = false;
}

// One watch event on objects kept by name (`objects`; `rv` and `relist`: the watcher's
// resourceVersion and relist flag). ERROR returns WatchErrorStatus; BOOKMARK moves `rv`
// only; DELETED removes `object`, ADDED and MODIFIED store it, and its resourceVersion
// becomes `rv` when it has one (a hand-written stand-in server may send none): those set
// `changed`.
template <class Map>
Status ApplyWatchEvent(std::string_view resource, WatchEventType type, const ApiStatus& status,
                       const typename Map::mapped_type& object, Map& objects, std::string& rv,
                       bool& relist, bool& changed) {
  switch (type) {
    case WatchEventType::kError:
      return WatchErrorStatus(resource, status, relist);
    case WatchEventType::kBookmark:
      rv = object.meta.resource_version;
      return Status::Ok();
    case WatchEventType::kDeleted:
      objects.erase(object.meta.name);
      break;
    case WatchEventType::kAdded:
    case WatchEventType::kModified:
      objects[object.meta.name] = object;
      break;
  }
  if (!object.meta.resource_version.empty()) rv = object.meta.resource_version;
  changed = true;
  return Status::Ok();
}

// `GET .../pods?labelSelector=...`: a PodList. Error: not JSON, not an object, or any
// item that does not decode as a Pod (the whole list is rejected: a partial list would
// silently drop endpoints).
Result<PodList> DecodePodList(std::string_view json);

// One Pod object (as in a list item or a watch event's `object`).
Result<Pod> DecodePod(std::string_view json);

// `GET .../inferencepools/NAME`: one InferencePool of either API version, told apart by
// `apiVersion` (or, when that is absent, by which spec fields are present). Error: an
// unknown apiVersion, no selector, no target port, a port outside 1..65535.
// v1 selector: matchLabels and matchExpressions are each optional, but a selector with
// neither (or both empty) is an error (it would select every pod in the namespace). An
// expression needs a key and an operator of In, NotIn, Exists, DoesNotExist; In/NotIn need
// at least one value, Exists/DoesNotExist none. Errors name the field path
// ("spec.selector.matchExpressions[1].values: ...").
Result<InferencePool> DecodeInferencePool(std::string_view json);

// One InferenceObjective (`GET .../inferenceobjectives/NAME`, or a watch event's object).
// The group comes from apiVersion: kObjectiveApiLlmD or kObjectiveApiXK8s. Error: a
// missing or unknown apiVersion, no metadata.name, no spec, spec.priority not an integer or
// outside int32, spec.poolRef not an object or without a name.
Result<InferenceObjective> DecodeInferenceObjective(std::string_view json);

// `GET .../inferenceobjectives`: an InferenceObjectiveList. An item without apiVersion takes
// the list's (an error when the list has none, or an unknown one). Error: as
// DecodePodList, any item that does not decode rejects the whole list.
Result<ObjectiveList> DecodeObjectiveList(std::string_view json);

// An InferencePoolList. Error: not JSON, not an object, or any item that does not decode
// as an InferencePool (named by its index).
Result<InferencePoolList> DecodeInferencePoolList(std::string_view json);

// A Status body (e.g. the 404 or 410 response of a GET). Error when not a JSON object.
Result<ApiStatus> DecodeStatus(std::string_view json);

// One watch-event line, without its trailing newline (surrounding whitespace is fine).
// Error: not JSON, no `type` or an unknown one, no `object`, or an object that does not
// decode as its type says.
Result<PodEvent> DecodePodEvent(std::string_view line);
Result<PoolEvent> DecodePoolEvent(std::string_view line);
// As DecodePodEvent. A BOOKMARK's object needs only metadata.resourceVersion (its
// apiVersion is not checked); ADDED/MODIFIED/DELETED decode as DecodeInferenceObjective.
Result<ObjectiveEvent> DecodeObjectiveEvent(std::string_view line);

}  // namespace kvroute::k8s
