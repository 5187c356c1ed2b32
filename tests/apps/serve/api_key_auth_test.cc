// The API key check and its reloads (router/api_key_auth.h) over an in-memory file
// system: every poll is one the test makes, every log line is captured.
#include "apps/serve/api_key_auth.h"
#include "support/memory_file_system.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <atomic>
#include <map>
#include <thread>
#include <string>
#include <vector>

#include "metrics/metric_sum.h"

namespace kvroute::router {
namespace {

using metrics::testing::MetricSum;

using test_support::MemoryFileSystem;

class ApiKeyAuthTest : public ::testing::Test {
 protected:
  std::unique_ptr<ApiKeyAuth> Make(config::UpstreamAuthorization mode = config::UpstreamAuthorization::kForward) {
    config::AuthConfig c;
    c.api_keys_file = c.api_keys_file_path = "keys.txt";
    c.upstream_authorization = mode;
    if (mode == config::UpstreamAuthorization::kReplace) {
      c.upstream_api_key_file = c.upstream_api_key_file_path = "up.key";
    }
    return std::make_unique<ApiKeyAuth>(c, 2, fs_, [this](std::string_view l) { log_.emplace_back(l); });
  }
  std::string Metrics(ApiKeyAuth& a) {
    std::string out;
    a.AppendMetrics(out);
    return out;
  }

  MemoryFileSystem fs_;
  std::vector<std::string> log_;
};

TEST_F(ApiKeyAuthTest, AcceptsLoadedKeysOnEveryWorkerAndCountsByName) {
  fs_.Write("keys.txt", "alice sk-a\nsk-b\n");
  auto a = Make();
  ASSERT_TRUE(a->Load().ok());
  EXPECT_EQ(a->Check("Bearer sk-a", 0), AuthVerdict::kAccepted);
  EXPECT_EQ(a->Check("BEARER\tsk-a ", 1), AuthVerdict::kAccepted);
  EXPECT_EQ(a->Check("Bearer sk-b", 1), AuthVerdict::kAccepted);
  EXPECT_EQ(a->Check("", 0), AuthVerdict::kMissing);
  EXPECT_EQ(a->Check("Bearer sk-", 0), AuthVerdict::kInvalid);
  EXPECT_EQ(a->Check("Bearer sk-aa", 0), AuthVerdict::kInvalid);
  EXPECT_EQ(a->Check("Bearersk-a", 0), AuthVerdict::kInvalid);
  EXPECT_EQ(a->Check("Token sk-a", 0), AuthVerdict::kInvalid);
  EXPECT_EQ(a->Check("Bearer ", 0), AuthVerdict::kInvalid);
  const std::string m = Metrics(*a);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_requests_total", {{"key", "alice"}}), 2) << m;
  EXPECT_EQ(MetricSum(m, "kvroute_auth_requests_total", {{"key", "line-2"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_rejected_total", {{"reason", "missing"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_rejected_total", {{"reason", "invalid"}}), 5);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_keys"), 2);
  EXPECT_TRUE(log_.empty());  // the first load is not a reload
}

TEST_F(ApiKeyAuthTest, ABrokenFileIsLoggedOnceWithoutTheKeysAndKeepsTheRunningSet) {
  fs_.Write("keys.txt", "alice sk-secret-a\n");
  auto a = Make();
  ASSERT_TRUE(a->Load().ok());
  fs_.Write("keys.txt", "alice sk-secret-a\nbob sk-secret-a\n");  // a duplicate key
  a->Poll();
  a->Poll();
  a->Poll();
  a->Reload();  // SIGHUP re-reads it: still the same error, not logged again
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0],
            "API keys not reloaded, keeping the 1 running: keys.txt:2: api_keys: duplicate key (the same "
            "key as line 1)");
  EXPECT_EQ(a->Check("Bearer sk-secret-a", 0), AuthVerdict::kAccepted);
  EXPECT_EQ(MetricSum(Metrics(*a), "kvroute_auth_reloads_total", {{"result", "rejected"}}), 2);

  fs_.Write("keys.txt", "alice sk-secret-a\n");  // back to the running keys: nothing to apply
  a->Poll();
  ASSERT_EQ(log_.size(), 2u);
  EXPECT_EQ(log_[1], "API keys files valid again: the running keys stay");
  fs_.Remove("keys.txt");
  a->Poll();
  ASSERT_EQ(log_.size(), 3u);
  EXPECT_EQ(log_[2], "API keys not reloaded, keeping the 1 running: keys.txt: cannot read file: No such file or directory");
  fs_.Write("keys.txt", "bob sk-secret-b\n");
  a->Poll();
  ASSERT_EQ(log_.size(), 4u);
  EXPECT_EQ(log_[3], "API keys reloaded from keys.txt: 1 loaded");
  EXPECT_EQ(a->Check("Bearer sk-secret-a", 1), AuthVerdict::kInvalid);
  EXPECT_EQ(a->Check("Bearer sk-secret-b", 1), AuthVerdict::kAccepted);
  for (const std::string& l : log_) EXPECT_EQ(l.find("sk-"), std::string::npos) << l;
  const std::string m = Metrics(*a);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_reloads_total", {{"result", "applied"}}), 1);
  EXPECT_EQ(MetricSum(m, "kvroute_auth_reloads_total", {{"result", "rejected"}}), 3);
}

TEST_F(ApiKeyAuthTest, AnUnchangedStatIsNotRead) {
  fs_.Write("keys.txt", "k1\n");
  auto a = Make();
  ASSERT_TRUE(a->Load().ok());
  const int reads = fs_.reads;
  for (int i = 0; i < 5; ++i) a->Poll();
  EXPECT_EQ(fs_.reads, reads);
  a->Reload();
  EXPECT_EQ(fs_.reads, reads + 1);
}

TEST_F(ApiKeyAuthTest, TheUpstreamKeyIsReadWithTheKeysAndABadOneKeepsBoth) {
  fs_.Write("keys.txt", "k1\n");
  fs_.Write("up.key", "sk-up-1\n");
  auto a = Make(config::UpstreamAuthorization::kReplace);
  ASSERT_TRUE(a->Load().ok());
  EXPECT_EQ(a->UpstreamAuthorization(0), "Bearer sk-up-1");
  fs_.Write("up.key", "\n\n");
  fs_.Write("keys.txt", "k2\n");
  a->Poll();
  EXPECT_EQ(a->UpstreamAuthorization(0), "Bearer sk-up-1");
  EXPECT_EQ(a->Check("Bearer k1", 0), AuthVerdict::kAccepted);  // the keys file was good, the pair was not
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0], "API keys not reloaded, keeping the 1 running: up.key: upstream_api_key: no key in the "
                     "file (its first non-empty line is sent)");
  fs_.Write("up.key", "sk-up-2\n");
  a->Poll();
  EXPECT_EQ(a->UpstreamAuthorization(1), "Bearer sk-up-2");
  EXPECT_EQ(a->Check("Bearer k2", 1), AuthVerdict::kAccepted);
  EXPECT_EQ(a->Check("Bearer k1", 1), AuthVerdict::kInvalid);
}

// Two workers check keys while reloads swap the set under them (run under ThreadSanitizer
// too): `stable` stays loaded throughout and is always accepted; each worker sees a key
// set whole.
TEST_F(ApiKeyAuthTest, WorkersCheckWhileReloadsSwapTheSet) {
  fs_.Write("keys.txt", "stable sk-stable\n");
  auto a = Make();
  ASSERT_TRUE(a->Load().ok());
  std::atomic<bool> done{false};
  std::atomic<int> refused{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      while (!done.load()) {
        if (a->Check("Bearer sk-stable", w) != AuthVerdict::kAccepted) refused.fetch_add(1);
        a->Check("Bearer sk-rotating", w);
      }
    });
  }
  for (int i = 0; i < 200; ++i) {
    fs_.Write("keys.txt", "stable sk-stable\n" + std::string(i % 2 ? "rot sk-rotating\n" : ""));
    if (i % 3 == 0) {
      a->Reload();
    } else {
      a->Poll();
    }
    std::string m;
    a->AppendMetrics(m);
  }
  done.store(true);
  for (auto& t : workers) t.join();
  EXPECT_EQ(refused.load(), 0);
  EXPECT_EQ(a->Check("Bearer sk-rotating", 0), AuthVerdict::kAccepted);  // i = 199 wrote it
  // i = 0 wrote the loaded keys again: not a change.
  EXPECT_EQ(MetricSum(Metrics(*a), "kvroute_auth_reloads_total", {{"result", "applied"}}), 199);
}

TEST_F(ApiKeyAuthTest, ALoadThatFailsAcceptsNothing) {
  auto a = Make();
  Status st = a->Load();
  EXPECT_EQ(st.message(), "keys.txt: cannot read file: No such file or directory");
  EXPECT_EQ(a->Check("Bearer anything", 0), AuthVerdict::kInvalid);
  EXPECT_EQ(MetricSum(Metrics(*a), "kvroute_auth_keys"), 0);
}

}  // namespace
}  // namespace kvroute::router
