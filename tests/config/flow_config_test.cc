// The `flow:` section of the router configuration (flow control in `kvroute serve`).
#include <gtest/gtest.h>

#include <string>

#include "config/router_config.h"

#include "router_config_util.h"

namespace kvroute::config {
namespace {

using config_test::ParseErr;

TEST(FlowConfigTest, OffWithTheQueueDefaultsWhenAbsent) {
  ConfigOr<RouterConfig> r = ParseRouterConfig("pool: {endpoints: [127.0.0.1:1]}\n", "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  const FlowConfig& f = r.value->flow;
  EXPECT_FALSE(f.enabled);
  EXPECT_TRUE(f.flow_header.empty());
  const flow::FlowOptions d;
  EXPECT_EQ(f.options.max_requests, d.max_requests);
  EXPECT_EQ(f.options.max_bytes, d.max_bytes);
  EXPECT_EQ(f.options.default_ttl_s, d.default_ttl_s);
  EXPECT_EQ(f.options.no_endpoint_ttl_s, d.no_endpoint_ttl_s);
  EXPECT_EQ(f.options.fairness, flow::Fairness::kRoundRobin);
  EXPECT_EQ(f.options.ordering, flow::Ordering::kFcfs);
  EXPECT_EQ(f.options.affinity_window, d.affinity_window);
  EXPECT_EQ(f.options.max_affinity_skips, d.max_affinity_skips);
  EXPECT_EQ(f.options.sheddable_reserve, 0);
  EXPECT_TRUE(f.options.slo_aware);
  EXPECT_EQ(f.options.slo_admit_fraction, 0.5);
  EXPECT_EQ(f.options.slo_release_fraction, 0.15);
}

TEST(FlowConfigTest, ReadsEveryKey) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(
      "flow:\n  enabled: true\n  max_requests: 100\n  max_bytes: 2MiB\n  ttl: 1500ms\n"
      "  no_endpoint_ttl: 250ms\n  fairness: global\n  ordering: earliest_deadline\n"
      "  flow_header: x-tenant-id\n  affinity_window: 4\n  max_affinity_skips: 0\n"
      "  sheddable_reserve: 3\n  slo_aware: false\n  slo_admit_fraction: 0.25\n"
      "  slo_release_fraction: 0.1\n",
      "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  const FlowConfig& f = r.value->flow;
  EXPECT_TRUE(f.enabled);
  EXPECT_EQ(f.options.max_requests, 100u);
  EXPECT_EQ(f.options.max_bytes, 2u << 20);
  EXPECT_DOUBLE_EQ(f.options.default_ttl_s, 1.5);
  EXPECT_DOUBLE_EQ(f.options.no_endpoint_ttl_s, 0.25);
  EXPECT_EQ(f.options.fairness, flow::Fairness::kGlobal);
  EXPECT_EQ(f.options.ordering, flow::Ordering::kEarliestDeadline);
  EXPECT_EQ(f.flow_header, "x-tenant-id");
  EXPECT_EQ(f.options.affinity_window, 4u);
  EXPECT_EQ(f.options.max_affinity_skips, 0u);
  EXPECT_EQ(f.options.sheddable_reserve, 3);
  EXPECT_FALSE(f.options.slo_aware);
  EXPECT_EQ(f.options.slo_admit_fraction, 0.25);
  EXPECT_EQ(f.options.slo_release_fraction, 0.1);
  EXPECT_TRUE(flow::Validate(f.options).ok());
}

TEST(FlowConfigTest, ErrorsNameFileLineAndField) {
  EXPECT_EQ(ParseErr("flow:\n  enabled: yes please\n"),
            "t.yaml:2: flow.enabled: must be true or false (got 'yes please')");
  EXPECT_EQ(ParseErr("flow:\n  slo_admit_fraction: 2\n"),
            "t.yaml:2: flow.slo_admit_fraction: must be between 0 and 1 (got 2)");
  EXPECT_EQ(ParseErr("flow:\n  enabled: true\n  slo_release_fraction: -0.5\n"),
            "t.yaml:3: flow.slo_release_fraction: must be between 0 and 1 (got -0.5)");
  EXPECT_EQ(ParseErr("flow:\n  slo_aware: 1\n"),
            "t.yaml:2: flow.slo_aware: must be true or false (got '1')");
  EXPECT_EQ(ParseErr("flow:\n  max_requests: 0\n"),
            "t.yaml:2: flow.max_requests: must be >= 1 (got 0)");
  EXPECT_EQ(ParseErr("flow:\n  enabled: true\n  ttl: 0\n"),
            "t.yaml:3: flow.ttl: must be > 0 (got '0')");
  EXPECT_EQ(ParseErr("flow:\n  fairness: fair\n"),
            "t.yaml:2: flow.fairness: unknown fairness 'fair' (known: round_robin, global)");
  EXPECT_EQ(ParseErr("flow:\n  ordering: edf\n"),
            "t.yaml:2: flow.ordering: unknown ordering 'edf' (known: fcfs, earliest_deadline)");
  EXPECT_EQ(ParseErr("flow:\n  affinity_window: 65\n"),
            "t.yaml:2: flow.affinity_window: must be <= 64 (got 65)");
  EXPECT_EQ(ParseErr("flow:\n  sheddable_reserve: 5\n"),
            "t.yaml:2: flow.sheddable_reserve: must be <= 4 (got 5)");
  EXPECT_EQ(ParseErr("flow:\n  flow_header: \"x tenant\"\n"),
            "t.yaml:2: flow.flow_header: must be an HTTP header name (got 'x tenant')");
  EXPECT_EQ(ParseErr("flow:\n  max_request: 3\n"),
            "t.yaml:2: flow.max_request: unknown key 'max_request' (did you mean "
            "'max_requests'?)");
}

}  // namespace
}  // namespace kvroute::config
