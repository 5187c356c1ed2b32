// Loopback tests of LoRA adapter routing in `kvroute serve` (issue 26, item 2): the router
// in-process in front of two stand-in replicas on 127.0.0.1 whose /metrics report
// vllm:lora_requests_info lines the test controls (vLLM's exact format) and whose
// completions answer a small valid body. The default policy (kvroute) carries the
// lora-affinity-scorer. Every wait is bounded.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/router_config.h"
#include "core/metrics/engine_metrics.h"
#include "apps/sim/fleet.h"
#include "support/sim_replica.h"
#include "adapters/http/test_client.h"
#include "apps/serve/router.h"
#include "support/openai_body.h"
#include "support/stub_server.h"
#include "support/wait.h"
#include "metrics/metric_sum.h"

namespace kvroute::router {
namespace {

using http::Fetch;
using kvroute::test_support::CompletionBody;
using kvroute::test_support::RecordingUpstream;
using kvroute::test_support::WaitFor;
using metrics::testing::MetricSum;

constexpr const char* kAnswer =
    R"({"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,)"
    R"("text":"ok","logprobs":null,"finish_reason":"length"}],)"
    R"("usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}})";

// An idle vLLM serving base-model with LoRA on: nothing running or waiting but the
// adapters the lora_requests_info series lists. An older series (smaller timestamp) with
// other adapters stays in the output, as vLLM leaves it.
std::string LoraMetrics(int max_lora, const std::string& running, const std::string& waiting) {
  const std::string model = "{engine=\"0\",model_name=\"base-model\"}";
  return "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running" + model + " 0.0\n" +
         "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting" + model + " 0.0\n" +
         "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc" + model + " 0.0\n" +
         "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
         "# TYPE vllm:lora_requests_info gauge\n"
         "vllm:lora_requests_info{max_lora=\"" + std::to_string(max_lora) +
         "\",running_lora_adapters=\"old-lora\",waiting_lora_adapters=\"\"} 1.7672254813954e+09\n"
         "vllm:lora_requests_info{max_lora=\"" + std::to_string(max_lora) +
         "\",running_lora_adapters=\"" + running + "\",waiting_lora_adapters=\"" + waiting +
         "\"} 1.7672256011276e+09\n";
}

class LoraRouteTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
  }

  void StartRouter() {
    const std::string yaml = "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n"
                             "  endpoints:\n    - {address: " + r1_.address() + ", name: r1}\n"
                             "    - {address: " + r2_.address() + ", name: r2}\n";
    config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(yaml, "test.yaml");
    ASSERT_TRUE(r.ok()) << r.error.ToString() << "\n" << yaml;
    RouterOptions o;
    o.listen = config::HostPort{"127.0.0.1", 0};
    o.log = false;
    router_ = std::make_unique<Router>(std::move(*r.value), o);
    Status st = router_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(WaitFor([&] {
      auto m = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
      return m && MetricSum(m->body, "kvroute_endpoint_metrics_fresh") == 2;
    }));
  }

  // Sets both replicas' /metrics and waits until the router has read them: two more scrape
  // requests each, so the first one answered with the new body was applied.
  void Serve(const std::string& m1, const std::string& m2) {
    r1_.ServeMetrics(m1);
    r2_.ServeMetrics(m2);
    const int n1 = r1_.metrics_requests(), n2 = r2_.metrics_requests();
    ASSERT_TRUE(WaitFor([&] {
      return r1_.metrics_requests() >= n1 + 2 && r2_.metrics_requests() >= n2 + 2;
    }));
  }

  // Sends a completion for `model`; returns the endpoint the router named.
  std::string Send(const std::string& model) {
    auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions",
                   CompletionBody("Tell me about adapters", 1, false, false, 0, model));
    EXPECT_TRUE(r.has_value());
    if (!r) return "";
    EXPECT_EQ(r->status, 200) << r->body;
    return r->Header("x-kvroute-endpoint");
  }

  RecordingUpstream r1_{kAnswer};
  RecordingUpstream r2_{kAnswer};
  std::unique_ptr<Router> router_;
};

// Two adapters loaded on different replicas at equal load: each adapter's requests go to
// its replica.
TEST_F(LoraRouteTest, EachAdapterGoesToItsReplica) {
  r1_.ServeMetrics(LoraMetrics(2, "lora-a", ""));
  r2_.ServeMetrics(LoraMetrics(2, "lora-b", ""));
  StartRouter();
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(Send("lora-a"), "r1") << i;
    EXPECT_EQ(Send("lora-b"), "r2") << i;
  }
  // The requests arrived unchanged (the adapter is the model).
  for (const auto& seen : r1_.seen()) {
    EXPECT_NE(seen.body.find("\"model\":\"lora-a\""), std::string::npos) << seen.body;
  }
  for (const auto& seen : r2_.seen()) {
    EXPECT_NE(seen.body.find("\"model\":\"lora-b\""), std::string::npos) << seen.body;
  }
}

// r1 holds max_lora adapters (one running, one waiting: no room), r2 has room: a new
// adapter goes to r2. Once r2 is full too and r1 has room again, it goes to r1.
TEST_F(LoraRouteTest, ANewAdapterGoesWhereThereIsRoom) {
  r1_.ServeMetrics(LoraMetrics(2, "lora-a", "lora-d"));
  r2_.ServeMetrics(LoraMetrics(2, "lora-b", ""));
  StartRouter();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(Send("lora-c"), "r2") << i;
  Serve(LoraMetrics(2, "lora-a", ""), LoraMetrics(2, "lora-b,lora-c", ""));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(Send("lora-e"), "r1") << i;
}

// An endpoint whose LoRA state is stale or garbage is not attractive for an adapter:
// with r1's lora_requests_info value NaN (invalid), lora-a, listed there, goes to r2,
// which has room.
TEST_F(LoraRouteTest, GarbageLoraStateIsUnknown) {
  std::string garbage = LoraMetrics(2, "lora-a", "");
  garbage = garbage.substr(0, garbage.rfind(' ')) + " NaN\n";
  garbage = garbage.replace(garbage.find("1.7672254813954e+09"), 19, "NaN");
  r1_.ServeMetrics(garbage);
  r2_.ServeMetrics(LoraMetrics(2, "lora-b", ""));
  StartRouter();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(Send("lora-a"), "r2") << i;
}

// The same done-test against real `kvroute sim` replicas (vLLM's LoRA behaviour, its
// vllm:lora_requests_info as the sim writes it): both replicas serve adapters lora-a,
// lora-b and lora-c (--lora-modules); r0 takes one adapter per batch (--max-loras 1), r1
// two. A long request for lora-a runs on r0 and one for lora-b on r1 (sent to them
// directly: equal load, one each), so r0 runs lora-a with no room and r1 runs lora-b with
// room for one more. Through serve: lora-a goes to r0, lora-b to r1, and lora-c, new
// everywhere, to r1 where it can load. The sims' engines run 10x slower than real time so
// the long requests (4,000 tokens) outlast the test.
class LoraSimRouteTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (router_) router_->Stop();
    router_.reset();
    fleet_.reset();  // cuts the long requests off
    for (auto& t : long_requests_) t.join();
  }

  static sim::ReplicaConfig LoraReplica(const std::string& name, int max_loras) {
    sim::ReplicaConfig r = test_support::SimReplica({.name = name, .time_scale = 10.0});
    r.engine.lora.enabled = true;
    r.engine.lora.max_loras = max_loras;
    r.engine.lora.max_cpu_loras = 4;
    for (const char* a : {"lora-a", "lora-b", "lora-c"}) {
      r.lora_modules.push_back({a, std::string("/adapters/") + a, ""});
    }
    return r;
  }

  std::string Metrics(int i) {
    auto m = Fetch("127.0.0.1", fleet_->port(i), "GET", "/metrics");
    return m ? m->body : std::string();
  }

  // A request for `adapter` straight to replica i that runs until the fleet stops.
  void RunLong(int i, const std::string& adapter) {
    const uint16_t port = fleet_->port(i);
    long_requests_.emplace_back([port, adapter] {
      std::string body = CompletionBody("a long answer for " + adapter, 4000, false, false, 0, adapter);
      body.insert(body.size() - 1, ",\"ignore_eos\":true");
      Fetch("127.0.0.1", port, "POST", "/v1/completions", body, {}, std::chrono::seconds(60));
    });
  }

  double Scrapes(const std::string& endpoint) {
    auto m = Fetch("127.0.0.1", router_->port(), "GET", "/metrics");
    return m ? MetricSum(m->body, "kvroute_endpoint_scrapes_ok_total", {{"endpoint", endpoint}}) : 0;
  }

  std::string Send(const std::string& model) {
    auto r = Fetch("127.0.0.1", router_->port(), "POST", "/v1/completions",
                   CompletionBody("Tell me about adapters", 1, false, false, 0, model), {},
                   std::chrono::seconds(30));
    EXPECT_TRUE(r.has_value());
    if (!r) return "";
    EXPECT_EQ(r->status, 200) << r->body;
    return r->Header("x-kvroute-endpoint");
  }

  std::unique_ptr<sim::Fleet> fleet_;
  std::unique_ptr<Router> router_;
  std::vector<std::thread> long_requests_;
};

TEST_F(LoraSimRouteTest, AdaptersGoWhereTheyRunAndANewOneWhereThereIsRoom) {
  fleet_ = std::make_unique<sim::Fleet>(
      std::vector<sim::ReplicaConfig>{LoraReplica("r0", 1), LoraReplica("r1", 2)}, 2);
  ASSERT_TRUE(fleet_->Start().ok());
  RunLong(0, "lora-a");
  RunLong(1, "lora-b");
  // The sim's newest lora_requests_info series, as the router parses it.
  metrics::EngineMetrics m0, m1;
  ASSERT_TRUE(WaitFor([&] {
    const auto names = metrics::MetricNames::For(metrics::EngineType::kVllm);
    metrics::ExtractEngineMetrics(Metrics(0), names, "", m0);
    metrics::ExtractEngineMetrics(Metrics(1), names, "", m1);
    return m0.Has(metrics::EngineMetrics::kLora) && m0.n_running_loras == 1 &&
           m1.Has(metrics::EngineMetrics::kLora) && m1.n_running_loras == 1;
  }));
  EXPECT_EQ(m0.max_lora, 1);
  EXPECT_EQ(m0.running_loras[0], metrics::AdapterKey("lora-a"));
  EXPECT_EQ(m0.n_waiting_loras, 0);
  EXPECT_EQ(m1.max_lora, 2);
  EXPECT_EQ(m1.running_loras[0], metrics::AdapterKey("lora-b"));
  EXPECT_EQ(m0.base_model_key, metrics::AdapterKey(test_support::kTestModel));
  EXPECT_FALSE(m0.lora_truncated);

  const std::string yaml = "threads: 2\npool:\n  scrape_interval: 20ms\n  staleness: 1s\n"
                           "  endpoints:\n    - {address: 127.0.0.1:" + std::to_string(fleet_->port(0)) +
                           ", name: r0}\n    - {address: 127.0.0.1:" + std::to_string(fleet_->port(1)) +
                           ", name: r1}\n";
  config::ConfigOr<config::RouterConfig> cfg = config::ParseRouterConfig(yaml, "test.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.error.ToString();
  RouterOptions o;
  o.listen = config::HostPort{"127.0.0.1", 0};
  o.log = false;
  router_ = std::make_unique<Router>(std::move(*cfg.value), o);
  ASSERT_TRUE(router_->Start().ok());
  // Two good scrapes of each after the long requests were running: the router has read
  // their adapters.
  ASSERT_TRUE(WaitFor([&] { return Scrapes("r0") >= 2 && Scrapes("r1") >= 2; }));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Send("lora-a"), "r0") << i;
    EXPECT_EQ(Send("lora-b"), "r1") << i;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Send("lora-c"), "r1") << i;
    // The router reads what the last request left (lora-c cached and idle on r1) before the
    // next one: two more scrapes of each.
    const double n0 = Scrapes("r0"), n1 = Scrapes("r1");
    ASSERT_TRUE(WaitFor([&] { return Scrapes("r0") >= n0 + 2 && Scrapes("r1") >= n1 + 2; }));
  }
}

}  // namespace
}  // namespace kvroute::router
