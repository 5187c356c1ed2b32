// `kvroute serve` with TLS on both sides, over loopback: an HTTPS listener (listen_tls,
// `listen: off`), a replica behind HTTPS under a CA made at test time (upstream_tls and an
// https:// address: proxied, scraped), the request's end-to-end headers reaching the
// replica and the replica's reaching the client, certificate reloads, and start-up errors
// naming the file at fault.
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include "config/router_config.h"
#include "adapters/http/client.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/tls.h"
#include "metrics/metric_sum.h"
#include "apps/serve/router.h"
#include "support/stub_server.h"
#include "support/wait.h"
#include "adapters/tls/pki.h"

namespace kvroute::router {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using kvroute::test_support::WaitFor;
using metrics::testing::MetricSum;

struct Answer {
  http::UpstreamResult result;
  std::string body;
  std::map<std::string, std::string> headers;
};

class ServeTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvroute-serve-tls.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    client_pool_.Start();
    tls::KeyPair router = ca_.Issue("kvroute", "IP:127.0.0.1");
    Write("tls.crt", router.cert_pem);
    Write("tls.key", router.key_pem);
    Write("ca.pem", ca_.cert_pem());
  }
  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    asio::post(client_pool_.context(0), [this] { clients_.clear(); });
    client_pool_.Stop();
    std::filesystem::remove_all(dir_);
  }

  // Written to a temporary name, then renamed into place (how a Secret or an editor
  // replaces a file).
  void Write(const std::string& name, const std::string& text) {
    const std::string tmp = dir_ + "/." + name + ".tmp";
    std::ofstream(tmp, std::ios::trunc) << text;
    std::filesystem::rename(tmp, dir_ + "/" + name);
  }

  std::string Yaml(uint16_t replica_port, const std::string& extra = "") {
    return "threads: 2\nlisten: off\nlisten_tls:\n  address: 127.0.0.1:8443\n  cert: " + dir_ +
           "/tls.crt\n  key: " + dir_ + "/tls.key\n  poll: 1h\nupstream_tls:\n  ca: " + dir_ +
           "/ca.pem\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n  endpoints:\n    - "
           "{address: 'https://127.0.0.1:" +
           std::to_string(replica_port) + "', name: secure}\nscheduling:\n  policy: round-robin\n" + extra;
  }

  Status StartRouter(const std::string& yaml) {
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, dir_ + "/serve.yaml");
    EXPECT_TRUE(r.ok()) << r.error.ToString();
    if (!r.ok()) return Status::InvalidArgument(r.error.ToString());
    RouterOptions o;
    o.log = false;
    o.listen_tls = config::HostPort{"127.0.0.1", 0};
    router_ = std::make_unique<Router>(std::move(*r.value), o);
    return router_->Start();
  }

  // A client on the test's loop trusting `ca_pem`; its index.
  std::size_t Client(const std::string& ca_pem) {
    auto ctx = http::MakeClientTls({.ca_pem = ca_pem});
    EXPECT_TRUE(ctx.ok());
    std::promise<std::size_t> p;
    asio::post(client_pool_.context(0), [&] {
      http::ClientOptions co;
      co.tls = ctx.value();
      clients_.push_back(std::make_unique<http::UpstreamClient>(client_pool_.context(0), co));
      p.set_value(clients_.size() - 1);
    });
    return p.get_future().get();
  }

  Answer Https(std::size_t client, std::string target, std::string body = {},
               std::vector<std::pair<std::string, std::string>> headers = {}) {
    auto out = std::make_shared<Answer>();
    auto done = std::make_shared<std::promise<void>>();
    auto keep = std::make_shared<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>>(
        std::move(body), std::move(headers));
    const uint16_t port = router_->tls_port();
    asio::post(client_pool_.context(0), [=, this] {
      http::UpstreamRequest req;
      req.tls = true;
      req.method = keep->first.empty() ? boost::beast::http::verb::get : boost::beast::http::verb::post;
      req.target = target;
      req.body = keep->first;
      req.headers = &keep->second;
      http::UpstreamCallbacks cb;
      cb.on_head = [out](const http::ResponseHead& h) {
        for (const auto& f : *h.fields) out->headers[std::string(f.name_string())] = std::string(f.value());
      };
      cb.on_data = [out](std::string_view d) { out->body += d; };
      cb.on_done = [out, done, keep](http::UpstreamResult&& r) {
        out->result = std::move(r);
        done->set_value();
      };
      clients_[client]->Start("127.0.0.1", port, req, std::move(cb));
    });
    EXPECT_EQ(done->get_future().wait_for(10s), std::future_status::ready);
    return *out;
  }

  std::string dir_;
  tls::Authority ca_{"serve-tls-ca"};
  http::IoPool client_pool_{1};
  std::vector<std::unique_ptr<http::UpstreamClient>> clients_;
  std::unique_ptr<Router> router_;
};

// The replica, behind HTTPS with a certificate for 127.0.0.1 from the test CA.
http::ServerOptions ReplicaTls(tls::Authority& ca) {
  tls::KeyPair pair = ca.Issue("replica", "IP:127.0.0.1");
  http::ServerOptions o;
  o.tls = http::ServerTls::Create(pair.cert_pem, pair.key_pem).value();
  return o;
}

TEST_F(ServeTlsTest, HttpsOnBothSidesCarriesEveryEndToEndHeaderBothWays) {
  test_support::RecordingUpstream replica(R"({"ok":true})", ReplicaTls(ca_));
  replica.AnswerHeaders({{"x-replica-trace", "abc"},
                         {"Keep-Alive", "timeout=5"},
                         {"Connection", "x-hop"},
                         {"x-hop", "replica-only"},
                         {"x-kvroute-endpoint", "spoofed"}});
  ASSERT_TRUE(StartRouter(Yaml(replica.port())).ok());
  EXPECT_EQ(router_->port(), 0);  // listen: off
  ASSERT_NE(router_->tls_port(), 0);
  std::size_t c = Client(ca_.cert_pem());
  // Ready only once the replica was scraped over HTTPS.
  ASSERT_TRUE(WaitFor([&] { return Https(c, "/readyz").result.status == 200; }));

  Answer a = Https(c, "/v1/completions", R"({"model":"m","prompt":"hello","max_tokens":1})",
                   {{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                    {"tracestate", "congo=t61rcWkgMzE"},
                    {"baggage", "userId=alice"},
                    {"x-app-tenant", "blue"},
                    {"connection", "keep-alive, x-client-hop"},
                    {"x-client-hop", "not for the replica"},
                    {"te", "trailers"}});
  ASSERT_TRUE(a.result.ok()) << a.result.message;
  ASSERT_EQ(a.result.status, 200) << a.body;
  EXPECT_EQ(a.body, R"({"ok":true})");
  EXPECT_EQ(a.headers["x-replica-trace"], "abc");
  EXPECT_EQ(a.headers["x-kvroute-endpoint"], "secure");  // the router's, not the replica's
  EXPECT_EQ(a.headers.count("Keep-Alive") + a.headers.count("keep-alive"), 0u);
  EXPECT_EQ(a.headers.count("x-hop"), 0u);

  auto seen = replica.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].Header("traceparent"), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  EXPECT_EQ(seen[0].Header("tracestate"), "congo=t61rcWkgMzE");
  EXPECT_EQ(seen[0].Header("baggage"), "userId=alice");
  EXPECT_EQ(seen[0].Header("x-app-tenant"), "blue");
  for (const char* gone : {"x-client-hop", "te"}) EXPECT_EQ(seen[0].headers.count(gone), 0u) << gone;
  EXPECT_EQ(seen[0].Header("connection"), "");

  Answer m = Https(c, "/metrics");
  EXPECT_EQ(MetricSum(m.body, "kvroute_tls_cert_reloads_total"), 0);
  EXPECT_EQ(MetricSum(m.body, "kvroute_http_tls_handshake_failures_total"), 0);
  EXPECT_GT(MetricSum(m.body, "kvroute_tls_cert_expiry_timestamp_seconds"), 1.7e9);
}

TEST_F(ServeTlsTest, ARenewedCertificateServesNewConnectionsAndABrokenOneIsRefused) {
  test_support::RecordingUpstream replica(R"({"ok":true})", ReplicaTls(ca_));
  ASSERT_TRUE(StartRouter(Yaml(replica.port())).ok());
  std::size_t old_trust = Client(ca_.cert_pem());
  ASSERT_TRUE(WaitFor([&] { return Https(old_trust, "/readyz").result.status == 200; }));
  EXPECT_FALSE(router_->PollCertificates());  // nothing changed

  tls::Authority next("renewed-ca");
  tls::KeyPair renewed = next.Issue("kvroute", "IP:127.0.0.1");
  Write("tls.crt", renewed.cert_pem);
  Write("tls.key", renewed.key_pem);
  EXPECT_TRUE(router_->PollCertificates());
  std::size_t new_trust = Client(next.cert_pem());
  Answer fresh = Https(new_trust, "/healthz");
  ASSERT_TRUE(fresh.result.ok()) << fresh.result.message;
  EXPECT_EQ(fresh.body, "ok\n");
  // The old client's pooled connection carries on; a new one under the old CA fails.
  EXPECT_TRUE(Https(old_trust, "/healthz").result.reused_connection);
  EXPECT_FALSE(Https(Client(ca_.cert_pem()), "/healthz").result.ok());

  // A key that is not the certificate's: refused, the renewed pair still serves.
  Write("tls.key", ca_.Issue("other", "").key_pem);
  EXPECT_FALSE(router_->PollCertificates());
  EXPECT_TRUE(Https(Client(next.cert_pem()), "/healthz").result.ok());
  Answer m = Https(new_trust, "/metrics");
  EXPECT_EQ(MetricSum(m.body, "kvroute_tls_cert_reloads_total", {{"result", "applied"}}), 1);
  EXPECT_EQ(MetricSum(m.body, "kvroute_tls_cert_reloads_total", {{"result", "rejected"}}), 1);
}

TEST_F(ServeTlsTest, AReplicaUnderAnotherCaIsNeverScrapedNorServed) {
  tls::Authority stranger("stranger-ca");
  test_support::RecordingUpstream replica(R"({"ok":true})", ReplicaTls(stranger));
  ASSERT_TRUE(StartRouter(Yaml(replica.port())).ok());
  std::size_t c = Client(ca_.cert_pem());
  // Scrapes fail their handshakes: not ready, and requests are refused, never sent.
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(Https(c, "/metrics").body, "kvroute_endpoint_scrapes_failed_total") >= 2;
  })) << Https(c, "/metrics").body;
  EXPECT_EQ(Https(c, "/readyz").result.status, 503);
  Answer a = Https(c, "/v1/completions", R"({"model":"m","prompt":"hi","max_tokens":1})");
  EXPECT_GE(a.result.status, 500);
  EXPECT_TRUE(replica.seen().empty());
}

TEST_F(ServeTlsTest, StartFailsNamingTheTlsFileAtFault) {
  Write("tls.key", "not a key");
  Status st = StartRouter(Yaml(1));
  EXPECT_EQ(st.message(), "listen_tls: " + dir_ + "/tls.key: no private key in the PEM");
  router_.reset();
  tls::KeyPair ok = ca_.Issue("kvroute", "IP:127.0.0.1");
  Write("tls.key", ok.key_pem);
  Write("tls.crt", ok.cert_pem);
  std::filesystem::remove(dir_ + "/ca.pem");
  st = StartRouter(Yaml(1));
  EXPECT_EQ(st.message().rfind("upstream_tls.ca: " + dir_ + "/ca.pem: cannot read file", 0), 0u) << st.message();
}

}  // namespace
}  // namespace kvroute::router
