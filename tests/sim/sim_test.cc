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
#include "http/test_client.h"
#include "sim/fleet.h"

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
      std::size_t end = text.find('\n', pos);
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

std::string CompletionBody(std::string_view prompt, int max_tokens, bool stream = false,
                           bool include_usage = false) {
  std::string body = "{\"model\":\"" + std::string(kModel) + "\",\"prompt\":";
  api::AppendJsonString(body, prompt);
  body += ",\"max_tokens\":" + std::to_string(max_tokens);
  if (stream) body += ",\"stream\":true";
  if (include_usage) body += ",\"stream_options\":{\"include_usage\":true}";
  body += "}";
  return body;
}

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
  EXPECT_EQ(int64_t(usage["prompt_tokens_details"]["cached_tokens"]), 0);
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
  StartFleet({SmallReplica()});
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
    EXPECT_EQ(line.substr(0, 5) == "vllm:" || line.substr(0, 13) == "kvroute_sim_r", true) << line;
  }
  EXPECT_GT(samples, 90);
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
  ReplicaConfig r = SmallReplica(/*time_scale=*/0.0);
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

}  // namespace
}  // namespace kvroute::sim
