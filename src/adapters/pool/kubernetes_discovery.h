// Kubernetes discovery (issue 9): the pods an InferencePool selects, as the routing
// core's endpoint set, and the InferenceObjectives' priorities, followed through the
// Kubernetes API (REFERENCE.md 12).
//
// Four collections, each followed by a k8s::ListWatch (LIST, then WATCH from the list's
// resourceVersion, resume, relist after 410, backoff with jitter on failures):
//   inferencepool   GET /apis/GROUP/VERSION/namespaces/NS/inferencepools
//                       ?fieldSelector=metadata.name%3DNAME
//                   (a LIST of one name rather than a GET, so a pool that does not exist
//                   yet arrives as an ADDED event on the watch, without polling)
//   pods            GET /api/v1/namespaces/NS/pods?labelSelector=<the pool's selector>
//                   (parked while there is no pool; relisted when the selector changes)
//   inferenceobjectives, llm-d.ai/v1alpha2 and inference.networking.x-k8s.io/v1alpha2
//                   (when enabled; a group whose CRD is not installed answers 404: no
//                   objectives from it, re-listed every missing_retry)
// The decoded events feed k8s::PoolWatchState and k8s::ObjectiveWatchState (pure, in
// src/adapters/k8s/objects); whenever the endpoint set or the priorities move, the callbacks get the
// new value. The pool missing, or its CRD not installed, means no endpoints (the routing
// core is then not ready: readiness NOT_SERVING) and a status() saying so.
//
// Every failed request is one log line ("kubernetes: list pods in ns: ...: HTTP 401 ...;
// retrying in 1.9s") and one increment of kvroute_k8s_failures_total{resource,phase,kind}.
//
// Threads: the ListWatches, the ApiClient and every callback run on the io_context given
// at construction. Start and Stop may be called from any thread; no callback runs after
// Stop returns. AppendMetrics and status() read atomics / a mutex: any thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/routing/routing_core.h"
#include "adapters/k8s/api_client.h"
#include "adapters/k8s/backoff.h"
#include "adapters/k8s/kubeconfig.h"

namespace kvroute::pool {

using Priorities = std::map<std::string, int64_t, std::less<>>;

struct KubernetesDiscoveryOptions {
  std::string pool_name;
  std::string namespace_name;
  std::string group = "inference.networking.k8s.io";  // or inference.networking.x-k8s.io
  bool objectives = true;
  k8s::BackoffPolicy backoff;
  std::chrono::milliseconds missing_retry{30000};
  k8s::ApiClientOptions client;
  uint64_t seed = 1;  // backoff jitter
};

class KubernetesDiscovery {
 public:
  struct Callbacks {
    // The endpoint set moved (the first call comes after the first pool list, even when
    // empty). On the io_context.
    std::function<void(std::vector<routing::EndpointSpec>)> on_endpoints;
    // The objectives' priorities moved (the llm-d.ai group wins over the older one).
    std::function<void(Priorities)> on_objectives;
    std::function<void(std::string_view)> log;
  };

  KubernetesDiscovery(boost::asio::io_context& ctx, k8s::ClusterAccess access,
                      KubernetesDiscoveryOptions options, Callbacks callbacks);
  ~KubernetesDiscovery();  // Stop()
  KubernetesDiscovery(const KubernetesDiscovery&) = delete;
  KubernetesDiscovery& operator=(const KubernetesDiscovery&) = delete;

  void Start();
  void Stop();

  // "" while the pool is known; else why there are no endpoints from it, e.g.
  // "InferencePool ns/name not found" or "not listed yet".
  std::string status() const;
  // kvroute_k8s_* series.
  void AppendMetrics(std::string& out) const;

  const KubernetesDiscoveryOptions& options() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Percent-encodes a query value: everything but A-Z a-z 0-9 - . _ ~.
std::string PercentEncode(std::string_view s);

}  // namespace kvroute::pool
