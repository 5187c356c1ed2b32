// Reads the fixtures in tests/metrics/testdata (copies of shared/fixtures/vllm).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace kvroute::metrics::testing {

inline std::string ReadTestdata(const std::string& name) {
  std::ifstream in(std::string(KVROUTE_SOURCE_DIR) + "/tests/metrics/testdata/" + name,
                   std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline constexpr const char* kV010 = "metrics-v0.10-engine-label.txt";
inline constexpr const char* kV06 = "metrics-v0.6-old-names.txt";

}  // namespace kvroute::metrics::testing
