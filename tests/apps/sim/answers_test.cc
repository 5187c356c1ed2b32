// `kvroute sim` on /v1/embeddings and /v1/responses (issue 26): vLLM's shapes over HTTP,
// deterministic vectors and texts, and the engine's costing (usage from the engine).
#include "apps/sim/answers.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/engine/tokenizer.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "support/sim_replica.h"

namespace kvroute::sim {
namespace {

using http::Fetch;
using test_support::kTestModel;

class AnswersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fleet_ = std::make_unique<Fleet>(
        std::vector<ReplicaConfig>{test_support::SimReplica({.kv_blocks = 512, .time_scale = 0.0})}, 1);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  std::optional<http::ClientResponse> Post(std::string_view path, const std::string& body) {
    return Fetch("127.0.0.1", fleet_->port(0), "POST", path, body);
  }
  std::string Model() const { return std::string(kTestModel); }
  std::unique_ptr<Fleet> fleet_;
};

std::vector<uint32_t> Tokens(std::string_view text) {
  std::vector<uint32_t> t;
  engine::TokenizeInto(text, &t);
  return t;
}

std::vector<float> FloatsOf(simdjson::dom::array a) {
  std::vector<float> v;
  for (simdjson::dom::element x : a) v.push_back(static_cast<float>(double(x)));
  return v;
}

TEST(EmbeddingVector, DeterministicUnitLengthAndDistinct) {
  std::vector<float> a, b, c;
  answers::EmbeddingVector(Tokens("hello world"), 384, a);
  answers::EmbeddingVector(Tokens("hello world"), 384, b);
  answers::EmbeddingVector(Tokens("hello there"), 384, c);
  ASSERT_EQ(a.size(), 384u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double norm = 0;
  for (float x : a) norm += double(x) * x;
  EXPECT_NEAR(norm, 1.0, 1e-5);
  std::vector<float> small;
  answers::EmbeddingVector(Tokens("hello world"), 8, small);
  ASSERT_EQ(small.size(), 8u);
  norm = 0;
  for (float x : small) norm += double(x) * x;
  EXPECT_NEAR(norm, 1.0, 1e-5);
}

TEST(Base64, StandardAlphabetWithPadding) {
  EXPECT_EQ(answers::Base64(""), "");
  EXPECT_EQ(answers::Base64("f"), "Zg==");
  EXPECT_EQ(answers::Base64("fo"), "Zm8=");
  EXPECT_EQ(answers::Base64("foo"), "Zm9v");
  EXPECT_EQ(answers::Base64("foobar"), "Zm9vYmFy");
  EXPECT_EQ(answers::Base64(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST_F(AnswersTest, EmbeddingsAnswerVllmsShapeWithTheEnginesUsage) {
  auto r = Post("/v1/embeddings",
                R"({"model":")" + Model() + R"(","input":["hello world","a b c"],"encoding_format":"float"})");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r->body);
  EXPECT_EQ(std::string_view(doc["object"]), "list");
  EXPECT_EQ(std::string_view(doc["id"]).substr(0, 5), "embd-");
  EXPECT_EQ(std::string_view(doc["model"]), kTestModel);
  simdjson::dom::array data = doc["data"];
  ASSERT_EQ(data.size(), 2u);
  const char* texts[] = {"hello world", "a b c"};
  for (std::size_t i = 0; i < 2; ++i) {
    simdjson::dom::element d = data.at(i);
    EXPECT_EQ(int64_t(d["index"]), int64_t(i));
    EXPECT_EQ(std::string_view(d["object"]), "embedding");
    std::vector<float> want;
    answers::EmbeddingVector(Tokens(texts[i]), answers::kEmbeddingDims, want);
    EXPECT_EQ(FloatsOf(d["embedding"]), want);  // shortest float text parses back exactly
  }
  const int64_t tokens = int64_t(Tokens("hello world").size() + Tokens("a b c").size());
  EXPECT_EQ(int64_t(doc["usage"]["prompt_tokens"]), tokens);
  EXPECT_EQ(int64_t(doc["usage"]["total_tokens"]), tokens);
  EXPECT_EQ(int64_t(doc["usage"]["completion_tokens"]), 0);
}

TEST_F(AnswersTest, EmbeddingsInBase64AreLittleEndianFloat32s) {
  auto r = Post("/v1/embeddings", R"({"model":")" + Model() +
                                      R"(","input":[5,6,7],"encoding_format":"base64","dimensions":3})");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r->body);
  std::vector<float> want;
  answers::EmbeddingVector(std::vector<uint32_t>{5, 6, 7}, 3, want);
  std::string raw(12, '\0');
  std::memcpy(raw.data(), want.data(), 12);  // little-endian host
  EXPECT_EQ(std::string_view(doc["data"].at(0)["embedding"]), answers::Base64(raw));
  EXPECT_EQ(int64_t(doc["usage"]["prompt_tokens"]), 3);
}

TEST_F(AnswersTest, EmbeddingsRefuseMoreDimensionsThanTheModelHasAndUnknownModels) {
  auto big = Post("/v1/embeddings", R"({"model":")" + Model() + R"(","input":"x","dimensions":385})");
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->status, 400);
  EXPECT_NE(big->body.find("\"param\":\"dimensions\""), std::string::npos) << big->body;
  auto other = Post("/v1/embeddings", R"({"model":"nope","input":"x"})");
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->status, 404);
  auto empty = Post("/v1/embeddings", R"({"model":")" + Model() + R"(","input":""})");
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->status, 400) << empty->body;
}

TEST_F(AnswersTest, ResponsesAnswerOneMessageWithTheEnginesText) {
  auto r = Post("/v1/responses", R"({"model":")" + Model() +
                                     R"(","input":"Say hi","max_output_tokens":4})");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r->body);
  EXPECT_EQ(std::string_view(doc["object"]), "response");
  EXPECT_EQ(std::string_view(doc["id"]).substr(0, 5), "resp_");
  EXPECT_EQ(std::string_view(doc["status"]), "incomplete");
  EXPECT_EQ(std::string_view(doc["incomplete_details"]["reason"]), "max_output_tokens");
  EXPECT_EQ(int64_t(doc["max_output_tokens"]), 4);
  simdjson::dom::element msg = doc["output"].at(0);
  EXPECT_EQ(std::string_view(msg["type"]), "message");
  EXPECT_EQ(std::string_view(msg["role"]), "assistant");
  EXPECT_EQ(std::string_view(msg["id"]).substr(0, 4), "msg_");
  std::string want;
  for (std::size_t i = 0; i < 4; ++i) want += engine::OutputTokenText(1, i);
  EXPECT_EQ(std::string_view(msg["content"].at(0)["type"]), "output_text");
  EXPECT_EQ(std::string_view(msg["content"].at(0)["text"]), want);
  // The prompt is the chat rendering of the input.
  EXPECT_EQ(int64_t(doc["usage"]["input_tokens"]),
            int64_t(Tokens("<|user|>\nSay hi\n<|assistant|>\n").size()));
  EXPECT_EQ(int64_t(doc["usage"]["output_tokens"]), 4);
  EXPECT_EQ(int64_t(doc["usage"]["total_tokens"]), int64_t(doc["usage"]["input_tokens"]) + 4);
}

TEST_F(AnswersTest, StreamedResponsesSendTheEventsInOrder) {
  auto r = Post("/v1/responses", R"({"model":")" + Model() +
                                     R"(","input":"Say hi","max_output_tokens":2,"stream":true})");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->Header("content-type"), "text/event-stream");
  std::vector<std::string> types;
  std::string deltas, done_text;
  int64_t expect_seq = 0;
  simdjson::dom::parser p;
  std::size_t pos = 0;
  const std::string& body = r->body;
  while (pos < body.size()) {
    const std::size_t end = body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos) << body.substr(pos);
    const std::string frame = body.substr(pos, end - pos);
    pos = end + 2;
    ASSERT_EQ(frame.substr(0, 7), "event: ") << frame;
    const std::size_t nl = frame.find('\n');
    const std::string type = frame.substr(7, nl - 7);
    ASSERT_EQ(frame.substr(nl + 1, 6), "data: ");
    simdjson::dom::element e = p.parse(frame.substr(nl + 7));
    EXPECT_EQ(std::string_view(e["type"]), type);
    EXPECT_EQ(int64_t(e["sequence_number"]), expect_seq++);
    types.push_back(type);
    if (type == "response.output_text.delta") deltas += std::string_view(e["delta"]);
    if (type == "response.output_text.done") done_text = std::string_view(e["text"]);
    if (type == "response.incomplete") {
      EXPECT_EQ(int64_t(e["response"]["usage"]["output_tokens"]), 2);
      EXPECT_EQ(std::string_view(e["response"]["output"].at(0)["content"].at(0)["text"]), deltas);
    }
  }
  EXPECT_EQ(types, (std::vector<std::string>{
                       "response.created", "response.in_progress", "response.output_item.added",
                       "response.content_part.added", "response.output_text.delta",
                       "response.output_text.delta", "response.output_text.done",
                       "response.content_part.done", "response.output_item.done",
                       "response.incomplete"}));
  EXPECT_EQ(deltas, std::string(engine::OutputTokenText(1, 0)) + std::string(engine::OutputTokenText(1, 1)));
  EXPECT_EQ(done_text, deltas);
}

}  // namespace
}  // namespace kvroute::sim
