// API keys in `kvroute serve` (issue 29, item 3) over loopback: a recording replica behind
// the router, the key files in a temporary directory, reloads driven by calling the poll
// hook (the poll timer is set to an hour, so it never runs on its own).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/router_config.h"
#include "adapters/http/test_client.h"
#include "apps/serve/router.h"
#include "metrics/metric_sum.h"
#include "support/openai_body.h"
#include "support/stub_server.h"
#include "support/wait.h"

namespace kvroute::router {
namespace {

namespace fs = std::filesystem;
using http::ClientResponse;
using http::Fetch;
using kvroute::test_support::CompletionBody;
using kvroute::test_support::RecordingUpstream;
using kvroute::test_support::WaitFor;
using metrics::testing::MetricSum;

constexpr std::string_view kUnauthorized = R"({"error":"Unauthorized"})";
using Headers = std::vector<std::pair<std::string, std::string>>;

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvroute-serve-auth-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    fs::remove_all(dir_);
  }

  // Written elsewhere and renamed into place, as an editor or a ConfigMap update does.
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name + ".tmp") << text;
    fs::rename(dir_ + "/" + name + ".tmp", dir_ + "/" + name);
  }

  std::string ConfigText(const std::string& auth) {
    return "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n  endpoints:\n"
           "    - {address: " + up_.address() + ", name: u}\n"
           "scheduling:\n  policy: round-robin\n"
           "auth:\n  api_keys_file: keys.txt\n  api_keys_poll: 1h\n" + auth;
  }

  Status TryStart(const std::string& auth = "") {
    const std::string path = dir_ + "/router.yaml";
    std::ofstream(path) << ConfigText(auth);
    config::ConfigOr<config::RouterConfig> r = config::LoadRouterConfig(path);
    if (!r.ok()) return r.status();
    RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = false;
    o.config_path = path;
    router_ = std::make_unique<Router>(std::move(*r.value), o);
    return router_->Start();
  }
  void Start(const std::string& auth = "") {
    Status st = TryStart(auth);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(WaitFor([&] {
      auto r = Fetch("127.0.0.1", router_->port(), "GET", "/readyz");
      return r && r->status == 200;
    }));
  }

  std::optional<ClientResponse> Post(const Headers& headers, std::string_view path = "/v1/completions",
                                     std::string_view body = {}) {
    const std::string b = body.empty() ? CompletionBody("Hello there", 2) : std::string(body);
    return Fetch("127.0.0.1", router_->port(), "POST", path, b, headers);
  }
  int Code(const Headers& headers) {
    auto r = Post(headers);
    return r ? r->status : -1;
  }
  std::string Metrics() {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? r->body : std::string();
  }

  std::string dir_;
  RecordingUpstream up_{R"({"ok":true})"};
  std::unique_ptr<Router> router_;
};

// A request without a valid key is refused as soon as its header is in: a client that
// announces a megabyte body gets the 401 before sending a byte of it (the connection then
// closes, the body unread); one with a valid key is read whole and served.
TEST_F(AuthTest, AKeylessRequestIsRefusedBeforeItsBodyIsRead) {
  Write("keys.txt", "alice sk-alice-1\n");
  Start();
  http::TestClient c("127.0.0.1", router_->port());
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRaw("POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                        "content-length: 1048576\r\n\r\n"));
  http::ClientResponse r;
  ASSERT_TRUE(c.ReadHead(&r)) << c.error();
  ASSERT_TRUE(c.ReadBody(&r)) << c.error();
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body, kUnauthorized);
  EXPECT_EQ(r.Header("connection"), "close");
  EXPECT_EQ(r.Header("www-authenticate"), "Bearer");

  http::TestClient ok("127.0.0.1", router_->port());
  ASSERT_TRUE(ok.Connect());
  const std::string body = CompletionBody("Hello there", 1);
  ASSERT_TRUE(ok.SendRaw("POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         "authorization: Bearer sk-alice-1\r\ncontent-length: " + std::to_string(body.size()) +
                         "\r\n\r\n"));
  ASSERT_TRUE(ok.SendRaw(body));
  http::ClientResponse served;
  ASSERT_TRUE(ok.ReadHead(&served)) << ok.error();
  ASSERT_TRUE(ok.ReadBody(&served)) << ok.error();
  EXPECT_EQ(served.status, 200) << served.body;
  // Counted once each: the early refusal, and the accepted request (at the handler only).
  const std::string m = Metrics();
  EXPECT_EQ(metrics::testing::MetricSum(m, "kvroute_auth_rejected_total", {{"reason", "missing"}}), 1);
  EXPECT_EQ(metrics::testing::MetricSum(m, "kvroute_auth_requests_total", {{"key", "alice"}}), 1);
}

TEST_F(AuthTest, RefusesMissingWrongAndOtherSchemeKeysWithVllmsShape) {
  Write("keys.txt", "# keys\nalice sk-alice-1\nsk-unnamed\n");
  Start();
  const std::vector<Headers> refused = {
      {},
      {{"authorization", "Bearer sk-wrong"}},
      {{"authorization", "Bearer sk-alice-"}},    // a prefix of a key
      {{"authorization", "Bearer sk-alice-12"}},  // a key plus one character
      {{"authorization", "Basic YWxpY2U6c2stYWxpY2UtMQ=="}},
      {{"authorization", "sk-alice-1"}},  // no scheme
      {{"authorization", "Bearer"}},
      {{"x-api-key", "sk-alice-1"}},
  };
  for (const Headers& h : refused) {
    auto r = Post(h);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 401) << (h.empty() ? "none" : h[0].second);
    EXPECT_EQ(r->body, kUnauthorized);
    EXPECT_EQ(r->Header("content-type"), "application/json");
    EXPECT_EQ(r->Header("www-authenticate"), "Bearer");
  }
  // Every path under /v1 needs a key, whatever it is (vLLM's rule): a GET, an unknown one.
  for (std::string_view path : {"/v1/models", "/v1/nope"}) {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", path);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(r->body, kUnauthorized);
  }
  EXPECT_TRUE(up_.seen().empty());  // nothing refused reached the replica

  EXPECT_EQ(Code({{"authorization", "Bearer sk-alice-1"}}), 200);
  EXPECT_EQ(Code({{"Authorization", "bearer  sk-alice-1"}}), 200);  // scheme case-insensitive
  EXPECT_EQ(Code({{"authorization", "Bearer sk-unnamed"}}), 200);
  EXPECT_EQ(up_.seen().size(), 3u);

  // Outside /v1 nothing is asked.
  for (std::string_view path : {"/healthz", "/readyz", "/metrics"}) {
    auto r = Fetch("127.0.0.1", router_->port(), "GET", path);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200) << path;
  }

  const std::string m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvroute_auth_requests_total", {{"key", "alice"}}), 2) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_auth_requests_total", {{"key", "line-3"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_rejected_total", {{"reason", "missing"}}), 4);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_rejected_total", {{"reason", "invalid"}}), 6);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_keys"), 2);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_reloads_total"), 0);
  EXPECT_EQ(m.find("sk-"), std::string::npos) << "a key in /metrics";
}

TEST_F(AuthTest, ForwardsTheClientsAuthorizationByDefault) {
  Write("keys.txt", "alice sk-alice-1\n");
  Start();
  ASSERT_EQ(Code({{"authorization", "Bearer sk-alice-1"}}), 200);
  ASSERT_EQ(up_.seen().size(), 1u);
  EXPECT_EQ(up_.seen()[0].Header("authorization"), "Bearer sk-alice-1");
}

TEST_F(AuthTest, ReplacesTheAuthorizationWithTheUpstreamKeyOnProxiedAndFannedOutRequests) {
  Write("keys.txt", "alice sk-alice-1\n");
  Write("up.key", "\n  sk-replica-1  \n");
  Start("  upstream_authorization: replace\n  upstream_api_key_file: up.key\n");
  ASSERT_EQ(Code({{"authorization", "Bearer sk-alice-1"}}), 200);
  auto lora = Post({{"authorization", "Bearer sk-alice-1"}}, "/v1/load_lora_adapter",
                   R"({"lora_name":"sql","lora_path":"/a"})");
  ASSERT_TRUE(lora.has_value());
  ASSERT_EQ(lora->status, 200) << lora->body;
  auto seen = up_.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].target, "/v1/completions");
  EXPECT_EQ(seen[0].Header("authorization"), "Bearer sk-replica-1");
  EXPECT_EQ(seen[1].target, "/v1/load_lora_adapter");
  EXPECT_EQ(seen[1].Header("authorization"), "Bearer sk-replica-1");

  // The upstream key is re-read with the keys file.
  Write("up.key", "sk-replica-2\n");
  router_->PollApiKeys();
  ASSERT_EQ(Code({{"authorization", "Bearer sk-alice-1"}}), 200);
  EXPECT_EQ(up_.seen().back().Header("authorization"), "Bearer sk-replica-2");
  EXPECT_EQ(MetricSum(Metrics(), "kvroute_auth_reloads_total", {{"result", "applied"}}), 1);
}

TEST_F(AuthTest, DropsTheAuthorization) {
  Write("keys.txt", "alice sk-alice-1\n");
  Start("  upstream_authorization: drop\n");
  ASSERT_EQ(Code({{"authorization", "Bearer sk-alice-1"}, {"x-app", "a"}}), 200);
  auto lora = Post({{"authorization", "Bearer sk-alice-1"}}, "/v1/unload_lora_adapter", R"({"lora_name":"sql"})");
  ASSERT_TRUE(lora && lora->status == 200);
  const auto seen = up_.seen();
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& s : seen) {
    EXPECT_EQ(s.headers.count("authorization"), 0u) << s.target;
  }
  EXPECT_EQ(seen[0].Header("x-app"), "a");
}

TEST_F(AuthTest, APolledChangeSwapsTheKeysAndABrokenFileKeepsTheLastGoodOnes) {
  Write("keys.txt", "alice sk-alice-1\nbob sk-bob-1\n");
  Start();
  router_->PollApiKeys();  // nothing changed: nothing happens
  EXPECT_EQ(MetricSum(Metrics(), "kvroute_auth_reloads_total"), 0);

  Write("keys.txt", "bob sk-bob-1\ncarol sk-carol-1\n");
  router_->PollApiKeys();
  EXPECT_EQ(Code({{"authorization", "Bearer sk-alice-1"}}), 401);
  EXPECT_EQ(Code({{"authorization", "Bearer sk-bob-1"}}), 200);
  EXPECT_EQ(Code({{"authorization", "Bearer sk-carol-1"}}), 200);
  std::string m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvroute_auth_reloads_total", {{"result", "applied"}}), 1) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_auth_keys"), 2);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_requests_total", {{"key", "carol"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_requests_total", {{"key", "alice"}}), 0);  // kept, at 0

  // Broken (a third field), then empty, then gone: the running keys stay each time.
  Write("keys.txt", "bob sk-bob-1 extra\n");
  router_->PollApiKeys();
  router_->PollApiKeys();  // the same broken file is not read again
  Write("keys.txt", "# all keys removed\n");
  router_->PollApiKeys();
  fs::remove(dir_ + "/keys.txt");
  router_->PollApiKeys();
  EXPECT_EQ(Code({{"authorization", "Bearer sk-bob-1"}}), 200);
  EXPECT_EQ(Code({{"authorization", "Bearer sk-carol-1"}}), 200);
  m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvroute_auth_reloads_total", {{"result", "rejected"}}), 3) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_auth_reloads_total", {{"result", "applied"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_keys"), 2);

  // Fixed again: applied.
  Write("keys.txt", "dave sk-dave-1\n");
  router_->PollApiKeys();
  EXPECT_EQ(Code({{"authorization", "Bearer sk-bob-1"}}), 401);
  EXPECT_EQ(Code({{"authorization", "Bearer sk-dave-1"}}), 200);
  EXPECT_EQ(MetricSum(Metrics(), "kvroute_auth_keys"), 1);
}

TEST_F(AuthTest, AReloadRereadsTheKeysFile) {
  Write("keys.txt", "alice sk-alice-1\n");
  Start();
  // Rewritten in place (same size, mtime put back): the reload SIGHUP runs reads it.
  const std::string path = dir_ + "/keys.txt";
  const auto mtime = fs::last_write_time(path);
  std::ofstream(path) << "alice sk-alice-2\n";
  fs::last_write_time(path, mtime);
  ASSERT_TRUE(router_->Reload().ok());
  EXPECT_EQ(Code({{"authorization", "Bearer sk-alice-1"}}), 401);
  EXPECT_EQ(Code({{"authorization", "Bearer sk-alice-2"}}), 200);
}

TEST_F(AuthTest, ABadKeysFileFailsTheStart) {
  Write("keys.txt", "alice sk-1\nbob sk-1\n");
  Status st = TryStart();
  EXPECT_EQ(st.message(), "auth: " + dir_ + "/keys.txt:2: api_keys: duplicate key (the same key as line 1)");
  router_.reset();
  Write("keys.txt", "\n");
  EXPECT_EQ(TryStart().message(), "auth: " + dir_ +
                                      "/keys.txt: api_keys: no API key in the file (auth is configured: "
                                      "nobody could be let in)");
  router_.reset();
  fs::remove(dir_ + "/keys.txt");
  EXPECT_EQ(TryStart().message().rfind("auth: " + dir_ + "/keys.txt: cannot read file", 0), 0u)
      << TryStart().message();
}

}  // namespace
}  // namespace kvroute::router
