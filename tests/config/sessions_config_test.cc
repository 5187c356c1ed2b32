// The `sessions:` section of the router configuration (session affinity; serve and epp).
#include <gtest/gtest.h>

#include <string>

#include "config/core_options.h"
#include "config/router_config.h"

#include "router_config_util.h"

namespace kvroute::config {
namespace {

using config_test::ParseErr;
using config_test::ParseOk;

TEST(SessionsConfigTest, OnWithTheReferenceDefaultsWhenAbsent) {
  const RouterConfig c = ParseOk("pool: {endpoints: [127.0.0.1:1]}\n");
  EXPECT_TRUE(c.sessions.enabled);
  EXPECT_DOUBLE_EQ(c.sessions.ttl_s, 300.0);
  EXPECT_EQ(c.sessions.max_sessions, 100000u);
  EXPECT_EQ(c.sessions.header, "x-session-id");
  EXPECT_EQ(c.sessions.token_header, "x-session-token");
}

TEST(SessionsConfigTest, ReadsEveryKeyIntoTheCoreOptions) {
  const RouterConfig c = ParseOk(
      "pool: {endpoints: [127.0.0.1:1]}\n"
      "sessions:\n"
      "  enabled: false\n"
      "  ttl: 90s\n"
      "  max_sessions: 12\n"
      "  header: X-Conversation\n"
      "  token_header: x-route-token\n");
  EXPECT_FALSE(c.sessions.enabled);
  EXPECT_DOUBLE_EQ(c.sessions.ttl_s, 90.0);
  EXPECT_EQ(c.sessions.max_sessions, 12u);
  EXPECT_EQ(c.sessions.header, "x-conversation");  // compared lower case
  EXPECT_EQ(c.sessions.token_header, "x-route-token");
  const routing::CoreOptions o = CoreOptionsFrom(c);
  EXPECT_FALSE(o.sessions.enabled);
  EXPECT_DOUBLE_EQ(o.sessions.ttl_s, 90.0);
  EXPECT_EQ(o.sessions.max_sessions, 12u);
  EXPECT_EQ(o.sessions.header, "x-conversation");
}

TEST(SessionsConfigTest, ErrorsNameTheLineAndField) {
  EXPECT_EQ(ParseErr("sessions:\n  ttl: 0s\n").rfind("t.yaml:2: sessions.ttl: ", 0), 0u)
      << ParseErr("sessions:\n  ttl: 0s\n");
  EXPECT_EQ(ParseErr("sessions:\n  max_sessions: 0\n").rfind("t.yaml:2: sessions.max_sessions: ", 0), 0u);
  EXPECT_EQ(ParseErr("sessions:\n  header: \"bad header\"\n"),
            "t.yaml:2: sessions.header: must be an HTTP header name (got 'bad header')");
  EXPECT_EQ(ParseErr("sessions:\n  enabled: maybe\n").rfind("t.yaml:2: sessions.enabled: ", 0), 0u);
  EXPECT_EQ(ParseErr("sessions:\n  ttl: 1s\n  tll: 2s\n").rfind("t.yaml:3: sessions.tll: unknown key", 0), 0u)
      << ParseErr("sessions:\n  ttl: 1s\n  tll: 2s\n");
  EXPECT_EQ(ParseErr("sessions:\n  token_header: x-session-id\n"),
            "t.yaml:2: sessions: header and token_header must differ (both 'x-session-id')");
}

}  // namespace
}  // namespace kvroute::config
