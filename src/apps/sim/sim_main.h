// `kvroute sim`: serve N simulated vLLM replicas (OpenAI API + /metrics) until SIGINT or
// SIGTERM. `argv[0]` is "sim". Returns the process exit code.
#pragma once

namespace kvroute::sim {

int SimMain(int argc, char** argv);

}  // namespace kvroute::sim
