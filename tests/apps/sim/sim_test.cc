// Loopback tests of the simulated replicas: the OpenAI API shapes (plain and SSE),
// usage and prefix caching, /metrics, every error path, and aborts on disconnect.
// The fleet runs in-process on port 0 with fast time scales; every wait is bounded.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <cmath>
#include <map>
#include <thread>

#include "core/api/openai.h"
#include "core/engine/tokenizer.h"
#include "adapters/http/test_client.h"
#include "config/fleet_config.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/wait.h"

namespace kvroute::sim {
namespace {

using namespace std::chrono_literals;
using http::ClientResponse;
using http::Fetch;
using http::TestClient;

constexpr const char* kModel = "test/model";

ReplicaConfig SmallReplica(double time_scale = 0.01) {
  ReplicaConfig r;
  r.name = "r";
  r.engine = *engine::PresetConfig("llama3-8b-h100");
  r.engine.model_name = kModel;
  r.engine.num_gpu_blocks = 512;
  r.engine.max_model_len = 4096;
  r.time_scale = time_scale;
  return r;
}

class FleetTest : public ::testing::Test {
 protected:
  void StartFleet(std::vector<ReplicaConfig> replicas) {
    fleet_ = std::make_unique<Fleet>(std::move(replicas), 2);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  void TearDown() override { fleet_.reset(); }
  uint16_t port(int i = 0) const { return fleet_->port(i); }

  std::optional<ClientResponse> Post(std::string_view path, std::string_view body, int i = 0) {
    return Fetch("127.0.0.1", port(i), "POST", path, body);
  }
  std::string Metrics(int i = 0) {
    auto r = Fetch("127.0.0.1", port(i), "GET", "/metrics");
    EXPECT_TRUE(r.has_value());
    return r ? r->body : std::string();
  }

  std::unique_ptr<Fleet> fleet_;
};

// The value of the sample whose name and label text match exactly, e.g.
// Sample(text, "vllm:num_preemptions_total", "engine=\"0\",model_name=\"m\""); NaN if absent.
double Sample(const std::string& text, std::string_view name, std::string_view labels) {
  std::string key = std::string(name) + (labels.empty() ? " " : "{" + std::string(labels) + "} ");
  std::size_t pos = 0;
  while ((pos = text.find(key, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') {
      return std::strtod(text.c_str() + pos + key.size(), nullptr);
    }
    pos += key.size();
  }
  return std::nan("");
}

const std::string kLabels = std::string("engine=\"0\",model_name=\"") + kModel + "\"";

double Counter(const std::string& text, std::string_view name) {
  return Sample(text, name, kLabels);
}

// "data: X\n\n" frames of an SSE body, without the "data: " prefix.
std::vector<std::string> Frames(std::string_view body) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < body.size()) {
    std::size_t end = body.find("\n\n", pos);
    if (end == std::string_view::npos) {
      ADD_FAILURE() << "unterminated frame: " << body.substr(pos);
      break;
    }
    std::string_view frame = body.substr(pos, end - pos);
    EXPECT_EQ(frame.substr(0, 6), "data: ");
    out.emplace_back(frame.substr(6));
    pos = end + 2;
  }
  return out;
}

std::string ExpectedText(uint64_t id, int tokens) {
  std::string s;
  for (int i = 0; i < tokens; ++i) s += engine::OutputTokenText(id, static_cast<std::size_t>(i));
  return s;
}

using kvroute::test_support::CompletionBody;

TEST_F(FleetTest, CompletionReturnsTextAndUsage) {
  StartFleet({SmallReplica()});
  const std::string prompt = "Hello there, simulated engine!";  // 30 bytes -> 8 tokens
  auto r = Post("/v1/completions", CompletionBody(prompt, 5));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->Header("content-type"), "application/json");
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r->body);
  EXPECT_EQ(std::string_view(doc["object"]), "text_completion");
  EXPECT_EQ(std::string_view(doc["model"]), kModel);
  EXPECT_EQ(std::string_view(doc["id"]).substr(0, 5), "cmpl-");
  simdjson::dom::element choice = doc["choices"].at(0);
  EXPECT_EQ(std::string_view(choice["text"]), ExpectedText(1, 5));
  EXPECT_EQ(std::string_view(choice["finish_reason"]), "length");
  simdjson::dom::element usage = doc["usage"];
  EXPECT_EQ(int64_t(usage["prompt_tokens"]), 8);
  EXPECT_EQ(int64_t(usage["completion_tokens"]), 5);
  EXPECT_EQ(int64_t(usage["total_tokens"]), 13);
  // Without --enable-prompt-tokens-details, as vLLM: no prompt_tokens_details.
  simdjson::dom::element details;
  EXPECT_EQ(usage["prompt_tokens_details"].get(details), simdjson::NO_SUCH_FIELD);
}

TEST_F(FleetTest, ChatCompletionCountsTheRenderedPrompt) {
  StartFleet({SmallReplica()});
  std::string body = std::string("{\"model\":\"") + kModel +
                     "\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                     "{\"role\":\"user\",\"content\":\"Hi!\"}],\"max_completion_tokens\":3}";
  auto r = Post("/v1/chat/completions", body);
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<api::ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi!"}};
  const auto expected_prompt = static_cast<int64_t>(engine::CountTokens(api::RenderChat(msgs)));
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r->body);
  EXPECT_EQ(std::string_view(doc["object"]), "chat.completion");
  simdjson::dom::element msg = doc["choices"].at(0)["message"];
  EXPECT_EQ(std::string_view(msg["role"]), "assistant");
  EXPECT_EQ(std::string_view(msg["content"]), ExpectedText(1, 3));
  EXPECT_EQ(int64_t(doc["usage"]["prompt_tokens"]), expected_prompt);
  EXPECT_EQ(int64_t(doc["usage"]["completion_tokens"]), 3);
}

TEST_F(FleetTest, StreamingCompletionSendsOneChunkPerStep) {
  StartFleet({SmallReplica()});
  const int kTokens = 6;
  TestClient c("127.0.0.1", port());
  ASSERT_TRUE(c.SendRequest("POST", "/v1/completions", CompletionBody("stream me", kTokens, true)));
  ClientResponse head;
  ASSERT_TRUE(c.ReadHead(&head)) << c.error();
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.chunked);
  EXPECT_EQ(head.Header("content-type"), "text/event-stream");
  std::vector<std::string> chunks;
  while (auto chunk = c.ReadChunk()) chunks.push_back(chunk->data);
  ASSERT_TRUE(c.ended()) << c.error();
  // One HTTP chunk per engine step that produced a token; [DONE] rides with the last.
  ASSERT_EQ(chunks.size(), static_cast<std::size_t>(kTokens));
  EXPECT_EQ(chunks.front().find("[DONE]"), std::string::npos);
  std::string all;
  for (const auto& ch : chunks) all += ch;
  auto frames = Frames(all);
  ASSERT_EQ(frames.size(), static_cast<std::size_t>(kTokens + 1));
  EXPECT_EQ(frames.back(), "[DONE]");
  simdjson::dom::parser p;
  std::string text;
  for (int i = 0; i < kTokens; ++i) {
    simdjson::dom::element doc = p.parse(frames[i]);
    EXPECT_EQ(std::string_view(doc["object"]), "text_completion");
    EXPECT_TRUE(doc["usage"].error() == simdjson::NO_SUCH_FIELD);
    simdjson::dom::element choice = doc["choices"].at(0);
    text += std::string_view(choice["text"]);
    if (i + 1 < kTokens) {
      EXPECT_TRUE(choice["finish_reason"].is_null());
    } else {
      EXPECT_EQ(std::string_view(choice["finish_reason"]), "length");
    }
  }
  EXPECT_EQ(text, ExpectedText(1, kTokens));
}

TEST_F(FleetTest, StreamingChatWithUsageFollowsVllmShape) {
  StartFleet({SmallReplica()});
  std::string body = std::string("{\"model\":\"") + kModel +
                     "\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me more\"}],"
                     "\"max_tokens\":4,\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
  auto r = Post("/v1/chat/completions", body);
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200);
  auto frames = Frames(r->body);
  // role chunk, 4 content chunks (last with finish_reason), usage chunk, [DONE].
  ASSERT_EQ(frames.size(), 7u);
  EXPECT_EQ(frames.back(), "[DONE]");
  simdjson::dom::parser p;
  simdjson::dom::element first = p.parse(frames[0]);
  EXPECT_EQ(std::string_view(first["object"]), "chat.completion.chunk");
  EXPECT_EQ(std::string_view(first["choices"].at(0)["delta"]["role"]), "assistant");
  EXPECT_TRUE(first["usage"].is_null());
  std::string text;
  for (int i = 1; i <= 4; ++i) {
    simdjson::dom::element doc = p.parse(frames[i]);
    EXPECT_TRUE(doc["usage"].is_null());
    text += std::string_view(doc["choices"].at(0)["delta"]["content"]);
    EXPECT_EQ(doc["choices"].at(0)["finish_reason"].is_null(), i < 4);
  }
  EXPECT_EQ(text, ExpectedText(1, 4));
  simdjson::dom::element last = p.parse(frames[5]);
  EXPECT_EQ(simdjson::dom::array(last["choices"]).size(), 0u);
  EXPECT_EQ(int64_t(last["usage"]["completion_tokens"]), 4);
  std::vector<api::ChatMessage> msgs = {{"user", "Tell me more"}};
  EXPECT_EQ(int64_t(last["usage"]["prompt_tokens"]),
            static_cast<int64_t>(engine::CountTokens(api::RenderChat(msgs))));
}

TEST_F(FleetTest, RepeatedLongPromptHitsThePrefixCache) {
  ReplicaConfig r = SmallReplica();
  r.enable_prompt_tokens_details = true;
  StartFleet({r});
  std::string prompt;
  for (int i = 0; prompt.size() < 2003; ++i) prompt += "word" + std::to_string(i) + " ";
  prompt.resize(2003);  // 501 tokens
  const int64_t n = static_cast<int64_t>(engine::CountTokens(prompt));
  ASSERT_EQ(n, 501);
  const int64_t expected_hit = (n - 1) / 16 * 16;

  auto first = Post("/v1/completions", CompletionBody(prompt, 2));
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->status, 200);
  const std::string m1 = Metrics();
  auto second = Post("/v1/completions", CompletionBody(prompt, 2));
  ASSERT_TRUE(second.has_value());
  const std::string m2 = Metrics();

  simdjson::dom::parser p;
  EXPECT_EQ(int64_t(p.parse(first->body)["usage"]["prompt_tokens_details"]["cached_tokens"]), 0);
  simdjson::dom::element usage = p.parse(second->body)["usage"];
  EXPECT_EQ(int64_t(usage["prompt_tokens"]), n);
  EXPECT_EQ(int64_t(usage["prompt_tokens_details"]["cached_tokens"]), expected_hit);
  EXPECT_EQ(Counter(m2, "vllm:prefix_cache_hits_total") -
                Counter(m1, "vllm:prefix_cache_hits_total"),
            static_cast<double>(expected_hit));
  EXPECT_EQ(Counter(m2, "vllm:prefix_cache_queries_total") -
                Counter(m1, "vllm:prefix_cache_queries_total"),
            static_cast<double>(n));
}

TEST_F(FleetTest, MetricsReadLikeVllm) {
  StartFleet({SmallReplica()});
  for (int i = 0; i < 3; ++i) {
    auto r = Post("/v1/completions", CompletionBody("metrics please " + std::to_string(i), 4));
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->status, 200);
  }
  auto resp = Fetch("127.0.0.1", port(), "GET", "/metrics");
  ASSERT_TRUE(resp.has_value());
  EXPECT_EQ(resp->Header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  const std::string& m = resp->body;
  EXPECT_NE(m.find("# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                   "# TYPE vllm:kv_cache_usage_perc gauge\n"),
            std::string::npos);
  EXPECT_NE(m.find("\nvllm:num_requests_running{" + kLabels + "} 0.0\n"), std::string::npos);
  EXPECT_EQ(Counter(m, "vllm:num_requests_waiting"), 0.0);
  EXPECT_EQ(Counter(m, "vllm:kv_cache_usage_perc"), 0.0);
  EXPECT_EQ(Counter(m, "vllm:num_preemptions_total"), 0.0);
  EXPECT_EQ(Counter(m, "vllm:generation_tokens_total"), 12.0);
  EXPECT_EQ(Counter(m, "vllm:prompt_tokens_total"), 12.0);  // 3 x 4 tokens (16 bytes)
  EXPECT_EQ(Sample(m, "vllm:request_success_total", kLabels + ",finished_reason=\"length\""), 3.0);
  EXPECT_EQ(Sample(m, "vllm:request_success_total", kLabels + ",finished_reason=\"stop\""), 0.0);
  EXPECT_EQ(Sample(m, "vllm:request_success_total", kLabels + ",finished_reason=\"abort\""), 0.0);
  EXPECT_EQ(Counter(m, "vllm:time_to_first_token_seconds_count"), 3.0);
  EXPECT_EQ(Sample(m, "vllm:time_to_first_token_seconds_bucket", kLabels + ",le=\"+Inf\""), 3.0);
  EXPECT_EQ(Sample(m, "vllm:time_to_first_token_seconds_bucket", kLabels + ",le=\"2560.0\""), 3.0);
  EXPECT_EQ(Counter(m, "vllm:inter_token_latency_seconds_count"), 9.0);  // 3 x (4 - 1)
  EXPECT_EQ(Counter(m, "vllm:e2e_request_latency_seconds_count"), 3.0);
  EXPECT_EQ(Counter(m, "vllm:request_queue_time_seconds_count"), 3.0);
  EXPECT_GT(Counter(m, "vllm:e2e_request_latency_seconds_sum"), 0.0);
  EXPECT_NE(m.find("vllm:cache_config_info{block_size=\"16\","), std::string::npos);
  EXPECT_NE(m.find("num_gpu_blocks=\"512\""), std::string::npos);
  EXPECT_EQ(m.find("gpu_cache_usage_perc"), std::string::npos);
  // Every sample line is "name[{labels}] value" with a parseable float.
  std::size_t pos = 0;
  int samples = 0;
  while (pos < m.size()) {
    std::size_t end = m.find('\n', pos);
    ASSERT_NE(end, std::string::npos) << "metrics must end with a newline";
    std::string_view line(m.data() + pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    ++samples;
    std::string value(line.substr(line.rfind(' ') + 1));
    char* stop = nullptr;
    std::strtod(value.c_str(), &stop);
    EXPECT_TRUE(*stop == '\0' || value == "+Inf") << line;
    EXPECT_EQ(line.substr(0, 5) == "vllm:" || line.substr(0, 12) == "kvroute_sim_", true) << line;
  }
  EXPECT_GT(samples, 90);
}

// vllm:request_prompt_tokens and vllm:request_generation_tokens count a request when it
// finishes, in vLLM's 1-2-5 buckets up to max_model_len (4096 here: the last finite
// bound is 2000).
TEST_F(FleetTest, RequestSizeHistogramsCountFinishedRequests) {
  StartFleet({SmallReplica()});
  for (int i = 0; i < 3; ++i) {  // 16 bytes: 4 prompt tokens, 4 output tokens
    auto r = Post("/v1/completions", CompletionBody("metrics please " + std::to_string(i), 4));
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->status, 200);
  }
  auto r = Post("/v1/completions", CompletionBody(std::string(100, 'x'), 12));  // 25 tokens
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200);
  const std::string m = Metrics();
  auto bucket = [&](std::string_view name, std::string_view le) {
    return Sample(m, name, kLabels + ",le=\"" + std::string(le) + "\"");
  };
  const char* p = "vllm:request_prompt_tokens_bucket";
  EXPECT_EQ(bucket(p, "1.0"), 0.0);
  EXPECT_EQ(bucket(p, "2.0"), 0.0);
  EXPECT_EQ(bucket(p, "5.0"), 3.0);
  EXPECT_EQ(bucket(p, "20.0"), 3.0);
  EXPECT_EQ(bucket(p, "50.0"), 4.0);
  EXPECT_EQ(bucket(p, "2000.0"), 4.0);
  EXPECT_TRUE(std::isnan(bucket(p, "5000.0")));  // above max_model_len: no such bucket
  EXPECT_EQ(bucket(p, "+Inf"), 4.0);
  EXPECT_EQ(Counter(m, "vllm:request_prompt_tokens_count"), 4.0);
  EXPECT_EQ(Counter(m, "vllm:request_prompt_tokens_sum"), 37.0);  // 3 x 4 + 25
  const char* g = "vllm:request_generation_tokens_bucket";
  EXPECT_EQ(bucket(g, "2.0"), 0.0);
  EXPECT_EQ(bucket(g, "5.0"), 3.0);
  EXPECT_EQ(bucket(g, "10.0"), 3.0);
  EXPECT_EQ(bucket(g, "20.0"), 4.0);
  EXPECT_EQ(bucket(g, "+Inf"), 4.0);
  EXPECT_EQ(Counter(m, "vllm:request_generation_tokens_count"), 4.0);
  EXPECT_EQ(Counter(m, "vllm:request_generation_tokens_sum"), 24.0);  // 3 x 4 + 12
  EXPECT_NE(m.find("# TYPE vllm:request_prompt_tokens histogram\n"), std::string::npos);
}

TEST_F(FleetTest, OldMetricNamesDropEngineLabel) {
  ReplicaConfig r = SmallReplica();
  r.old_metric_names = true;
  StartFleet({r});
  const std::string m = Metrics();
  const std::string old_labels = std::string("model_name=\"") + kModel + "\"";
  EXPECT_EQ(Sample(m, "vllm:gpu_cache_usage_perc", old_labels), 0.0);
  EXPECT_EQ(Sample(m, "vllm:gpu_prefix_cache_queries_total", old_labels), 0.0);
  EXPECT_EQ(Sample(m, "vllm:gpu_prefix_cache_hits_total", old_labels), 0.0);
  EXPECT_EQ(m.find("vllm:kv_cache_usage_perc"), std::string::npos);
  EXPECT_EQ(m.find("vllm:prefix_cache_hits_total"), std::string::npos);
  EXPECT_EQ(m.find("engine=\"0\""), std::string::npos);
}

// Checks an error response: status, OpenAI error shape, and the message.
void ExpectError(const std::optional<ClientResponse>& r, int status, std::string_view type,
                 std::string_view message_part) {
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, status) << r->body;
  EXPECT_EQ(r->Header("content-type"), "application/json");
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  ASSERT_EQ(p.parse(r->body).get(doc), simdjson::SUCCESS) << r->body;
  simdjson::dom::element e = doc["error"];
  EXPECT_EQ(int64_t(e["code"]), status);
  EXPECT_EQ(std::string_view(e["type"]), type);
  EXPECT_NE(std::string_view(e["message"]).find(message_part), std::string_view::npos)
      << r->body;
  EXPECT_TRUE(e["param"].error() == simdjson::SUCCESS);  // present (string or null)
}

class ErrorPathTest : public FleetTest {
 protected:
  void SetUp() override {
    ReplicaConfig r = SmallReplica();
    r.max_body_bytes = 64 * 1024;
    StartFleet({r});
  }
  // After every error the replica still serves a good request.
  void ExpectStillServes() {
    auto ok = Post("/v1/completions", CompletionBody("still alive?", 2));
    ASSERT_TRUE(ok.has_value());
    EXPECT_EQ(ok->status, 200) << ok->body;
  }
};

TEST_F(ErrorPathTest, MalformedJsonIs400) {
  ExpectError(Post("/v1/completions", "{\"model\": "), 400, "BadRequestError", "JSON");
  ExpectStillServes();
}

TEST_F(ErrorPathTest, MissingOrWrongTypedFieldsAre400) {
  ExpectError(Post("/v1/completions", "{\"prompt\":\"x\"}"), 400, "BadRequestError", "model");
  ExpectStillServes();
  ExpectError(Post("/v1/completions",
                   std::string("{\"model\":\"") + kModel + "\",\"prompt\":\"x\",\"max_tokens\":\"9\"}"),
              400, "BadRequestError", "max_tokens");
  ExpectStillServes();
  ExpectError(Post("/v1/chat/completions", std::string("{\"model\":\"") + kModel + "\"}"), 400,
              "BadRequestError", "messages");
  ExpectStillServes();
  ExpectError(Post("/v1/completions", "[1,2,3]"), 400, "BadRequestError", "");
  ExpectStillServes();
}

TEST_F(ErrorPathTest, ContextOverflowIs400) {
  std::string prompt(4000, 'a');  // 1000 tokens; + 3500 > 4096
  ExpectError(Post("/v1/completions", CompletionBody(prompt, 3500)), 400, "BadRequestError",
              "This model's maximum context length is 4096 tokens. However, you requested 4500 "
              "tokens (1000 in the messages, 3500 in the completion).");
  ExpectStillServes();
  ExpectError(Post("/v1/completions", CompletionBody("x", 0)), 400, "BadRequestError",
              "max_tokens must be at least 1");
  ExpectStillServes();
}

TEST_F(ErrorPathTest, UnknownModelIs404) {
  auto r = Post("/v1/completions", "{\"model\":\"nope\",\"prompt\":\"x\"}");
  ExpectError(r, 404, "NotFoundError", "The model `nope` does not exist.");
  ExpectStillServes();
}

TEST_F(ErrorPathTest, UnknownRouteIs404AndWrongMethodIs405) {
  ExpectError(Fetch("127.0.0.1", port(), "GET", "/v2/nothing"), 404, "NotFoundError", "Not Found");
  ExpectStillServes();
  auto r = Fetch("127.0.0.1", port(), "GET", "/v1/completions");
  ExpectError(r, 405, "MethodNotAllowed", "Method Not Allowed");
  EXPECT_EQ(r->Header("allow"), "POST");
  ExpectStillServes();
  ExpectError(Fetch("127.0.0.1", port(), "POST", "/metrics", "{}"), 405, "MethodNotAllowed", "");
  ExpectStillServes();
}

TEST_F(ErrorPathTest, OversizedBodyIs413AndHeadersAre431) {
  std::string big(70 * 1024, 'x');
  ExpectError(Post("/v1/completions", CompletionBody(big, 1)), 413, "RequestEntityTooLarge",
              "exceeds");
  ExpectStillServes();
  auto r = Fetch("127.0.0.1", port(), "GET", "/health", {}, {{"x-big", std::string(20000, 'h')}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 431);
  simdjson::dom::parser p;
  EXPECT_EQ(int64_t(p.parse(r->body)["error"]["code"]), 431);
  EXPECT_EQ(std::string_view(p.parse(r->body)["error"]["type"]), "RequestHeaderFieldsTooLarge");
  ExpectStillServes();
}

TEST_F(FleetTest, ModelsAndHealth) {
  StartFleet({SmallReplica()});
  auto h = Fetch("127.0.0.1", port(), "GET", "/health");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(h->body, "");
  auto m = Fetch("127.0.0.1", port(), "GET", "/v1/models");
  ASSERT_TRUE(m.has_value());
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(m->body);
  EXPECT_EQ(std::string_view(doc["object"]), "list");
  EXPECT_EQ(std::string_view(doc["data"].at(0)["id"]), kModel);
  EXPECT_EQ(int64_t(doc["data"].at(0)["max_model_len"]), 4096);
}

// Polls replica `i`'s /metrics until `pred` holds (at most ~3 s). Returns the last text.
template <typename Pred>
std::string WaitForMetrics(uint16_t port, Pred pred) {
  std::string text;
  for (int i = 0; i < 300; ++i) {
    auto r = Fetch("127.0.0.1", port, "GET", "/metrics");
    if (r) text = r->body;
    if (pred(text)) break;
    std::this_thread::sleep_for(10ms);
  }
  return text;
}

TEST_F(FleetTest, DisconnectMidStreamAbortsAndFreesBlocks) {
  StartFleet({SmallReplica(/*time_scale=*/1.0)});  // ~6 ms per token: 2000 tokens ~ 12 s
  {
    TestClient c("127.0.0.1", port());
    ASSERT_TRUE(c.SendRequest("POST", "/v1/completions",
                              CompletionBody(std::string(800, 'q'), 2000, true)));
    ClientResponse head;
    ASSERT_TRUE(c.ReadHead(&head));
    ASSERT_TRUE(c.ReadChunk().has_value()) << c.error();
    const std::string during = Metrics();
    EXPECT_EQ(Counter(during, "vllm:num_requests_running"), 1.0);
    EXPECT_GT(Counter(during, "vllm:kv_cache_usage_perc"), 0.0);
  }  // disconnect
  const std::string after = WaitForMetrics(port(), [](const std::string& m) {
    return Sample(m, "vllm:request_success_total", kLabels + ",finished_reason=\"abort\"") == 1.0;
  });
  EXPECT_EQ(Sample(after, "vllm:request_success_total", kLabels + ",finished_reason=\"abort\""), 1.0);
  EXPECT_EQ(Counter(after, "vllm:num_requests_running"), 0.0);
  EXPECT_EQ(Counter(after, "vllm:kv_cache_usage_perc"), 0.0);
  EXPECT_EQ(fleet_->LiveRequests(0), 0);
  // The replica is idle and healthy again.
  auto ok = Post("/v1/completions", CompletionBody("after abort", 1));
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200);
}

TEST_F(FleetTest, KvPressurePreemptsButEveryRequestFinishes) {
  // Steps take 5% of their modelled time (each request ~100 ms of wall time), so all four
  // requests are in the engine together even when the machine is loaded; at time scale 0
  // the first could finish before the fourth arrived, and nothing would be preempted.
  ReplicaConfig r = SmallReplica(/*time_scale=*/0.05);
  r.engine.num_gpu_blocks = 65;  // 64 usable blocks = 1024 tokens
  StartFleet({r, SmallReplica(0.0)});
  // Four requests of 200 prompt + 300 output tokens need 4 x 32 blocks > 64.
  std::vector<std::unique_ptr<TestClient>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<TestClient>("127.0.0.1", port(0)));
    std::string prompt = std::to_string(i) + std::string(799, 'p');
    ASSERT_TRUE(clients.back()->SendRequest("POST", "/v1/completions", CompletionBody(prompt, 300)));
  }
  simdjson::dom::parser p;
  for (auto& c : clients) {
    ClientResponse resp;
    ASSERT_TRUE(c->ReadHead(&resp) && c->ReadBody(&resp)) << c->error();
    ASSERT_EQ(resp.status, 200) << resp.body;
    EXPECT_EQ(int64_t(p.parse(resp.body)["usage"]["completion_tokens"]), 300);
  }
  const std::string m = Metrics(0);
  EXPECT_GT(Counter(m, "vllm:num_preemptions_total"), 0.0);
  EXPECT_EQ(Sample(m, "vllm:request_success_total", kLabels + ",finished_reason=\"length\""), 4.0);
  EXPECT_EQ(Counter(m, "vllm:kv_cache_usage_perc"), 0.0);
  // The other replica saw nothing.
  const std::string other = Metrics(1);
  EXPECT_EQ(Counter(other, "vllm:prompt_tokens_total"), 0.0);
  EXPECT_EQ(Counter(other, "vllm:num_preemptions_total"), 0.0);
}

TEST_F(FleetTest, KeepAliveAndLatencyDelayStillAnswer) {
  ReplicaConfig r = SmallReplica();
  r.latency_ms = 5;
  StartFleet({r});
  TestClient c("127.0.0.1", port());
  for (int i = 0; i < 3; ++i) {
    auto resp = c.Roundtrip("POST", "/v1/completions", CompletionBody("again", 2));
    ASSERT_TRUE(resp.has_value()) << c.error();
    EXPECT_EQ(resp->status, 200);
  }
}

// ---- Faults (docs/FAULTS.md) ----
// Every kind through the admin endpoint and through a fleet-file schedule, with the same
// probe of what a client sees while it is active, then recovery once it ends. Faults last
// kFaultS of wall time; the only waits are the faults' own.

constexpr double kFaultS = 0.4;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::optional<ClientResponse> Admin(uint16_t port, std::string_view method,
                                    std::string_view target = "/admin/fault",
                                    std::string_view body = {}) {
  return Fetch("127.0.0.1", port, method, target, body);
}

using kvroute::test_support::WaitFor;

// latency_ms is one-way and symmetric (issue 10): a request reaches the engine latency_ms
// after it arrived, and its answer leaves latency_ms after the engine produced it. With
// time_scale 0 the engine takes no wall time, so the request is done (as /metrics, which
// answers at once, shows) about latency_ms after it was sent, and the first byte of the
// answer arrives about latency_ms after that: 2 x latency_ms in all.
TEST_F(FleetTest, LatencyAppliesOnTheRequestAndTheResponsePath) {
  constexpr double kLatencyS = 0.15;
  for (bool stream : {true, false}) {
    ReplicaConfig r = SmallReplica(/*time_scale=*/0.0);
    r.latency_ms = kLatencyS * 1000;
    StartFleet({r});
    TestClient c("127.0.0.1", port());
    const auto t0 = Clock::now();
    ASSERT_TRUE(c.SendRequest("POST", "/v1/completions", CompletionBody("far away", 4, stream)));
    // The request path: the engine finishes it no sooner than latency_ms after the send.
    ASSERT_TRUE(WaitFor([&] {
      return Sample(Metrics(), "vllm:request_success_total",
                    kLabels + ",finished_reason=\"length\"") == 1.0;
    }, 3000ms));
    const double done_s = Since(t0);
    EXPECT_GE(done_s, kLatencyS) << "stream " << stream;
    // The response path: nothing of the answer before another latency_ms.
    ClientResponse resp;
    ASSERT_TRUE(c.ReadHead(&resp)) << c.error();
    const double head_s = Since(t0);
    ASSERT_TRUE(c.ReadBody(&resp)) << c.error();
    EXPECT_EQ(resp.status, 200) << resp.body;
    EXPECT_GE(head_s, 2 * kLatencyS) << "stream " << stream;
    // (A poll observes completion up to one poll interval late: allow it.)
    EXPECT_GE(head_s - done_s, kLatencyS - 0.05) << "stream " << stream;
    EXPECT_LT(head_s, 2 * kLatencyS + 1.0) << "stream " << stream;
    if (stream) {
      EXPECT_EQ(Frames(resp.body).back(), "[DONE]");
    } else {
      simdjson::dom::parser p;
      EXPECT_EQ(int64_t(p.parse(resp.body)["usage"]["completion_tokens"]), 4);
    }
    fleet_.reset();
  }
}

struct FaultCase {
  const char* kind;
  const char* fields;  // extra JSON fields, also written as YAML flow-map entries
  const char* yaml;
};

const FaultCase kFaultCases[] = {
    {"crash", "", ""},
    {"hang", "", ""},
    {"delay", R"(,"delay":"150ms")", ", delay: 150ms"},
    {"stall", R"(,"after_chunks":2)", ", after_chunks: 2"},
    {"reset", R"(,"after_chunks":2)", ", after_chunks: 2"},
    {"http_error", R"(,"status":503)", ", status: 503"},
    {"restart", "", ""},
    {"slow", R"(,"factor":50)", ", factor: 50"},
    {"metrics_stale", "", ""},
    {"metrics_nan", "", ""},
    {"metrics_missing", "", ""},
    {"metrics_slow", R"(,"delay":"150ms")", ", delay: 150ms"},
};

class FaultKindTest : public FleetTest,
                      public ::testing::WithParamInterface<std::tuple<int, bool>> {
 protected:
  const FaultCase& fc() const { return kFaultCases[std::get<0>(GetParam())]; }
  bool from_yaml() const { return std::get<1>(GetParam()); }
  bool Active() {
    return fleet_->FaultsJson(0).find(std::string("\"") + fc().kind + "\"") != std::string::npos;
  }
  // What a client sees while the fault is active.
  void Probe();
};

void FaultKindTest::Probe() {
  const std::string kind = fc().kind;
  if (kind == "crash" || kind == "restart") {
    EXPECT_FALSE(Fetch("127.0.0.1", port(), "GET", "/health", {}, {}, 1000ms).has_value())
        << "the port should refuse connections";
  } else if (kind == "hang") {
    // Held silently, closed when the hang ends; the admin endpoint still answers.
    TestClient c("127.0.0.1", port(), 2000ms);
    ASSERT_TRUE(c.Connect());
    ASSERT_TRUE(c.SendRequest("GET", "/metrics"));
    auto admin = Admin(port(), "GET");
    ASSERT_TRUE(admin.has_value());
    EXPECT_EQ(admin->status, 200);
    const auto t0 = Clock::now();
    ClientResponse head;
    EXPECT_FALSE(c.ReadHead(&head));
    EXPECT_LT(Since(t0), 1.9) << "closed at the hang's end, not timed out";
  } else if (kind == "delay") {
    const auto t0 = Clock::now();
    auto r = Post("/v1/completions", CompletionBody("late", 2));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_GE(Since(t0), 0.15);
  } else if (kind == "stall" || kind == "reset") {
    TestClient c("127.0.0.1", port(), 2000ms);
    ASSERT_TRUE(c.Connect());
    ASSERT_TRUE(c.SendRequest("POST", "/v1/completions", CompletionBody("cut me", 50, true)));
    ClientResponse head;
    ASSERT_TRUE(c.ReadHead(&head)) << c.error();
    EXPECT_EQ(head.status, 200);
    EXPECT_TRUE(c.ReadChunk().has_value());
    EXPECT_TRUE(c.ReadChunk().has_value());
    const auto t0 = Clock::now();
    EXPECT_FALSE(c.ReadChunk().has_value());  // stall: closed at the fault's end
    EXPECT_FALSE(c.ended());                  // never the terminating chunk
    EXPECT_LT(Since(t0), 1.9);
  } else if (kind == "http_error") {
    auto r = Post("/v1/completions", CompletionBody("fail me", 2));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 503);
    simdjson::dom::parser p;
    simdjson::dom::element doc = p.parse(r->body);
    EXPECT_EQ(int64_t(doc["error"]["code"]), 503);
    EXPECT_EQ(std::string_view(doc["error"]["type"]), "ServiceUnavailableError");
    const std::string m = Metrics();  // /metrics answers: "looks idle"
    EXPECT_EQ(Sample(m, "kvroute_sim_fault_active", "replica=\"r\",kind=\"http_error\""), 1.0);
  } else if (kind == "slow") {
    const auto t0 = Clock::now();
    auto r = Post("/v1/completions", CompletionBody("slowly", 10));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    // 10 steps of >= 5.75 ms engine time, x50, at time_scale 0.01.
    EXPECT_GE(Since(t0), 10 * 0.00575 * 50 * 0.01);
  } else if (kind == "metrics_stale") {
    const std::string before = Metrics();
    auto r = Post("/v1/completions", CompletionBody("changes counters", 3));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(Metrics(), before);
  } else if (kind == "metrics_nan") {
    const std::string m = Metrics();
    EXPECT_TRUE(std::isnan(Counter(m, "vllm:num_requests_running")));
    EXPECT_NE(m.find("vllm:kv_cache_usage_perc{" + kLabels + "} NaN"), std::string::npos);
    EXPECT_NE(m.find("vllm:num_requests_waiting{" + kLabels + "} NaN"), std::string::npos);
  } else if (kind == "metrics_missing") {
    const std::string m = Metrics();
    EXPECT_EQ(m.find("vllm:num_requests_running"), std::string::npos);
    EXPECT_EQ(m.find("vllm:num_requests_waiting"), std::string::npos);
    EXPECT_EQ(m.find("vllm:kv_cache_usage_perc"), std::string::npos);
    EXPECT_NE(m.find("vllm:prompt_tokens_total"), std::string::npos);
  } else if (kind == "metrics_slow") {
    const auto t0 = Clock::now();
    EXPECT_FALSE(Metrics().empty());
    EXPECT_GE(Since(t0), 0.15);
  } else {
    FAIL() << "no probe for " << kind;
  }
}

TEST_P(FaultKindTest, ActiveThenRecovers) {
  const std::string kind = fc().kind;
  ReplicaConfig r = SmallReplica();
  if (from_yaml()) {
    // Through the fleet file's parser, as `kvroute sim -c` reads it.
    const std::string yaml = "replicas:\n  - faults: [{kind: " + kind +
                             ", at: 100ms, duration: " + std::to_string(kFaultS) + fc().yaml +
                             "}]\n";
    auto file = config::ParseFleetYaml(yaml, "faults.yaml");
    ASSERT_TRUE(file.ok()) << file.error.ToString();
    ASSERT_EQ(file.value->replicas[0].faults.size(), 1u);
    r.faults = file.value->replicas[0].faults;
  }
  StartFleet({r});
  // Something for a restart to forget.
  auto warm = Post("/v1/completions", CompletionBody("warm up the counters", 2));
  ASSERT_TRUE(warm.has_value());
  if (from_yaml()) {
    ASSERT_TRUE(WaitFor([&] { return Active(); }, 3000ms)) << kind << " never started";
  } else {
    const std::string body = std::string(R"({"kind":")") + kind + R"(","duration":)" +
                             std::to_string(kFaultS) + fc().fields + "}";
    auto resp = Admin(port(), "POST", "/admin/fault", body);
    ASSERT_TRUE(resp.has_value());
    EXPECT_EQ(resp->status, 200) << resp->body;
    EXPECT_NE(resp->body.find("\"kind\":\"" + kind + "\""), std::string::npos) << resp->body;
  }
  Probe();
  // It ends by itself; then the replica serves normally again.
  ASSERT_TRUE(WaitFor([&] { return !Active(); }, 3000ms)) << kind << " never ended";
  ASSERT_TRUE(WaitFor([&] {
    auto h = Fetch("127.0.0.1", port(), "GET", "/health", {}, {}, 1000ms);
    return h && h->status == 200;
  }, 3000ms));
  auto ok = Post("/v1/completions", CompletionBody("after the fault", 2));
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200);
  const std::string m = Metrics();
  EXPECT_EQ(Sample(m, "kvroute_sim_fault_active", "replica=\"r\",kind=\"" + kind + "\""), 0.0);
  if (kind == "restart") {
    // Counters restarted from zero: only the request after the restart is counted.
    EXPECT_EQ(Sample(m, "vllm:request_success_total", kLabels + ",finished_reason=\"length\""),
              1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, FaultKindTest,
    ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kFaultCases))),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
      return std::string(kFaultCases[std::get<0>(info.param)].kind) +
             (std::get<1>(info.param) ? "_yaml" : "_admin");
    });

TEST_F(FleetTest, AdminEndpointListsClearsAndRejectsBadBodies) {
  StartFleet({SmallReplica()});
  auto r = Admin(port(), "GET");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, R"({"active":[]})");
  r = Admin(port(), "POST", "/admin/fault", R"({"kind":"metrics_nan"})");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  r = Admin(port(), "POST", "/admin/fault", R"({"kind":"http_error","status":500,"fraction":0.5})");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  r = Admin(port(), "GET");
  EXPECT_NE(r->body.find(R"("kind":"metrics_nan")"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find(R"("kind":"http_error")"), std::string::npos) << r->body;
  // fraction 0.5: every 2nd generation request fails, by a counter.
  std::vector<int> statuses;
  for (int i = 0; i < 4; ++i) {
    auto g = Post("/v1/completions", CompletionBody("x", 1));
    ASSERT_TRUE(g.has_value());
    statuses.push_back(g->status);
  }
  EXPECT_EQ(statuses, (std::vector<int>{200, 500, 200, 500}));
  r = Admin(port(), "DELETE", "/admin/fault?kind=http_error");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body.find("http_error"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("metrics_nan"), std::string::npos) << r->body;
  r = Admin(port(), "DELETE");
  EXPECT_EQ(r->body, R"({"active":[]})");
  EXPECT_EQ(Counter(Metrics(), "vllm:num_requests_running"), 0.0);

  struct Bad {
    const char* method;
    const char* target;
    const char* body;
    int status;
    const char* param;  // "" -> null
  };
  const Bad bad[] = {
      {"POST", "/admin/fault", "{nope", 400, ""},
      {"POST", "/admin/fault", R"({"kind":"hnag"})", 400, "kind"},
      {"POST", "/admin/fault", R"({"kind":"crash"})", 400, "duration"},
      {"POST", "/admin/fault", R"({"kind":"delay","delay":"soon"})", 400, "delay"},
      {"POST", "/admin/fault", R"({"kind":"hang","at":"1s"})", 400, "at"},
      {"POST", "/admin/fault", R"({"kind":"hang","factor":2})", 400, "factor"},
      {"DELETE", "/admin/fault?kind=bogus", "", 400, "kind"},
      {"PUT", "/admin/fault", "{}", 405, ""},
  };
  for (const Bad& b : bad) {
    auto e = Admin(port(), b.method, b.target, b.body);
    ASSERT_TRUE(e.has_value()) << b.body;
    EXPECT_EQ(e->status, b.status) << b.body;
    simdjson::dom::parser p;
    simdjson::dom::element doc = p.parse(e->body);
    EXPECT_EQ(int64_t(doc["error"]["code"]), b.status) << e->body;
    if (*b.param) {
      EXPECT_EQ(std::string_view(doc["error"]["param"]), b.param) << e->body;
    }
  }
}

TEST_F(FleetTest, RestartDropsInFlightAndEmptiesThePrefixCache) {
  ReplicaConfig config = SmallReplica(1.0);  // real time: the stream below outlives the restart
  config.enable_prompt_tokens_details = true;
  StartFleet({config});
  const std::string prompt(2000, 'p');
  auto first = Post("/v1/completions", CompletionBody(prompt, 1));
  ASSERT_TRUE(first.has_value());
  TestClient c("127.0.0.1", port(), 3000ms);
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRequest("POST", "/v1/completions", CompletionBody(prompt, 1000, true)));
  ClientResponse head;
  ASSERT_TRUE(c.ReadHead(&head));
  ASSERT_TRUE(c.ReadChunk().has_value());
  const std::string before = Metrics();
  EXPECT_GT(Counter(before, "vllm:prefix_cache_hits_total"), 0.0);
  auto r = Admin(port(), "POST", "/admin/fault", R"({"kind":"restart"})");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  // The stream is cut without its terminating chunk.
  while (c.ReadChunk().has_value()) {
  }
  EXPECT_FALSE(c.ended());
  const std::string after = Metrics();
  EXPECT_EQ(Counter(after, "vllm:prefix_cache_queries_total"), 0.0);
  EXPECT_EQ(Counter(after, "vllm:prompt_tokens_total"), 0.0);
  EXPECT_EQ(Counter(after, "vllm:num_requests_running"), 0.0);
  EXPECT_EQ(Sample(after, "vllm:time_to_first_token_seconds_count", kLabels), 0.0);
  // The same prompt finds nothing cached.
  auto again = Post("/v1/completions", CompletionBody(prompt, 1));
  ASSERT_TRUE(again.has_value());
  simdjson::dom::parser p;
  EXPECT_EQ(int64_t(p.parse(again->body)["usage"]["prompt_tokens_details"]["cached_tokens"]), 0);
}

TEST_F(FleetTest, CrashCutsStreamsAndKeepsThePort) {
  StartFleet({SmallReplica(1.0)});
  const uint16_t before = port();
  TestClient c("127.0.0.1", port(), 3000ms);
  ASSERT_TRUE(c.Connect());
  ASSERT_TRUE(c.SendRequest("POST", "/v1/completions", CompletionBody("long", 1000, true)));
  ClientResponse head;
  ASSERT_TRUE(c.ReadHead(&head));
  auto r = Admin(port(), "POST", "/admin/fault", R"({"kind":"crash","duration":"200ms"})");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  while (c.ReadChunk().has_value()) {
  }
  EXPECT_FALSE(c.ended());
  EXPECT_EQ(fleet_->LiveRequests(0), 0);
  EXPECT_FALSE(Fetch("127.0.0.1", port(), "GET", "/health").has_value());
  ASSERT_TRUE(WaitFor([&] {
    auto h = Fetch("127.0.0.1", port(), "GET", "/health", {}, {}, 500ms);
    return h && h->status == 200;
  }, 3000ms));
  EXPECT_EQ(port(), before);
}

}  // namespace
}  // namespace kvroute::sim
