// Reads the fixtures in tests/metrics/testdata (copies of shared/fixtures/vllm).
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <tuple>

#include "support/test_paths.h"

namespace kvroute::metrics::testing {

inline std::string ReadTestdata(const std::string& name) {
  std::ifstream in(kvroute::test_support::SourceDir() + "/tests/metrics/testdata/" + name,
                   std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline constexpr const char* kV010 = "metrics-v0.10-engine-label.txt";
inline constexpr const char* kV06 = "metrics-v0.6-old-names.txt";
inline constexpr const char* kLora = "metrics-lora.txt";  // vLLM with LoRA on

// Variants of the fixtures for tests of garbage and of fleets: the real files with the
// engine figures replaced, so every other line is what vLLM really sends.
inline std::string ReplaceOnce(std::string text, const std::string& from, const std::string& to) {
  std::size_t at = text.find(from);
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

inline const std::string kFixtureModel = "model_name=\"meta-llama/Llama-3.1-8B-Instruct\"";
inline std::string V010Series(const std::string& family, const std::string& engine) {
  return "vllm:" + family + "{engine=\"" + engine + "\"," + kFixtureModel + "} ";
}

// The v0.10 fixture (41 running, 132 waiting, KV 0.98) with engine 0's running, waiting
// and KV usage replaced by the given sample values (any text: "NaN", "-4", "+Inf").
inline std::string V010With(const std::string& running, const std::string& waiting,
                            const std::string& kv) {
  std::string t = ReadTestdata(kV010);
  t = ReplaceOnce(t, V010Series("num_requests_running", "0") + "41.0",
                  V010Series("num_requests_running", "0") + running);
  t = ReplaceOnce(t, V010Series("num_requests_waiting", "0") + "132.0",
                  V010Series("num_requests_waiting", "0") + waiting);
  t = ReplaceOnce(t, V010Series("kv_cache_usage_perc", "0") + "0.9812345679012346",
                  V010Series("kv_cache_usage_perc", "0") + kv);
  return t;
}

// Two data-parallel engines: the fixture's engine 0 as it is, and an engine 1 with 39
// running, 120 waiting and KV usage `kv1`.
inline std::string V010DataParallel(const std::string& kv1) {
  std::string t = ReadTestdata(kV010);
  for (auto [family, value, v1] :
       {std::tuple<std::string, std::string, std::string>{"num_requests_running", "41.0", "39.0"},
        {"num_requests_waiting", "132.0", "120.0"},
        {"kv_cache_usage_perc", "0.9812345679012346", kv1}}) {
    const std::string line0 = V010Series(family, "0") + value;
    t = ReplaceOnce(t, line0, line0 + "\n" + V010Series(family, "1") + v1);
  }
  return t;
}

// The old-names fixture (v0.6: gpu_cache_usage_perc, no engine label) at KV usage `kv`.
inline std::string V06WithKv(const std::string& kv) {
  return ReplaceOnce(ReadTestdata(kV06), "vllm:gpu_cache_usage_perc{" + kFixtureModel + "} 0.4011",
                     "vllm:gpu_cache_usage_perc{" + kFixtureModel + "} " + kv);
}

}  // namespace kvroute::metrics::testing
