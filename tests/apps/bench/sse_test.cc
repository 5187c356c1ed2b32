#include "apps/bench/sse.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/bench/request_body.h"
#include "core/api/openai.h"

namespace kvroute::bench {
namespace {

std::vector<std::string> SplitAll(const std::vector<std::string>& pieces) {
  SseSplitter s;
  std::vector<std::string> out;
  for (const std::string& p : pieces) {
    s.Feed(p, [&](std::string_view d) { out.emplace_back(d); });
  }
  return out;
}

TEST(SseSplitterTest, EveryCutOfAStreamGivesTheSameEvents) {
  const std::string stream =
      "data: {\"a\":1}\n\n"
      ": comment\n\n"
      "event: x\ndata: two\ndata: lines\n\n"
      "data:{\"b\":2}\r\n\r\n"
      "data: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "two\nlines", "{\"b\":2}", "[DONE]"};
  EXPECT_EQ(SplitAll({stream}), want);
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    EXPECT_EQ(SplitAll({stream.substr(0, cut), stream.substr(cut)}), want) << cut;
  }
  // Byte by byte.
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  EXPECT_EQ(SplitAll(bytes), want);
}

TEST(SseSplitterTest, KeepsAnIncompleteEvent) {
  SseSplitter s;
  int n = 0;
  s.Feed("data: x\n", [&](std::string_view) { ++n; });
  EXPECT_EQ(n, 0);
  EXPECT_EQ(s.pending_bytes(), 8u);
  s.Feed("\n", [&](std::string_view d) {
    EXPECT_EQ(d, "x");
    ++n;
  });
  EXPECT_EQ(n, 1);
  EXPECT_EQ(s.pending_bytes(), 0u);
}

TEST(StreamEventParserTest, ReadsCompletionChatUsageErrorAndDone) {
  StreamEventParser p;
  StreamEvent e = p.Parse(
      R"({"id":"c","object":"text_completion","choices":[{"index":0,"text":"abc ","logprobs":null,"finish_reason":null}],"usage":null})");
  EXPECT_EQ(e.kind, StreamEvent::Kind::kChunk);
  EXPECT_EQ(e.text, "abc ");
  EXPECT_FALSE(e.finished);
  EXPECT_FALSE(e.has_usage);

  e = p.Parse(
      R"({"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"length"}]})");
  EXPECT_EQ(e.text, "hi");
  EXPECT_TRUE(e.finished);

  e = p.Parse(R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})");
  EXPECT_EQ(e.kind, StreamEvent::Kind::kChunk);
  EXPECT_TRUE(e.text.empty());

  e = p.Parse(
      R"({"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":7,"total_tokens":127,"prompt_tokens_details":{"cached_tokens":96}}})");
  EXPECT_TRUE(e.has_usage);
  EXPECT_EQ(e.prompt_tokens, 120);
  EXPECT_EQ(e.completion_tokens, 7);
  EXPECT_EQ(e.cached_tokens, 96);

  e = p.Parse(R"({"error":{"message":"boom","type":"InternalServerError","code":500}})");
  EXPECT_EQ(e.kind, StreamEvent::Kind::kError);
  EXPECT_EQ(e.error_code, 500);
  EXPECT_EQ(e.error_message, "boom");

  EXPECT_EQ(p.Parse("[DONE]").kind, StreamEvent::Kind::kDone);
  EXPECT_EQ(p.Parse("{not json").kind, StreamEvent::Kind::kInvalid);
  EXPECT_EQ(p.Parse("[1,2]").kind, StreamEvent::Kind::kInvalid);
}

TEST(RequestBodyTest, CompletionsBodyParsesToTheSpec) {
  workload::RequestSpec spec;
  spec.id = 3;
  spec.segments = {{11, 40, workload::Role::kSystem, false}, {12, 9, workload::Role::kUser, false}};
  spec.prompt_tokens = 49;
  spec.max_tokens = 17;
  std::string scratch, body;
  BuildRequestBody(spec, "m/x", nullptr, &scratch, &body);
  EXPECT_EQ(RequestTarget(spec), "/v1/completions");
  api::ParseResult r = api::ParseRequest(api::Endpoint::kCompletions, body);
  ASSERT_TRUE(r.ok()) << r.error.message;
  EXPECT_EQ(r.request->model, "m/x");
  EXPECT_TRUE(r.request->stream);
  EXPECT_TRUE(r.request->include_usage);
  EXPECT_TRUE(r.request->ignore_eos);
  EXPECT_EQ(r.request->max_tokens, 17);
  EXPECT_EQ(r.request->prompt_text.size(), 49u * workload::kBytesPerToken);
}

TEST(RequestBodyTest, ChatBodyCarriesEveryTurn) {
  workload::RequestSpec spec;
  spec.endpoint = api::Endpoint::kChatCompletions;
  spec.segments = {{1, 10, workload::Role::kSystem, false},
                   {2, 5, workload::Role::kUser, false},
                   {77, 3, workload::Role::kAssistant, true},
                   {4, 6, workload::Role::kUser, false}};
  spec.max_tokens = 5;
  std::string scratch, body;
  workload::OutputTextFn out = [](uint64_t id, int32_t tokens, std::string* text) {
    EXPECT_EQ(id, 77u);
    EXPECT_EQ(tokens, 3);
    text->append("abc def ghi ");
  };
  BuildRequestBody(spec, "m", out, &scratch, &body);
  EXPECT_EQ(RequestTarget(spec), "/v1/chat/completions");
  api::ParseResult r = api::ParseRequest(api::Endpoint::kChatCompletions, body);
  ASSERT_TRUE(r.ok()) << r.error.message;
  std::string rendered;
  workload::RenderPrompt(spec, out, &rendered);
  EXPECT_EQ(r.request->prompt_text, rendered);
  EXPECT_NE(body.find("\"role\":\"assistant\",\"content\":\"abc def ghi \""), std::string::npos);
}

}  // namespace
}  // namespace kvroute::bench
