// vLLM's /tokenize and /detokenize shapes (core/api/tokenize.h): the server's reading of
// both bodies and writing of the answers, the client's body building and answer reading.
#include "core/api/tokenize.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/api/openai.h"

namespace kvroute::api {
namespace {

const char* kChatMessages =
    R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi!"}])";

std::string ChatBody(std::string_view extra = {}) {
  std::string b = std::string(R"({"model":"m","messages":)") + kChatMessages;
  b += extra;
  return b + "}";
}

TEST(ParseTokenizeRequest, CompletionFormWithVllmDefaults) {
  TokenizeParse p = ParseTokenizeRequest(R"({"model":"m","prompt":"Hello there"})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request->form, TokenizeForm::kCompletion);
  EXPECT_EQ(p.request->model, "m");
  EXPECT_EQ(p.request->text, "Hello there");
  EXPECT_TRUE(p.request->add_special_tokens);
  EXPECT_FALSE(p.request->return_token_strs);

  p = ParseTokenizeRequest(
      R"({"model":"m","prompt":["one"],"add_special_tokens":false,"return_token_strs":true})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request->text, "one");
  EXPECT_FALSE(p.request->add_special_tokens);
  EXPECT_TRUE(p.request->return_token_strs);
}

TEST(ParseTokenizeRequest, ChatFormRendersAsAChatCompletionDoes) {
  TokenizeParse p = ParseTokenizeRequest(ChatBody());
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request->form, TokenizeForm::kChat);
  EXPECT_FALSE(p.request->add_special_tokens);  // vLLM's chat default
  const std::string chat_completion =
      std::string(R"({"model":"m","max_tokens":3,"messages":)") + kChatMessages + "}";
  ParseResult engine_view = ParseRequest(Endpoint::kChatCompletions, chat_completion);
  ASSERT_TRUE(engine_view.ok());
  EXPECT_EQ(p.request->text, engine_view.request->prompt_text);
  EXPECT_EQ(p.request->text, "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n");
}

TEST(ParseTokenizeRequest, ChatTemplateFlagsCutTheText) {
  TokenizeParse p = ParseTokenizeRequest(ChatBody(R"(,"add_generation_prompt":false)"));
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request->text, "<|system|>\nBe brief.\n<|user|>\nHi!\n");
  p = ParseTokenizeRequest(
      ChatBody(R"(,"add_generation_prompt":false,"continue_final_message":true)"));
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request->text, "<|system|>\nBe brief.\n<|user|>\nHi!");
  p = ParseTokenizeRequest(ChatBody(R"(,"continue_final_message":true)"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error.status, 400);
  EXPECT_EQ(p.error.message,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  // Accepted and ignored: the sim has one template.
  p = ParseTokenizeRequest(ChatBody(
      R"(,"chat_template":"{{x}}","chat_template_kwargs":{"a":1},"tools":[],"return_token_strs":null)"));
  ASSERT_TRUE(p.ok()) << p.error.message;
}

TEST(ParseTokenizeRequest, BadBodiesAre400sNamingTheField) {
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {"not json", ""},
      {"[1,2]", ""},
      {R"({"prompt":"x"})", "model"},
      {R"({"model":"m"})", "prompt"},
      {R"({"model":"m","prompt":[1,2]})", "prompt"},
      {R"({"model":"m","prompt":"x","add_special_tokens":"yes"})", "add_special_tokens"},
      {R"({"model":"m","prompt":"x","return_token_strs":1})", "return_token_strs"},
      {R"({"model":"m","messages":"hi"})", "messages"},
      {R"({"model":"m","messages":null})", "messages"},
      {R"({"model":"m","messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"model":"m","messages":[],"tools":{}})", "tools"},
      {R"({"model":"m","messages":[{"role":"u","content":"x"}],"chat_template":3})",
       "chat_template"},
      {R"({"model":"m","messages":[{"role":"u","content":"x"}],"chat_template_kwargs":[]})",
       "chat_template_kwargs"},
      {R"({"model":"m","messages":[{"role":"u","content":"x"}],"add_generation_prompt":0})",
       "add_generation_prompt"},
  };
  for (const Case& c : cases) {
    TokenizeParse p = ParseTokenizeRequest(c.body);
    ASSERT_FALSE(p.ok()) << c.body;
    EXPECT_EQ(p.error.status, 400) << c.body;
    EXPECT_EQ(p.error.type, "BadRequestError") << c.body;
    EXPECT_EQ(p.error.param, c.param) << c.body;
    EXPECT_FALSE(p.error.message.empty());
  }
}

TEST(ParseDetokenizeRequest, ReadsIdsAndRejectsWhatIsNotAnId) {
  DetokenizeParse p = ParseDetokenizeRequest(R"({"model":"m","tokens":[0,7,4294967295]})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request->model, "m");
  EXPECT_EQ(p.request->tokens, (std::vector<uint32_t>{0, 7, 4294967295u}));
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {"{", ""},
      {R"({"tokens":[1]})", "model"},
      {R"({"model":"m"})", "tokens"},
      {R"({"model":"m","tokens":"1 2"})", "tokens"},
      {R"({"model":"m","tokens":[1,-1]})", "tokens[1]"},
      {R"({"model":"m","tokens":[4294967296]})", "tokens[0]"},
      {R"({"model":"m","tokens":[1.5]})", "tokens[0]"},
      {R"({"model":"m","tokens":[18446744073709551615]})", "tokens[0]"},
  };
  for (const Case& c : cases) {
    DetokenizeParse e = ParseDetokenizeRequest(c.body);
    ASSERT_FALSE(e.ok()) << c.body;
    EXPECT_EQ(e.error.status, 400) << c.body;
    EXPECT_EQ(e.error.param, c.param) << c.body;
  }
}

TEST(TokenizeAnswerBody, HasVllmsShape) {
  const std::vector<uint32_t> ids = {5, 31999, 0};
  EXPECT_EQ(TokenizeAnswerBody(ids, 4096, nullptr),
            R"({"count":3,"max_model_len":4096,"tokens":[5,31999,0],"token_strs":null})");
  const std::vector<std::string> strs = {"Hell", "o \"x", "\xE2\x82"};
  EXPECT_EQ(TokenizeAnswerBody(ids, 8, &strs),
            "{\"count\":3,\"max_model_len\":8,\"tokens\":[5,31999,0],"
            "\"token_strs\":[\"Hell\",\"o \\\"x\",\"\xEF\xBF\xBD\"]}");
  EXPECT_EQ(TokenizeAnswerBody({}, 8, nullptr),
            R"({"count":0,"max_model_len":8,"tokens":[],"token_strs":null})");
  EXPECT_EQ(DetokenizeAnswerBody("a\nb"), R"({"prompt":"a\nb"})");
}

std::string Valid(std::string_view bytes) {
  std::string out;
  AppendValidUtf8(out, bytes);
  return out;
}

TEST(AppendValidUtf8, ReplacesMaximalIllFormedSubpartsAsPythonDoes) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(Valid("plain ascii"), "plain ascii");
  EXPECT_EQ(Valid("\xC3\xA9t\xC3\xA9"), "\xC3\xA9t\xC3\xA9");          // été
  EXPECT_EQ(Valid("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");            // U+1F600
  EXPECT_EQ(Valid("a\xE2\x82"), "a" + r);                               // cut 3-byte: one
  EXPECT_EQ(Valid("\x82\xACx"), r + r + "x");                           // lone continuations
  EXPECT_EQ(Valid("\xC0\xAF"), r + r);                                  // overlong lead
  EXPECT_EQ(Valid("\xED\xA0\x80"), r + r + r);                          // surrogate
  EXPECT_EQ(Valid("\xF0\x9F\x98"), r);                                  // cut 4-byte
  EXPECT_EQ(Valid("\xF0\x9F\x41"), r + "A");
  EXPECT_EQ(Valid("\xFF"), r);
  // "\xE2\x82\xAC" is the euro sign: split across two 4-byte runs and joined again.
  EXPECT_EQ(Valid("ab \xE2") + Valid("\x82\xAC!"), "ab " + r + r + r + "!");
}

TEST(BuildTokenizeBody, CompletionFormAddsSpecialTokensUnlessTheClientSaidOtherwise) {
  TokenizeSource s;
  s.endpoint = Endpoint::kCompletions;
  s.model = "m";
  s.prompt = "say \"hi\"";
  Result<std::string> b = BuildTokenizeBody(s);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, R"({"model":"m","prompt":"say \"hi\"","add_special_tokens":true})");
  s.add_special_tokens = false;
  EXPECT_EQ(*BuildTokenizeBody(s), R"({"model":"m","prompt":"say \"hi\"","add_special_tokens":false})");
}

TEST(BuildTokenizeBody, ChatFormForwardsMessagesAndTemplateFieldsVerbatim) {
  TokenizeSource s;
  s.endpoint = Endpoint::kChatCompletions;
  s.model = "m";
  // Spacing and escapes as the client wrote them; unrelated fields are left out.
  s.body = R"({ "model" : "m", "stream": true, "messages" : [ {"role": "user", "content": "caf\u00e9"} ] ,)"
           R"( "tools": [{"type":"function"}], "chat_template_kwargs": {"enable_thinking": false},)"
           R"( "add_generation_prompt" : true , "max_tokens": 5, "continue_final_message": false,)"
           R"( "chat_template": "{{ m }}" })";
  Result<std::string> b = BuildTokenizeBody(s);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(*b,
            R"({"model":"m","messages":[ {"role": "user", "content": "caf\u00e9"} ],)"
            R"("add_generation_prompt":true,"continue_final_message":false,)"
            R"("chat_template":"{{ m }}","chat_template_kwargs":{"enable_thinking": false},)"
            R"("tools":[{"type":"function"}],"add_special_tokens":false})");
  // What the server reads back is what the chat completion renders.
  TokenizeParse server = ParseTokenizeRequest(*b);
  ASSERT_TRUE(server.ok()) << server.error.message;
  ParseResult chat = ParseRequest(Endpoint::kChatCompletions, s.body);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(server.request->text, chat.request->prompt_text);

  s.body = R"({"model":"m","messages":[{"role":"user","content":"x"}]})";
  s.add_special_tokens = true;
  EXPECT_EQ(*BuildTokenizeBody(s),
            R"({"model":"m","messages":[{"role":"user","content":"x"}],"add_special_tokens":true})");
}

TEST(BuildTokenizeBody, ChatWithoutMessagesIsInvalid) {
  TokenizeSource s;
  s.endpoint = Endpoint::kChatCompletions;
  s.model = "m";
  for (std::string_view body : {std::string_view(""), std::string_view("[]"),
                                std::string_view(R"({"model":"m"})"),
                                std::string_view(R"({"messages":"x"})"),
                                std::string_view(R"({"messages":[1,)")}) {
    s.body = body;
    Result<std::string> b = BuildTokenizeBody(s);
    ASSERT_FALSE(b.ok()) << body;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << body;
  }
}

TEST(ParseTokenizeAnswer, ReadsIdsAndChecksTheShape) {
  Result<TokenizeAnswer> a = ParseTokenizeAnswer(
      R"({"count":3,"max_model_len":131072,"tokens":[128000,9906,0],"token_strs":null})");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->tokens, (std::vector<uint32_t>{128000, 9906, 0}));
  EXPECT_EQ(a->max_model_len, 131072);
  a = ParseTokenizeAnswer(R"({"tokens":[]})");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->tokens.empty());
  EXPECT_EQ(a->max_model_len, 0);

  struct Case {
    const char* body;
    const char* message;
  } cases[] = {
      {"<html>502</html>", "tokenize answer is not JSON: "},
      {"", "tokenize answer is not JSON: "},
      {"[1,2,3]", "tokenize answer is not a JSON object"},
      {R"({"count":1})", "tokenize answer has no 'tokens' array"},
      {R"({"tokens":"1,2"})", "tokenize answer has no 'tokens' array"},
      {R"({"tokens":[1,"2"]})", "tokenize answer: tokens[1] is not a token id"},
      {R"({"tokens":[-3]})", "tokenize answer: tokens[0] is not a token id"},
      {R"({"tokens":[1e3]})", "tokenize answer: tokens[0] is not a token id"},
      {R"({"count":2,"tokens":[1]})", "tokenize answer: count 2 but 1 tokens"},
      {R"({"count":"1","tokens":[1]})", "tokenize answer: count \"1\" but 1 tokens"},
  };
  for (const Case& c : cases) {
    Result<TokenizeAnswer> e = ParseTokenizeAnswer(c.body);
    ASSERT_FALSE(e.ok()) << c.body;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(e.status().message().substr(0, std::string_view(c.message).size()), c.message)
        << e.status().message();
  }
}

}  // namespace
}  // namespace kvroute::api
