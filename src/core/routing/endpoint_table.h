// The endpoints a discovery source names, and the table of one configuration as the routing
// core publishes it: ids dense and stable across reloads while an address survives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvroute::routing {

// One endpoint as a discovery source names it.
struct EndpointSpec {
  std::string address;  // "host:port": the identity across reloads
  std::string name;     // for logs and metrics; defaults to address
  std::string host;
  uint16_t port = 0;
  bool tls = false;  // an https:// address: the adapters speak TLS to it
  std::vector<std::pair<std::string, std::string>> labels;
  // Where the endpoint publishes its KV-cache events (tcp://HOST:PORT) and its replay
  // socket; empty: none. The core only notes that events are expected (its precise index
  // tracks the endpoint from then on); the subscriber adapter connects to them.
  std::string kv_events;
  std::string kv_events_replay;
};

// Per-endpoint counters and gauges for observability, updated lock-free.
struct EndpointStats;

// An endpoint of the published table. Immutable once published, except `stats`.
struct Endpoint {
  uint32_t id = 0;
  EndpointSpec spec;
  std::shared_ptr<EndpointStats> stats;  // survives reloads with the endpoint
};

// The endpoints of one configuration, by id (ids are dense; vacant ids hold nullptr).
struct EndpointTable {
  uint64_t version = 0;
  std::vector<std::shared_ptr<const Endpoint>> by_id;
  // The endpoint with id `id`, or nullptr.
  const Endpoint* Find(uint32_t id) const {
    return id < by_id.size() ? by_id[id].get() : nullptr;
  }
};

}  // namespace kvroute::routing
