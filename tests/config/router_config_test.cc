#include "config/core_options.h"
#include "config/router_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <variant>

#include "core/sched/registry.h"
#include "support/test_paths.h"

#include "router_config_util.h"

namespace kvroute::config {
namespace {

using config_test::ParseErr;
using config_test::ParseOk;

TEST(RouterConfig, SeedYamlLoadsExactly) {
  const std::string path = kvroute::test_support::SourceDir() + "/examples/seed.yaml";
  ConfigOr<RouterConfig> r = LoadRouterConfig(path);
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  const RouterConfig& c = *r.value;
  EXPECT_EQ(c.listen, "0.0.0.0:8080");
  EXPECT_EQ(c.listen_addr.host, "0.0.0.0");
  EXPECT_EQ(c.listen_addr.port, 8080);
  ASSERT_EQ(c.pool.endpoints.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const EndpointConfig& ep = c.pool.endpoints[i];
    EXPECT_EQ(ep.address, "127.0.0.1:" + std::to_string(18001 + i));
    EXPECT_EQ(ep.name, ep.address);
    EXPECT_EQ(ep.host_port.host, "127.0.0.1");
    EXPECT_EQ(ep.host_port.port, 18001 + i);
    EXPECT_EQ(ep.line, 12 + i);
  }
  EXPECT_EQ(c.pool.engine_type, metrics::EngineType::kVllm);
  EXPECT_EQ(c.pool.metric_names.kv_usage, "vllm:kv_cache_usage_perc");
  EXPECT_DOUBLE_EQ(c.pool.scrape_interval_s, 0.05);
  EXPECT_DOUBLE_EQ(c.pool.staleness_s, 2.0);
  EXPECT_EQ(c.pool.stale_policy, StalePolicy::kExclude);

  const sched::SchedulingSpec& s = c.scheduling;
  EXPECT_EQ(s.policy, "");
  ASSERT_EQ(s.plugins.size(), 3u);
  EXPECT_EQ(s.plugins[0].type, "prefix-cache-scorer");
  EXPECT_EQ(s.plugins[1].type, "kv-cache-utilization-scorer");
  EXPECT_EQ(s.plugins[2].type, "queue-depth-scorer");
  EXPECT_EQ(s.plugins[0].name, "");  // defaults to type in the scheduler
  EXPECT_EQ(s.plugins[0].line, 23);
  EXPECT_EQ(s.plugins[1].line, 25);
  EXPECT_EQ(s.plugins[2].line, 26);
  ASSERT_EQ(s.profiles.size(), 1u);
  EXPECT_EQ(s.profiles[0].name, "default");
  ASSERT_EQ(s.profiles[0].plugins.size(), 3u);
  const char* refs[] = {"prefix-cache-scorer", "kv-cache-utilization-scorer",
                        "queue-depth-scorer"};
  const double weights[] = {3, 2, 1};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.profiles[0].plugins[i].plugin_ref, refs[i]);
    EXPECT_EQ(s.profiles[0].plugins[i].weight, weights[i]);
    EXPECT_EQ(s.profiles[0].plugins[i].line, 28 + 2 * i);
  }
  // It is the scheduler's own rendering of the article, and it builds.
  const sched::SchedulingSpec article = sched::SeedArticleSpec();
  ASSERT_EQ(article.profiles.size(), 1u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(article.profiles[0].plugins[i].plugin_ref, s.profiles[0].plugins[i].plugin_ref);
    EXPECT_EQ(article.profiles[0].plugins[i].weight, s.profiles[0].plugins[i].weight);
  }
  EXPECT_TRUE(sched::BuildScheduler(s).ok());
}

TEST(RouterConfig, EmptyTextGivesDefaults) {
  RouterConfig c = ParseOk("");
  EXPECT_EQ(c.listen, "0.0.0.0:8080");
  EXPECT_EQ(c.threads, 0);
  EXPECT_TRUE(c.pool.endpoints.empty());
  EXPECT_DOUBLE_EQ(c.pool.scrape_interval_s, 0.05);
  EXPECT_DOUBLE_EQ(c.pool.staleness_s, 2.0);
  EXPECT_EQ(c.limits.max_body_bytes, 16u << 20);
  EXPECT_EQ(c.limits.max_header_bytes, 64u << 10);
  EXPECT_EQ(c.limits.max_headers, 100u);
  EXPECT_DOUBLE_EQ(c.timeouts.connect_s, 2.0);
  EXPECT_DOUBLE_EQ(c.timeouts.first_byte_s, 120.0);
  EXPECT_DOUBLE_EQ(c.timeouts.idle_s, 60.0);
  EXPECT_EQ(c.retries.max_attempts, 2);
  EXPECT_FALSE(c.allow_routing_headers);
  EXPECT_TRUE(c.scheduling.plugins.empty());
  EXPECT_TRUE(c.scheduling.profiles.empty());
  EXPECT_EQ(c.scheduling.policy, "");
  // Comments only is also empty.
  EXPECT_EQ(ParseOk("# nothing here\n").listen, "0.0.0.0:8080");
}

TEST(RouterConfig, EveryField) {
  RouterConfig c = ParseOk(R"(listen: "[::1]:9000"
threads: 4
pool:
  metric_names:
    waiting: my:queue
    kv_usage_old: ""
    lora_info: my:loras
    max_lora_label: cap
  engine_type: sglang
  model: qwen
  scrape_interval: 250us
  staleness: 0.5
  stale_policy: saturated
  endpoints:
    - address: 10.0.0.1:8000
      name: eu-1
      labels: {region: eu, gpu: h100}
    - address: "[fe80::1]:8000"
scheduling:
  plugins:
    - type: prefix-cache-scorer
      name: prefix
      parameters: {blockSize: 32, lruCapacityPerServer: 1000}
    - type: max-score-picker
  schedulingProfiles:
    - name: main
      plugins:
        - pluginRef: prefix
          weight: 2.5
        - pluginRef: max-score-picker
limits: {max_body_bytes: 1MiB, max_header_bytes: 8192, max_headers: 50}
timeouts: {connect: 1s, first_byte: 1m, idle: 1500ms}
retries: {max_attempts: 3}
allow_routing_headers: true
)");
  EXPECT_EQ(c.listen_addr.host, "::1");
  EXPECT_EQ(c.listen_addr.port, 9000);
  EXPECT_EQ(c.listen_addr.ToString(), "[::1]:9000");
  EXPECT_EQ(c.threads, 4);
  EXPECT_EQ(c.pool.engine_type, metrics::EngineType::kSglang);
  EXPECT_EQ(c.pool.metric_names.waiting, "my:queue");              // override
  EXPECT_EQ(c.pool.metric_names.running, "sglang:num_running_reqs");  // engine default
  EXPECT_EQ(c.pool.metric_names.kv_usage_old, "");
  EXPECT_EQ(c.pool.metric_names.lora_info, "my:loras");  // SGLang has none by default
  EXPECT_EQ(c.pool.metric_names.max_lora_label, "cap");
  EXPECT_EQ(c.pool.metric_names.running_loras_label, "");
  EXPECT_EQ(c.pool.model, "qwen");
  EXPECT_DOUBLE_EQ(c.pool.scrape_interval_s, 250e-6);
  EXPECT_DOUBLE_EQ(c.pool.staleness_s, 0.5);
  EXPECT_EQ(c.pool.stale_policy, StalePolicy::kSaturated);
  ASSERT_EQ(c.pool.endpoints.size(), 2u);
  EXPECT_EQ(c.pool.endpoints[0].name, "eu-1");
  EXPECT_EQ(c.pool.endpoints[0].labels.at("region"), "eu");
  EXPECT_EQ(c.pool.endpoints[0].labels.at("gpu"), "h100");
  EXPECT_EQ(c.pool.endpoints[1].name, "[fe80::1]:8000");
  EXPECT_EQ(c.pool.endpoints[1].host_port.host, "fe80::1");
  ASSERT_EQ(c.scheduling.plugins.size(), 2u);
  EXPECT_EQ(c.scheduling.plugins[0].name, "prefix");
  EXPECT_EQ(std::get<double>(c.scheduling.plugins[0].parameters.at("blockSize")), 32.0);
  ASSERT_EQ(c.scheduling.profiles.size(), 1u);
  EXPECT_EQ(c.scheduling.profiles[0].name, "main");
  EXPECT_EQ(c.scheduling.profiles[0].plugins[0].weight, 2.5);
  EXPECT_EQ(c.scheduling.profiles[0].plugins[1].weight, 1.0);  // missing weight is 1
  EXPECT_EQ(c.limits.max_body_bytes, 1u << 20);
  EXPECT_EQ(c.limits.max_header_bytes, 8192u);
  EXPECT_EQ(c.limits.max_headers, 50u);
  EXPECT_DOUBLE_EQ(c.timeouts.connect_s, 1.0);
  EXPECT_DOUBLE_EQ(c.timeouts.first_byte_s, 60.0);
  EXPECT_DOUBLE_EQ(c.timeouts.idle_s, 1.5);
  EXPECT_EQ(c.retries.max_attempts, 3);
  EXPECT_TRUE(c.allow_routing_headers);
}

TEST(RouterConfig, PolicyByName) {
  RouterConfig c = ParseOk("scheduling:\n  policy: round-robin\n");
  EXPECT_EQ(c.scheduling.policy, "round-robin");
  EXPECT_TRUE(c.scheduling.plugins.empty());
}

TEST(RouterConfig, ParameterValueTypes) {
  RouterConfig c = ParseOk(R"(plugins:
  - type: saturation-filter
    parameters: {kvThreshold: 0.9, queueThreshold: 7}
)");
  const auto& p = c.scheduling.plugins[0].parameters;
  EXPECT_EQ(std::get<double>(p.at("kvThreshold")), 0.9);
  EXPECT_EQ(std::get<double>(p.at("queueThreshold")), 7.0);
}

// The seed article's block with one weight changed; used by several error tests.
constexpr const char* kSeedBlock = R"(plugins:
  - type: prefix-cache-scorer
  - type: kv-cache-utilization-scorer
  - type: queue-depth-scorer
schedulingProfile:
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: kv-cache-utilization-scorer
    weight: WEIGHT
  - pluginRef: queue-depth-scorer
    weight: 1
)";

std::string SeedWithWeight(std::string_view w) {
  std::string s = kSeedBlock;
  s.replace(s.find("WEIGHT"), 6, w);
  return s;
}

TEST(RouterConfigErrors, NegativeWeight) {
  EXPECT_EQ(ParseErr(SeedWithWeight("-1")),
            "t.yaml:9: schedulingProfile[1].weight: weight must be >= 0 (got -1)");
  EXPECT_EQ(ParseErr(SeedWithWeight("-0.5")),
            "t.yaml:9: schedulingProfile[1].weight: weight must be >= 0 (got -0.5)");
  EXPECT_EQ(ParseErr(SeedWithWeight(".inf")),
            "t.yaml:9: schedulingProfile[1].weight: weight must be a finite number (got .inf)");
  EXPECT_EQ(ParseErr(SeedWithWeight("heavy")),
            "t.yaml:9: schedulingProfile[1].weight: must be a number (got 'heavy')");
  EXPECT_EQ(ParseErr(SeedWithWeight("\"2\"")),
            "t.yaml:9: schedulingProfile[1].weight: must be a number (got '2')");
  EXPECT_EQ(ParseOk(SeedWithWeight("0")).scheduling.profiles[0].plugins[1].weight, 0.0);
}

TEST(RouterConfigErrors, DanglingPluginRef) {
  std::string text = SeedWithWeight("2");
  text.replace(text.find("pluginRef: queue-depth-scorer"), 29, "pluginRef: queue-scorer");
  EXPECT_EQ(ParseErr(text),
            "t.yaml:10: schedulingProfile[2].pluginRef: pluginRef 'queue-scorer' names no "
            "plugin in plugins");
  // The same under `scheduling:` with the schedulingProfiles form.
  EXPECT_EQ(ParseErr(R"(scheduling:
  plugins:
    - type: kv-cache-utilization-scorer
  schedulingProfiles:
    - name: default
      plugins:
        - pluginRef: kv-cache-utilization-scorer
        - pluginRef: nope
)"),
            "t.yaml:8: scheduling.schedulingProfiles[0].plugins[1].pluginRef: pluginRef 'nope' "
            "names no plugin in plugins");
}

TEST(RouterConfigErrors, UnknownPluginType) {
  std::string text = SeedWithWeight("2");
  text.replace(text.find("type: queue-depth-scorer"), 24, "type: queue-depht-scorer");
  EXPECT_EQ(ParseErr(text), "t.yaml:4: plugins[2].type: unknown plugin type 'queue-depht-scorer'");
}

TEST(RouterConfigErrors, DuplicatePluginName) {
  EXPECT_EQ(ParseErr(R"(plugins:
  - type: queue-depth-scorer
  - type: queue-scorer
    name: queue-depth-scorer
)"),
            "t.yaml:3: plugins[1].name: duplicate plugin name 'queue-depth-scorer'");
}

TEST(RouterConfigErrors, BadParameterFromScheduler) {
  EXPECT_EQ(ParseErr(R"(plugins:
  - type: kv-cache-utilization-scorer
  - type: prefix-cache-scorer
    parameters:
      blockSize: 64
      blokSize: 16
)"),
            "t.yaml:3: plugins[1].parameters.blokSize: unknown parameter 'blokSize' for plugin "
            "type 'prefix-cache-scorer' (known: blockSize, maxPrefixBlocksToMatch, "
            "lruCapacityPerServer, preciseEvents, speculativeWeight, minMaxNormalize)");
}

TEST(RouterConfigTest, SchedulingSloIsThePoolDefaultObjective) {
  RouterConfig c = ParseOk("scheduling:\n  policy: kvroute\n  slo: {ttft: 2s, tpot: 50ms}\n");
  EXPECT_DOUBLE_EQ(c.slo.ttft_s, 2.0);
  EXPECT_DOUBLE_EQ(c.slo.tpot_s, 0.05);
  EXPECT_EQ(c.scheduling.policy, "kvroute");
  const routing::CoreOptions o = CoreOptionsFrom(c);
  EXPECT_DOUBLE_EQ(o.default_slo_ttft_s, 2.0);
  EXPECT_DOUBLE_EQ(o.default_slo_tpot_s, 0.05);
  EXPECT_EQ(ParseOk("").slo.ttft_s, 0.0);
  EXPECT_EQ(ParseErr("scheduling:\n  slo: {ttft: 0s}\n").substr(0, 27), "t.yaml:2: scheduling.slo.tt");
  EXPECT_NE(ParseErr("scheduling:\n  slo: {e2e: 1s}\n").find("scheduling.slo"), std::string::npos);
}

TEST(RouterConfigTest, SchedulingPdIsTheDecidersThresholds) {
  RouterConfig c = ParseOk("scheduling:\n  pd: {non_cached_tokens: 512, prompt_tokens: 1024}\n");
  EXPECT_EQ(c.pd.non_cached_tokens, 512);
  EXPECT_EQ(c.pd.prompt_tokens, 1024);
  const routing::CoreOptions o = CoreOptionsFrom(c);
  EXPECT_EQ(o.pd.non_cached_tokens, 512);
  EXPECT_EQ(o.pd.prompt_tokens, 1024);
  EXPECT_EQ(ParseOk("").pd.non_cached_tokens, 256);  // documented defaults
  EXPECT_EQ(ParseOk("").pd.prompt_tokens, 256);
  EXPECT_EQ(ParseErr("scheduling:\n  pd:\n    prompt_tokens: -1\n").substr(0, 37),
            "t.yaml:3: scheduling.pd.prompt_tokens");
  EXPECT_NE(ParseErr("scheduling:\n  pd: {tokens: 5}\n").find("scheduling.pd"), std::string::npos);
}

TEST(RouterConfigErrors, PolicyErrors) {
  EXPECT_EQ(ParseErr("scheduling:\n  policy: fastest\n"),
            "t.yaml:2: scheduling.policy: unknown policy 'fastest' (known: round-robin, random, "
            "least-request, gie-default, sglang-cache-aware, dynamo-cost, dynamo-kv, llm-d-sticky, "
            "llm-d-precise, kvroute)");
  EXPECT_EQ(ParseErr("policy: random\nplugins:\n  - type: random-picker\n"),
            "t.yaml:3: policy: a named policy cannot be combined with plugins or "
            "schedulingProfiles");
}

TEST(RouterConfigErrors, UnknownKeys) {
  EXPECT_EQ(ParseErr("listen: 0.0.0.0:80\npool:\n  staleness: 2s\n  scrape_intervl: 50ms\n"),
            "t.yaml:4: pool.scrape_intervl: unknown key 'scrape_intervl' (did you mean "
            "'scrape_interval'?)");
  EXPECT_EQ(ParseErr("pool:\n  scrape_intervall: 50ms\n"),
            "t.yaml:2: pool.scrape_intervall: unknown key 'scrape_intervall' (did you mean "
            "'scrape_interval'?)");
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - adress: 1.2.3.4:80\n"),
            "t.yaml:3: pool.endpoints[0].adress: unknown key 'adress' (did you mean 'address'?)");
  EXPECT_EQ(ParseErr("listen: 0.0.0.0:80\nfoo: 1\n"),
            "t.yaml:2: foo: unknown key 'foo' (known: listen, listen_tls, upstream_tls, threads, pool, scheduling, "
            "limits, timeouts, retries, outlier_detection, allow_routing_headers, epp, "
            "flow, locality, sessions, auth, capture, policy, plugins, schedulingProfiles, schedulingProfile)");
  EXPECT_EQ(ParseErr("schedulingProfile:\n  - pluginRef: a\n    wieght: 3\n"),
            "t.yaml:3: schedulingProfile[0].wieght: unknown key 'wieght' (did you mean "
            "'weight'?)");
  EXPECT_EQ(ParseErr("pool:\n  metric_names: {queue: q}\n"),
            "t.yaml:2: pool.metric_names.queue: unknown metric name key 'queue' (known: running, "
            "waiting, kv_usage, kv_usage_old, prefix_queries, prefix_queries_old, prefix_hits, "
            "prefix_hits_old, preemptions, cache_info, block_size_label, num_blocks_label, "
            "engine_label, model_label, lora_info, max_lora_label, running_loras_label, "
            "waiting_loras_label, swapped)");
  EXPECT_EQ(ParseErr("threads: 1\nthreads: 2\n"), "t.yaml:2: threads: duplicate key 'threads'");
}

TEST(RouterConfigErrors, BadAddresses) {
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - 127.0.0.1\n"),
            "t.yaml:3: pool.endpoints[0]: bad address '127.0.0.1': expected host:port");
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - name: a\n      address: 127.0.0.1:70000\n"),
            "t.yaml:4: pool.endpoints[0].address: bad address '127.0.0.1:70000': port must be a "
            "number from 1 to 65535");
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - :8000\n"),
            "t.yaml:3: pool.endpoints[0]: bad address ':8000': missing host");
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - name: x\n"),
            "t.yaml:3: pool.endpoints[0].address: missing address");
  EXPECT_EQ(ParseErr("listen: localhost\n"),
            "t.yaml:1: listen: bad address 'localhost': expected host:port");
  EXPECT_EQ(ParseErr("listen: ::1:80\n"),
            "t.yaml:1: listen: bad address '::1:80': IPv6 addresses must be written [addr]:port");
}

TEST(RouterConfigErrors, DuplicateEndpoints) {
  EXPECT_EQ(ParseErr(R"(pool:
  endpoints:
    - {address: 127.0.0.1:1, name: a}
    - {address: 127.0.0.1:2, name: a}
)"),
            "t.yaml:4: pool.endpoints[1]: duplicate endpoint name 'a' (first at line 3)");
  EXPECT_EQ(ParseErr(R"(pool:
  endpoints:
    - 127.0.0.1:1
    - {address: 127.0.0.1:1, name: b}
)"),
            "t.yaml:4: pool.endpoints[1]: duplicate endpoint address '127.0.0.1:1' (first at "
            "line 3)");
}

TEST(RouterConfigErrors, WrongTypes) {
  EXPECT_EQ(ParseErr("threads: many\n"), "t.yaml:1: threads: must be an integer (got 'many')");
  EXPECT_EQ(ParseErr("threads: -1\n"), "t.yaml:1: threads: must be >= 0 (got -1)");
  EXPECT_EQ(ParseErr("allow_routing_headers: yes please\n"),
            "t.yaml:1: allow_routing_headers: must be true or false (got 'yes please')");
  EXPECT_EQ(ParseErr("pool:\n  endpoints: 5\n"),
            "t.yaml:2: pool.endpoints: must be a list of endpoints");
  EXPECT_EQ(ParseErr("pool: [a]\n"), "t.yaml:1: pool: must be a mapping");
  EXPECT_EQ(ParseErr("listen: [a]\n"), "t.yaml:1: listen: must be a string");
  EXPECT_EQ(ParseErr("pool:\n  engine_type: trt\n"),
            "t.yaml:2: pool.engine_type: unknown engine type 'trt' (known: vllm, sglang)");
  EXPECT_EQ(ParseErr("pool:\n  stale_policy: drop\n"),
            "t.yaml:2: pool.stale_policy: unknown stale policy 'drop' (known: exclude, "
            "saturated)");
  EXPECT_EQ(ParseErr("limits:\n  max_body_bytes: 16 MiB\n"),
            "t.yaml:2: limits.max_body_bytes: must be a size such as 16MiB, 64KiB or 1048576 "
            "(got '16 MiB')");
  EXPECT_EQ(ParseErr("retries: {max_attempts: 0}\n"),
            "t.yaml:1: retries.max_attempts: must be >= 1 (got 0)");
  EXPECT_EQ(ParseErr("plugins:\n  - prefix-cache-scorer\n"),
            "t.yaml:2: plugins[0]: must be a mapping with a type");
  EXPECT_EQ(ParseErr("plugins:\n  - name: x\n"), "t.yaml:2: plugins[0].type: missing plugin type");
  EXPECT_EQ(ParseErr("- a\n- b\n"), "t.yaml:1: the top level must be a mapping");
}

TEST(RouterConfigErrors, DurationErrors) {
  EXPECT_EQ(ParseErr("pool:\n  scrape_interval: fast\n"),
            "t.yaml:2: pool.scrape_interval: must be a duration such as 50ms, 2s or 0.5 "
            "(seconds) (got 'fast')");
  EXPECT_EQ(ParseErr("pool:\n  scrape_interval: 0ms\n"),
            "t.yaml:2: pool.scrape_interval: must be > 0 (got '0ms')");
  EXPECT_EQ(ParseErr("timeouts:\n  idle: -5s\n"),
            "t.yaml:2: timeouts.idle: must be a duration such as 50ms, 2s or 0.5 (seconds) (got "
            "'-5s')");
  EXPECT_EQ(ParseErr("pool:\n  scrape_interval: 5s\n  staleness: 1s\n"),
            "t.yaml:3: pool.staleness: staleness (1.000000s) must be >= scrape_interval "
            "(5.000000s)");
}

TEST(RouterConfigErrors, ConflictingSchedulingForms) {
  EXPECT_EQ(ParseErr(R"(plugins:
  - type: queue-scorer
schedulingProfiles:
  - name: a
    plugins: [{pluginRef: queue-scorer}]
schedulingProfile:
  - pluginRef: queue-scorer
)"),
            "t.yaml:6: schedulingProfile: use either schedulingProfiles or schedulingProfile, "
            "not both");
  EXPECT_EQ(ParseErr("scheduling:\n  policy: random\nplugins:\n  - type: queue-scorer\n"),
            "t.yaml:3: plugins: scheduling keys given both at top level and under 'scheduling'; "
            "use one");
  EXPECT_EQ(ParseErr(R"(schedulingProfiles:
  - name: a
  - name: a
)"),
            "t.yaml:3: schedulingProfiles[1].name: duplicate profile name 'a' (first at line 2)");
}

TEST(RouterConfigErrors, YamlSyntax) {
  EXPECT_EQ(ParseErr("pool:\n  endpoints: [127.0.0.1:1, 127.0.0.1:2\nthreads: 2\n"),
            "t.yaml:3: YAML syntax error: end of sequence flow not found (column 8)");
  EXPECT_EQ(ParseErr("pool:\n\tendpoints: []\n"),
            "t.yaml:2: YAML syntax error: illegal map value (column 11)");
}

TEST(RouterConfigErrors, MissingFile) {
  ConfigOr<RouterConfig> r = LoadRouterConfig("/nonexistent/kvroute.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.ToString(), "/nonexistent/kvroute.yaml: cannot read file: No such file or directory");
}

TEST(HostPorts, Parse) {
  EXPECT_EQ(ParseHostPort("127.0.0.1:8000")->ToString(), "127.0.0.1:8000");
  EXPECT_EQ(ParseHostPort("vllm-0.svc:80")->host, "vllm-0.svc");
  EXPECT_EQ(ParseHostPort("[::1]:80")->host, "::1");
  std::string why;
  EXPECT_EQ(ParseHostPort("host:0", &why), std::nullopt);
  EXPECT_EQ(why, "port must be a number from 1 to 65535");
  EXPECT_EQ(ParseHostPort("host:", &why), std::nullopt);
  EXPECT_EQ(ParseHostPort("host:8x", &why), std::nullopt);
  EXPECT_EQ(ParseHostPort("http://host:80", &why), std::nullopt);
  EXPECT_EQ(why, "invalid character '/' in host");
  EXPECT_EQ(ParseHostPort("[::1]80", &why), std::nullopt);
  EXPECT_EQ(why, "expected [ipv6]:port");
}

}  // namespace
}  // namespace kvroute::config

namespace kvroute::config {
namespace {

TEST(RouterConfig, RetryBudgetAndOutlierDetection) {
  RouterConfig d = ParseOk("listen: 0.0.0.0:80\n");
  EXPECT_EQ(d.retries.max_attempts, 2);
  EXPECT_DOUBLE_EQ(d.retries.budget_ratio, 0.2);
  EXPECT_EQ(d.retries.budget_min_retries, 10);
  EXPECT_DOUBLE_EQ(d.retries.budget_window_s, 10.0);
  EXPECT_EQ(d.outlier.consecutive_failures, 5);
  EXPECT_DOUBLE_EQ(d.outlier.base_ejection_s, 5.0);
  EXPECT_DOUBLE_EQ(d.outlier.max_ejection_s, 300.0);
  EXPECT_DOUBLE_EQ(d.outlier.max_ejection_percent, 50.0);
  RouterConfig c = ParseOk(
      "retries: {max_attempts: 3, budget_ratio: 0.1, budget_min_retries: 0, budget_window: 30s}\n"
      "outlier_detection:\n  consecutive_failures: 0\n  base_ejection: 250ms\n"
      "  max_ejection: 1m\n  max_ejection_percent: 34\n");
  EXPECT_EQ(c.retries.max_attempts, 3);
  EXPECT_DOUBLE_EQ(c.retries.budget_ratio, 0.1);
  EXPECT_EQ(c.retries.budget_min_retries, 0);
  EXPECT_DOUBLE_EQ(c.retries.budget_window_s, 30.0);
  EXPECT_EQ(c.outlier.consecutive_failures, 0);
  EXPECT_DOUBLE_EQ(c.outlier.base_ejection_s, 0.25);
  EXPECT_DOUBLE_EQ(c.outlier.max_ejection_s, 60.0);
  EXPECT_DOUBLE_EQ(c.outlier.max_ejection_percent, 34.0);
}

TEST(RouterConfigErrors, RetryBudgetAndOutlierDetection) {
  EXPECT_EQ(ParseErr("retries:\n  budget_ratio: 1.5\n"),
            "t.yaml:2: retries.budget_ratio: must be between 0 and 1 (got 1.5)");
  EXPECT_EQ(ParseErr("retries:\n  budget_ration: 0.5\n"),
            "t.yaml:2: retries.budget_ration: unknown key 'budget_ration' (did you mean "
            "'budget_ratio'?)");
  EXPECT_EQ(ParseErr("outlier_detection:\n  max_ejection_percent: 120\n"),
            "t.yaml:2: outlier_detection.max_ejection_percent: must be between 0 and 100 (got 120)");
  EXPECT_EQ(ParseErr("outlier_detection:\n  base_ejection: 10s\n  max_ejection: 2s\n"),
            "t.yaml:2: outlier_detection: max_ejection must be >= base_ejection");
  EXPECT_EQ(ParseErr("outlier_detection:\n  consecutive_failures: -1\n"),
            "t.yaml:2: outlier_detection.consecutive_failures: must be >= 0 (got -1)");
}

TEST(RouterConfigTest, ClientLimitsAndTimeouts) {
  RouterConfig d = ParseOk("");
  EXPECT_EQ(d.limits.max_connections, 16384u);
  EXPECT_DOUBLE_EQ(d.timeouts.request_read_s, 30.0);
  EXPECT_DOUBLE_EQ(d.timeouts.keepalive_idle_s, 60.0);
  RouterConfig c = ParseOk(
      "limits: {max_connections: 100}\ntimeouts: {request_read: 150ms, keepalive_idle: 2m}\n");
  EXPECT_EQ(c.limits.max_connections, 100u);
  EXPECT_DOUBLE_EQ(c.timeouts.request_read_s, 0.15);
  EXPECT_DOUBLE_EQ(c.timeouts.keepalive_idle_s, 120.0);
  EXPECT_EQ(ParseOk("limits: {max_connections: 0}\n").limits.max_connections, 0u);  // unlimited
  EXPECT_EQ(ParseErr("limits:\n  max_connections: -1\n"),
            "t.yaml:2: limits.max_connections: must be >= 0 (got -1)");
  EXPECT_EQ(ParseErr("limits:\n  max_connections: lots\n"),
            "t.yaml:2: limits.max_connections: must be an integer (got 'lots')");
  EXPECT_EQ(ParseErr("timeouts:\n  request_read: 0s\n"),
            "t.yaml:2: timeouts.request_read: must be > 0 (got '0s')");
  EXPECT_EQ(ParseErr("timeouts:\n  keepalive_idel: 5s\n"),
            "t.yaml:2: timeouts.keepalive_idel: unknown key 'keepalive_idel' (did you mean "
            "'keepalive_idle'?)");
}

}  // namespace
}  // namespace kvroute::config
