// The `epp:` section of the router configuration (`kvroute epp`'s own keys).
#include <gtest/gtest.h>

#include "config/router_config.h"

namespace kvroute::config {
namespace {

TEST(EppConfigTest, DefaultsWhenAbsent) {
  ConfigOr<RouterConfig> r = ParseRouterConfig("pool: {endpoints: [127.0.0.1:1]}\n", "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->epp.body_mode, EppBodyMode::kFullDuplexStreamed);
  EXPECT_EQ(r.value->epp.fallbacks, 2);
  EXPECT_EQ(r.value->epp.stream_timeout_s, 60.0);
  EXPECT_TRUE(r.value->epp.objectives.empty());
}

TEST(EppConfigTest, ReadsEveryKey) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(
      "epp:\n  body_mode: buffered\n  fallbacks: 0\n  stream_timeout: 500ms\n"
      "  objectives: {batch: -1, chat: 10}\n",
      "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->epp.body_mode, EppBodyMode::kBuffered);
  EXPECT_EQ(r.value->epp.fallbacks, 0);
  EXPECT_DOUBLE_EQ(r.value->epp.stream_timeout_s, 0.5);
  EXPECT_EQ(r.value->epp.objectives.at("batch"), -1);
  EXPECT_EQ(r.value->epp.objectives.at("chat"), 10);
  EXPECT_TRUE(r.value->epp.objective_slos.empty());
  r = ParseRouterConfig("epp: {body_mode: streamed}\n", "t.yaml");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value->epp.body_mode, EppBodyMode::kStreamed);
}

TEST(EppConfigTest, ErrorsNameFileLineAndField) {
  auto error = [](const char* text) {
    ConfigOr<RouterConfig> r = ParseRouterConfig(text, "t.yaml");
    EXPECT_FALSE(r.ok());
    return r.error.ToString();
  };
  EXPECT_NE(error("epp:\n  body_mode: duplex\n").find("t.yaml:2"), std::string::npos);
  EXPECT_NE(error("epp:\n  body_mode: duplex\n").find("epp.body_mode"), std::string::npos);
  EXPECT_NE(error("epp:\n  fallbacks: 9\n").find("epp.fallbacks"), std::string::npos);
  EXPECT_NE(error("epp:\n  stream_timeout: -1s\n").find("epp.stream_timeout"), std::string::npos);
  EXPECT_NE(error("epp:\n  objectives: {a: x}\n").find("epp.objectives.a"), std::string::npos);
  EXPECT_NE(error("epp:\n  fallback: 1\n").find("did you mean 'fallbacks'"), std::string::npos);
  EXPECT_NE(error("epp:\n  objectives:\n    chat: {slo: {ttfb: 1s}}\n").find("t.yaml:3"),
            std::string::npos);
  EXPECT_NE(error("epp:\n  objectives:\n    chat: {slo: {ttfb: 1s}}\n").find("did you mean 'ttft'"),
            std::string::npos);
  EXPECT_NE(error("epp:\n  objectives:\n    chat: {priority: high}\n").find("epp.objectives.chat.priority"),
            std::string::npos);
  EXPECT_NE(error("epp:\n  objectives:\n    chat: {slo: {ttft: soon}}\n").find("epp.objectives.chat.slo.ttft"),
            std::string::npos);
}

// An objective with its own latency objectives (issue 24): `NAME: {priority, slo}`.
TEST(EppConfigTest, ObjectivesMayCarryTheirOwnSlo) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(
      "epp:\n  objectives:\n    batch: -1\n    chat: {priority: 10, slo: {ttft: 500ms, tpot: 40ms}}\n"
      "    voice: {slo: {ttft: 200ms}}\n",
      "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  const EppConfig& e = r.value->epp;
  EXPECT_EQ(e.objectives.size(), 3u);
  EXPECT_EQ(e.objectives.at("batch"), -1);
  EXPECT_EQ(e.objectives.at("chat"), 10);
  EXPECT_EQ(e.objectives.at("voice"), 0);  // priority defaults to 0
  ASSERT_EQ(e.objective_slos.size(), 2u);
  EXPECT_EQ(e.objective_slos.at("chat"), (SloConfig{0.5, 0.04}));
  EXPECT_EQ(e.objective_slos.at("voice"), (SloConfig{0.2, 0.0}));
}

}  // namespace
}  // namespace kvroute::config
