#include "config/endpoints_file.h"

#include <gtest/gtest.h>

#include <string>

#include "config/router_config.h"
#include "support/test_paths.h"

namespace kvroute::config {
namespace {

std::vector<EndpointConfig> ParseOk(std::string_view text) {
  ConfigOr<std::vector<EndpointConfig>> r = ParseEndpointsFile(text, "eps.yaml");
  EXPECT_TRUE(r.ok()) << r.error.ToString();
  return r.ok() ? *r.value : std::vector<EndpointConfig>{};
}

std::string ParseErr(std::string_view text) {
  ConfigOr<std::vector<EndpointConfig>> r = ParseEndpointsFile(text, "eps.yaml");
  EXPECT_FALSE(r.ok()) << text;
  return r.error.ToString();
}

TEST(EndpointsFile, EntriesAndShorthandAsPoolEndpoints) {
  const auto eps = ParseOk(
      "# fleet\n"
      "- address: 10.0.0.7:8000\n"
      "  name: eu-1\n"
      "  labels: {region: eu, gpu: h100}\n"
      "- 10.0.0.8:8000\n"
      "- {address: '[fe80::1]:9000'}\n");
  ASSERT_EQ(eps.size(), 3u);
  EXPECT_EQ(eps[0].address, "10.0.0.7:8000");
  EXPECT_EQ(eps[0].name, "eu-1");
  EXPECT_EQ(eps[0].host_port.host, "10.0.0.7");
  EXPECT_EQ(eps[0].host_port.port, 8000);
  EXPECT_EQ(eps[0].labels.at("region"), "eu");
  EXPECT_EQ(eps[0].labels.at("gpu"), "h100");
  EXPECT_EQ(eps[0].line, 2);
  EXPECT_EQ(eps[1].name, "10.0.0.8:8000");  // name defaults to the address
  EXPECT_EQ(eps[1].line, 5);
  EXPECT_EQ(eps[2].host_port.host, "fe80::1");
}

TEST(EndpointsFile, EmptyFileAndEmptyListAreNoEndpoints) {
  EXPECT_TRUE(ParseOk("").empty());
  EXPECT_TRUE(ParseOk("# nothing yet\n").empty());
  EXPECT_TRUE(ParseOk("[]\n").empty());
  EXPECT_TRUE(ParseOk("~\n").empty());
}

TEST(EndpointsFile, ErrorsNameTheFileLineAndField) {
  EXPECT_EQ(ParseErr("- 10.0.0.7:8000\n- 10.0.0.8\n"),
            "eps.yaml:2: endpoints[1]: bad address '10.0.0.8': expected host:port");
  EXPECT_EQ(ParseErr("- name: a\n  address: 10.0.0.7:0\n"),
            "eps.yaml:2: endpoints[0].address: bad address '10.0.0.7:0': port must be a number "
            "from 1 to 65535");
  EXPECT_EQ(ParseErr("- adress: 10.0.0.7:8000\n"),
            "eps.yaml:1: endpoints[0].adress: unknown key 'adress' (did you mean 'address'?)");
  EXPECT_EQ(ParseErr("- name: x\n"), "eps.yaml:1: endpoints[0].address: missing address");
  EXPECT_EQ(ParseErr("- [1, 2]\n"), "eps.yaml:1: endpoints[0]: must be an address or a mapping");
  EXPECT_EQ(ParseErr("- {address: 10.0.0.7:8000, name: ''}\n"),
            "eps.yaml:1: endpoints[0].name: must not be empty");
}

TEST(EndpointsFile, DuplicatesAreErrors) {
  EXPECT_EQ(ParseErr("- 10.0.0.7:8000\n- 10.0.0.8:8000\n- 10.0.0.7:8000\n"),
            "eps.yaml:3: endpoints[2]: duplicate endpoint address '10.0.0.7:8000' (first at "
            "line 1)");
  EXPECT_EQ(ParseErr("- {address: 10.0.0.7:8000, name: a}\n- {address: 10.0.0.8:8000, name: a}\n"),
            "eps.yaml:2: endpoints[1]: duplicate endpoint name 'a' (first at line 1)");
}

TEST(EndpointsFile, NotAListIsAnError) {
  EXPECT_EQ(ParseErr("endpoints:\n  - 10.0.0.7:8000\n"),
            "eps.yaml:1: endpoints: must be a list of endpoints");
  EXPECT_EQ(ParseErr("10.0.0.7:8000\n"), "eps.yaml:1: endpoints: must be a list of endpoints");
  const std::string syntax = ParseErr("- [10.0.0.7:8000\n");
  EXPECT_EQ(syntax.rfind("eps.yaml:", 0), 0u) << syntax;
  EXPECT_NE(syntax.find("YAML syntax error"), std::string::npos) << syntax;
}

TEST(EndpointsFile, ExampleFileParses) {
  const std::string path = kvroute::test_support::SourceDir() + "/examples/endpoints.yaml";
  ConfigOr<std::string> text = ReadConfigFile(path);
  ASSERT_TRUE(text.ok()) << text.error.ToString();
  ConfigOr<std::vector<EndpointConfig>> r = ParseEndpointsFile(*text.value, path);
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_GE(r.value->size(), 2u);
}

TEST(RouterConfigEndpointsFile, RelativePathIsAgainstTheConfigDirectory) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(
      "pool:\n  endpoints_file: fleet/eps.yaml\n  endpoints_file_poll: 250ms\n",
      "/etc/kvroute/router.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->pool.endpoints_file, "fleet/eps.yaml");
  EXPECT_EQ(r.value->pool.endpoints_file_path, "/etc/kvroute/fleet/eps.yaml");
  EXPECT_DOUBLE_EQ(r.value->pool.endpoints_file_poll_s, 0.25);
  EXPECT_TRUE(r.value->pool.endpoints.empty());

  r = ParseRouterConfig("pool:\n  endpoints_file: /srv/eps.yaml\n", "conf/router.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->pool.endpoints_file_path, "/srv/eps.yaml");
  EXPECT_DOUBLE_EQ(r.value->pool.endpoints_file_poll_s, 1.0);

  r = ParseRouterConfig("pool:\n  endpoints_file: eps.yaml\n", "router.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->pool.endpoints_file_path, "eps.yaml");
}

TEST(RouterConfigEndpointsFile, ExampleConfigPointsAtTheExampleFile) {
  const std::string dir = kvroute::test_support::SourceDir() + "/examples";
  ConfigOr<RouterConfig> r = LoadRouterConfig(dir + "/router-endpoints-file.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->pool.endpoints_file_path, dir + "/endpoints.yaml");
}

TEST(RouterConfigEndpointsFile, ExclusiveWithEndpointsAndChecked) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(
      "pool:\n  endpoints: [127.0.0.1:1]\n  endpoints_file: eps.yaml\n", "t.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.ToString(),
            "t.yaml:3: pool.endpoints_file: pool.endpoints and pool.endpoints_file are mutually "
            "exclusive; use one");
  r = ParseRouterConfig("pool:\n  endpoints_file: eps.yaml\n  endpoints: []\n", "t.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.ToString(),
            "t.yaml:3: pool.endpoints: pool.endpoints and pool.endpoints_file are mutually "
            "exclusive; use one");
  r = ParseRouterConfig("pool:\n  endpoints_file: ''\n", "t.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.ToString(), "t.yaml:2: pool.endpoints_file: must not be empty");
  r = ParseRouterConfig("pool:\n  endpoints_file: e.yaml\n  endpoints_file_pol: 1s\n", "t.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.ToString(),
            "t.yaml:3: pool.endpoints_file_pol: unknown key 'endpoints_file_pol' (did you mean "
            "'endpoints_file_poll'?)");
  r = ParseRouterConfig("pool:\n  endpoints_file: e.yaml\n  endpoints_file_poll: 0\n", "t.yaml");
  ASSERT_FALSE(r.ok());
}

}  // namespace
}  // namespace kvroute::config
