// KV-cache events from the pool's endpoints into the routing core: one subscriber
// (adapters/kvevents/subscriber.h, one thread for every source) following the core's endpoint
// table. Each endpoint with EndpointSpec::kv_events is a source: its own SUB socket
// (with its replay socket when kv_events_replay is set), or, in the centralized mode
// (pool.kv_events.bind), a stream of the one bound socket found by the host in its topic
// (kv@<host>@<model>). Every report reaches the core: batches (live and replayed) as
// OnKvEvents, gaps, restarts and undecodable batches as their own calls, at the pool's
// time.
//
// Threads: Sync from the pool's configuration path (any thread, one at a time); reports
// run on the subscriber's thread; AppendMetrics from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "config/router_config.h"
#include "core/common/published.h"
#include "core/routing/routing_core.h"
#include "adapters/kvevents/subscriber.h"

namespace kvroute::pool {

class KvEventsFeed {
 public:
  // `now` is the core's clock; `log` gets one line per source added, removed or failed.
  KvEventsFeed(routing::RoutingCore& core, std::function<double()> now,
               std::function<void(std::string_view)> log);
  ~KvEventsFeed();
  KvEventsFeed(const KvEventsFeed&) = delete;
  KvEventsFeed& operator=(const KvEventsFeed&) = delete;

  // Follows the core's current table: sources for new endpoints (or changed addresses),
  // none for removed ones. The subscriber thread starts with the first source.
  void Sync(const config::KvEventsConfig& config);
  // Closes every source and joins the thread. Idempotent.
  void Stop();

  // kvroute_kv_events_replays_total, _replayed_batches_total, _duplicates_total,
  // _unknown_events_total, _lag_seconds, per endpoint with events (transport figures; the
  // core writes the index's). Nothing when no endpoint has events.
  void AppendMetrics(std::string& out) const;

 private:
  struct Source {
    uint32_t id = 0;
    std::string url, replay;
    std::string name;  // the endpoint's name, for metrics
    std::shared_ptr<std::atomic<double>> lag_s;
  };
  void OnReport(uint32_t id, const kvevents::Report& r, std::atomic<double>* lag);
  // The centralized stream's endpoint, by the host in its topic.
  void OnBoundReport(const kvevents::Report& r);

  routing::RoutingCore& core_;
  std::function<double()> now_;
  std::function<void(std::string_view)> log_;
  std::mutex mu_;  // Sync/Stop
  std::unique_ptr<kvevents::Subscriber> sub_;
  std::map<std::string, Source> sources_;  // by endpoint address (per-endpoint mode)
  std::string bound_url_;                  // centralized mode: the bind address, "" none
  struct Bound {
    std::unordered_map<std::string, uint32_t> by_host;
    std::unordered_map<uint32_t, std::shared_ptr<std::atomic<double>>> lag_s;
    std::map<uint32_t, std::string> names;
  };
  Published<Bound> bound_;
  mutable std::mutex metrics_mu_;  // sources_ snapshot for AppendMetrics
};

}  // namespace kvroute::pool
