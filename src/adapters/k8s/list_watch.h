// ListWatch: follows one Kubernetes resource collection the way the API asks clients to
// (REFERENCE.md 12): LIST it, hand the list to the owner, WATCH from the list's
// resourceVersion, hand every event line to the owner, and when the watch ends resume it
// from the last resourceVersion the owner saw; after a 410 Gone (or whenever the owner
// says so) LIST again. Failures wait a Backoff delay (exponential, jittered) before the
// next attempt; a watch the server ends cleanly (its timeout) resumes at once.
//
// What to request and what the bytes mean stay with the owner, through Callbacks: the
// owner decodes with src/adapters/k8s/objects and keeps the resourceVersions in its watch state.
//
//   Start ──> [relist_needed()?] ──yes──> LIST list_target() ──ok──> on_list ──ok──┐
//                   │ no                        │ fail / on_list error               │
//                   v                           v                                    │
//            WATCH watch_target() <──── (backoff delay, on_failure) <────────────────┘
//                   │ lines -> on_line (FailedPrecondition = 410: relist next)
//                   └─ ends: clean -> resume at once; failure -> backoff; kGone -> relist
//
// An empty list_target() parks the loop (nothing to follow yet, e.g. pods before their
// pool exists) until Kick().
//
// Threads: the ApiClient's io_context; call every method there. No callback runs after
// Stop() or destruction.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/common/status.h"
#include "adapters/k8s/api_client.h"
#include "adapters/k8s/backoff.h"

namespace kvroute::k8s {

enum class ListWatchPhase : uint8_t { kList, kWatch };
std::string_view ListWatchPhaseName(ListWatchPhase p);  // "list", "watch"

class ListWatch {
 public:
  struct Callbacks {
    // Whether the next attempt must LIST (else it WATCHes). Read before every attempt.
    std::function<bool()> relist_needed;
    // The LIST request target (path and query); "" parks the loop until Kick().
    std::function<std::string()> list_target;
    // The WATCH request target, with watch=1 and the resourceVersion to resume from.
    std::function<std::string()> watch_target;
    // A 2xx LIST body. A non-ok Status counts as a protocol failure (backoff, retried).
    std::function<Status(ApiResult&& result)> on_list;
    // A LIST that answered 404 (a custom resource whose CRD is not installed, say).
    // Returning true makes it a handled outcome: logged by on_failure, retried after
    // `missing_retry`; false treats it as any other failure.
    std::function<bool(const ApiResult& result)> on_missing;
    // One watch event line. FailedPrecondition (a 410 ERROR event) ends the watch and
    // relists; other errors are reported through on_failure and the watch goes on.
    std::function<Status(std::string_view line)> on_line;
    // The watch is established (response head 200).
    std::function<void()> on_watch_open;
    // A failed attempt (not a clean end of a watch, not Stop), with the delay before the
    // next one: for the log line and the failure metric. An error of on_list or on_line
    // arrives as kProtocol with http_status 200 and that error as its status.
    std::function<void(ListWatchPhase phase, const ApiResult& result,
                       std::chrono::milliseconds next_delay)>
        on_failure;
  };

  struct Options {
    BackoffPolicy backoff;
    // Delay before re-listing a collection that answered 404 and was handled by on_missing.
    std::chrono::milliseconds missing_retry{10000};
    uint64_t seed = 1;  // jitter
  };

  ListWatch(ApiClient& client, Callbacks callbacks, Options options);
  ~ListWatch();  // Stop()
  ListWatch(const ListWatch&) = delete;
  ListWatch& operator=(const ListWatch&) = delete;

  void Start();
  void Stop();
  // Abandon the current request or delay and start over now (the owner's state moved:
  // the pod selector changed, a parked loop has something to follow). Idempotent.
  void Kick();

  uint64_t lists() const;    // LIST requests started
  uint64_t watches() const;  // WATCH requests started
  bool watching() const;     // a watch is established now

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kvroute::k8s
