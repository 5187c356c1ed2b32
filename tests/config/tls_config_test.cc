// serve's TLS settings: listen_tls (the HTTPS listener), listen: off, upstream_tls, and
// https:// endpoint addresses.
#include <gtest/gtest.h>

#include "config/router_config.h"
#include "router_config_util.h"

namespace kvroute::config {
namespace {

using config_test::ParseErr;
using config_test::ParseOk;

TEST(TlsConfigTest, ListenTlsPathsAreResolvedAgainstTheConfigsDirectory) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(
      "listen_tls:\n  address: 127.0.0.1:8443\n  cert: certs/tls.crt\n  key: /etc/k/tls.key\n  poll: 250ms\n",
      "/srv/kvroute/serve.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  const ListenTlsConfig& t = r.value->listen_tls;
  EXPECT_EQ(t.addr, (HostPort{"127.0.0.1", 8443}));
  EXPECT_EQ(t.cert_path, "/srv/kvroute/certs/tls.crt");
  EXPECT_EQ(t.key_path, "/etc/k/tls.key");
  EXPECT_DOUBLE_EQ(t.poll_s, 0.25);
  EXPECT_TRUE(r.value->listen_plain);
  EXPECT_TRUE(ParseOk("").listen_tls.address.empty());
}

TEST(TlsConfigTest, ListenOffNeedsAnHttpsListener) {
  EXPECT_EQ(ParseErr("listen: off\n"),
            "t.yaml:1: listen: 'off' needs listen_tls: there would be no listener");
  RouterConfig c = ParseOk("listen: off\nlisten_tls: {address: 0.0.0.0:8443, cert: a.crt, key: a.key}\n");
  EXPECT_FALSE(c.listen_plain);
  EXPECT_EQ(c.listen_tls.cert_path, "a.crt");
}

TEST(TlsConfigTest, ListenTlsErrorsNameTheField) {
  EXPECT_EQ(ParseErr("listen_tls:\n  address: 0.0.0.0:8443\n  key: a.key\n"),
            "t.yaml:2: listen_tls.cert: missing cert (a PEM certificate file)");
  EXPECT_EQ(ParseErr("listen_tls:\n  cert: a.crt\n  key: a.key\n"),
            "t.yaml:2: listen_tls.address: missing address");
  EXPECT_EQ(ParseErr("listen_tls:\n  address: nowhere\n  cert: a\n  key: b\n"),
            "t.yaml:2: listen_tls.address: bad address 'nowhere': expected host:port");
  EXPECT_EQ(ParseErr("listen_tls:\n  address: 0.0.0.0:1\n  cert: a\n  key: b\n  poll: 1ms\n"),
            "t.yaml:5: listen_tls.poll: must be at least 10ms");
  EXPECT_EQ(ParseErr("listen_tls:\n  address: 0.0.0.0:1\n  cert: a\n  key: b\n  pol: 1s\n"),
            "t.yaml:5: listen_tls.pol: unknown key 'pol' (did you mean 'poll'?)");
}

TEST(TlsConfigTest, UpstreamTlsNeedsBothHalvesOfAClientCertificate) {
  RouterConfig c = ParseOk("upstream_tls: {ca: ca.pem, verify: false}\n");
  EXPECT_EQ(c.upstream_tls.ca_path, "ca.pem");
  EXPECT_FALSE(c.upstream_tls.verify);
  EXPECT_TRUE(ParseOk("").upstream_tls.verify);
  EXPECT_EQ(ParseErr("upstream_tls:\n  cert: c.crt\n"),
            "t.yaml:2: upstream_tls.key: a client certificate needs both cert and key");
}

TEST(TlsConfigTest, EndpointAddressesNameTheirScheme) {
  RouterConfig c = ParseOk(
      "pool:\n  endpoints:\n    - https://10.0.0.7:8443\n    - http://10.0.0.8:8000/\n"
      "    - {address: 'https://[::1]:9443', name: v6}\n    - 10.0.0.9:8000\n");
  ASSERT_EQ(c.pool.endpoints.size(), 4u);
  EXPECT_TRUE(c.pool.endpoints[0].tls);
  EXPECT_EQ(c.pool.endpoints[0].host_port, (HostPort{"10.0.0.7", 8443}));
  EXPECT_EQ(c.pool.endpoints[0].name, "https://10.0.0.7:8443");
  EXPECT_FALSE(c.pool.endpoints[1].tls);
  EXPECT_EQ(c.pool.endpoints[1].host_port, (HostPort{"10.0.0.8", 8000}));
  EXPECT_TRUE(c.pool.endpoints[2].tls);
  EXPECT_EQ(c.pool.endpoints[2].host_port, (HostPort{"::1", 9443}));
  EXPECT_FALSE(c.pool.endpoints[3].tls);
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - ftp://10.0.0.7:21\n"),
            "t.yaml:3: pool.endpoints[0]: bad address 'ftp://10.0.0.7:21': the scheme must be "
            "http:// or https://");
  // The same host and port under two schemes is one endpoint written twice.
  EXPECT_EQ(ParseErr("pool:\n  endpoints:\n    - https://10.0.0.7:8443\n    - 10.0.0.7:8443\n"),
            "t.yaml:4: pool.endpoints[1]: duplicate endpoint address '10.0.0.7:8443' (first at line 3)");
}

}  // namespace
}  // namespace kvroute::config
