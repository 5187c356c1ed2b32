// Loopback tests of vLLM's prefill/decode (P/D) protocol on simulated replicas
// (REFERENCE.md section 20; docs/SIM_API.md, "Prefill/decode disaggregation"): the
// prefill leg's answer and hold, the decode leg's pull, local recompute, lease expiry,
// every transfer failure under both kv_load_failure_policy values, and kv_both.
// Exact timing lives in the engine's tests (tests/core/engine, EnginePdTest); here only
// lower bounds on wall time and exact engine-time figures from /metrics.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <chrono>
#include <cmath>
#include <future>
#include <string>
#include <vector>

#include "core/api/openai.h"
#include "core/engine/tokenizer.h"
#include "core/metrics/prom_parser.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/wait.h"

namespace kvroute::sim {
namespace {

using http::ClientResponse;
using http::Fetch;
using test_support::WaitFor;

constexpr const char* kModel = "test/model";  // support/openai_body.h's kTestModel

ReplicaConfig PdReplica(std::string name, std::string policy = "fail") {
  ReplicaConfig r;
  r.name = std::move(name);
  r.engine = *engine::PresetConfig("llama3-8b-h100");
  r.engine.model_name = kModel;
  r.engine.num_gpu_blocks = 512;
  r.engine.max_model_len = 8192;
  r.time_scale = 0.01;
  r.enable_prompt_tokens_details = true;
  r.pd.load_failure_policy = std::move(policy);
  return r;
}

// A prompt of exactly `tokens` tokens (the tokenizer stand-in: 4 bytes a token), distinct
// per `seed`.
std::string Prompt(int tokens, char seed) {
  std::string s;
  for (int i = 0; i < tokens; ++i) {
    s += seed;
    s += static_cast<char>('a' + i % 26);
    s += static_cast<char>('a' + (i / 26) % 26);
    s += static_cast<char>('a' + (i / 676) % 26);
  }
  return s;
}

std::string WithParams(std::string_view prompt, int max_tokens, std::string_view params,
                       bool stream = false) {
  std::string body = test_support::CompletionBody(prompt, max_tokens, stream, stream);
  body.pop_back();  // '}'
  body += ",\"kv_transfer_params\":";
  body += params;
  return body + "}";
}

// The prefill leg as a P/D proxy sends it.
std::string PrefillBody(std::string_view prompt) {
  return WithParams(prompt, 1,
                    R"({"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,)"
                    R"("remote_block_ids":null,"remote_host":null,"remote_port":null})");
}

// `ids` block ids 1..ids.
std::string BlockIds(int ids) {
  std::string s = "[";
  for (int i = 1; i <= ids; ++i) s += (i > 1 ? "," : "") + std::to_string(i);
  return s + "]";
}

std::string DecodeParams(std::string_view engine_id, std::string_view request_id, int ids) {
  return std::string(R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":")") +
         std::string(engine_id) + R"(","remote_request_id":")" + std::string(request_id) +
         R"(","remote_block_ids":)" + BlockIds(ids) +
         R"(,"remote_host":"127.0.0.1","remote_port":1,"tp_size":1})";
}

class PdTest : public ::testing::Test {
 protected:
  void StartFleet(std::vector<ReplicaConfig> replicas) {
    fleet_ = std::make_unique<Fleet>(std::move(replicas), 2);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  void TearDown() override { fleet_.reset(); }

  ClientResponse Post(std::string_view body, int i) {
    std::optional<ClientResponse> r =
        Fetch("127.0.0.1", fleet_->port(i), "POST", "/v1/completions", body);
    EXPECT_TRUE(r.has_value());
    return r ? *r : ClientResponse{};
  }
  std::string Metrics(int i) {
    auto r = Fetch("127.0.0.1", fleet_->port(i), "GET", "/metrics");
    EXPECT_TRUE(r.has_value());
    return r ? r->body : std::string();
  }
  // One sample of replica i's /metrics: `name` with the replica label plus `extra` (a
  // label=value pair, or empty); vLLM's series by their own labels. NaN when absent.
  double Sample(int i, std::string_view name, std::pair<std::string, std::string> extra = {}) {
    const std::string text = Metrics(i);
    metrics::ParseReport report;
    std::vector<metrics::OwnedSample> samples = metrics::ParseAllSamples(text, &report);
    EXPECT_TRUE(report.ok()) << text;
    for (const metrics::OwnedSample& s : samples) {
      if (s.name != name) continue;
      bool match = extra.first.empty();
      for (const auto& [k, v] : s.labels) {
        if (k == extra.first && v == extra.second) match = true;
      }
      if (match) return s.value;
    }
    return std::nan("");
  }

  // The prefill leg's answer on replica i: its kv_transfer_params as a parsed object.
  struct PrefillAnswer {
    std::string response_id;
    std::string params_raw;  // minified, as a proxy passes it on
    int blocks = 0;
  };
  PrefillAnswer Prefill(std::string_view prompt, int i) {
    ClientResponse r = Post(PrefillBody(prompt), i);
    EXPECT_EQ(r.status, 200) << r.body;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    PrefillAnswer a;
    if (p.parse(r.body).get(doc)) {
      ADD_FAILURE() << r.body;
      return a;
    }
    a.response_id = std::string(std::string_view(doc["id"]));
    simdjson::dom::element params = doc["kv_transfer_params"];
    a.params_raw = simdjson::minify(params);
    simdjson::dom::array ids;
    if (!params["remote_block_ids"].get_array().get(ids)) a.blocks = static_cast<int>(ids.size());
    return a;
  }

  std::unique_ptr<Fleet> fleet_;
};

int64_t CachedTokens(const ClientResponse& r) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(r.body).get(doc)) return -1;
  return int64_t(doc["usage"]["prompt_tokens_details"]["cached_tokens"]);
}

TEST_F(PdTest, PrefillLegAnswersEveryFieldAndHoldsItsBlocksUntilTheDecodePulls) {
  StartFleet({PdReplica("p"), PdReplica("d")});
  const std::string prompt = Prompt(1000, 'x');  // 62 full blocks of 16 (+ 8 tokens)
  ClientResponse r = Post(PrefillBody(prompt), 0);
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(r.body);
  // An ordinary non-streaming answer of one token...
  EXPECT_EQ(std::string_view(doc["object"]), "text_completion");
  EXPECT_EQ(std::string_view(doc["choices"].at(0)["finish_reason"]), "length");
  EXPECT_EQ(int64_t(doc["usage"]["completion_tokens"]), 1);
  EXPECT_EQ(int64_t(doc["usage"]["prompt_tokens"]), 1000);
  // ...with the top-level kv_transfer_params, every field of the right type and value.
  simdjson::dom::object kv = doc["kv_transfer_params"];
  EXPECT_EQ(kv.size(), 8u);
  EXPECT_TRUE(bool(kv["do_remote_prefill"]));
  EXPECT_FALSE(bool(kv["do_remote_decode"]));
  simdjson::dom::array ids = kv["remote_block_ids"];
  ASSERT_EQ(ids.size(), 62u);
  std::vector<int64_t> seen;
  for (simdjson::dom::element id : ids) seen.push_back(int64_t(id));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end()) << "block ids repeat";
  EXPECT_GE(seen.front(), 1);  // block 0 is the reserved null block
  EXPECT_EQ(std::string_view(kv["remote_engine_id"]), "kvroute-sim-0-p");
  EXPECT_EQ(std::string_view(kv["remote_engine_id"]), fleet_->engine_id(0));
  EXPECT_EQ(std::string_view(kv["remote_request_id"]), std::string_view(doc["id"]));
  EXPECT_EQ(std::string_view(kv["remote_host"]), "127.0.0.1");
  EXPECT_EQ(int64_t(kv["remote_port"]), fleet_->port(0));
  EXPECT_EQ(int64_t(kv["tp_size"]), 1);

  // Held: the blocks stay in use after the request finished.
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_held_blocks"), 62);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_leases"), 1);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_prefill_requests_total"), 1);
  EXPECT_DOUBLE_EQ(Sample(0, "vllm:kv_cache_usage_perc"), 62.0 / 511);
  EXPECT_EQ(Sample(0, "vllm:num_requests_running"), 0);

  // The decode leg: the original body plus prefill's params, verbatim.
  const std::string params = simdjson::minify(doc["kv_transfer_params"]);
  ClientResponse d = Post(WithParams(prompt, 4, params), 1);
  ASSERT_EQ(d.status, 200) << d.body;
  simdjson::dom::element ddoc = parser.parse(d.body);
  EXPECT_EQ(int64_t(ddoc["usage"]["completion_tokens"]), 4);
  EXPECT_EQ(int64_t(ddoc["usage"]["prompt_tokens_details"]["cached_tokens"]), 992);
  simdjson::dom::element none;
  EXPECT_EQ(ddoc["kv_transfer_params"].get(none), simdjson::SUCCESS);
  EXPECT_TRUE(none.is_null());  // the decode leg holds nothing for anyone
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_kv_pulls_total"), 1);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_decode_requests_total", {"path", "pulled"}), 1);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_kv_pulled_tokens_total"), 992);
  EXPECT_DOUBLE_EQ(Sample(1, "kvroute_sim_pd_kv_transfer_seconds_total"),
                   992.0 * 131072 / 25e9);
  EXPECT_EQ(Sample(1, "vllm:prefix_cache_hits_total", {"engine", "0"}), 0);  // pulled, not hit
  // A successful pull releases the prefill's hold (before the decode leg was admitted).
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_held_blocks"), 0);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_leases"), 0);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_leases_released_total"), 1);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_leases_expired_total"), 0);
  EXPECT_EQ(Sample(0, "vllm:kv_cache_usage_perc"), 0);
  // The pulled blocks are cached on the decode replica like computed ones.
  EXPECT_EQ(fleet_->PeekCachedTokens(1, engine::Tokenize(prompt)), 992);

  // The same decode leg again: the decode replica caches the prompt now, so under 64
  // tokens are missing and nothing is pulled (the spent lease does not matter).
  ClientResponse again = Post(WithParams(prompt, 4, params), 1);
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_decode_requests_total", {"path", "local"}), 1);
}

TEST_F(PdTest, UnderOneBlockThePrefillLegHoldsNothingAndTheListIsEmpty) {
  StartFleet({PdReplica("p"), PdReplica("d")});
  PrefillAnswer a = Prefill(Prompt(10, 's'), 0);
  EXPECT_EQ(a.blocks, 0);
  EXPECT_NE(a.params_raw.find(R"("remote_block_ids":[])"), std::string::npos) << a.params_raw;
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_held_blocks"), 0);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_leases"), 0);
  ClientResponse d = Post(WithParams(Prompt(10, 's'), 2, a.params_raw), 1);
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(CachedTokens(d), 0);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_decode_requests_total", {"path", "local"}), 1);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_kv_pulls_total"), 0);
}

TEST_F(PdTest, ParamsAreNullUnlessThePrefillLegEndsByItsLengthCap) {
  ReplicaConfig p = PdReplica("p");
  p.engine.fixed_output_tokens = 1;  // every request stops (finish_reason stop) after 1 token
  StartFleet({p});
  std::string body = WithParams(Prompt(100, 'n'), 3,
                                R"({"do_remote_decode":true,"do_remote_prefill":false})");
  ClientResponse r = Post(body, 0);
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(r.body);
  EXPECT_EQ(std::string_view(doc["choices"].at(0)["finish_reason"]), "stop");
  simdjson::dom::element kv;
  ASSERT_EQ(doc["kv_transfer_params"].get(kv), simdjson::SUCCESS);
  EXPECT_TRUE(kv.is_null());
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_leases"), 0);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_prefill_requests_total"), 0);
}

TEST_F(PdTest, LeaseExpiresThenFailOrRecompute) {
  ReplicaConfig p = PdReplica("p");
  p.pd.lease_s = 5.0;  // engine seconds: 50 ms of wall time at time_scale 0.01
  StartFleet({p, PdReplica("d-fail", "fail"), PdReplica("d-recompute", "recompute")});
  const std::string prompt = Prompt(500, 'l');  // 31 full blocks
  PrefillAnswer a = Prefill(prompt, 0);
  ASSERT_EQ(a.blocks, 31);
  ASSERT_TRUE(WaitFor([&] { return Sample(0, "kvroute_sim_pd_kv_leases_expired_total") == 1; }));
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_held_blocks"), 0);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_leases_released_total"), 0);

  ClientResponse f = Post(WithParams(prompt, 2, a.params_raw), 1);
  EXPECT_EQ(f.status, 500) << f.body;
  simdjson::dom::parser parser;
  simdjson::dom::element err = parser.parse(f.body);
  EXPECT_EQ(std::string_view(err["error"]["type"]), "InternalServerError");
  EXPECT_EQ(int64_t(err["error"]["code"]), 500);
  EXPECT_NE(std::string_view(err["error"]["message"]).find("lease_expired"), std::string::npos);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_kv_transfer_failures_total", {"reason", "lease_expired"}), 1);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_decode_requests_total", {"path", "failed"}), 1);
  EXPECT_EQ(Sample(1, "vllm:num_requests_waiting"), 0);

  ClientResponse rc = Post(WithParams(prompt, 2, a.params_raw), 2);
  ASSERT_EQ(rc.status, 200) << rc.body;
  EXPECT_EQ(CachedTokens(rc), 0);  // computed locally
  EXPECT_EQ(Sample(2, "kvroute_sim_pd_kv_transfer_failures_total", {"reason", "lease_expired"}), 1);
  EXPECT_EQ(Sample(2, "kvroute_sim_pd_decode_requests_total", {"path", "recomputed"}), 1);
  EXPECT_EQ(Sample(2, "kvroute_sim_pd_kv_pulls_total"), 0);
}

TEST_F(PdTest, UnknownEngineFailsOrRecomputes) {
  StartFleet({PdReplica("d-fail", "fail"), PdReplica("d-recompute", "recompute")});
  const std::string prompt = Prompt(300, 'u');
  const std::string params = DecodeParams("no-such-engine", "cmpl-1", 18);
  ClientResponse f = Post(WithParams(prompt, 2, params), 0);
  EXPECT_EQ(f.status, 500) << f.body;
  EXPECT_NE(f.body.find("unknown_engine"), std::string::npos) << f.body;
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_transfer_failures_total", {"reason", "unknown_engine"}), 1);
  ClientResponse rc = Post(WithParams(prompt, 2, params), 1);
  ASSERT_EQ(rc.status, 200) << rc.body;
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_kv_transfer_failures_total", {"reason", "unknown_engine"}), 1);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_decode_requests_total", {"path", "recomputed"}), 1);
  // A missing remote_engine_id is an unknown engine too.
  ClientResponse missing = Post(
      WithParams(prompt, 2, R"({"do_remote_prefill":true,"remote_block_ids":)" + BlockIds(18) + "}"),
      0);
  EXPECT_EQ(missing.status, 500) << missing.body;
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_transfer_failures_total", {"reason", "unknown_engine"}), 2);
}

TEST_F(PdTest, PrefillReplicaDownFailsOrRecomputes) {
  StartFleet({PdReplica("p"), PdReplica("d-fail", "fail"), PdReplica("d-recompute", "recompute")});
  const std::string prompt = Prompt(400, 'g');
  PrefillAnswer a = Prefill(prompt, 0);
  ASSERT_EQ(a.blocks, 25);
  auto crash = Fetch("127.0.0.1", fleet_->port(0), "POST", "/admin/fault",
                     R"({"kind":"crash","duration":"60s"})");
  ASSERT_TRUE(crash.has_value());
  ASSERT_EQ(crash->status, 200) << crash->body;
  ClientResponse f = Post(WithParams(prompt, 2, a.params_raw), 1);
  EXPECT_EQ(f.status, 500) << f.body;
  EXPECT_NE(f.body.find("prefill_down"), std::string::npos) << f.body;
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_kv_transfer_failures_total", {"reason", "prefill_down"}), 1);
  ClientResponse rc = Post(WithParams(prompt, 2, a.params_raw), 2);
  ASSERT_EQ(rc.status, 200) << rc.body;
  EXPECT_EQ(CachedTokens(rc), 0);
  EXPECT_EQ(Sample(2, "kvroute_sim_pd_kv_transfer_failures_total", {"reason", "prefill_down"}), 1);
}

TEST_F(PdTest, FewMissingTokensAreRecomputedLocallyAndTheHoldReleased) {
  StartFleet({PdReplica("p"), PdReplica("d")});
  // 50 tokens: 3 full blocks = 48 pullable tokens, under the 64-token threshold.
  const std::string small = Prompt(50, 'f');
  PrefillAnswer a = Prefill(small, 0);
  ASSERT_EQ(a.blocks, 3);
  ClientResponse d = Post(WithParams(small, 2, a.params_raw), 1);
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(CachedTokens(d), 0);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_kv_pulls_total"), 0);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_decode_requests_total", {"path", "local"}), 1);
  // The decode told the prefill replica to drop its hold (asynchronously).
  EXPECT_TRUE(WaitFor([&] { return Sample(0, "kvroute_sim_pd_kv_leases_released_total") == 1; }));
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_held_blocks"), 0);

  // A long prompt the decode replica already caches: nothing missing, nothing pulled.
  const std::string big = Prompt(700, 'c');  // 43 full blocks; cache hit capped at 688
  ASSERT_EQ(Post(test_support::CompletionBody(big, 1), 1).status, 200);
  PrefillAnswer b = Prefill(big, 0);
  ASSERT_EQ(b.blocks, 43);
  ClientResponse d2 = Post(WithParams(big, 2, b.params_raw), 1);
  ASSERT_EQ(d2.status, 200) << d2.body;
  EXPECT_EQ(CachedTokens(d2), 688);  // a local hit
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_kv_pulls_total"), 0);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_decode_requests_total", {"path", "local"}), 2);
}

TEST_F(PdTest, TheDecodeLegWaitsForItsTransferAndCountsAsWaiting) {
  ReplicaConfig d = PdReplica("d");
  // 992 tokens x 128 KiB at this bandwidth: exactly 40 engine seconds, 0.4 s of wall time.
  d.pd.transfer_bandwidth = 992.0 * 131072 / 40.0;
  StartFleet({PdReplica("p"), d});
  const std::string prompt = Prompt(1000, 'w');
  PrefillAnswer a = Prefill(prompt, 0);
  ASSERT_EQ(a.blocks, 62);
  const auto start = std::chrono::steady_clock::now();
  auto pending = std::async(std::launch::async, [&] {
    return Fetch("127.0.0.1", fleet_->port(1), "POST", "/v1/completions",
                 WithParams(prompt, 3, a.params_raw, /*stream=*/true));
  });
  // WAITING_FOR_REMOTE_KVS: a waiting request, its blocks not allocated yet.
  EXPECT_TRUE(WaitFor([&] { return Sample(1, "kvroute_sim_pd_waiting_for_remote_kvs") == 1; }));
  EXPECT_EQ(Sample(1, "vllm:num_requests_waiting", {"engine", "0"}), 1);
  EXPECT_EQ(Sample(1, "vllm:num_requests_running", {"engine", "0"}), 0);
  // Other work is not held up by the transfer.
  ClientResponse other = Post(test_support::CompletionBody(Prompt(20, 'o'), 2), 1);
  EXPECT_EQ(other.status, 200);
  std::optional<ClientResponse> r = pending.get();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_GE(wall, 0.39);  // the transfer alone takes 40 engine seconds at time_scale 0.01
  // The stream's final usage reports the pulled tokens as cached.
  EXPECT_NE(r->body.find(R"("prompt_tokens_details":{"cached_tokens":992})"), std::string::npos)
      << r->body;
  EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos);
  EXPECT_DOUBLE_EQ(Sample(1, "kvroute_sim_pd_kv_transfer_seconds_total"), 40.0);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_waiting_for_remote_kvs"), 0);
  // Its queue time (engine time x time_scale) covers the transfer.
  EXPECT_GE(Sample(1, "vllm:request_queue_time_seconds_sum", {"engine", "0"}), 0.39);
}

TEST_F(PdTest, EveryReplicaServesBothLegs) {
  StartFleet({PdReplica("a"), PdReplica("b")});
  const std::string p1 = Prompt(810, '1');  // 50 full blocks
  const std::string p2 = Prompt(800, '2');
  // a prefills, b decodes; then the other way round.
  PrefillAnswer x = Prefill(p1, 0);
  ClientResponse dx = Post(WithParams(p1, 2, x.params_raw), 1);
  ASSERT_EQ(dx.status, 200) << dx.body;
  EXPECT_EQ(CachedTokens(dx), 800);  // all 50 blocks pulled, 10 tokens computed
  PrefillAnswer y = Prefill(p2, 1);
  ClientResponse dy = Post(WithParams(p2, 2, y.params_raw), 0);
  ASSERT_EQ(dy.status, 200) << dy.body;
  EXPECT_EQ(CachedTokens(dy), 799);  // 800 is a whole number of blocks: the last token is computed
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_pulls_total"), 1);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_kv_pulls_total"), 1);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_prefill_requests_total"), 1);
  EXPECT_EQ(Sample(1, "kvroute_sim_pd_prefill_requests_total"), 1);
  // Both legs on one replica: its own prefix cache has the blocks, nothing to pull.
  const std::string p3 = Prompt(800, '3');
  PrefillAnswer z = Prefill(p3, 0);
  ClientResponse dz = Post(WithParams(p3, 2, z.params_raw), 0);
  ASSERT_EQ(dz.status, 200) << dz.body;
  EXPECT_EQ(CachedTokens(dz), 784);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_pulls_total"), 1);
  EXPECT_TRUE(WaitFor([&] { return Sample(0, "kvroute_sim_pd_kv_leases") == 0; }));
}

TEST_F(PdTest, WithoutAClockTheTransferIsAJumpInEngineTime) {
  ReplicaConfig p = PdReplica("p");
  ReplicaConfig d = PdReplica("d");
  p.time_scale = 0;
  d.time_scale = 0;
  d.pd.transfer_bandwidth = 992.0 * 131072 / 1000.0;  // 1000 engine seconds: no wall wait
  StartFleet({p, d});
  const std::string prompt = Prompt(1000, 'z');
  PrefillAnswer a = Prefill(prompt, 0);
  ASSERT_EQ(a.blocks, 62);
  const auto start = std::chrono::steady_clock::now();
  ClientResponse r = Post(WithParams(prompt, 2, a.params_raw), 1);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(CachedTokens(r), 992);
  EXPECT_DOUBLE_EQ(Sample(1, "kvroute_sim_pd_kv_transfer_seconds_total"), 1000.0);
  EXPECT_EQ(Sample(0, "kvroute_sim_pd_kv_leases_released_total"), 1);
}

TEST_F(PdTest, TheRoleLabelIsAValidPrometheusLabel) {
  ReplicaConfig p = PdReplica("p");
  p.labels = {{"llm-d.ai/role", "prefill"}, {"9zone", "b"}};
  StartFleet({p});
  // Sample() asserts a clean parse of the whole exposition.
  EXPECT_EQ(Sample(0, "kvroute_sim_replica_info", {"llm_d_ai_role", "prefill"}), 1);
  EXPECT_EQ(Sample(0, "kvroute_sim_replica_info", {"_9zone", "b"}), 1);
}

TEST_F(PdTest, EngineIdsAreStableAndConfigurable) {
  ReplicaConfig named = PdReplica("n");
  named.pd.engine_id = "prefill-east-0";
  StartFleet({PdReplica("a"), named});
  EXPECT_EQ(fleet_->engine_id(0), "kvroute-sim-0-a");
  EXPECT_EQ(fleet_->engine_id(1), "prefill-east-0");
  PrefillAnswer a = Prefill(Prompt(200, 'e'), 1);
  EXPECT_NE(a.params_raw.find(R"("remote_engine_id":"prefill-east-0")"), std::string::npos);
  fleet_.reset();
  ReplicaConfig twin = named;
  Fleet dup({named, twin}, 1);
  Status s = dup.Start();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "n: kv_engine_id 'prefill-east-0' is also n's");
}

}  // namespace
}  // namespace kvroute::sim
