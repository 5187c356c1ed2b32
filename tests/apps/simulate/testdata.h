// Helpers shared by the simulate tests. Scenario parsing itself is tested in
// tests/config/scenario_config_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "config/scenario_config.h"

namespace kvroute::simulate::testing {

// The scenario `yaml` describes, read as test.yaml with relative paths from ".".
// A parse error fails the calling test (naming the error) and gives a default Scenario.
inline config::Scenario MustParse(const std::string& yaml) {
  config::ConfigOr<config::Scenario> load = config::ParseScenario(yaml, "test.yaml", ".");
  EXPECT_TRUE(load.ok()) << load.error.ToString();
  return load.ok() ? *load.value : config::Scenario{};
}

}  // namespace kvroute::simulate::testing
