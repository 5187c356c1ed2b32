// The Kubernetes API objects kvroute's discovery reads (Pod, InferencePool, Status) and
// their decoding from the API server's JSON: a PodList, one InferencePool, and watch
// events (one JSON object per line of a `watch=1` response). REFERENCE.md 12.
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

struct Pod {
  ObjectMeta meta;
  std::string ip;       // status.podIP; "" when not yet assigned
  bool ready = false;   // status.conditions[type=Ready].status == "True"
  std::string phase;    // status.phase ("Pending", "Running", ...); "" when absent
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

// An InferencePool, both API versions mapped onto one shape.
struct InferencePool {
  ObjectMeta meta;
  PoolApiVersion api_version = PoolApiVersion::kV1;
  // v1: spec.selector.matchLabels; v1alpha2: spec.selector (a plain map). Never empty.
  Labels selector;
  // v1: spec.targetPorts[].number (1-8 of them); v1alpha2: [spec.targetPortNumber].
  // Never empty; each 1..65535; no duplicates; in the order given.
  std::vector<uint16_t> target_ports;
  // v1: spec.endpointPickerRef; v1alpha2: spec.extensionRef. "" / 0 when absent.
  std::string picker_name;
  uint16_t picker_port = 0;   // v1: endpointPickerRef.port.number; v1alpha2: portNumber
  std::string failure_mode;   // "FailOpen" / "FailClose" as given
};

// A Kubernetes Status object (the body of an ERROR watch event, or of a failed request).
struct ApiStatus {
  int64_t code = 0;     // HTTP-like: 410 = Gone (the resourceVersion expired)
  std::string reason;   // "Expired", "Gone", "NotFound", ...
  std::string message;

  bool gone() const { return code == 410; }
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

// `GET .../pods?labelSelector=...`: a PodList. Error: not JSON, not an object, or any
// item that does not decode as a Pod (the whole list is rejected: a partial list would
// silently drop endpoints).
Result<PodList> DecodePodList(std::string_view json);

// One Pod object (as in a list item or a watch event's `object`).
Result<Pod> DecodePod(std::string_view json);

// `GET .../inferencepools/NAME`: one InferencePool of either API version, told apart by
// `apiVersion` (or, when that is absent, by which spec fields are present). Error: an
// unknown apiVersion, no selector, no target port, a port outside 1..65535.
Result<InferencePool> DecodeInferencePool(std::string_view json);

// A Status body (e.g. the 404 or 410 response of a GET). Error when not a JSON object.
Result<ApiStatus> DecodeStatus(std::string_view json);

// One watch-event line, without its trailing newline (surrounding whitespace is fine).
// Error: not JSON, no `type` or an unknown one, no `object`, or an object that does not
// decode as its type says.
Result<PodEvent> DecodePodEvent(std::string_view line);
Result<PoolEvent> DecodePoolEvent(std::string_view line);

}  // namespace kvroute::k8s
