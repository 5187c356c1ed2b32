// FakeApiServer (fake_api_server.h) and the fake-kube-apiserver binary behave as the
// Kubernetes API server does where discovery depends on it: lists and watches filtered
// by label and field selectors, 404 Status for unknown objects and uninstalled CRDs, an
// object modified out of a watch's selector arriving as DELETED, injected failures, a
// server started after its client, a kubeconfig that LoadKubeconfig accepts.
#include "fake_api_server.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <simdjson.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "adapters/k8s/api_client.h"
#include "adapters/k8s/kubeconfig.h"
#include "support/test_paths.h"

extern char** environ;

namespace kvroute::k8s {
namespace {

using kvroute::k8s::testing::FakeApiServer;
using kvroute::k8s::testing::FakeApiServerOptions;
using kvroute::k8s::testing::TestPki;
using kvroute::k8s::testing::fake_api_detail::LabelSelector;
using namespace std::chrono_literals;

constexpr const char* kPods = "/api/v1/namespaces/ns/pods";
constexpr const char* kPoolsV1 =
    "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools";
constexpr const char* kPoolsV1Alpha2 =
    "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/ns/inferencepools";
constexpr const char* kObjectives = "/apis/llm-d.ai/v1alpha2/namespaces/ns/inferenceobjectives";

std::string Pod(const std::string& name, const std::map<std::string, std::string>& labels) {
  return FakeApiServer::PodJson(name, "10.0.0.1", true, labels);
}

// What the tests read back from JSON: a document's top-level string field, the names of
// a list's items, an event's type and object name.
struct Parsed {
  std::string kind, api_version, reason, list_rv, type, name, rv;
  int64_t code = 0;
  std::vector<std::string> names;
};
Parsed Parse(const std::string& json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  Parsed p;
  EXPECT_EQ(parser.parse(json).get(root), simdjson::SUCCESS) << json;
  if (!root.is_object()) return p;
  std::string_view s;
  if (!root["kind"].get_string().get(s)) p.kind = s;
  if (!root["apiVersion"].get_string().get(s)) p.api_version = s;
  if (!root["reason"].get_string().get(s)) p.reason = s;
  if (!root["metadata"]["resourceVersion"].get_string().get(s)) p.list_rv = s;
  if (!root["type"].get_string().get(s)) p.type = s;
  if (!root["object"]["metadata"]["name"].get_string().get(s)) p.name = s;
  if (!root["object"]["metadata"]["resourceVersion"].get_string().get(s)) p.rv = s;
  if (!root["object"]["kind"].get_string().get(s)) p.kind = s;
  if (root["code"].get_int64().get(p.code)) p.code = 0;
  simdjson::dom::array items;
  if (!root["items"].get_array().get(items)) {
    for (simdjson::dom::element item : items) {
      if (!item["metadata"]["name"].get_string().get(s)) p.names.emplace_back(s);
    }
  }
  return p;
}

class FakeApiServerTest : public ::testing::Test {
 protected:
  bool RunUntil(const std::function<bool()>& done, std::chrono::milliseconds limit = 5000ms) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      ctx_.run_for(5ms);
    }
    return true;
  }
  ClusterAccess Access(uint16_t port, const std::string& ca_pem) {
    ClusterAccess a;
    EXPECT_EQ(ParseServerUrl("https://127.0.0.1:" + std::to_string(port), a).ToString(), "OK");
    a.ca_pem = ca_pem;
    a.token = TokenSource::Fixed("test-token");
    return a;
  }
  ApiClient& Client(FakeApiServer& server) {
    client_.emplace(ctx_, Access(server.port(), server.pki().cert_pem()));
    return *client_;
  }
  ApiResult Get(const std::string& target) {
    std::optional<ApiResult> out;
    client_->Get(target, [&](ApiResult&& r) { out = std::move(r); });
    EXPECT_TRUE(RunUntil([&] { return out.has_value(); }));
    return out ? std::move(*out) : ApiResult{};
  }
  // Opens a watch on `target`; its lines collect in `lines`.
  ApiRequest Watch(FakeApiServer& server, const std::string& target,
                   std::vector<std::string>& lines, std::optional<ApiResult>* done = nullptr) {
    int before = server.open_watches();
    bool open = false;
    ApiRequest r = client_->Watch(
        target, {[&open] { open = true; }, [&lines](std::string_view l) { lines.emplace_back(l); },
                 [done](ApiResult&& res) {
                   if (done) *done = std::move(res);
                 }});
    EXPECT_TRUE(RunUntil([&] { return open && server.open_watches() == before + 1; }));
    return r;
  }

  boost::asio::io_context ctx_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      ctx_.get_executor()};
  std::optional<ApiClient> client_;
};

TEST(LabelSelectorTest, ParsesTheApiStringForm) {
  std::map<std::string, std::string> labels = {{"app", "vllm"}, {"tier", "gpu"}};
  auto matches = [&](const std::string& text) {
    LabelSelector s;
    EXPECT_EQ(s.Parse(text), "") << text;
    return s.Matches(labels);
  };
  EXPECT_TRUE(matches(""));
  EXPECT_TRUE(matches("app=vllm"));
  EXPECT_TRUE(matches("app==vllm,tier=gpu"));
  EXPECT_FALSE(matches("app=vllm,tier=cpu"));
  EXPECT_TRUE(matches("app!=sglang"));
  EXPECT_TRUE(matches("zone!=a"));  // absent: != holds
  EXPECT_TRUE(matches("app in (sglang, vllm)"));
  EXPECT_FALSE(matches("app in (sglang)"));
  EXPECT_TRUE(matches("app notin (sglang),zone notin (a)"));
  EXPECT_FALSE(matches("tier notin (gpu,tpu)"));
  EXPECT_TRUE(matches("app"));
  EXPECT_FALSE(matches("zone"));
  EXPECT_TRUE(matches("!zone"));
  EXPECT_FALSE(matches("!app"));
  LabelSelector bad;
  EXPECT_NE(bad.Parse("app in vllm"), "");
  EXPECT_NE(bad.Parse("app in (vllm"), "");
  EXPECT_NE(bad.Parse("=x"), "");
}

TEST_F(FakeApiServerTest, ListFiltersByLabelAndFieldSelectors) {
  FakeApiServer server;
  server.Put(kPods, Pod("a", {{"app", "vllm"}, {"tier", "gpu"}}));
  server.Put(kPods, Pod("b", {{"app", "vllm"}}));
  server.Put(kPods, Pod("c", {{"app", "sglang"}}));
  int rv = server.Put("/api/v1/namespaces/other/pods", Pod("d", {{"app", "vllm"}}));
  Client(server);
  auto names = [&](const std::string& query) {
    ApiResult r = Get(std::string(kPods) + query);
    EXPECT_TRUE(r.ok()) << r.status.message();
    return Parse(r.body).names;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(""), (V{"a", "b", "c"}));  // this namespace only, by name
  EXPECT_EQ(names("?labelSelector=app%3Dvllm"), (V{"a", "b"}));
  EXPECT_EQ(names("?labelSelector=app%3Dvllm%2Ctier%3Dgpu"), V{"a"});
  EXPECT_EQ(names("?labelSelector=app+in+%28sglang%2Cvllm%29,!tier"), (V{"b", "c"}));
  EXPECT_EQ(names("?labelSelector=app%20notin%20(vllm)"), V{"c"});
  EXPECT_EQ(names("?labelSelector=tier"), V{"a"});
  EXPECT_EQ(names("?fieldSelector=metadata.name%3Db"), V{"b"});
  EXPECT_EQ(names("?labelSelector=app%3Dvllm&fieldSelector=metadata.name%3Dc"), V{});

  ApiResult r = Get(kPods);
  Parsed list = Parse(r.body);
  EXPECT_EQ(list.kind, "PodList");
  EXPECT_EQ(list.api_version, "v1");
  EXPECT_EQ(list.list_rv, std::to_string(rv));  // one counter for every collection

  ApiResult bad = Get(std::string(kPods) + "?labelSelector=app%20in%20vllm");
  EXPECT_EQ(bad.http_status, 400);
  EXPECT_EQ(Parse(bad.body).reason, "BadRequest");
  EXPECT_EQ(Get(std::string(kPods) + "?fieldSelector=spec.nodeName%3Dn").http_status, 400);
}

TEST_F(FakeApiServerTest, PutStoresTheServersResourceVersionAndNamespace) {
  FakeApiServer server;
  int rv = server.Put(kPods,
                      "{\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"999\"},"
                      "\"status\":{\"podIP\":\"10.0.0.7\"}}");
  EXPECT_EQ(rv, 2);
  Client(server);
  ApiResult r = Get(std::string(kPods) + "/a");
  ASSERT_TRUE(r.ok()) << r.status.message();
  EXPECT_EQ(r.body,
            "{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"a\","
            "\"namespace\":\"ns\",\"resourceVersion\":\"2\"},\"status\":{\"podIP\":\"10.0.0.7\"}}");
  EXPECT_THROW(server.Put(kPods, "{\"metadata\":{}}"), std::invalid_argument);
  EXPECT_THROW(server.Put(kPods, "[1]"), std::invalid_argument);
  EXPECT_THROW(server.Put(kPods, "{\"metadata\":{\"name\":\"x\",\"namespace\":\"other\"}}"),
               std::invalid_argument);
  EXPECT_EQ(server.resource_version(), 2);  // nothing stored by a refused Put
  EXPECT_EQ(server.Delete(kPods, "nope"), 0);
  EXPECT_EQ(server.Delete(kPods, "a"), 3);
}

TEST_F(FakeApiServerTest, GetOfAMissingObjectIs404NotFound) {
  FakeApiServer server;
  server.Put(kPods, Pod("a", {}));
  Client(server);
  EXPECT_TRUE(Get(std::string(kPods) + "/a").ok());
  ApiResult r = Get(std::string(kPods) + "/b");
  EXPECT_EQ(r.http_status, 404);
  Parsed p = Parse(r.body);
  EXPECT_EQ(p.kind, "Status");
  EXPECT_EQ(p.reason, "NotFound");
  EXPECT_EQ(p.code, 404);
  EXPECT_NE(r.body.find("pods \\\"b\\\" not found"), std::string::npos) << r.body;
}

TEST_F(FakeApiServerTest, CustomResourcesAre404UntilTheCrdIsInstalled) {
  FakeApiServer server;
  EXPECT_THROW(server.Put(kPoolsV1, FakeApiServer::PoolV1Json("p", {{"app", "vllm"}}, {8000})),
               std::invalid_argument);
  Client(server);
  for (std::string target : {std::string(kPoolsV1), std::string(kPoolsV1) + "/p",
                             std::string(kPoolsV1) + "?watch=1&resourceVersion=1"}) {
    ApiResult r = Get(target);
    EXPECT_EQ(r.http_status, 404) << target;
    EXPECT_EQ(Parse(r.body).kind, "Status");
    EXPECT_EQ(Parse(r.body).reason, "NotFound");
  }
  server.InstallCrd(kPoolsV1);
  server.InstallCrd(kPoolsV1Alpha2);
  server.InstallCrd(kObjectives);
  server.Put(kPoolsV1, FakeApiServer::PoolV1Json("p", {{"app", "vllm"}}, {8000, 8001}));
  server.Put(kPoolsV1Alpha2, FakeApiServer::PoolV1Alpha2Json("old", {{"app", "vllm"}}, 8000));
  server.Put(kObjectives, FakeApiServer::ObjectiveJson("llm-d.ai/v1alpha2", "chat", "p", 5));

  ApiResult list = Get(kPoolsV1);
  ASSERT_TRUE(list.ok()) << list.status.message();
  Parsed p = Parse(list.body);
  EXPECT_EQ(p.kind, "InferencePoolList");
  EXPECT_EQ(p.api_version, "inference.networking.k8s.io/v1");
  EXPECT_EQ(p.names, std::vector<std::string>{"p"});
  EXPECT_NE(list.body.find("\"targetPorts\":[{\"number\":8000},{\"number\":8001}]"),
            std::string::npos);
  Parsed old = Parse(Get(kPoolsV1Alpha2).body);
  EXPECT_EQ(old.api_version, "inference.networking.x-k8s.io/v1alpha2");
  EXPECT_EQ(old.names, std::vector<std::string>{"old"});
  EXPECT_EQ(Parse(Get(kObjectives).body).kind, "InferenceObjectiveList");
  ApiResult one = Get(std::string(kPoolsV1) + "/p");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(Parse(one.body).kind, "InferencePool");
  EXPECT_EQ(Get(std::string(kPoolsV1) + "/missing").http_status, 404);
}

TEST_F(FakeApiServerTest, WatchSendsTheCollectionsEventsThatPassTheSelectors) {
  FakeApiServer server;
  server.InstallCrd(kPoolsV1);
  Client(server);
  std::vector<std::string> lines;
  auto w = Watch(server,
                 std::string(kPods) + "?labelSelector=app%3Dvllm&watch=1&allowWatchBookmarks=true",
                 lines);
  server.Put(kPods, Pod("other", {{"app", "sglang"}}));                    // not selected
  server.Put("/api/v1/namespaces/ns2/pods", Pod("a", {{"app", "vllm"}}));  // another collection
  server.Put(kPoolsV1, FakeApiServer::PoolV1Json("p", {{"app", "vllm"}}, {8000}));
  int rv = server.Put(kPods, Pod("a", {{"app", "vllm"}}));
  ASSERT_TRUE(RunUntil([&] { return !lines.empty(); }));
  server.Bookmark();
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 2; }));
  Parsed added = Parse(lines[0]);
  EXPECT_EQ(added.type, "ADDED");
  EXPECT_EQ(added.name, "a");
  EXPECT_EQ(added.rv, std::to_string(rv));
  Parsed bookmark = Parse(lines[1]);
  EXPECT_EQ(bookmark.type, "BOOKMARK");
  EXPECT_EQ(bookmark.kind, "Pod");
  EXPECT_EQ(bookmark.rv, std::to_string(rv));

  // A watch on one name, from a resourceVersion: the stored events after it.
  std::vector<std::string> named;
  auto w2 = Watch(
      server, std::string(kPods) + "?fieldSelector=metadata.name%3Dother&watch=1&resourceVersion=1",
      named);
  ASSERT_TRUE(RunUntil([&] { return named.size() == 1; }));
  EXPECT_EQ(Parse(named[0]).name, "other");
  EXPECT_EQ(Parse(named[0]).type, "ADDED");
  w.Cancel();
  w2.Cancel();
}

TEST_F(FakeApiServerTest, AnObjectModifiedOutOfTheSelectorIsDeletedAndBackInIsAdded) {
  FakeApiServer server;
  server.Put(kPods, Pod("a", {{"app", "vllm"}}));
  Client(server);
  std::vector<std::string> lines;
  auto w = Watch(server, std::string(kPods) + "?labelSelector=app%3Dvllm&watch=1&resourceVersion=2",
                 lines);
  server.Put(kPods, FakeApiServer::PodJson("a", "10.0.0.1", false, {{"app", "vllm"}}));  // MODIFIED
  int out_rv = server.Put(kPods, Pod("a", {{"app", "retired"}}));                        // leaves
  server.Put(kPods, Pod("a", {{"app", "retired"}, {"x", "y"}}));                         // outside
  int in_rv = server.Put(kPods, Pod("a", {{"app", "vllm"}}));                            // returns
  int del_rv = server.Delete(kPods, "a");
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 4; }));
  std::vector<std::string> types;
  for (const auto& l : lines) types.push_back(Parse(l).type);
  EXPECT_EQ(types, (std::vector<std::string>{"MODIFIED", "DELETED", "ADDED", "DELETED"}));
  // The DELETED for leaving carries the last content the watch could see, at the new version.
  EXPECT_NE(lines[1].find("\"app\":\"vllm\""), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("\"status\":\"False\""), std::string::npos) << lines[1];
  EXPECT_EQ(Parse(lines[1]).rv, std::to_string(out_rv));
  EXPECT_EQ(Parse(lines[2]).rv, std::to_string(in_rv));
  EXPECT_EQ(Parse(lines[3]).rv, std::to_string(del_rv));
  w.Cancel();
}

TEST_F(FakeApiServerTest, CompactAndDropEndWatchesAsTheRealServerDoes) {
  FakeApiServer server;
  server.Put(kPods, Pod("a", {}));
  Client(server);
  std::vector<std::string> lines;
  std::optional<ApiResult> done;
  auto w = Watch(server, std::string(kPods) + "?watch=1&resourceVersion=2", lines, &done);
  server.DropWatches();
  ASSERT_TRUE(RunUntil([&] { return done.has_value(); }));
  EXPECT_TRUE(done->ok()) << done->status.message();
  done.reset();
  auto w2 = Watch(server, std::string(kPods) + "?watch=1&resourceVersion=2", lines, &done);
  server.Compact();
  ASSERT_TRUE(RunUntil([&] { return done.has_value(); }));
  EXPECT_EQ(done->error, ApiError::kGone);
  done.reset();
  lines.clear();
  client_->Watch(std::string(kPods) + "?watch=1&resourceVersion=1",
                 {nullptr, [&](std::string_view l) { lines.emplace_back(l); },
                  [&](ApiResult&& r) { done = std::move(r); }});
  ASSERT_TRUE(RunUntil([&] { return done.has_value(); }));
  EXPECT_EQ(done->error, ApiError::kGone);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(Parse(lines[0]).type, "ERROR");
  // timeoutSeconds: the server ends the watch cleanly.
  done.reset();
  client_->Watch(std::string(kPods) + "?watch=1&timeoutSeconds=1",
                 {nullptr, nullptr, [&](ApiResult&& r) { done = std::move(r); }});
  ASSERT_TRUE(RunUntil([&] { return done.has_value(); }, 3000ms));
  EXPECT_TRUE(done->ok()) << done->status.message();
}

TEST_F(FakeApiServerTest, FailNextAnswersTheStatusThenRecovers) {
  FakeApiServer server;
  Client(server);
  server.FailNext(503, 2);
  ApiResult r1 = Get(kPods);
  EXPECT_EQ(r1.http_status, 503);
  EXPECT_EQ(Parse(r1.body).reason, "ServiceUnavailable");
  std::optional<ApiResult> done;
  client_->Watch(std::string(kPods) + "?watch=1",
                 {nullptr, nullptr, [&](ApiResult&& r) { done = std::move(r); }});
  ASSERT_TRUE(RunUntil([&] { return done.has_value(); }));
  EXPECT_EQ(done->http_status, 503);
  EXPECT_TRUE(Get(kPods).ok());
  server.FailNext(500);
  ApiResult r3 = Get(kPods);
  EXPECT_EQ(r3.http_status, 500);
  EXPECT_EQ(Parse(r3.body).reason, "InternalError");
  EXPECT_TRUE(Get(kPods).ok());
}

// "API server down at start, then up": the client's watch loop retries until a server
// comes up on the port (and under the CA) it was given.
TEST_F(FakeApiServerTest, AServerOnAFixedPortCanStartAfterItsClient) {
  uint16_t port;
  {
    FakeApiServer probe;  // a port that was free a moment ago
    port = probe.port();
  }
  auto pki = std::make_shared<TestPki>();
  client_.emplace(ctx_, Access(port, pki->cert_pem()));
  int opens = 0, connect_errors = 0;
  WatchLoop::Callbacks cb;
  cb.target = [] { return std::string(kPods) + "?watch=1"; };
  cb.on_open = [&] { ++opens; };
  cb.on_end = [&](const ApiResult& r, std::chrono::milliseconds) {
    if (r.error == ApiError::kConnect) ++connect_errors;
  };
  BackoffPolicy p;
  p.initial = 10ms;
  p.max = 50ms;
  WatchLoop loop(*client_, cb, p);
  loop.Start();
  ASSERT_TRUE(RunUntil([&] { return connect_errors >= 2; }));
  EXPECT_EQ(opens, 0);
  FakeApiServerOptions o;
  o.port = port;
  o.pki = pki;
  FakeApiServer server(o);
  EXPECT_EQ(server.port(), port);
  ASSERT_TRUE(RunUntil([&] { return opens == 1 && server.open_watches() == 1; }));
  loop.Stop();
}

TEST_F(FakeApiServerTest, ItsKubeconfigLoads) {
  FakeApiServer server;
  server.Put(kPods, Pod("a", {}));
  auto path = std::filesystem::temp_directory_path() /
              ("kvroute-fake-kubeconfig-" + std::to_string(getpid()) + ".yaml");
  std::ofstream(path, std::ios::trunc) << server.KubeconfigYaml("ns");
  auto access = LoadKubeconfig(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(access.ok()) << access.error.ToString();
  EXPECT_EQ(access.value->host, "127.0.0.1");
  EXPECT_EQ(access.value->port, server.port());
  EXPECT_EQ(access.value->namespace_name, "ns");
  EXPECT_EQ(access.value->ca_pem, server.pki().cert_pem());
  client_.emplace(ctx_, *access.value);
  ApiResult r = Get(kPods);
  ASSERT_TRUE(r.ok()) << r.status.message();
  EXPECT_EQ(Parse(r.body).names, std::vector<std::string>{"a"});
}

// The binary, driven as an end-to-end test drives it.
class FakeApiServerBinaryTest : public FakeApiServerTest {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    kubeconfig_ = (std::filesystem::temp_directory_path() /
                   ("kvroute-fake-apiserver-" + std::to_string(getpid()) + ".yaml"))
                      .string();
    int in[2], out[2];
    ASSERT_EQ(pipe(in), 0);
    ASSERT_EQ(pipe(out), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    const std::string server = kvroute::test_support::FakeKubeApiserver();
    std::vector<std::string> args = {server, "--kubeconfig-out", kubeconfig_};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(posix_spawn(&pid_, server.c_str(), &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  void TearDown() override {
    if (to_) fclose(to_);
    if (from_) fclose(from_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (!kubeconfig_.empty()) std::filesystem::remove(kubeconfig_);
  }
  std::string ReadLine() {
    char buf[4096];
    if (!fgets(buf, sizeof buf, from_)) return "<eof>";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  std::string Command(const std::string& line) {
    fputs((line + "\n").c_str(), to_);
    fflush(to_);
    return ReadLine();
  }
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  std::string kubeconfig_;
};

TEST_F(FakeApiServerBinaryTest, ServesWhatItIsToldThroughItsKubeconfig) {
  Start({"--token", "test-token"});
  std::string ready = ReadLine();
  ASSERT_EQ(ready.rfind("ready ", 0), 0u) << ready;
  int port = std::stoi(ready.substr(6));
  auto access = LoadKubeconfig(kubeconfig_);
  ASSERT_TRUE(access.ok()) << access.error.ToString();
  EXPECT_EQ(access.value->port, port);
  client_.emplace(ctx_, *access.value);

  EXPECT_EQ(Command("crd " + std::string(kPoolsV1)), "ok 1");
  EXPECT_EQ(Command("put " + std::string(kPoolsV1) + " " +
                    FakeApiServer::PoolV1Json("p", {{"app", "vllm"}}, {8000})),
            "ok 2");
  EXPECT_EQ(Command("put " + std::string(kPods) + " " + Pod("a", {{"app", "vllm"}})), "ok 3");
  EXPECT_EQ(Command("put " + std::string(kPods) + " {not json"), "error Put pods: not valid JSON");
  EXPECT_EQ(Command("put /apis/x/v1/namespaces/ns/widgets {\"metadata\":{\"name\":\"w\"}}")
                .rfind("error ", 0),
            0u);
  EXPECT_EQ(Command("frobnicate"), "error unknown command \"frobnicate\"");
  EXPECT_EQ(Parse(Get(std::string(kPoolsV1) + "/p").body).kind, "InferencePool");

  std::vector<std::string> lines;
  std::optional<ApiResult> done;
  bool open = false;
  client_->Watch(std::string(kPods) + "?watch=1&resourceVersion=3",
                 {[&] { open = true; }, [&](std::string_view l) { lines.emplace_back(l); },
                  [&](ApiResult&& r) { done = std::move(r); }});
  ASSERT_TRUE(RunUntil([&] { return open; }));
  EXPECT_EQ(Command("delete " + std::string(kPods) + " a"), "ok 4");
  EXPECT_EQ(Command("delete " + std::string(kPods) + " a"), "ok 0");
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 1; }));
  EXPECT_EQ(Parse(lines[0]).type, "DELETED");
  EXPECT_EQ(Command("bookmark"), "ok 4");
  ASSERT_TRUE(RunUntil([&] { return lines.size() == 2; }));
  EXPECT_EQ(Parse(lines[1]).type, "BOOKMARK");
  EXPECT_EQ(Command("drop"), "ok 4");
  ASSERT_TRUE(RunUntil([&] { return done.has_value(); }));
  EXPECT_TRUE(done->ok()) << done->status.message();
  EXPECT_EQ(Command("fail 500"), "ok 4");
  EXPECT_EQ(Get(kPods).http_status, 500);
  EXPECT_EQ(Command("fail 503 x"), "error usage: fail <status 100-599> [count]");
  EXPECT_EQ(Command("compact"), "ok 4");
  EXPECT_TRUE(Get(kPods).ok());

  fclose(to_);  // end of stdin: exit 0
  to_ = nullptr;
  EXPECT_EQ(ReadLine(), "<eof>");
  EXPECT_EQ(Wait(), 0);
}

TEST_F(FakeApiServerBinaryTest, SigtermExitsZero) {
  Start();
  ASSERT_EQ(ReadLine().rfind("ready ", 0), 0u);
  kill(pid_, SIGTERM);
  EXPECT_EQ(Wait(), 0);
}

// With --ca and a fixed --port, a second run serves under the same CA, so a kubeconfig
// written by the first still works.
TEST_F(FakeApiServerBinaryTest, CaFileAndFixedPortSurviveARestart) {
  auto ca = std::filesystem::temp_directory_path() /
            ("kvroute-fake-ca-" + std::to_string(getpid()) + ".pem");
  std::filesystem::remove(ca);
  Start({"--ca", ca.string()});
  std::string ready = ReadLine();
  ASSERT_EQ(ready.rfind("ready ", 0), 0u) << ready;
  std::string port = ready.substr(6);
  auto first = LoadKubeconfig(kubeconfig_);
  ASSERT_TRUE(first.ok()) << first.error.ToString();
  kill(pid_, SIGTERM);
  ASSERT_EQ(Wait(), 0);
  fclose(to_);
  fclose(from_);
  to_ = nullptr;
  from_ = nullptr;

  Start({"--ca", ca.string(), "--port", port});
  ASSERT_EQ(ReadLine(), "ready " + port);
  client_.emplace(ctx_, *first.value);  // the first run's CA and address
  ApiResult r = Get(kPods);
  EXPECT_TRUE(r.ok()) << r.status.message();
  std::filesystem::remove(ca);
}

}  // namespace
}  // namespace kvroute::k8s
