// A scenario suite file (`kvroute simulate --suite FILE`, docs/SUITE.md):
//
//   name: broad
//   scenarios:                 # scenario files, relative to this file
//     - ../scenarios/seed-8x.yaml
//   generate:                  # scenario families drawn from a seed (simkit/suite)
//     count: 60
//     seed: 1
//     traces: [../traces/mooncake-synthetic.jsonl]   # the trace family's traces
//     min_requests: 600
//     max_requests: 1500
//   policies: [round-robin, ..., kvroute]   # default: every built-in one
//   reference: kvroute         # the policy the summary judges first (default kvroute)
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/yaml_reader.h"
#include "simkit/suite/generator.h"

namespace kvroute::config {

struct SuiteSpec {
  std::string name;
  std::string source;                  // the file
  std::vector<std::string> scenarios;  // resolved paths
  std::optional<suite::GeneratorOptions> generate;
  std::vector<std::string> policies;
  std::string reference = "kvroute";
};

ConfigOr<SuiteSpec> ParseSuite(std::string_view yaml, std::string_view source, std::string_view base_dir);
ConfigOr<SuiteSpec> LoadSuiteFile(const std::string& path);

}  // namespace kvroute::config
