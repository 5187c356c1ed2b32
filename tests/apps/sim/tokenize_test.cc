// The simulated replica's POST /tokenize and /detokenize over loopback: vLLM's shapes, ids
// that are exactly the engine's for the same completion or chat request (checked against
// usage and against the engine's prefix cache), detokenization of what the replica has
// seen, and the error answers.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <string>
#include <vector>

#include "core/api/openai.h"
#include "core/engine/tokenizer.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "apps/sim/tokenize_api.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"

namespace kvroute::sim {
namespace {

using http::ClientResponse;
using http::Fetch;
using test_support::CompletionBody;
using test_support::kTestModel;

class SimTokenizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fleet_ = std::make_unique<Fleet>(std::vector<ReplicaConfig>{test_support::SimReplica()}, 1);
    ASSERT_TRUE(fleet_->Start().ok());
  }

  ClientResponse Post(std::string_view path, std::string_view body) {
    std::optional<ClientResponse> r = Fetch("127.0.0.1", fleet_->port(0), "POST", path, body);
    EXPECT_TRUE(r.has_value());
    return r ? *r : ClientResponse{};
  }

  // POST /tokenize; the ids of a 200 answer (checked against its count).
  std::vector<uint32_t> Tokenize(const std::string& body) {
    ClientResponse r = Post("/tokenize", body);
    EXPECT_EQ(r.status, 200) << r.body;
    std::vector<uint32_t> ids;
    simdjson::dom::element doc;
    if (parser_.parse(r.body).get(doc)) {
      ADD_FAILURE() << "not JSON: " << r.body;
      return ids;
    }
    for (simdjson::dom::element id : doc["tokens"].get_array()) {
      ids.push_back(static_cast<uint32_t>(int64_t(id)));
    }
    EXPECT_EQ(int64_t(doc["count"]), static_cast<int64_t>(ids.size()));
    EXPECT_EQ(int64_t(doc["max_model_len"]), 8192);
    return ids;
  }

  std::string Detokenize(const std::vector<uint32_t>& ids) {
    std::string body = "{\"model\":\"test/model\",\"tokens\":[";
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) body += ",";
      body += std::to_string(ids[i]);
    }
    ClientResponse r = Post("/detokenize", body + "]}");
    EXPECT_EQ(r.status, 200) << r.body;
    simdjson::dom::element doc;
    if (parser_.parse(r.body).get(doc)) return "<not json>";
    return std::string(std::string_view(doc["prompt"]));
  }

  // usage.prompt_tokens of a 200 generation answer.
  int64_t PromptTokens(std::string_view path, const std::string& body) {
    ClientResponse r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    simdjson::dom::element doc;
    if (parser_.parse(r.body).get(doc)) return -1;
    return int64_t(doc["usage"]["prompt_tokens"]);
  }

  std::unique_ptr<Fleet> fleet_;
  simdjson::dom::parser parser_;
};

std::string LongPrompt(std::size_t bytes) {
  std::string p;
  for (int i = 0; p.size() < bytes; ++i) p += "line " + std::to_string(i) + " of the shared context. ";
  p.resize(bytes);
  return p;
}

TEST_F(SimTokenizeTest, CompletionFormIdsAreTheEnginesIds) {
  const std::string prompt = LongPrompt(2003);  // 501 tokens
  std::string body = R"({"model":"test/model","prompt":)";
  api::AppendJsonString(body, prompt);
  const std::vector<uint32_t> ids = Tokenize(body + "}");
  ASSERT_EQ(ids.size(), 501u);
  EXPECT_EQ(ids, engine::Tokenize(prompt));
  // add_special_tokens adds nothing: the engine has no BOS.
  EXPECT_EQ(Tokenize(body + R"(,"add_special_tokens":true})"), ids);
  EXPECT_EQ(Tokenize(body + R"(,"add_special_tokens":false})"), ids);

  // Nothing cached yet; the same prompt as a completion: as many prompt tokens, and the
  // engine's cache then holds exactly the blocks of these ids (all full blocks but the
  // one holding the last token, as admission caps a hit).
  ASSERT_EQ(fleet_->PeekCachedTokens(0, ids), 0);
  EXPECT_EQ(PromptTokens("/v1/completions", CompletionBody(prompt, 2)), 501);
  EXPECT_EQ(fleet_->PeekCachedTokens(0, ids), 496);
  std::vector<uint32_t> other = ids;
  other[0] = (other[0] + 1) % engine::kVocabSize;
  EXPECT_EQ(fleet_->PeekCachedTokens(0, other), 0) << "a different first id hits nothing";
  other = ids;
  other[17 * 16] = (other[17 * 16] + 1) % engine::kVocabSize;
  EXPECT_EQ(fleet_->PeekCachedTokens(0, other), 17 * 16);
}

TEST_F(SimTokenizeTest, ChatFormIdsAreTheEnginesIdsForTheSameChatRequest) {
  const std::string messages = std::string(R"([{"role":"system","content":")") +
                               LongPrompt(700) + R"("},{"role":"user","content":"And then?"}])";
  const std::vector<uint32_t> ids =
      Tokenize(std::string(R"({"model":"test/model","messages":)") + messages + "}");
  const std::string chat = std::string(R"({"model":"test/model","max_tokens":2,"messages":)") +
                           messages + "}";
  ASSERT_EQ(fleet_->PeekCachedTokens(0, ids), 0);
  EXPECT_EQ(PromptTokens("/v1/chat/completions", chat), static_cast<int64_t>(ids.size()));
  EXPECT_EQ(fleet_->PeekCachedTokens(0, ids), static_cast<int>((ids.size() - 1) / 16 * 16));
  EXPECT_GT(ids.size(), 16u * 11);

  // Without the generation prompt: the same ids but the last "<|assistant|>\n" (14 bytes,
  // cut at a 4-byte boundary here or not, so compare with the engine's tokenizer).
  const std::vector<uint32_t> no_gen = Tokenize(
      std::string(R"({"model":"test/model","add_generation_prompt":false,"messages":)") +
      messages + "}");
  const std::string system = LongPrompt(700);
  std::vector<api::ChatMessage> msgs = {{"system", system}, {"user", "And then?"}};
  std::string rendered = api::RenderChat(msgs);
  rendered.resize(rendered.size() - std::string_view("<|assistant|>\n").size());
  EXPECT_EQ(no_gen, engine::Tokenize(rendered));
}

TEST_F(SimTokenizeTest, TokenStrsAreEachTokensBytes) {
  ClientResponse r = Post("/tokenize", R"({"model":"test/model","prompt":"Hello, world","return_token_strs":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<uint32_t> ids = engine::Tokenize("Hello, world");
  std::string expected = "{\"count\":3,\"max_model_len\":8192,\"tokens\":[" +
                         std::to_string(ids[0]) + "," + std::to_string(ids[1]) + "," +
                         std::to_string(ids[2]) + "],\"token_strs\":[\"Hell\",\"o, w\",\"orld\"]}";
  EXPECT_EQ(r.body, expected);
  EXPECT_EQ(r.Header("content-type"), "application/json");
  r = Post("/tokenize", R"({"model":"test/model","prompt":""})");
  EXPECT_EQ(r.body, R"({"count":0,"max_model_len":8192,"tokens":[],"token_strs":null})");
}

TEST_F(SimTokenizeTest, DetokenizeGivesBackWhatTheReplicaHasSeen) {
  const std::string prompt = "The quick brown fox jumps over the lazy dog.";
  std::string body = R"({"model":"test/model","prompt":)";
  api::AppendJsonString(body, prompt);
  const std::vector<uint32_t> ids = Tokenize(body + "}");
  EXPECT_EQ(Detokenize(ids), prompt);

  // A prompt seen through a completion, not /tokenize.
  const std::string seen = "Only sent as a completion, never tokenized.";
  ClientResponse c = Post("/v1/completions", CompletionBody(seen, 3));
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(Detokenize(engine::Tokenize(seen)), seen);

  // Generated tokens: the output words are known from the start.
  simdjson::dom::element doc = parser_.parse(c.body);
  const std::string text(std::string_view(doc["choices"].at(0)["text"]));
  // The engine's request id: the last 12 hex digits of the response id.
  const uint64_t id = std::stoull(std::string(std::string_view(doc["id"]).substr(9)), nullptr, 16);
  ASSERT_EQ(text, std::string(engine::OutputTokenText(id, 0)) +
                      std::string(engine::OutputTokenText(id, 1)) +
                      std::string(engine::OutputTokenText(id, 2)));
  EXPECT_EQ(Detokenize({engine::OutputTokenId(id, 0), engine::OutputTokenId(id, 1),
                        engine::OutputTokenId(id, 2)}),
            text);

  // An id never seen: the placeholder; ids run back to back with what is known.
  uint32_t unseen = 0;
  for (; unseen < engine::kVocabSize; ++unseen) {
    bool known = false;
    for (uint32_t k : ids) known = known || k == unseen;
    for (uint32_t k : engine::Tokenize(seen)) known = known || k == unseen;
    for (std::string_view w : engine::OutputTokenWords()) known = known || engine::TokenId(w) == unseen;
    if (!known) break;
  }
  EXPECT_EQ(Detokenize({ids[0], unseen}), "The <unk:" + std::to_string(unseen) + ">");
  EXPECT_EQ(TokenizeApi::Placeholder(unseen), "<unk:" + std::to_string(unseen) + ">");
  EXPECT_EQ(Detokenize({}), "");
}

TEST_F(SimTokenizeTest, DetokenizeRepairsCutUtf8) {
  // "ab é": 'é' is two bytes; the first run is "ab \xC3", the second "\xA9".
  const std::string prompt = "ab \xC3\xA9";
  std::string body = R"({"model":"test/model","prompt":)";
  api::AppendJsonString(body, prompt);
  const std::vector<uint32_t> ids = Tokenize(body + "}");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(Detokenize(ids), prompt);
  EXPECT_EQ(Detokenize({ids[0]}), "ab \xEF\xBF\xBD");
}

TEST_F(SimTokenizeTest, ErrorsHaveVllmsShapes) {
  ClientResponse r = Post("/tokenize", R"({"model":"other","prompt":"x"})");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body,
            R"({"error":{"message":"The model `other` does not exist.","type":"NotFoundError","param":"model","code":404}})");
  r = Post("/detokenize", R"({"model":"other","tokens":[1]})");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body,
            R"({"error":{"message":"The model `other` does not exist.","type":"NotFoundError","param":"model","code":404}})");

  r = Post("/tokenize", "{\"model\":");
  EXPECT_EQ(r.status, 400);
  simdjson::dom::element doc = parser_.parse(r.body);
  EXPECT_EQ(std::string_view(doc["error"]["type"]), "BadRequestError");
  EXPECT_EQ(int64_t(doc["error"]["code"]), 400);
  EXPECT_TRUE(doc["error"]["param"].is_null());

  r = Post("/tokenize", R"({"model":"test/model","prompt":"x","return_token_strs":"yes"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body,
            R"({"error":{"message":"'return_token_strs' must be a boolean","type":"BadRequestError","param":"return_token_strs","code":400}})");

  r = Post("/detokenize", R"({"model":"test/model","tokens":[1,32000]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body,
            R"({"error":{"message":"Token id 32000 is out of vocabulary (ids 0..31999).","type":"BadRequestError","param":"tokens[1]","code":400}})");

  std::optional<ClientResponse> get = Fetch("127.0.0.1", fleet_->port(0), "GET", "/tokenize");
  ASSERT_TRUE(get.has_value());
  EXPECT_EQ(get->status, 405);
  EXPECT_EQ(get->Header("allow"), "POST");
}

}  // namespace
}  // namespace kvroute::sim
