// kvroute: one binary, several subcommands. This is the only file that sees every app.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "apps/bench/bench_main.h"
#include "apps/demo/demo_main.h"
#include "apps/doctor/doctor_main.h"
#include "apps/epp/epp_main.h"
#include "apps/serve/serve_main.h"
#include "apps/sidecar/sidecar_main.h"
#include "apps/sim/sim_main.h"
#include "apps/simulate/simulate_main.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

constexpr Command kCommands[] = {
    {"sim", "run a fleet of simulated vLLM replicas (OpenAI API + /metrics)",
     kvroute::sim::SimMain},
    {"serve", "route OpenAI-compatible requests across replicas (the router/proxy)",
     kvroute::router::ServeMain},
    {"epp", "endpoint picker for Envoy gateways (Gateway API Inference Extension, gRPC ext_proc)",
     kvroute::epp::EppMain},
    {"sidecar", "the decode pod's prefill/decode legs behind `kvroute epp` (x-prefiller-host-port)",
     kvroute::sidecar::SidecarMain},
    {"simulate", "compare routing policies on a scenario in virtual time",
     kvroute::simulate::SimulateMain},
    {"bench", "open-loop load generator for an OpenAI-compatible endpoint (+ fleet /metrics)",
     kvroute::bench::BenchMain},
    {"demo", "live comparison of routing policies on the seed article's traffic",
     kvroute::demo::DemoMain},
    {"doctor", "diagnose a live fleet's /metrics: hit rate, KV spread, queues (routing or hardware?)",
     kvroute::doctor::DoctorMain},
};

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "kvroute: an inference-aware router for LLM serving fleets\n\n"
               "Usage: kvroute <command> [options]   (kvroute <command> --help for its flags)\n\n"
               "Commands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  std::string_view cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    PrintUsage(stdout);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (cmd == c.name) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "kvroute: unknown command '%s'\n\n", argv[1]);
  PrintUsage(stderr);
  return 2;
}
