// `kvroute simulate`: compare routing policies on a scenario in virtual time.
//   kvroute simulate --scenario FILE [--policies a,b,...] [--out DIR] [--seed N]
// Writes DIR/report.json, report.md, ttft_cdf.svg and kv_usage.svg, prints the table.
// `argv[0]` is "simulate". Returns the process exit code.
#pragma once

namespace kvroute::simulate {

int SimulateMain(int argc, char** argv);

}  // namespace kvroute::simulate
