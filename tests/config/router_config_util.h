// The router-config tests' two helpers: a text that must load, and one that must fail
// (its error as "file:line: field: message"). The file is always called "t.yaml".
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "config/router_config.h"

namespace kvroute::config::config_test {

inline RouterConfig ParseOk(std::string_view text) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(text, "t.yaml");
  EXPECT_TRUE(r.ok()) << r.error.ToString();
  return r.ok() ? *r.value : RouterConfig{};
}

inline std::string ParseErr(std::string_view text) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(text, "t.yaml");
  EXPECT_FALSE(r.ok()) << text;
  return r.error.ToString();
}

}  // namespace kvroute::config::config_test
