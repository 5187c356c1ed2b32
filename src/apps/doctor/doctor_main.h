// `kvroute doctor`: the seed article's diagnosis of a live fleet as a command. Scrapes
// every replica's /metrics for a window (apps/doctor/collect.h), diagnoses (apps/doctor/diagnosis) and
// prints the report (text, --json, or a live --watch view). `argv[0]` is "doctor".
// Returns the exit code: 0 healthy, 1 findings, 2 nothing readable or a usage/config error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/status.h"
#include "apps/doctor/collect.h"

namespace kvroute::doctor {

int DoctorMain(int argc, char** argv);

// The targets of an --endpoints list: "host:port,host:port" ("[v6]:port" too), each named
// as written. Returns ok, else InvalidArgument saying what is wrong, naming the entry
// ("--endpoints entry 2 'localhost': expected host:port"); `out` is then unspecified.
Status ParseEndpointList(std::string_view list, std::vector<Target>& out);

// The targets of a serve/epp configuration's pool: pool.endpoints, pool.endpoints_file
// (read once), or Kubernetes discovery (the InferencePool's pods, listed once, waiting at
// most `discovery_timeout_s`). Returns ok, else InvalidArgument with the loader's error
// naming file, line and field (or saying the pool lists no endpoints), or why discovery gave
// nothing (Unavailable; DeadlineExceeded when the pool was not listed in time).
//
// KV-cache events: each target's Target::kv_events is its own `kv_events`, else
// tcp://<host>:<pool.kv_events.port> (as the router derives it, pool::ApplyKvEvents). With
// the centralized pool.kv_events.bind the replicas connect to the router, so there is
// nothing doctor can subscribe to: kv_events stays empty and `kv`, when given, says so.
struct ConfigKvEvents {
  int32_t block_size = 0;  // pool.kv_events.block_size when some endpoint has events, else 0
  std::string bind;        // pool.kv_events.bind (centralized mode), "" when not
};
Status TargetsFromConfig(const std::string& path, double discovery_timeout_s,
                         std::vector<Target>& out, ConfigKvEvents* kv = nullptr);

// --kv-events-port P with --endpoints: every target's events at tcp://<its host>:P.
void ApplyKvEventsPort(uint16_t port, std::vector<Target>& targets);
// --kv-events URL,URL,... with --endpoints: the i-th target's events at the i-th URL
// ("tcp://HOST:PORT"; an empty entry: none). InvalidArgument naming the entry when a URL is
// bad or the count differs from the targets'.
Status ApplyKvEventsList(std::string_view list, std::vector<Target>& targets);

}  // namespace kvroute::doctor
