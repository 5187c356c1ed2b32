// The fault matrix (issue 13): every fault `kvroute sim` injects, under steady traffic
// through `kvroute serve`, on loopback with real sockets. For every request sent the test
// asserts one of three outcomes:
//   ok       200 and a complete answer (JSON with choices, or a stream ending in [DONE]
//            without an error frame); "retried" when x-kvroute-attempts says so
//   error    the documented error: 502/503/504 with an OpenAI-shaped JSON body, or a 200
//            stream that ends with an SSE error frame and [DONE]
// and never anything else: no hang (every read is bounded), no malformed answer. After
// the traffic stops, the router's in-flight count is back to zero and its memory near its
// baseline. Each case also checks what the fault should do to the router (an ejection,
// a restart noticed, a signal turning unknown).
//
// Faults go in through the replica's admin endpoint (POST /admin/fault, docs/FAULTS.md).
// With KVROUTE_FAULT_REPORT=<file> each case appends its row of the matrix (Markdown) to
// the file: docs/RELIABILITY.md's table comes from
//   KVROUTE_FAULT_REPORT=/tmp/matrix.md build/tests/fault_matrix_tests
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/router_config.h"
#include "core/api/openai.h"
#include "core/engine/engine.h"
#include "adapters/http/test_client.h"
#include "core/metrics/prom_parser.h"
#include "apps/serve/router.h"
#include "apps/sim/fleet.h"
#include "metrics/metric_sum.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"

namespace kvroute {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kReplicas = 3;
constexpr int kClients = 4;

using metrics::testing::MetricSum;

// Resident set size of this process (the router and the fleet both live in it), KB.
long RssKb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// An OpenAI-shaped error object: {"error":{"message":"...","type":"...",...,"code":N}}.
bool IsOpenAiError(std::string_view json, int code) {
  return json.rfind("{\"error\":{\"message\":\"", 0) == 0 &&
         json.find("\"type\":\"") != std::string_view::npos &&
         json.find("\"code\":" + std::to_string(code) + "}}") != std::string_view::npos;
}

enum class Outcome { kOk, kRetried, kError, kBad };

struct Tally {
  int sent = 0, ok = 0, retried = 0, errored = 0, bad = 0;
  std::vector<std::string> bad_examples;
};

// Classifies one answer. `stream`: the request asked for SSE.
Outcome Classify(bool stream, const std::optional<http::ClientResponse>& r, std::string* why) {
  if (!r) {
    *why = "no answer within the client's timeout";
    return Outcome::kBad;
  }
  const bool retried = !r->Header("x-kvroute-attempts").empty();
  if (r->status == 200 && !stream) {
    if (r->body.find("\"choices\":[") != std::string::npos) return retried ? Outcome::kRetried : Outcome::kOk;
    *why = "200 without choices: " + r->body.substr(0, 200);
    return Outcome::kBad;
  }
  if (r->status == 200 && stream) {
    static const std::string kDone = "data: [DONE]\n\n";
    if (r->body.size() < kDone.size() ||
        r->body.compare(r->body.size() - kDone.size(), kDone.size(), kDone) != 0) {
      *why = "stream without [DONE]: ..." + r->body.substr(r->body.size() > 200 ? r->body.size() - 200 : 0);
      return Outcome::kBad;
    }
    auto e = r->body.find("data: {\"error\":");
    if (e == std::string::npos) return retried ? Outcome::kRetried : Outcome::kOk;
    // The documented end of a broken stream: an error frame, then [DONE], nothing else.
    std::string_view frame(r->body);
    frame = frame.substr(e + 6);
    auto end = frame.find("\n\n");
    std::string_view json = frame.substr(0, end);
    bool shaped = IsOpenAiError(json, 502) || IsOpenAiError(json, 504);
    if (shaped && frame.substr(end + 2) == kDone) return Outcome::kError;
    *why = "malformed stream error: " + std::string(frame.substr(0, 300));
    return Outcome::kBad;
  }
  if ((r->status == 502 || r->status == 503 || r->status == 504) && IsOpenAiError(r->body, r->status)) {
    return Outcome::kError;
  }
  *why = "status " + std::to_string(r->status) + ": " + r->body.substr(0, 200);
  return Outcome::kBad;
}

std::string Body(int i, bool stream) {
  std::string prompt = "Request " + std::to_string(i) + " of the fault matrix: ";
  while (prompt.size() < 400) prompt += static_cast<char>('a' + (i * 7 + prompt.size()) % 26);
  return kvroute::test_support::CompletionBody(prompt, stream ? 24 : 6, stream);
}

// Whether requests may end in the documented error: never, possibly (only requests caught
// in flight at the fault's start can), or certainly (the fault breaks every stream).
enum class Errors { kNone, kMay, kMust };

struct Case {
  const char* name;
  std::string fault;      // POST /admin/fault body, sent to replica 0
  const char* client_sees;  // the matrix's "what the client saw" column
  bool expect_retries = false;
  Errors errors = Errors::kNone;
  bool expect_ejection = false;
  bool expect_restart = false;
  // r0 stops being treated as normal during the fault (its load unknown or stale: last
  // resort), seen on kvroute_endpoint_treatment.
  bool leaves_normal = false;
};

class FaultMatrix : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::vector<sim::ReplicaConfig> replicas;
    for (int i = 0; i < kReplicas; ++i) {
      // Real time: ~6 ms per decode step, so streams overlap faults.
      replicas.push_back(kvroute::test_support::SimReplica(
          {.name = "r" + std::to_string(i), .kv_blocks = 2048, .time_scale = 1.0}));
    }
    fleet_ = std::make_unique<sim::Fleet>(std::move(replicas), 2);
    ASSERT_TRUE(fleet_->Start().ok());
    std::string yaml =
        "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 300ms\n  endpoints:\n";
    for (int i = 0; i < kReplicas; ++i) {
      yaml += "    - {address: 127.0.0.1:" + std::to_string(fleet_->port(i)) + ", name: r" +
              std::to_string(i) + "}\n";
    }
    yaml +=
        "scheduling:\n  policy: round-robin\n"
        "timeouts: {connect: 200ms, first_byte: 1500ms, idle: 1s}\n"
        "retries: {max_attempts: 3}\n"
        "outlier_detection: {consecutive_failures: 3, base_ejection: 1s, max_ejection: 10s}\n";
    config::ConfigOr<config::RouterConfig> cfg = config::ParseRouterConfig(yaml, "matrix.yaml");
    ASSERT_TRUE(cfg.ok()) << cfg.error.ToString();
    router::RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = std::getenv("KVROUTE_FAULT_LOG") != nullptr;
    router_ = std::make_unique<router::Router>(std::move(*cfg.value), o);
    ASSERT_TRUE(router_->Start().ok());
    auto deadline = Clock::now() + 5s;
    while (Clock::now() < deadline &&
           MetricSum(Metrics(), "kvroute_endpoint_metrics_fresh") != kReplicas) {
      std::this_thread::sleep_for(10ms);
    }
    ASSERT_EQ(MetricSum(Metrics(), "kvroute_endpoint_metrics_fresh"), kReplicas);
  }

  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    fleet_.reset();
  }

  std::string Metrics() {
    auto r = http::Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    return r && r->status == 200 ? r->body : std::string();
  }

  // Clients send back-to-back requests (every other one streamed) until `stop`.
  void Traffic(std::atomic<bool>& stop, Tally& tally, std::mutex& mu) {
    std::vector<std::thread> clients;
    std::atomic<int> next{0};
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&] {
        while (!stop.load()) {
          const int i = next.fetch_add(1);
          const bool stream = i % 2 == 0;
          auto r = http::Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions",
                               Body(i, stream), {}, 10s);
          std::string why;
          Outcome o = Classify(stream, r, &why);
          std::lock_guard<std::mutex> lock(mu);
          ++tally.sent;
          switch (o) {
            case Outcome::kOk: ++tally.ok; break;
            case Outcome::kRetried: ++tally.retried; break;
            case Outcome::kError: ++tally.errored; break;
            case Outcome::kBad:
              ++tally.bad;
              if (tally.bad_examples.size() < 5) tally.bad_examples.push_back(why);
              break;
          }
        }
      });
    }
    for (auto& t : clients) t.join();
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<router::Router> router_;
};

TEST_P(FaultMatrix, EveryRequestIsAnsweredAsDocumented) {
  const Case& c = GetParam();
  const long rss_before = RssKb();
  Tally tally;
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::thread traffic([&] { Traffic(stop, tally, mu); });

  std::this_thread::sleep_for(300ms);  // steady traffic first
  const std::string before = Metrics();
  auto injected = http::Fetch("127.0.0.1", fleet_->port(0), "POST", "/admin/fault", c.fault);
  ASSERT_TRUE(injected.has_value());
  ASSERT_EQ(injected->status, 200) << injected->body;
  const auto fault_start = Clock::now();
  bool left_normal = false;
  double ejections = 0;
  // Every fault lasts 1 s (its `duration`); watch the router meanwhile.
  while (Clock::now() < fault_start + 1s) {
    std::string m = Metrics();
    if (MetricSum(m, "kvroute_endpoint_treatment", {{"endpoint", "r0"}, {"treatment", "normal"}}) == 0) {
      left_normal = true;
    }
    ejections = std::max(ejections, MetricSum(m, "kvroute_endpoint_ejections_total", {{"endpoint", "r0"}}));
    std::this_thread::sleep_for(20ms);
  }
  // Recovery: from the fault's end until r0 answers a proxied request successfully again.
  const double served_at_end =
      MetricSum(Metrics(), "kvroute_requests_total", {{"endpoint", "r0"}, {"code", "200"}});
  double recovery_s = -1;
  while (Clock::now() < fault_start + 1s + 15s) {
    std::string m = Metrics();
    ejections = std::max(ejections, MetricSum(m, "kvroute_endpoint_ejections_total", {{"endpoint", "r0"}}));
    if (MetricSum(m, "kvroute_requests_total", {{"endpoint", "r0"}, {"code", "200"}}) > served_at_end) {
      recovery_s = std::chrono::duration<double>(Clock::now() - (fault_start + 1s)).count();
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  stop = true;
  traffic.join();

  // Nothing left in flight, once the last answers are accounted.
  std::string after;
  auto deadline = Clock::now() + 3s;
  do {
    after = Metrics();
    if (MetricSum(after, "kvroute_endpoint_inflight") == 0) break;
    std::this_thread::sleep_for(20ms);
  } while (Clock::now() < deadline);
  EXPECT_EQ(MetricSum(after, "kvroute_endpoint_inflight"), 0) << "leaked in-flight accounting";
  const long rss_after = RssKb();

  EXPECT_EQ(tally.bad, 0) << [&] {
    std::string s;
    for (const auto& b : tally.bad_examples) s += "\n  " + b;
    return s;
  }();
  EXPECT_EQ(tally.sent, tally.ok + tally.retried + tally.errored + tally.bad);
  EXPECT_GT(tally.sent, 20);
  EXPECT_GE(recovery_s, 0.0) << "r0 never served again after the fault ended";
  const double retries = MetricSum(after, "kvroute_retries_total") - MetricSum(before, "kvroute_retries_total");
  if (c.expect_retries) {
    EXPECT_GT(tally.retried, 0);
  }
  if (c.errors == Errors::kMust) {
    EXPECT_GT(tally.errored, 0);
  }
  if (c.errors == Errors::kNone) {
    EXPECT_EQ(tally.errored, 0);
  }
  if (c.expect_ejection) {
    EXPECT_GE(ejections, 1);
  }
  if (c.expect_restart) {
    EXPECT_EQ(MetricSum(after, "kvroute_endpoint_restarts_total", {{"endpoint", "r0"}}), 1);
  }
  if (c.leaves_normal) {
    EXPECT_TRUE(left_normal) << "r0 was treated as normal throughout";
  }
  // The process's memory (router and fleet) back near where it started: no per-request
  // growth. Loose: the allocator keeps some freed pages.
  EXPECT_LT(rss_after - rss_before, 64 * 1024) << rss_before << " KB -> " << rss_after << " KB";

  if (const char* path = std::getenv("KVROUTE_FAULT_REPORT")) {
    std::ofstream out(path, std::ios::app);
    char rec[32];
    std::snprintf(rec, sizeof rec, "%.2f", recovery_s);
    out << "| " << c.name << " | " << c.client_sees << " | " << tally.sent << " | "
        << tally.ok + tally.retried << " | " << tally.retried << " | " << tally.errored << " | "
        << static_cast<long>(retries) << " | " << static_cast<long>(ejections) << " | " << rec
        << " | " << (rss_after - rss_before) / 1024 << " |\n";
  }
}

// Issue 25: a prefill replica crashes for 1 s under P/D load through serve (2 prefill and
// 2 decode replicas, every prompt long and new, so every request is a pair). No request
// may fail: a prefill leg caught by the crash, or sent while the port is closed, moves to
// the other prefill replica, or the decode replica prefills locally.
TEST(PdFaultMatrix, APrefillReplicaCrashUnderLoadLosesNoRequest) {
  std::vector<sim::ReplicaConfig> replicas;
  const char* names[] = {"p0", "p1", "d0", "d1"};
  for (const char* n : names) {
    replicas.push_back(kvroute::test_support::SimReplica({.name = n, .kv_blocks = 2048, .time_scale = 1.0}));
  }
  sim::Fleet fleet(std::move(replicas), 2);
  ASSERT_TRUE(fleet.Start().ok());
  std::string yaml = "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 300ms\n  endpoints:\n";
  for (int i = 0; i < 4; ++i) {
    yaml += "    - {address: 127.0.0.1:" + std::to_string(fleet.port(i)) + ", name: " + names[i] +
            ", labels: {llm-d.ai/role: " + (i < 2 ? "prefill" : "decode") + "}}\n";
  }
  yaml +=
      "timeouts: {connect: 200ms, first_byte: 1500ms, idle: 1s}\n"
      "retries: {max_attempts: 3}\n"
      "outlier_detection: {consecutive_failures: 3, base_ejection: 1s, max_ejection: 10s}\n";
  config::ConfigOr<config::RouterConfig> cfg = config::ParseRouterConfig(yaml, "pd-matrix.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.error.ToString();
  router::RouterOptions o;
  o.listen = config::HostPort{"127.0.0.1", 0};
  router::Router router(std::move(*cfg.value), o);
  ASSERT_TRUE(router.Start().ok());
  auto metrics = [&] {
    auto r = http::Fetch("127.0.0.1", router.port(), "GET", "/metrics");
    return r && r->status == 200 ? r->body : std::string();
  };
  auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline && MetricSum(metrics(), "kvroute_endpoint_metrics_fresh") != 4) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(MetricSum(metrics(), "kvroute_endpoint_metrics_fresh"), 4);

  Tally tally;
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::atomic<int> next{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      while (!stop.load()) {
        const int i = next.fetch_add(1);
        const bool stream = i % 2 == 0;
        // About 600 tokens, new from its first characters: uncached everywhere.
        std::string prompt = "Request " + std::to_string(i) + " of the P/D fault case: ";
        while (prompt.size() < 2400) prompt += static_cast<char>('a' + (i * 7 + prompt.size()) % 26);
        auto r = http::Fetch("127.0.0.1", router.port(), "POST", "/v1/completions",
                             kvroute::test_support::CompletionBody(prompt, stream ? 24 : 6, stream),
                             {}, 10s);
        std::string why;
        const Outcome out = Classify(stream, r, &why);
        std::lock_guard<std::mutex> lock(mu);
        ++tally.sent;
        if (out == Outcome::kOk || out == Outcome::kRetried) {
          ++tally.ok;
        } else {
          ++tally.bad;
          if (tally.bad_examples.size() < 5) tally.bad_examples.push_back(why);
        }
      }
    });
  }
  std::this_thread::sleep_for(300ms);  // steady pairs first
  const double prefill_ok_before =
      MetricSum(metrics(), "kvroute_pd_legs_total", {{"leg", "prefill"}, {"outcome", "ok"}});
  auto injected = http::Fetch("127.0.0.1", fleet.port(0), "POST", "/admin/fault",
                              R"({"kind":"crash","duration":"1s"})");
  ASSERT_TRUE(injected.has_value());
  ASSERT_EQ(injected->status, 200) << injected->body;
  std::this_thread::sleep_for(1300ms);  // the crash, and a little after
  stop = true;
  for (auto& t : clients) t.join();

  std::string after;
  deadline = Clock::now() + 3s;
  do {
    after = metrics();
    if (MetricSum(after, "kvroute_endpoint_inflight") == 0 &&
        MetricSum(after, "kvroute_pd_prefill_queued_tokens") == 0) {
      break;
    }
    std::this_thread::sleep_for(20ms);
  } while (Clock::now() < deadline);
  router.Stop();
  EXPECT_EQ(tally.bad, 0) << [&] {
    std::string s;
    for (const auto& b : tally.bad_examples) s += "\n  " + b;
    return s;
  }();
  EXPECT_GT(tally.sent, 20);
  EXPECT_EQ(tally.ok, tally.sent);
  EXPECT_GT(prefill_ok_before, 0) << "no pair before the crash";
  EXPECT_GT(MetricSum(after, "kvroute_pd_decisions_total", {{"decision", "disaggregate"}}), 0);
  // The crash was felt and handled: a leg moved to p1 or the decode replica prefilled, or
  // a failed scrape of p0 took it out of the prefill picks before any leg went there
  // (which of these comes first depends on timing; both lose nothing).
  EXPECT_GE(MetricSum(after, "kvroute_pd_fallbacks_total", {{"reason", "prefill_retry"}}) +
                MetricSum(after, "kvroute_pd_fallbacks_total", {{"reason", "local_prefill"}}) +
                MetricSum(after, "kvroute_endpoint_scrapes_failed_total", {{"endpoint", "p0"}}),
            1);
  EXPECT_EQ(MetricSum(after, "kvroute_endpoint_inflight"), 0) << "leaked in-flight accounting";
  EXPECT_EQ(MetricSum(after, "kvroute_pd_prefill_queued_tokens"), 0) << "leaked prefill charge";
}

INSTANTIATE_TEST_SUITE_P(
    Faults, FaultMatrix,
    ::testing::Values(
        Case{"crash", R"({"kind":"crash","duration":"1s"})",
             "connection refused: retried on another replica at no cost (or avoided: a failed scrape marks it down first); streams open on it end with an SSE error frame",
             false, Errors::kMay},
        Case{"hang", R"({"kind":"hang","duration":"1s"})",
             "no answer: its scrapes time out first, so it turns stale (last resort) within a scrape or two; requests already sent there are retried when the connection closes (or at the first-byte timeout); open streams end with an SSE error frame",
             false, Errors::kMay},
        Case{"delay", R"({"kind":"delay","duration":"1s","delay":"300ms"})",
             "slower answers (300 ms more), all complete"},
        Case{"stall", R"({"kind":"stall","duration":"1s","after_chunks":2})",
             "streams on it stop after 2 chunks: SSE error frame after the idle timeout (1 s)",
             false, Errors::kMust},
        Case{"reset", R"({"kind":"reset","duration":"1s","after_chunks":2})",
             "streams on it cut after 2 chunks: SSE error frame at once", false, Errors::kMust},
        Case{"http_error 503", R"({"kind":"http_error","duration":"1s","status":503})",
             "nothing: each 503 retried on another replica, the replica ejected after 3",
             true, Errors::kNone, true},
        Case{"http_error 500", R"({"kind":"http_error","duration":"1s","status":500})",
             "nothing: each 500 retried on another replica, the replica ejected after 3",
             true, Errors::kNone, true},
        Case{"restart", R"({"kind":"restart","duration":"1s"})",
             "in-flight requests dropped: unanswered ones retried, open streams end with an SSE error frame; cache forgotten",
             false, Errors::kMay, false, true},
        Case{"slow", R"({"kind":"slow","duration":"1s","factor":4})",
             "slower answers (steps 4x), all complete"},
        Case{"metrics_stale", R"({"kind":"metrics_stale","duration":"1s"})",
             "nothing (frozen metrics still parse; the router's own in-flight count adds to them)"},
        Case{"metrics_nan", R"({"kind":"metrics_nan","duration":"1s"})",
             "nothing: the replica's load is unknown, treated as last resort, never as idle",
             false, Errors::kNone, false, false, true},
        Case{"metrics_missing", R"({"kind":"metrics_missing","duration":"1s"})",
             "nothing: load unknown while the series are missing", false, Errors::kNone, false, false,
             true},
        Case{"metrics_slow", R"({"kind":"metrics_slow","duration":"1s","delay":"700ms"})",
             "nothing: scrapes time out, the replica turns stale and is used only as a last resort",
             false, Errors::kNone, false, false, true}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string n = info.param.name;
      for (char& ch : n) {
        if (ch == ' ') ch = '_';
      }
      return n;
    });

}  // namespace
}  // namespace kvroute
