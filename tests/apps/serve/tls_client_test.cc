// HTTPS end to end between the project's own pieces over loopback: http::Server with a
// TLS listener (http/tls.h ServerTls) and UpstreamClient speaking TLS to it, under a
// private CA made at test time (src/adapters/tls/pki.h). Trust, host-name checks, client
// certificates, certificate reloads seen by new connections only, pooled TLS connections,
// streamed bodies, and a stalled or garbage handshake cut without harm.
#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <future>

#include "adapters/http/client.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/tls.h"
#include "support/stub_server.h"
#include "adapters/tls/pki.h"

namespace kvroute::http {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using kvroute::test_support::LoopbackServer;

struct Outcome {
  std::string body;
  UpstreamResult result;
};

void Handle(std::shared_ptr<Exchange> ex) {
  std::string target(ex->request().target());
  if (target == "/stream") {
    ex->BeginStream(200);
    ex->SendChunk("data: 1\n\n");
    auto timer = std::make_shared<asio::steady_timer>(ex->executor(), 20ms);
    timer->async_wait([ex, timer](auto) {
      ex->SendChunk("data: 2\n\n");
      ex->EndStream();
    });
    return;
  }
  ex->Respond(200, "tls " + std::string(ex->request().method_string()) + " " + target + " " +
                       ex->request().body(),
              "text/plain");
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_.Start();
    leaf_ = ca_.Issue("replica", "IP:127.0.0.1,DNS:localhost");
  }
  void TearDown() override {
    Post([this] { clients_.clear(); });
    pool_.Stop();
  }

  // An HTTPS server with `pair`, read_timeout as given.
  std::unique_ptr<LoopbackServer> Serve(const tls::KeyPair& pair,
                                        std::chrono::milliseconds read_timeout = 5000ms) {
    auto tls = ServerTls::Create(pair.cert_pem, pair.key_pem);
    EXPECT_TRUE(tls.ok()) << tls.status().ToString();
    tls_ = tls.value();
    ServerOptions o;
    o.tls = tls_;
    o.read_timeout = read_timeout;
    auto s = std::make_unique<LoopbackServer>(Handle, o);
    EXPECT_EQ(s->listen_status().ToString(), "OK");
    return s;
  }

  // A client on the pool's context trusting `options`; index into clients_.
  std::size_t Client(const ClientTlsOptions& options) {
    auto ctx = MakeClientTls(options);
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    std::size_t i = 0;
    Post([&] {
      ClientOptions co;
      co.tls = ctx.value();
      clients_.push_back(std::make_unique<UpstreamClient>(pool_.context(0), co));
      i = clients_.size() - 1;
    });
    return i;
  }

  template <typename F>
  void Post(F f) {
    std::promise<void> p;
    asio::post(pool_.context(0), [&] {
      f();
      p.set_value();
    });
    ASSERT_EQ(p.get_future().wait_for(5s), std::future_status::ready);
  }

  Outcome Run(std::size_t client, const std::string& host, uint16_t port, std::string target,
              bool tls = true, std::string body = {}) {
    auto out = std::make_shared<Outcome>();
    auto done = std::make_shared<std::promise<void>>();
    auto keep = std::make_shared<std::string>(std::move(body));
    asio::post(pool_.context(0), [=, this] {
      UpstreamRequest req;
      req.tls = tls;
      req.method = keep->empty() ? boost::beast::http::verb::get : boost::beast::http::verb::post;
      req.target = target;
      req.body = *keep;
      UpstreamCallbacks cb;
      cb.on_data = [out](std::string_view d) { out->body += d; };
      cb.on_done = [out, done, keep](UpstreamResult&& r) {
        out->result = std::move(r);
        done->set_value();
      };
      clients_[client]->Start(host, port, req, std::move(cb));
    });
    EXPECT_EQ(done->get_future().wait_for(10s), std::future_status::ready);
    return *out;
  }

  tls::Authority ca_{"tls-test-ca"};
  tls::KeyPair leaf_;
  std::shared_ptr<ServerTls> tls_;
  IoPool pool_{1};
  std::vector<std::unique_ptr<UpstreamClient>> clients_;
};

TEST_F(TlsTest, ATrustedReplicaAnswersOverHttpsOnPooledConnections) {
  auto server = Serve(leaf_);
  std::size_t c = Client({.ca_pem = ca_.cert_pem()});
  Outcome a = Run(c, "127.0.0.1", server->port(), "/a", true, "body");
  ASSERT_TRUE(a.result.ok()) << a.result.message;
  EXPECT_EQ(a.result.status, 200);
  EXPECT_EQ(a.body, "tls POST /a body");
  EXPECT_FALSE(a.result.reused_connection);
  Outcome b = Run(c, "127.0.0.1", server->port(), "/b");
  ASSERT_TRUE(b.result.ok()) << b.result.message;
  EXPECT_EQ(b.body, "tls GET /b ");
  EXPECT_TRUE(b.result.reused_connection);
  Outcome s = Run(c, "127.0.0.1", server->port(), "/stream");
  ASSERT_TRUE(s.result.ok()) << s.result.message;
  EXPECT_EQ(s.body, "data: 1\n\ndata: 2\n\n");
  EXPECT_EQ(server->stats().connections_accepted.load(), 1u);
  // The same host and port in plain HTTP is another pool entry: it speaks plaintext to a
  // TLS port and fails (the server sees a bad handshake), it never borrows the TLS one.
  Outcome plain = Run(c, "127.0.0.1", server->port(), "/plain", false);
  EXPECT_FALSE(plain.result.ok());
  EXPECT_EQ(server->stats().connections_accepted.load(), 2u);
}

TEST_F(TlsTest, UntrustedOrMisnamedCertificatesAreRefusedUnlessVerificationIsOff) {
  auto server = Serve(leaf_);
  tls::Authority other("other-ca");
  std::size_t wrong_ca = Client({.ca_pem = other.cert_pem()});
  Outcome a = Run(wrong_ca, "127.0.0.1", server->port(), "/a");
  EXPECT_EQ(a.result.error, UpstreamError::kConnectFailed);
  EXPECT_NE(a.result.message.find("TLS handshake with 127.0.0.1:"), std::string::npos) << a.result.message;
  EXPECT_NE(a.result.message.find("certificate verify failed"), std::string::npos) << a.result.message;

  // Trusted CA, but the certificate names neither this IP nor "localhost".
  auto misnamed = Serve(ca_.Issue("elsewhere", "DNS:replica.example"));
  std::size_t good = Client({.ca_pem = ca_.cert_pem()});
  Outcome b = Run(good, "127.0.0.1", misnamed->port(), "/b");
  EXPECT_EQ(b.result.error, UpstreamError::kConnectFailed);
  Outcome by_name = Run(good, "localhost", server->port(), "/by-name");
  ASSERT_TRUE(by_name.result.ok()) << by_name.result.message;

  std::size_t lax = Client({.ca_pem = other.cert_pem(), .verify = false});
  Outcome c = Run(lax, "127.0.0.1", misnamed->port(), "/c");
  ASSERT_TRUE(c.result.ok()) << c.result.message;
  EXPECT_EQ(c.body, "tls GET /c ");
}

TEST_F(TlsTest, AReplicaRequiringAClientCertificateGetsTheConfiguredOne) {
  auto server = Serve(leaf_);
  // The replica asks for, and requires, a certificate from this CA.
  tls_->context()->set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
  tls_->context()->add_certificate_authority(asio::buffer(ca_.cert_pem()));
  tls::KeyPair router = ca_.Issue("kvroute", "");
  std::size_t without = Client({.ca_pem = ca_.cert_pem()});
  EXPECT_FALSE(Run(without, "127.0.0.1", server->port(), "/a").result.ok());
  std::size_t with = Client({.ca_pem = ca_.cert_pem(), .cert_pem = router.cert_pem, .key_pem = router.key_pem});
  Outcome ok = Run(with, "127.0.0.1", server->port(), "/b");
  ASSERT_TRUE(ok.result.ok()) << ok.result.message;
  EXPECT_EQ(ok.body, "tls GET /b ");
}

TEST_F(TlsTest, ClientTlsOptionsThatDoNotLoadAreNamed) {
  EXPECT_EQ(MakeClientTls({.ca_pem = "nope"}).status().message().rfind("ca: no certificate in the PEM", 0), 0u);
  EXPECT_EQ(MakeClientTls({.cert_pem = leaf_.cert_pem}).status().message(),
            "client certificate: give both the certificate and its key");
  EXPECT_EQ(MakeClientTls({.cert_pem = leaf_.cert_pem, .key_pem = ca_.key_pem()}).status().message(),
            "client certificate: the private key does not match the certificate");
  EXPECT_EQ(ServerTls::Create("x", leaf_.key_pem).status().message(), "no certificate in the PEM");
}

TEST_F(TlsTest, AReloadedCertificateServesNewConnectionsAndOpenOnesCarryOn) {
  auto server = Serve(leaf_);
  tls::Authority next("next-ca");
  std::size_t old_trust = Client({.ca_pem = ca_.cert_pem()});
  std::size_t new_trust = Client({.ca_pem = next.cert_pem()});
  ASSERT_TRUE(Run(old_trust, "127.0.0.1", server->port(), "/1").result.ok());
  EXPECT_FALSE(Run(new_trust, "127.0.0.1", server->port(), "/2").result.ok());

  // A pair that does not load is refused; the server keeps serving the running one.
  EXPECT_EQ(tls_->Update(leaf_.cert_pem, next.Issue("x", "").key_pem).message(),
            "the private key does not match the certificate");
  EXPECT_EQ(tls_->updates(), 0u);
  tls::KeyPair renewed = next.Issue("replica", "IP:127.0.0.1");
  ASSERT_TRUE(tls_->Update(renewed.cert_pem, renewed.key_pem).ok());
  EXPECT_EQ(tls_->updates(), 1u);

  // The pooled connection (old certificate) is reused; a new one gets the new certificate.
  Outcome pooled = Run(old_trust, "127.0.0.1", server->port(), "/3");
  ASSERT_TRUE(pooled.result.ok()) << pooled.result.message;
  EXPECT_TRUE(pooled.result.reused_connection);
  Outcome fresh = Run(new_trust, "127.0.0.1", server->port(), "/4");
  ASSERT_TRUE(fresh.result.ok()) << fresh.result.message;
  EXPECT_FALSE(fresh.result.reused_connection);
  std::size_t old_fresh = Client({.ca_pem = ca_.cert_pem()});
  EXPECT_FALSE(Run(old_fresh, "127.0.0.1", server->port(), "/5").result.ok());
}

// A raw TCP connection to `port`.
int Dial(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Milliseconds until the server closes `fd` (reads to EOF), or -1 past `limit`.
long MsUntilClosed(int fd, std::chrono::milliseconds limit) {
  auto start = std::chrono::steady_clock::now();
  char buf[4096];
  while (std::chrono::steady_clock::now() - start < limit) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
    }
  }
  return -1;
}

TEST_F(TlsTest, StalledAndGarbageHandshakesAreCutAndTheServerServesOn) {
  auto server = Serve(leaf_, 300ms);
  int silent = Dial(server->port());
  long closed_after = MsUntilClosed(silent, 3000ms);
  ::close(silent);
  EXPECT_GE(closed_after, 150);  // not before the read timeout (some slack for the accept)
  EXPECT_LE(closed_after, 2000);

  int garbage = Dial(server->port());
  std::string junk = "GET / HTTP/1.1\r\nhost: x\r\n\r\n" + std::string(600, '\x16');
  ASSERT_EQ(::send(garbage, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  EXPECT_GE(MsUntilClosed(garbage, 3000ms), 0);
  ::close(garbage);

  std::size_t c = Client({.ca_pem = ca_.cert_pem()});
  Outcome ok = Run(c, "127.0.0.1", server->port(), "/after");
  ASSERT_TRUE(ok.result.ok()) << ok.result.message;
  EXPECT_EQ(ok.body, "tls GET /after ");
  EXPECT_EQ(server->stats().tls_handshake_failures.load(), 2u);
}

}  // namespace
}  // namespace kvroute::http
