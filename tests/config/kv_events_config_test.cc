// pool.kv_events and the per-endpoint kv_events addresses (issue 23): the contract's
// shapes, and errors naming file, line and field.
#include <gtest/gtest.h>

#include <string>

#include "config/core_options.h"
#include "config/endpoints_file.h"
#include "config/router_config.h"

#include "router_config_util.h"

namespace kvroute::config {
namespace {

using config_test::ParseErr;
using config_test::ParseOk;

TEST(KvEventsConfig, PerEndpointAddressesAndPoolDefaults) {
  RouterConfig c = ParseOk(R"(pool:
  endpoints:
    - address: 10.0.0.7:8000
      kv_events: tcp://10.0.0.7:5557
      kv_events_replay: tcp://10.0.0.7:5558
    - 10.0.0.8:8000
  kv_events:
    port: 5557
    replay_port: 5558
    block_size: 32
    speculative_ttl: 500ms
    stale_after: 4s
    resync: 20s
    replay_timeout: 250ms
    tokenizer: 10.0.0.9:8000
    tokenize_timeout: 300ms
)");
  ASSERT_EQ(c.pool.endpoints.size(), 2u);
  EXPECT_EQ(c.pool.endpoints[0].kv_events, "tcp://10.0.0.7:5557");
  EXPECT_EQ(c.pool.endpoints[0].kv_events_replay, "tcp://10.0.0.7:5558");
  EXPECT_EQ(c.pool.endpoints[1].kv_events, "");
  const KvEventsConfig& k = c.pool.kv_events;
  EXPECT_EQ(k.port, 5557);
  EXPECT_EQ(k.replay_port, 5558);
  EXPECT_EQ(k.bind, "");
  EXPECT_EQ(k.block_size, 32);
  EXPECT_DOUBLE_EQ(k.speculative_ttl_s, 0.5);
  EXPECT_DOUBLE_EQ(k.stale_after_s, 4.0);
  EXPECT_DOUBLE_EQ(k.resync_s, 20.0);
  EXPECT_DOUBLE_EQ(k.replay_timeout_s, 0.25);
  ASSERT_TRUE(k.tokenizer.has_value());
  EXPECT_EQ(k.tokenizer->ToString(), "10.0.0.9:8000");
  EXPECT_DOUBLE_EQ(k.tokenize_timeout_s, 0.3);
  routing::CoreOptions o = CoreOptionsFrom(c);
  EXPECT_EQ(o.kv_events.block_tokens, 32);
  EXPECT_DOUBLE_EQ(o.kv_events.speculative_ttl_s, 0.5);
  EXPECT_DOUBLE_EQ(o.kv_events.stale_after_s, 4.0);
  EXPECT_DOUBLE_EQ(o.kv_events.resync_s, 20.0);
}

TEST(KvEventsConfig, CentralizedBind) {
  RouterConfig c = ParseOk("pool:\n  kv_events: {bind: \"tcp://*:5557\"}\n");
  EXPECT_EQ(c.pool.kv_events.bind, "tcp://*:5557");
  EXPECT_EQ(c.pool.kv_events.port, 0);
  // Defaults when absent.
  RouterConfig d = ParseOk("pool: {}\n");
  EXPECT_EQ(d.pool.kv_events, KvEventsConfig{});
  EXPECT_EQ(d.pool.kv_events.block_size, 16);
}

TEST(KvEventsConfig, ErrorsNameFileLineAndField) {
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - address: 10.0.0.7:8000\n      kv_events: 10.0.0.7:5557\n"),
            "t.yaml:4: pool.endpoints[0].kv_events: '10.0.0.7:5557' is not a tcp://HOST:PORT address");
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - address: 10.0.0.7:8000\n      kv_events: tcp://h:0\n"),
            "t.yaml:4: pool.endpoints[0].kv_events: bad address 'tcp://h:0': port must be a number from 1 to 65535");
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - address: 10.0.0.7:8000\n"
                     "      kv_events_replay: tcp://h:5558\n"),
            "t.yaml:4: pool.endpoints[0].kv_events_replay: kv_events_replay needs kv_events");
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - address: 10.0.0.7:8000\n      kv_events: tcp://*:5557\n"),
            "t.yaml:4: pool.endpoints[0].kv_events: 'tcp://*:5557': host '*' is for "
            "pool.kv_events.bind; name the replica's host");
  EXPECT_EQ(ParseErr("pool:\n  kv_events:\n    port: 5557\n    bind: tcp://*:5557\n"),
            "t.yaml:4: pool.kv_events.bind: port (replicas publish, the router connects) and bind "
            "(replicas connect to the router) are exclusive; use one");
  EXPECT_EQ(ParseErr("pool:\n  kv_events:\n    replay_port: 5558\n"),
            "t.yaml:3: pool.kv_events.replay_port: replay_port needs port");
  EXPECT_EQ(ParseErr("pool:\n  kv_events:\n    port: 70000\n"),
            "t.yaml:3: pool.kv_events.port: must be <= 65535 (got 70000)");
  EXPECT_EQ(ParseErr("pool:\n  kv_events:\n    tokenizer: nohost\n"),
            "t.yaml:3: pool.kv_events.tokenizer: bad address 'nohost': expected host:port");
  EXPECT_EQ(ParseErr("pool:\n  kv_events:\n    blok_size: 16\n"),
            "t.yaml:3: pool.kv_events.blok_size: unknown key 'blok_size' (did you mean 'block_size'?)");
}

TEST(KvEventsConfig, EndpointsFileEntriesCarryAddresses) {
  ConfigOr<std::vector<EndpointConfig>> r = ParseEndpointsFile(
      "- address: 10.0.0.7:8000\n  kv_events: tcp://10.0.0.7:5557\n- 10.0.0.8:8000\n", "eps.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ((*r.value)[0].kv_events, "tcp://10.0.0.7:5557");
  EXPECT_EQ((*r.value)[1].kv_events, "");
  ConfigOr<std::vector<EndpointConfig>> bad =
      ParseEndpointsFile("- address: 10.0.0.7:8000\n  kv_events: udp://x:1\n", "eps.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error.ToString(),
            "eps.yaml:2: endpoints[0].kv_events: 'udp://x:1' is not a tcp://HOST:PORT address");
}

}  // namespace
}  // namespace kvroute::config
