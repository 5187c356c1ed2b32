// --enable-prompt-tokens-details over loopback: usage.prompt_tokens_details.cached_tokens is
// the engine's prefix-cache hit for the request, in plain answers and in a stream's final
// usage chunk; without the flag there is no prompt_tokens_details, as in vLLM.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <string>
#include <vector>

#include "core/api/openai.h"
#include "core/engine/tokenizer.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"

namespace kvroute::sim {
namespace {

using http::ClientResponse;
using test_support::CompletionBody;

class PromptTokensDetailsTest : public ::testing::Test {
 protected:
  void Start(bool details) {
    ReplicaConfig r = test_support::SimReplica();
    r.enable_prompt_tokens_details = details;
    fleet_ = std::make_unique<Fleet>(std::vector<ReplicaConfig>{r}, 1);
    ASSERT_TRUE(fleet_->Start().ok());
  }

  // The usage object of a plain answer, or of the final usage chunk of a stream (the one
  // with "choices": [], checked to be the last before [DONE]), as JSON text.
  std::string Usage(std::string_view path, const std::string& body, bool stream) {
    std::optional<ClientResponse> r = http::Fetch("127.0.0.1", fleet_->port(0), "POST", path, body);
    if (!r || r->status != 200) {
      ADD_FAILURE() << (r ? r->body : "no answer");
      return {};
    }
    simdjson::dom::element doc;
    if (!stream) {
      if (parser_.parse(r->body).get(doc)) return "<not json>";
      return simdjson::to_string(doc["usage"]);
    }
    std::vector<std::string> frames;
    for (std::size_t pos = 0; pos < r->body.size();) {
      const std::size_t end = r->body.find("\n\n", pos);
      if (end == std::string::npos) break;
      frames.push_back(r->body.substr(pos + 6, end - pos - 6));  // without "data: "
      pos = end + 2;
    }
    if (frames.size() < 2 || frames.back() != "[DONE]") {
      ADD_FAILURE() << r->body;
      return {};
    }
    if (parser_.parse(frames[frames.size() - 2]).get(doc)) return "<not json>";
    EXPECT_EQ(simdjson::dom::array(doc["choices"]).size(), 0u);
    return simdjson::to_string(doc["usage"]);
  }

  std::string StreamBody(const std::string& prompt) {
    return CompletionBody(prompt, 2, /*stream=*/true, /*include_usage=*/true);
  }

  std::unique_ptr<Fleet> fleet_;
  simdjson::dom::parser parser_;
};

std::string Prompt(std::size_t bytes, char fill) {
  std::string p;
  for (int i = 0; p.size() < bytes; ++i) p += fill + std::to_string(i) + " ";
  p.resize(bytes);
  return p;
}

TEST_F(PromptTokensDetailsTest, OffMeansNoPromptTokensDetails) {
  Start(false);
  const std::string prompt = Prompt(400, 'a');  // 100 tokens
  for (int i = 0; i < 2; ++i) {  // the second one hits the cache: still no details
    EXPECT_EQ(Usage("/v1/completions", CompletionBody(prompt, 2), false),
              R"({"prompt_tokens":100,"total_tokens":102,"completion_tokens":2})");
    EXPECT_EQ(Usage("/v1/completions", StreamBody(prompt), true),
              R"({"prompt_tokens":100,"total_tokens":102,"completion_tokens":2})");
  }
}

TEST_F(PromptTokensDetailsTest, PlainAnswersReportTheEnginesHit) {
  Start(true);
  const std::string prompt = Prompt(2003, 'b');  // 501 tokens
  const std::vector<uint32_t> ids = engine::Tokenize(prompt);
  EXPECT_EQ(Usage("/v1/completions", CompletionBody(prompt, 2), false),
            R"({"prompt_tokens":501,"total_tokens":503,"completion_tokens":2,)"
            R"("prompt_tokens_details":{"cached_tokens":0}})");
  const std::optional<int> hit = fleet_->PeekCachedTokens(0, ids);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, 496);  // every full block but the one with the last token
  EXPECT_EQ(Usage("/v1/completions", CompletionBody(prompt, 2), false),
            R"({"prompt_tokens":501,"total_tokens":503,"completion_tokens":2,)"
            R"("prompt_tokens_details":{"cached_tokens":)" + std::to_string(*hit) + "}}");
}

TEST_F(PromptTokensDetailsTest, StreamsReportItInTheFinalUsageChunk) {
  Start(true);
  const std::string prompt = Prompt(1000, 'c');  // 250 tokens
  EXPECT_EQ(Usage("/v1/completions", StreamBody(prompt), true),
            R"({"prompt_tokens":250,"total_tokens":252,"completion_tokens":2,)"
            R"("prompt_tokens_details":{"cached_tokens":0}})");
  const std::optional<int> hit = fleet_->PeekCachedTokens(0, engine::Tokenize(prompt));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, 240);
  EXPECT_EQ(Usage("/v1/completions", StreamBody(prompt), true),
            R"({"prompt_tokens":250,"total_tokens":252,"completion_tokens":2,)"
            R"("prompt_tokens_details":{"cached_tokens":240}})");

  // Chat: the rendered conversation; a follow-up turn hits the first turn's blocks.
  const std::string system = Prompt(900, 'd');
  auto chat = [&](std::string_view user) {
    std::string b = R"({"model":"test/model","max_tokens":2,"stream":true,)"
                    R"("stream_options":{"include_usage":true},"messages":[{"role":"system","content":)";
    api::AppendJsonString(b, system);
    b += R"(},{"role":"user","content":)";
    api::AppendJsonString(b, user);
    return b + "}]}";
  };
  const std::string first = Usage("/v1/chat/completions", chat("first question"), true);
  EXPECT_NE(first.find(R"("prompt_tokens_details":{"cached_tokens":0})"), std::string::npos)
      << first;
  std::vector<api::ChatMessage> msgs = {{"system", system}, {"user", "second question"}};
  const std::vector<uint32_t> second_ids = engine::Tokenize(api::RenderChat(msgs));
  const std::optional<int> chat_hit = fleet_->PeekCachedTokens(0, second_ids);
  ASSERT_TRUE(chat_hit.has_value());
  EXPECT_GT(*chat_hit, 200);
  const std::string second = Usage("/v1/chat/completions", chat("second question"), true);
  EXPECT_NE(second.find(R"("prompt_tokens_details":{"cached_tokens":)" +
                        std::to_string(*chat_hit) + "}"),
            std::string::npos)
      << second;
}

}  // namespace
}  // namespace kvroute::sim
