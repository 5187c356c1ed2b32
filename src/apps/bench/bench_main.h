// `kvroute bench`: open-loop load against an OpenAI-compatible endpoint, with per-token
// latency, goodput and the fleet's own /metrics view. `argv[0]` is "bench". Returns the
// process exit code (0 when the run completed, whatever its error count; 2 on bad flags).
#pragma once

namespace kvroute::bench {

int BenchMain(int argc, char** argv);

}  // namespace kvroute::bench
