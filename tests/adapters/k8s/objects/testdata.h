// The k8s core tests' fixtures: files under tests/adapters/k8s/objects/testdata/ in the API's shapes.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_paths.h"

namespace kvroute::k8s::testing {

// The whole of testdata/`name` (a failed expectation when it cannot be read).
inline std::string Fixture(const std::string& name) {
  std::ifstream in(kvroute::test_support::SourceDir() + "/tests/adapters/k8s/objects/testdata/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The non-empty lines of `text` (a watch response's events).
inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

}  // namespace kvroute::k8s::testing
