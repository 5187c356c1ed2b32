// The `locality:` section of the router configuration (several regions; serve and epp).
#include <gtest/gtest.h>

#include <string>

#include "config/router_config.h"

#include "router_config_util.h"

namespace kvroute::config {
namespace {

using config_test::ParseErr;

TEST(LocalityConfigTest, OffAndMeasuringWhenAbsent) {
  ConfigOr<RouterConfig> r = ParseRouterConfig("pool: {endpoints: [127.0.0.1:1]}\n", "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_TRUE(r.value->locality.region.empty());
  EXPECT_TRUE(r.value->locality.rtt_s.empty());
  EXPECT_TRUE(r.value->locality.measure_rtt);
}

TEST(LocalityConfigTest, ReadsEveryKeyAndEndpointRegions) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(
      "pool:\n"
      "  endpoints:\n"
      "    - {address: 127.0.0.1:1, labels: {region: us-east}}\n"
      "    - {address: 127.0.0.1:2, labels: {topology.kubernetes.io/region: eu-west}}\n"
      "locality:\n"
      "  region: us-east\n"
      "  rtt: {eu-west: 80ms, ap-south: 0.15, same-site: 0s}\n"
      "  measure_rtt: false\n",
      "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  const LocalityConfig& l = r.value->locality;
  EXPECT_EQ(l.region, "us-east");
  ASSERT_EQ(l.rtt_s.size(), 3u);
  EXPECT_EQ(l.rtt_s[0].first, "eu-west");
  EXPECT_DOUBLE_EQ(l.rtt_s[0].second, 0.08);
  EXPECT_EQ(l.rtt_s[1].first, "ap-south");
  EXPECT_DOUBLE_EQ(l.rtt_s[1].second, 0.15);
  EXPECT_DOUBLE_EQ(l.rtt_s[2].second, 0.0);
  EXPECT_FALSE(l.measure_rtt);
  EXPECT_EQ(r.value->pool.endpoints[1].labels.at("topology.kubernetes.io/region"), "eu-west");
}

TEST(LocalityConfigTest, ErrorsNameFileLineAndField) {
  EXPECT_EQ(ParseErr("locality:\n  regoin: us-east\n"),
            "t.yaml:2: locality.regoin: unknown key 'regoin' (did you mean 'region'?)");
  EXPECT_EQ(ParseErr("locality:\n  region: us east\n"),
            "t.yaml:2: locality.region: 'us east' is not a region name (no spaces, commas or quotes)");
  EXPECT_EQ(ParseErr("locality:\n  region: [a]\n"), "t.yaml:2: locality.region: must be a string");
  EXPECT_EQ(ParseErr("locality:\n  region: us-east\n  rtt: [80ms]\n"),
            "t.yaml:3: locality.rtt: must be a mapping of region to round trip");
  EXPECT_EQ(ParseErr("locality:\n  rtt:\n    eu-west: 80ms\n    ap-south: fast\n"),
            "t.yaml:4: locality.rtt.ap-south: must be a duration such as 80ms (got 'fast')");
  EXPECT_EQ(ParseErr("locality:\n  rtt: {eu-west: -5ms}\n"),
            "t.yaml:2: locality.rtt.eu-west: must be a duration such as 80ms (got '-5ms')");
  EXPECT_EQ(ParseErr("locality:\n  rtt:\n    eu-west: 80ms\n    eu-west: 90ms\n"),
            "t.yaml:4: locality.rtt.eu-west: duplicate key 'eu-west'");
  EXPECT_EQ(ParseErr("locality:\n  measure_rtt: sometimes\n"),
            "t.yaml:2: locality.measure_rtt: must be true or false (got 'sometimes')");
  EXPECT_EQ(ParseErr("locality: [us-east]\n"), "t.yaml:1: locality: must be a mapping");
}

TEST(LocalityConfigTest, RegionNames) {
  EXPECT_EQ(CheckRegionName("").ToString(), "OK");
  EXPECT_EQ(CheckRegionName("us-east1").ToString(), "OK");
  EXPECT_EQ(CheckRegionName("eu_west.2").ToString(), "OK");
  EXPECT_FALSE(CheckRegionName("a,b").ok());
  EXPECT_FALSE(CheckRegionName("a\tb").ok());
  EXPECT_FALSE(CheckRegionName("\"q\"").ok());
}

}  // namespace
}  // namespace kvroute::config
