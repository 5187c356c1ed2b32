// `kvroute doctor`: the seed article's diagnosis of a live fleet as a command. Scrapes
// every replica's /metrics for a window (doctor/collect.h), diagnoses (doctor/diagnosis) and
// prints the report (text, --json, or a live --watch view). `argv[0]` is "doctor".
// Returns the exit code: 0 healthy, 1 findings, 2 nothing readable or a usage/config error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/common/status.h"
#include "doctor/collect.h"

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
Status TargetsFromConfig(const std::string& path, double discovery_timeout_s,
                         std::vector<Target>& out);

}  // namespace kvroute::doctor
