// `kvroute doctor --trace`'s run: the fleet's shape (one scrape of the replicas, or
// --fleet), simulate under each policy with progress on stderr, the table on stdout
// (trace_compare.h holds the pure parts).
#pragma once

#include <cstdint>
#include <string>

#include "apps/doctor/collect.h"

namespace kvroute::doctor {

struct TraceRun {
  std::string trace, format;  // format "": by the file's extension
  int64_t block_size = 512;
  double time_scale = 1.0;
  std::string fleet_file;     // "": the live replicas' shape (`collect` must be set)
  std::string policies;       // comma-separated; "": every built-in policy
  bool quiet = false;
};

// Returns the exit code: 0 when the table was printed, 1 when no fleet shape could be read
// or a simulation failed, 2 on a bad trace or fleet file (the error on stderr).
int RunTraceCompare(const TraceRun& run, CollectOptions* collect);

}  // namespace kvroute::doctor
