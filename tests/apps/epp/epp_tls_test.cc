// `kvroute epp` with TLS on the ext_proc port (EppOptions::tls): a self-signed
// certificate, a given pair reloaded from --cert-path, and connections that stall or send
// garbage. The picker runs in-process on loopback port 0 in front of a simulated fleet;
// the client is gRPC's own, with SslCredentials. Every wait is bounded.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <vector>

#include "config/router_config.h"
#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"
#include "apps/epp/epp.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/wait.h"
#include "adapters/tls/pki.h"

namespace kvroute::epp {
namespace {

using namespace std::chrono_literals;
namespace pb = ::envoy::service::ext_proc::v3;
namespace core_pb = ::envoy::config::core::v3;
namespace mode_pb = ::envoy::extensions::filters::http::ext_proc::v3;
namespace health_pb = ::grpc::health::v1;
using kvroute::test_support::WaitFor;

constexpr std::string_view kDest = "x-gateway-destination-endpoint";

// Writes `text` to `path` by a rename, as a Secret volume update appears at once.
void Put(const std::string& path, const std::string& text) {
  {
    std::ofstream f(path + ".tmp", std::ios::binary | std::ios::trunc);
    f << text;
  }
  std::filesystem::rename(path + ".tmp", path);
}

std::shared_ptr<grpc::Channel> TlsChannel(uint16_t port, const std::string& root_pem) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = root_pem;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a fresh connection per channel
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::SslCredentials(o), args);
}

// True when a new channel trusting only `root_pem` completes its TLS handshake.
bool Handshakes(uint16_t port, const std::string& root_pem, std::chrono::milliseconds limit = 2000ms) {
  auto ch = TlsChannel(port, root_pem);
  return ch->WaitForConnected(std::chrono::system_clock::now() + limit);
}

// A raw TCP connection to 127.0.0.1:port; -1 on failure.
int Connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads from `fd` until the peer closes it; the time that took, or nullopt when it was
// still open after `limit`.
std::optional<std::chrono::milliseconds> TimeToClose(int fd, std::chrono::milliseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + limit;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    }
  }
}

class EppTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<sim::ReplicaConfig> rs(2, kvroute::test_support::SimReplica({.kv_blocks = 4096}));
    rs[0].name = "r0";
    rs[1].name = "r1";
    fleet_ = std::make_unique<sim::Fleet>(std::move(rs), 2);
    ASSERT_TRUE(fleet_->Start().ok());
    for (int i = 0; i < 2; ++i) addresses_.insert("127.0.0.1:" + std::to_string(fleet_->port(i)));
    char tmpl[] = "/tmp/kvroute-epp-tls-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }

  void TearDown() override {
    if (epp_) epp_->Stop();
    epp_.reset();
    fleet_->Stop();
    std::filesystem::remove_all(dir_);
  }

  void StartEpp(EppTlsOptions tls) {
    std::string yaml = "pool:\n  scrape_interval: 50ms\n  endpoints:\n";
    for (int i = 0; i < 2; ++i) yaml += "    - 127.0.0.1:" + std::to_string(fleet_->port(i)) + "\n";
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "epp.yaml");
    ASSERT_TRUE(r.ok()) << r.error.ToString();
    EppOptions o;
    o.host = "127.0.0.1";
    o.grpc_port = 0;
    o.health_port = 0;
    o.metrics_port = 0;
    o.tls = std::move(tls);
    o.log_sink = [this](std::string_view l) {
      std::lock_guard<std::mutex> lock(log_mu_);
      log_.emplace_back(l);
    };
    epp_ = std::make_unique<Epp>(std::move(*r.value), o);
    Status st = epp_->Start();
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(WaitFor([&] { return epp_->Ready(); }));
  }

  // One full-duplex pick over `channel`: the destination header, or the failure.
  std::string Pick(const std::shared_ptr<grpc::Channel>& channel, grpc::Status* status = nullptr) {
    auto stub = pb::ExternalProcessor::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    auto stream = stub->Process(&ctx);
    pb::ProcessingRequest h;
    auto add = [&](std::string k, std::string v) {
      core_pb::HeaderValue* x = h.mutable_request_headers()->mutable_headers()->add_headers();
      x->set_key(std::move(k));
      x->set_raw_value(std::move(v));
    };
    add(":method", "POST");
    add(":path", "/v1/completions");
    add("content-type", "application/json");
    h.mutable_protocol_config()->set_request_body_mode(mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED);
    pb::ProcessingRequest b;
    b.mutable_request_body()->set_body(kvroute::test_support::CompletionBody("tls pick", 4));
    b.mutable_request_body()->set_end_of_stream(true);
    stream->Write(h);
    stream->Write(b);
    stream->WritesDone();
    std::string dest;
    pb::ProcessingResponse r;
    while (stream->Read(&r)) {
      if (!r.has_request_headers()) continue;
      for (const auto& o : r.request_headers().response().header_mutation().set_headers()) {
        if (o.header().key() == kDest) dest = o.header().raw_value();
      }
    }
    grpc::Status st = stream->Finish();
    if (status) *status = st;
    return dest.substr(0, dest.find(','));  // the winner (fallbacks follow)
  }

  // The value of the sample `series` (name with labels, as written) on /metrics; -1 if absent.
  double Series(const std::string& series) {
    const std::string text = epp_->MetricsText();
    const std::string key = "\n" + series + " ";
    std::size_t at = text.find(key);
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + key.size()));
  }

  std::vector<std::string> LogLinesWith(std::string_view needle) {
    std::lock_guard<std::mutex> lock(log_mu_);
    std::vector<std::string> out;
    for (const auto& l : log_) {
      if (l.find(needle) != std::string::npos) out.push_back(l);
    }
    return out;
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::set<std::string> addresses_;
  std::string dir_;
  std::unique_ptr<Epp> epp_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

TEST_F(EppTlsTest, SelfSignedCertificatePicksForAClientTrustingIt) {
  StartEpp({.secure_serving = true});
  const std::string cert = epp_->serving_cert_pem();
  ASSERT_NE(cert.find("BEGIN CERTIFICATE"), std::string::npos);
  Result<tls::CertificateInfo> info = tls::DescribeCertificate(cert);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->sha256_fingerprint.size(), 32u * 3 - 1);

  grpc::Status st;
  const std::string dest = Pick(TlsChannel(epp_->grpc_port(), cert), &st);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(addresses_.count(dest), 1u) << dest;

  // A plaintext client cannot talk to the TLS port.
  grpc::Status plain;
  EXPECT_EQ(Pick(grpc::CreateChannel("127.0.0.1:" + std::to_string(epp_->grpc_port()),
                                     grpc::InsecureChannelCredentials()), &plain), "");
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  // Nor a TLS client trusting another CA.
  tls::Authority other("another-ca");
  EXPECT_FALSE(Handshakes(epp_->grpc_port(), other.cert_pem(), 1000ms));

  // gRPC health stays plaintext for kubelet's probes.
  auto health = health_pb::Health::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(epp_->health_port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 2s);
  health_pb::HealthCheckRequest req;
  req.set_service("readiness");
  health_pb::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), health_pb::HealthCheckResponse::SERVING);

  EXPECT_EQ(Series("kvroute_tls_cert_expiry_timestamp_seconds"), static_cast<double>(info->not_after_unix_s));
  EXPECT_EQ(Series("kvroute_tls_cert_reloads_total{result=\"applied\"}"), 0);
}

TEST_F(EppTlsTest, PlaintextWhenSecureServingIsOff) {
  StartEpp({.secure_serving = false});
  EXPECT_EQ(epp_->serving_cert_pem(), "");
  grpc::Status st;
  const std::string dest = Pick(grpc::CreateChannel("127.0.0.1:" + std::to_string(epp_->grpc_port()),
                                                    grpc::InsecureChannelCredentials()), &st);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(addresses_.count(dest), 1u) << dest;
  EXPECT_EQ(Series("kvroute_tls_cert_reloads_total{result=\"applied\"}"), -1);
}

TEST_F(EppTlsTest, ABadCertPathFailsTheStartNamingTheFile) {
  tls::Authority ca;
  tls::KeyPair a = ca.Issue("epp", "IP:127.0.0.1");
  tls::KeyPair b = ca.Issue("epp", "IP:127.0.0.1");
  Put(dir_ + "/tls.crt", a.cert_pem);
  Put(dir_ + "/tls.key", b.key_pem);
  config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig("pool:\n  endpoints: [127.0.0.1:1]\n", "e.yaml");
  ASSERT_TRUE(r.ok());
  EppOptions o;
  o.host = "127.0.0.1";
  o.grpc_port = o.health_port = o.metrics_port = 0;
  o.log = false;
  o.tls = {.secure_serving = true, .cert_path = dir_};
  Epp epp(std::move(*r.value), o);
  Status st = epp.Start();
  EXPECT_EQ(st.message(), "--cert-path: " + dir_ + "/tls.key: the private key does not match the certificate");
  epp.Stop();
}

TEST_F(EppTlsTest, AReloadedPairIsSeenByNewConnectionsAndABadOneIsRejectedOnce) {
  tls::Authority ca_a("ca-a"), ca_b("ca-b");
  tls::KeyPair a = ca_a.Issue("epp-a", "DNS:localhost,IP:127.0.0.1");
  tls::KeyPair b = ca_b.Issue("epp-b", "DNS:localhost,IP:127.0.0.1");
  Put(dir_ + "/tls.crt", a.cert_pem);
  Put(dir_ + "/tls.key", a.key_pem);
  StartEpp({.secure_serving = true, .cert_path = dir_, .enable_cert_reload = true, .reload_interval_s = 0.05});
  EXPECT_EQ(epp_->serving_cert_pem(), a.cert_pem);
  grpc::Status st;
  EXPECT_EQ(addresses_.count(Pick(TlsChannel(epp_->grpc_port(), ca_a.cert_pem()), &st)), 1u) << st.error_message();
  EXPECT_FALSE(Handshakes(epp_->grpc_port(), ca_b.cert_pem(), 500ms));

  // Pair B replaces A (two renames, as a Secret update may look): once applied, a new
  // connection sees B's certificate; an open one keeps working.
  auto old_channel = TlsChannel(epp_->grpc_port(), ca_a.cert_pem());
  ASSERT_TRUE(old_channel->WaitForConnected(std::chrono::system_clock::now() + 2s));
  Put(dir_ + "/tls.crt", b.cert_pem);
  Put(dir_ + "/tls.key", b.key_pem);
  ASSERT_TRUE(WaitFor([&] { return Series("kvroute_tls_cert_reloads_total{result=\"applied\"}") == 1; }));
  EXPECT_EQ(epp_->serving_cert_pem(), b.cert_pem);
  ASSERT_TRUE(WaitFor([&] { return Handshakes(epp_->grpc_port(), ca_b.cert_pem(), 500ms); }, 5000ms, 50ms));
  EXPECT_EQ(addresses_.count(Pick(TlsChannel(epp_->grpc_port(), ca_b.cert_pem()), &st)), 1u) << st.error_message();
  EXPECT_FALSE(Handshakes(epp_->grpc_port(), ca_a.cert_pem(), 500ms));
  EXPECT_EQ(addresses_.count(Pick(old_channel, &st)), 1u) << st.error_message();
  EXPECT_EQ(LogLinesWith("certificate reloaded from " + dir_).size(), 1u);
  Result<tls::CertificateInfo> info_b = tls::DescribeCertificate(b.cert_pem);
  EXPECT_EQ(Series("kvroute_tls_cert_expiry_timestamp_seconds"), static_cast<double>(info_b->not_after_unix_s));

  // A corrupt key: rejected, B still served, one log line however often it is seen.
  const double rejected = Series("kvroute_tls_cert_reloads_total{result=\"rejected\"}");
  const std::size_t lines = LogLinesWith("tls:").size();
  Put(dir_ + "/tls.key", "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n");
  ASSERT_TRUE(WaitFor([&] { return Series("kvroute_tls_cert_reloads_total{result=\"rejected\"}") == rejected + 1; }));
  Put(dir_ + "/tls.key", "-----BEGIN PRIVATE KEY-----\nnot a key either\n-----END PRIVATE KEY-----\n");
  ASSERT_TRUE(WaitFor([&] { return Series("kvroute_tls_cert_reloads_total{result=\"rejected\"}") == rejected + 2; }));
  std::vector<std::string> after = LogLinesWith("tls:");
  ASSERT_EQ(after.size(), lines + 1);
  EXPECT_EQ(after.back(), "tls: certificate from " + dir_ + " not reloaded, serving the last good one: " + dir_ +
                              "/tls.key: no private key in the PEM");
  EXPECT_TRUE(Handshakes(epp_->grpc_port(), ca_b.cert_pem()));
  EXPECT_EQ(epp_->serving_cert_pem(), b.cert_pem);
  EXPECT_EQ(Series("kvroute_tls_cert_reloads_total{result=\"applied\"}"), 1);
}

TEST_F(EppTlsTest, AStalledHandshakeIsCutAndGarbageLeavesTheServerServing) {
  StartEpp({.secure_serving = true, .handshake_timeout_s = 0.3});
  // Connects and says nothing: closed once the handshake timeout passes.
  int silent = Connect(epp_->grpc_port());
  ASSERT_GE(silent, 0);
  std::optional<std::chrono::milliseconds> took = TimeToClose(silent, 5000ms);
  ::close(silent);
  ASSERT_TRUE(took.has_value()) << "a silent connection stayed open";
  EXPECT_GE(took->count(), 200);
  EXPECT_LT(took->count(), 3000);

  // Garbage instead of a ClientHello: the connection is dropped, the server serves on.
  for (const std::string& junk : {std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
                                  std::string("\x16\x03\x01\xff\xff", 5) + std::string(300, '\x7f'),
                                  std::string(64, '\0')}) {
    int fd = Connect(epp_->grpc_port());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
    EXPECT_TRUE(TimeToClose(fd, 5000ms).has_value());
    ::close(fd);
  }
  grpc::Status st;
  EXPECT_EQ(addresses_.count(Pick(TlsChannel(epp_->grpc_port(), epp_->serving_cert_pem()), &st)), 1u)
      << st.error_message();
}

}  // namespace
}  // namespace kvroute::epp
