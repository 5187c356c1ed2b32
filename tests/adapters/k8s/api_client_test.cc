// The Kubernetes API client against FakeApiServer (fake_api_server.h), which stands in for
// the real API server: no cluster runs here. Real TLS over loopback, a CA generated per
// test, the list and watch wire protocol of REFERENCE.md 12.
#include "adapters/k8s/api_client.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fake_api_server.h"

namespace kvroute::k8s {
namespace {

using kvroute::k8s::testing::FakeApiServer;
using kvroute::k8s::testing::TestPki;
using namespace std::chrono_literals;

class ApiClientTest : public ::testing::Test {
 protected:
  // Runs the client's loop until `done` or 5 s.
  bool RunUntil(const std::function<bool()>& done, std::chrono::milliseconds limit = 5000ms) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      ctx_.run_for(5ms);
    }
    return true;
  }
  ClusterAccess Access(FakeApiServer& server, std::string token = "test-token") {
    ClusterAccess a;
    EXPECT_EQ(ParseServerUrl("https://127.0.0.1:" + std::to_string(server.port()), a).ToString(),
              "OK");
    a.ca_pem = server.pki().cert_pem();
    a.token = TokenSource::Fixed(std::move(token));
    a.source = "test";
    return a;
  }
  std::optional<ApiResult> GetOnce(ApiClient& client, const std::string& target) {
    std::optional<ApiResult> out;
    client.Get(target, [&](ApiResult&& r) { out = std::move(r); });
    EXPECT_TRUE(RunUntil([&] { return out.has_value(); }));
    return out;
  }

  boost::asio::io_context ctx_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{ctx_.get_executor()};
};

constexpr const char* kPodCollection = "/api/v1/namespaces/ns/pods";
constexpr const char* kPods = "/api/v1/namespaces/ns/pods?labelSelector=app%3Dvllm";

// A ready pod the kPods selector matches.
std::string VllmPod(const std::string& name, bool ready = true) {
  return FakeApiServer::PodJson(name, "10.0.0.1", ready, {{"app", "vllm"}});
}

std::string WatchTarget(int rv) {
  return std::string(kPods) + "&watch=1&resourceVersion=" + std::to_string(rv) +
         "&allowWatchBookmarks=true";
}

TEST_F(ApiClientTest, ListsPodsOverVerifiedTls) {
  FakeApiServer server;
  server.Put(kPodCollection, VllmPod("vllm-0"));  // rv 2
  server.Put(kPodCollection, VllmPod("vllm-1"));  // rv 3
  server.Put(kPodCollection, FakeApiServer::PodJson("other", "10.0.0.9", true, {{"app", "x"}}));
  ApiClient client(ctx_, Access(server));
  ASSERT_TRUE(client.init_status().ok()) << client.init_status().ToString();
  auto r = GetOnce(client, kPods);
  ASSERT_TRUE(r && r->ok()) << (r ? r->status.message() : "no result");
  EXPECT_EQ(r->http_status, 200);
  EXPECT_TRUE(r->status.ok());
  EXPECT_NE(r->body.find("\"kind\":\"PodList\""), std::string::npos);
  EXPECT_NE(r->body.find("\"metadata\":{\"resourceVersion\":\"4\"}"), std::string::npos);
  EXPECT_NE(r->body.find("vllm-1"), std::string::npos);
  EXPECT_EQ(r->body.find("other"), std::string::npos);  // not selected
  EXPECT_EQ(server.targets(), std::vector<std::string>{kPods});
  EXPECT_EQ(client.stats().requests, 1u);
}

TEST_F(ApiClientTest, WatchDeliversLinesAsTheyArrive) {
  FakeApiServer server;
  ApiClient client(ctx_, Access(server));
  std::vector<std::string> lines;
  bool open = false;
  std::optional<ApiResult> done;
  client.Watch(WatchTarget(1), {[&] { open = true; },
                                [&](std::string_view l) { lines.emplace_back(l); },
                                [&](ApiResult&& r) { done = std::move(r); }});
  ASSERT_TRUE(RunUntil([&] { return open && server.open_watches() == 1; }));
  server.Put(kPodCollection, VllmPod("vllm-0"));
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 1; }));
  EXPECT_FALSE(done);  // one line out, the stream still open
  EXPECT_EQ(lines[0].rfind("{\"type\":\"ADDED\"", 0), 0u) << lines[0];
  server.SplitNextEvent();  // one event in two chunks
  server.Put(kPodCollection, VllmPod("vllm-0", /*ready=*/false));
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 2; }));
  EXPECT_EQ(lines[1].rfind("{\"type\":\"MODIFIED\"", 0), 0u);
  EXPECT_EQ(lines[1].back(), '}');
  server.Bookmark();
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 3; }));
  EXPECT_NE(lines[2].find("\"type\":\"BOOKMARK\""), std::string::npos);
  EXPECT_NE(lines[2].find("\"resourceVersion\":\"3\""), std::string::npos);
  server.DropWatches();  // the server's watch timeout: a clean end
  ASSERT_TRUE(RunUntil([&] { return done.has_value(); }));
  EXPECT_TRUE(done->ok()) << done->status.message();
  EXPECT_EQ(client.stats().watch_lines, 3u);
}

TEST_F(ApiClientTest, WatchResumesAfterTheResourceVersionGiven) {
  FakeApiServer server;
  server.Put(kPodCollection, VllmPod("a"));  // rv 2
  server.Put(kPodCollection, VllmPod("b"));  // rv 3
  server.Delete(kPodCollection, "a");        // rv 4
  ApiClient client(ctx_, Access(server));
  std::vector<std::string> lines;
  auto req = client.Watch(WatchTarget(2), {nullptr, [&](std::string_view l) { lines.emplace_back(l); },
                                           [](ApiResult&&) {}});
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 2; }));
  EXPECT_NE(lines[0].find("\"resourceVersion\":\"3\""), std::string::npos);
  EXPECT_NE(lines[1].find("\"type\":\"DELETED\""), std::string::npos);
  req.Cancel();
  EXPECT_EQ(client.stats().failures_of(ApiError::kCancelled), 1u);
}

TEST_F(ApiClientTest, GoneEventEndsTheWatchAsGone) {
  FakeApiServer server;
  server.Put(kPodCollection, VllmPod("a"));
  server.Compact();
  ApiClient client(ctx_, Access(server));
  std::vector<std::string> lines;
  std::optional<ApiResult> done;
  client.Watch(WatchTarget(1), {nullptr, [&](std::string_view l) { lines.emplace_back(l); },
                                [&](ApiResult&& r) { done = std::move(r); }});
  ASSERT_TRUE(RunUntil([&] { return done.has_value(); }));
  EXPECT_EQ(done->error, ApiError::kGone) << done->status.message();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("\"code\":410"), std::string::npos);  // the owner relists
  EXPECT_EQ(client.stats().failures_of(ApiError::kGone), 1u);
}

TEST_F(ApiClientTest, WrongCaFailsVerification) {
  FakeApiServer server;
  TestPki other("some-other-ca");
  ClusterAccess a = Access(server);
  a.ca_pem = other.cert_pem();
  ApiClient client(ctx_, a);
  auto r = GetOnce(client, kPods);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error, ApiError::kTls);
  EXPECT_NE(r->status.message().find("certificate verify failed"), std::string::npos)
      << r->status.message();
  EXPECT_EQ(client.stats().failures_of(ApiError::kTls), 1u);
  EXPECT_TRUE(server.targets().empty());  // no request was sent
}

TEST_F(ApiClientTest, NameMismatchFailsVerification) {
  FakeApiServer server;
  ClusterAccess a = Access(server);
  a.tls_server_name = "kubernetes.default.svc";  // not in the certificate
  ApiClient client(ctx_, a);
  auto r = GetOnce(client, kPods);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error, ApiError::kTls) << r->status.message();
}

TEST_F(ApiClientTest, WrongTokenIs401WithAClearMessage) {
  FakeApiServer server;
  ApiClient client(ctx_, Access(server, "stale-token"));
  auto r = GetOnce(client, kPods);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error, ApiError::kUnauthorized);
  EXPECT_EQ(r->http_status, 401);
  EXPECT_EQ(r->status.message(), "GET 127.0.0.1:" + std::to_string(server.port()) + kPods +
                                     ": HTTP 401: Unauthorized");
  EXPECT_EQ(r->status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(client.stats().failures_of(ApiError::kUnauthorized), 1u);
}

TEST_F(ApiClientTest, RotatedTokenFileIsUsedOnTheNextRequest) {
  FakeApiServer server;
  auto path = std::filesystem::temp_directory_path() /
              ("kvroute-token-" + std::to_string(getpid()));
  std::ofstream(path, std::ios::trunc) << "expired\n";
  ClusterAccess a = Access(server);
  a.token = TokenSource::File(path.string());
  ApiClient client(ctx_, a);
  auto r1 = GetOnce(client, kPods);
  ASSERT_TRUE(r1);
  EXPECT_EQ(r1->error, ApiError::kUnauthorized);
  std::ofstream(path, std::ios::trunc) << "test-token\n";
  auto r2 = GetOnce(client, kPods);
  ASSERT_TRUE(r2);
  EXPECT_TRUE(r2->ok()) << r2->status.message();
  std::filesystem::remove(path);
}

TEST_F(ApiClientTest, ClientCertificateIsPresented) {
  FakeApiServer::Options o;
  o.require_client_cert = true;
  FakeApiServer server(o);
  {
    ApiClient client(ctx_, Access(server));
    auto r = GetOnce(client, kPods);
    ASSERT_TRUE(r);
    EXPECT_FALSE(r->ok());  // the server refuses a client without a certificate
  }
  tls::KeyPair leaf = server.pki().Issue("kvroute-epp", "");
  ClusterAccess a = Access(server);
  a.client_cert_pem = leaf.cert_pem;
  a.client_key_pem = leaf.key_pem;
  ApiClient client(ctx_, a);
  ASSERT_TRUE(client.init_status().ok()) << client.init_status().ToString();
  auto r = GetOnce(client, kPods);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->ok()) << r->status.message();
}

TEST_F(ApiClientTest, NothingListeningIsAConnectError) {
  uint16_t port;
  {
    FakeApiServer gone;
    port = gone.port();
  }
  ClusterAccess a;
  ParseServerUrl("https://127.0.0.1:" + std::to_string(port), a);
  ApiClient client(ctx_, a);
  auto r = GetOnce(client, kPods);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error, ApiError::kConnect) << r->status.message();
  EXPECT_EQ(r->status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(client.stats().failures_of(ApiError::kConnect), 1u);
}

TEST_F(ApiClientTest, BadCaPemIsAnInitError) {
  FakeApiServer server;
  ClusterAccess a = Access(server);
  a.ca_pem = "not a certificate";
  ApiClient client(ctx_, a);
  EXPECT_FALSE(client.init_status().ok());
  auto r = GetOnce(client, kPods);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error, ApiError::kTls);
}

// The watch dropped by the server is resumed from the last resourceVersion seen, with
// nothing replayed and nothing missed.
TEST_F(ApiClientTest, WatchLoopReconnectsAfterTheServerDropsTheWatch) {
  FakeApiServer server;
  ApiClient client(ctx_, Access(server));
  int last_rv = 1;
  std::vector<std::string> lines;
  std::vector<ApiError> ends;
  int opens = 0;
  WatchLoop::Callbacks cb;
  cb.target = [&] { return WatchTarget(last_rv); };
  cb.on_open = [&] { ++opens; };
  cb.on_line = [&](std::string_view l) {
    lines.emplace_back(l);
    // The owner's decoder reads the version; a crude find stands in for it here.
    size_t at = l.find("\"resourceVersion\":\"");
    if (at != std::string_view::npos) last_rv = std::stoi(std::string(l.substr(at + 19)));
  };
  cb.on_end = [&](const ApiResult& r, std::chrono::milliseconds) { ends.push_back(r.error); };
  BackoffPolicy p;
  p.initial = 20ms;
  p.max = 100ms;
  WatchLoop loop(client, cb, p, 3);
  loop.Start();
  ASSERT_TRUE(RunUntil([&] { return opens == 1 && server.open_watches() == 1; }));
  server.Put(kPodCollection, VllmPod("a"));  // rv 2
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 1; }));
  server.DropWatches();
  ASSERT_TRUE(RunUntil([&] { return opens == 2 && server.open_watches() == 1; }));
  server.Put(kPodCollection, VllmPod("b"));  // rv 3
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 2; }));
  EXPECT_NE(lines[1].find("\"name\":\"b\""), std::string::npos);
  EXPECT_EQ(ends, std::vector<ApiError>{ApiError::kNone});
  EXPECT_EQ(loop.connections(), 2u);
  std::vector<std::string> t = server.targets();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[1], WatchTarget(2));
  loop.Stop();
}

// API server down at start: connect errors with growing delays, then it comes up.
TEST_F(ApiClientTest, WatchLoopRetriesWhileTheServerIsDown) {
  uint16_t port;
  {
    FakeApiServer gone;
    port = gone.port();
  }
  ClusterAccess a;
  ParseServerUrl("https://127.0.0.1:" + std::to_string(port), a);
  ApiClient client(ctx_, a);
  std::vector<std::chrono::milliseconds> delays;
  WatchLoop::Callbacks cb;
  cb.target = [] { return WatchTarget(1); };
  cb.on_end = [&](const ApiResult& r, std::chrono::milliseconds d) {
    EXPECT_EQ(r.error, ApiError::kConnect);
    delays.push_back(d);
  };
  BackoffPolicy p;
  p.initial = 5ms;
  p.max = 40ms;
  p.jitter = 0;
  WatchLoop loop(client, cb, p);
  loop.Start();
  ASSERT_TRUE(RunUntil([&] { return delays.size() >= 5; }));
  loop.Stop();
  EXPECT_EQ(delays[0], 5ms);
  EXPECT_EQ(delays[1], 10ms);
  EXPECT_EQ(delays[3], 40ms);
  EXPECT_EQ(delays[4], 40ms);
  EXPECT_EQ(client.stats().failures_of(ApiError::kConnect), delays.size());
}

}  // namespace
}  // namespace kvroute::k8s
