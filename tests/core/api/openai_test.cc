#include "core/api/openai.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvroute::api {
namespace {

ParsedRequest ParseOk(Endpoint ep, std::string_view body) {
  ParseResult r = ParseRequest(ep, body);
  EXPECT_TRUE(r.ok()) << "body: " << body << "\nerror: " << r.error.message;
  return r.ok() ? *r.request : ParsedRequest{};
}

ApiError ParseErr(Endpoint ep, std::string_view body) {
  ParseResult r = ParseRequest(ep, body);
  EXPECT_FALSE(r.ok()) << "body: " << body;
  return r.error;
}

constexpr Endpoint kCmpl = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChatCompletions;

TEST(ParseRequest, CompletionsAllFields) {
  ParsedRequest r = ParseOk(kCmpl, R"({"model":"llama","prompt":"Hello\nworld \u00e9",
      "stream":true,"stream_options":{"include_usage":true},"max_tokens":128,
      "cache_salt":"s1","priority":-3,"ignore_eos":true,"temperature":0.7,"n":1})");
  EXPECT_EQ(r.endpoint, kCmpl);
  EXPECT_EQ(r.model, "llama");
  EXPECT_EQ(r.prompt_text, "Hello\nworld \xc3\xa9");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_TRUE(r.max_tokens.has_value());
  EXPECT_EQ(*r.max_tokens, 128);
  EXPECT_EQ(r.cache_salt, "s1");
  EXPECT_EQ(r.priority, -3);
  EXPECT_TRUE(r.ignore_eos);
}

TEST(ParseRequest, CompletionsDefaults) {
  ParsedRequest r = ParseOk(kCmpl, R"({"model":"m","prompt":"p"})");
  EXPECT_EQ(r.prompt_text, "p");
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.cache_salt, "");
  EXPECT_EQ(r.priority, 0);
  EXPECT_FALSE(r.ignore_eos);
}

TEST(ParseRequest, NullOptionalFieldsAreAbsent) {
  ParsedRequest r = ParseOk(kCmpl, R"({"model":"m","prompt":"p","max_tokens":null,
      "stream":null,"stream_options":null,"cache_salt":null,"priority":null})");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.priority, 0);
}

TEST(ParseRequest, PromptArrayOfOneString) {
  EXPECT_EQ(ParseOk(kCmpl, R"({"model":"m","prompt":["only one"]})").prompt_text, "only one");
}

TEST(ParseRequest, PromptTokenIdsRejected) {
  ApiError e = ParseErr(kCmpl, R"({"model":"m","prompt":[1,2,3]})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "BadRequestError");
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.message, "token-id prompts are not supported; send 'prompt' as text");
  EXPECT_EQ(ParseErr(kCmpl, R"({"model":"m","prompt":[[1,2]]})").param, "prompt");
}

TEST(ParseRequest, PromptBatchAndEmptyRejected) {
  EXPECT_EQ(ParseErr(kCmpl, R"({"model":"m","prompt":["a","b"]})").message,
            "batched prompts are not supported; send one prompt per request");
  EXPECT_EQ(ParseErr(kCmpl, R"({"model":"m","prompt":[]})").message,
            "'prompt' must not be an empty array");
  EXPECT_EQ(ParseErr(kCmpl, R"({"model":"m","prompt":5})").message,
            "'prompt' must be a string or an array of one string");
}

TEST(ParseRequest, MissingFields) {
  ApiError e = ParseErr(kCmpl, R"({"prompt":"p"})");
  EXPECT_EQ(e.param, "model");
  EXPECT_EQ(e.message, "Missing required field 'model'");
  e = ParseErr(kCmpl, R"({"model":"m"})");
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.message, "Missing required field 'prompt'");
  e = ParseErr(kChat, R"({"model":"m","prompt":"p"})");
  EXPECT_EQ(e.param, "messages");
  EXPECT_EQ(e.message, "Missing required field 'messages'");
}

TEST(ParseRequest, WrongTypesNameTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* message;
  } cases[] = {
      {R"({"model":1,"prompt":"p"})", "model", "'model' must be a string"},
      {R"({"model":null,"prompt":"p"})", "model", "'model' must be a string"},
      {R"({"model":"m","prompt":"p","stream":"yes"})", "stream", "'stream' must be a boolean"},
      {R"({"model":"m","prompt":"p","stream_options":true})", "stream_options",
       "'stream_options' must be an object"},
      {R"({"model":"m","prompt":"p","stream_options":{"include_usage":1}})",
       "stream_options.include_usage", "'stream_options.include_usage' must be a boolean"},
      {R"({"model":"m","prompt":"p","max_tokens":"10"})", "max_tokens",
       "'max_tokens' must be an integer"},
      {R"({"model":"m","prompt":"p","max_tokens":1.5})", "max_tokens",
       "'max_tokens' must be an integer"},
      {R"({"model":"m","prompt":"p","max_tokens":-1})", "max_tokens",
       "'max_tokens' must be a non-negative integer (got -1)"},
      {R"({"model":"m","prompt":"p","cache_salt":7})", "cache_salt",
       "'cache_salt' must be a string"},
      {R"({"model":"m","prompt":"p","priority":"high"})", "priority",
       "'priority' must be an integer"},
      {R"({"model":"m","prompt":"p","ignore_eos":0})", "ignore_eos",
       "'ignore_eos' must be a boolean"},
  };
  for (const Case& c : cases) {
    ApiError e = ParseErr(kCmpl, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.message, c.message) << c.body;
  }
}

TEST(ParseRequest, MalformedJson) {
  for (const char* body : {"", "{", R"({"model":"m",})", R"({"model":"m" "prompt":"p"})",
                           "nul", R"({"model":"m","prompt":"\x"})"}) {
    ApiError e = ParseErr(kCmpl, body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.type, "BadRequestError");
    EXPECT_EQ(e.param, "") << body;
    EXPECT_EQ(e.message.rfind("Invalid JSON body: ", 0), 0u) << e.message;
  }
  ApiError e = ParseErr(kCmpl, "[1,2]");
  EXPECT_EQ(e.message, "Request body must be a JSON object");
  EXPECT_EQ(e.param, "");
}

TEST(ParseRequest, ChatRendersTemplate) {
  ParsedRequest r = ParseOk(kChat, R"({"model":"m","messages":[
      {"role":"system","content":"You are terse."},
      {"role":"user","content":[{"type":"text","text":"part one"},{"type":"text","text":"part two"}]},
      {"role":"assistant","content":null},
      {"role":"user","content":"Q?"}]})");
  EXPECT_EQ(r.endpoint, kChat);
  EXPECT_EQ(r.prompt_text,
            "<|system|>\nYou are terse.\n"
            "<|user|>\npart one\npart two\n"
            "<|assistant|>\n\n"
            "<|user|>\nQ?\n"
            "<|assistant|>\n");
}

TEST(ParseRequest, ChatMatchesRenderChat) {
  ParsedRequest r = ParseOk(
      kChat, R"({"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi \"there\""}]})");
  const std::vector<ChatMessage> msgs = {{"system", "sys"}, {"user", "hi \"there\""}};
  EXPECT_EQ(r.prompt_text, RenderChat(msgs));
  EXPECT_EQ(RenderChat(msgs), "<|system|>\nsys\n<|user|>\nhi \"there\"\n<|assistant|>\n");
}

TEST(ParseRequest, ChatMaxCompletionTokensWins) {
  EXPECT_EQ(*ParseOk(kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "max_tokens":10,"max_completion_tokens":20})").max_tokens, 20);
  EXPECT_EQ(*ParseOk(kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "max_tokens":10})").max_tokens, 10);
  // Completions ignore the chat-only field.
  EXPECT_FALSE(ParseOk(kCmpl, R"({"model":"m","prompt":"x","max_completion_tokens":20})")
                   .max_tokens.has_value());
  EXPECT_EQ(ParseErr(kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "max_completion_tokens":-5})").message,
            "'max_completion_tokens' must be a non-negative integer (got -5)");
}

TEST(ParseRequest, ChatErrorsNameTheField) {
  struct Case {
    const char* messages;
    const char* param;
    const char* message;
  } cases[] = {
      {R"("hi")", "messages", "'messages' must be an array"},
      {R"([])", "messages", "'messages' must not be empty"},
      {R"([{"role":"user","content":"a"},"b"])", "messages[1]", "'messages[1]' must be an object"},
      {R"([{"content":"a"}])", "messages[0].role", "Missing required field 'messages[0].role'"},
      {R"([{"role":3,"content":"a"}])", "messages[0].role", "'messages[0].role' must be a string"},
      {R"([{"role":"user","content":5}])", "messages[0].content",
       "'messages[0].content' must be a string or an array of content parts"},
      {R"([{"role":"user","content":["x"]}])", "messages[0].content[0]",
       "'messages[0].content[0]' must be an object"},
      {R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}}]}])",
       "messages[0].content[1].type",
       "unsupported content part type 'image_url'; only 'text' parts are supported"},
      {R"([{"role":"user","content":[{"type":"text"}]}])", "messages[0].content[0].text",
       "'messages[0].content[0].text' must be a string"},
  };
  for (const Case& c : cases) {
    const std::string body = std::string(R"({"model":"m","messages":)") + c.messages + "}";
    ApiError e = ParseErr(kChat, body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, c.param) << body;
    EXPECT_EQ(e.message, c.message) << body;
  }
}

TEST(ParseRequest, PaddedVariantAgrees) {
  std::string body = R"({"model":"m","prompt":"abc","max_tokens":3})";
  const size_t n = body.size();
  body.append(kJsonPadding, ' ');
  ParseResult r = ParseRequestPadded(kCmpl, std::string_view(body.data(), n));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.request->prompt_text, "abc");
  EXPECT_EQ(*r.request->max_tokens, 3);
}

TEST(ParseRequest, LargePromptIsCopiedIntact) {
  std::string prompt(220 * 1024, 'a');
  for (size_t i = 0; i < prompt.size(); i += 97) prompt[i] = ' ';
  std::string body = R"({"model":"m","prompt":)";
  AppendJsonString(body, prompt);
  body += "}";
  EXPECT_EQ(ParseOk(kCmpl, body).prompt_text, prompt);
}

TEST(ParseRequest, KvTransferParamsOfAPrefillLeg) {
  // As a P/D proxy sends the prefill leg (REFERENCE.md section 20).
  ParsedRequest r = ParseOk(kCmpl, R"({"model":"m","prompt":"p","max_tokens":1,
      "kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,
      "remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}})");
  ASSERT_TRUE(r.kv_transfer_params.has_value());
  const KvTransferParams& p = *r.kv_transfer_params;
  EXPECT_TRUE(p.do_remote_decode);
  EXPECT_FALSE(p.do_remote_prefill);
  EXPECT_FALSE(p.remote_engine_id.has_value());
  EXPECT_FALSE(p.remote_block_ids.has_value());
  EXPECT_FALSE(p.remote_port.has_value());
  EXPECT_EQ(p.raw,
            R"({"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,)"
            R"("remote_block_ids":null,"remote_host":null,"remote_port":null})");
}

TEST(ParseRequest, KvTransferParamsOfADecodeLegKeepUnknownFieldsInRaw) {
  ParsedRequest r = ParseOk(kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,
      "remote_block_ids":[3,1,2],"remote_engine_id":"e1","remote_request_id":"cmpl-1",
      "remote_host":"10.0.0.5","remote_port":5600,"tp_size":1,
      "remote_prefill_cached_tokens":32,"future_field":{"a":[1.5,"b"]}}})");
  ASSERT_TRUE(r.kv_transfer_params.has_value());
  const KvTransferParams& p = *r.kv_transfer_params;
  EXPECT_TRUE(p.do_remote_prefill);
  EXPECT_FALSE(p.do_remote_decode);
  EXPECT_EQ(p.remote_block_ids, (std::vector<int64_t>{3, 1, 2}));
  EXPECT_EQ(p.remote_engine_id, "e1");
  EXPECT_EQ(p.remote_request_id, "cmpl-1");
  EXPECT_EQ(p.remote_host, "10.0.0.5");
  EXPECT_EQ(p.remote_port, 5600);
  EXPECT_EQ(p.tp_size, 1);
  EXPECT_EQ(p.remote_prefill_cached_tokens, 32);
  EXPECT_NE(p.raw.find(R"("future_field":{"a":[1.5,"b"]})"), std::string::npos) << p.raw;
  // Absent or null: no params.
  EXPECT_FALSE(ParseOk(kCmpl, R"({"model":"m","prompt":"p"})").kv_transfer_params.has_value());
  EXPECT_FALSE(ParseOk(kCmpl, R"({"model":"m","prompt":"p","kv_transfer_params":null})")
                   .kv_transfer_params.has_value());
}

TEST(ParseRequest, KvTransferParamsWrongTypesNameTheField) {
  struct Case {
    const char* params;
    const char* param;
  } cases[] = {
      {R"("yes")", "kv_transfer_params"},
      {R"({"do_remote_decode":1})", "kv_transfer_params.do_remote_decode"},
      {R"({"do_remote_prefill":"true"})", "kv_transfer_params.do_remote_prefill"},
      {R"({"remote_engine_id":7})", "kv_transfer_params.remote_engine_id"},
      {R"({"remote_request_id":[]})", "kv_transfer_params.remote_request_id"},
      {R"({"remote_host":1})", "kv_transfer_params.remote_host"},
      {R"({"remote_port":-1})", "kv_transfer_params.remote_port"},
      {R"({"remote_port":"5600"})", "kv_transfer_params.remote_port"},
      {R"({"tp_size":1.5})", "kv_transfer_params.tp_size"},
      {R"({"remote_prefill_cached_tokens":-2})", "kv_transfer_params.remote_prefill_cached_tokens"},
      {R"({"remote_block_ids":{}})", "kv_transfer_params.remote_block_ids"},
      {R"({"remote_block_ids":[1,2,"3"]})", "kv_transfer_params.remote_block_ids[2]"},
      {R"({"remote_block_ids":[-1]})", "kv_transfer_params.remote_block_ids[0]"},
  };
  for (const Case& c : cases) {
    ApiError e = ParseErr(kCmpl, std::string(R"({"model":"m","prompt":"p","kv_transfer_params":)") +
                                     c.params + "}");
    EXPECT_EQ(e.status, 400) << c.params;
    EXPECT_EQ(e.type, "BadRequestError") << c.params;
    EXPECT_EQ(e.param, c.param) << c.params;
  }
}

TEST(ErrorBody, Shape) {
  EXPECT_EQ(ErrorBody(MakeError(400, "bad \"x\"", "max_tokens")),
            R"({"error":{"message":"bad \"x\"","type":"BadRequestError","param":"max_tokens","code":400}})");
  EXPECT_EQ(ErrorBody(MakeError(404, "The model `x` does not exist.")),
            R"({"error":{"message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}})");
}

// What serve, epp and sim answer their HTTP servers' own errors with (moved here from the
// http server's tests when the shape became the front end's).
TEST(ErrorBody, ForAServersOwnErrors) {
  EXPECT_EQ(ErrorBodyFor(413, "too \"big\""),
            "{\"error\":{\"message\":\"too \\\"big\\\"\",\"type\":\"RequestEntityTooLarge\","
            "\"param\":null,\"code\":413}}");
}

TEST(ErrorBody, TypeForStatus) {
  EXPECT_EQ(ErrorTypeForStatus(400), "BadRequestError");
  EXPECT_EQ(ErrorTypeForStatus(404), "NotFoundError");
  EXPECT_EQ(ErrorTypeForStatus(413), "RequestEntityTooLarge");
  EXPECT_EQ(ErrorTypeForStatus(429), "RateLimitError");
  EXPECT_EQ(ErrorTypeForStatus(500), "InternalServerError");
  EXPECT_EQ(ErrorTypeForStatus(502), "InternalServerError");
  EXPECT_EQ(ErrorTypeForStatus(503), "ServiceUnavailableError");
  EXPECT_EQ(ErrorTypeForStatus(418), "BadRequestError");
}

TEST(AppendJsonString, Escapes) {
  std::string out;
  AppendJsonString(out, std::string_view("a\"b\\c\nd\te\x01\x1f\xc3\xa9", 13));
  EXPECT_EQ(out, "\"a\\\"b\\\\c\\nd\\te\\u0001\\u001f\xc3\xa9\"");
}

TEST(AppendJsonString, RoundTripsThroughParser) {
  std::string s;
  for (int c = 1; c < 128; ++c) s.push_back(static_cast<char>(c));
  std::string body = R"({"model":"m","prompt":)";
  AppendJsonString(body, s);
  body += "}";
  EXPECT_EQ(ParseOk(kCmpl, body).prompt_text, s);
}

}  // namespace
}  // namespace kvroute::api

namespace kvroute::api {
namespace {

// Every truncation of a valid body is a clean 400, never a crash or a partial request.
TEST(ParseRequest, EveryTruncationIsACleanError) {
  const std::string body =
      R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\"b"}]}],)"
      R"("stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"priority":1})";
  ASSERT_TRUE(ParseRequest(Endpoint::kChatCompletions, body).ok());
  for (size_t n = 0; n < body.size(); ++n) {
    ParseResult r = ParseRequest(Endpoint::kChatCompletions, std::string_view(body.data(), n));
    EXPECT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.error.status, 400) << n;
    EXPECT_FALSE(r.error.message.empty()) << n;
  }
}

TEST(SloHeaders, MillisecondsToSecondsCurrentNameFirst) {
  ParsedRequest r;
  EXPECT_FALSE(ParseSloHeaders("250", "900", "", "40.5", &r).has_value());
  EXPECT_DOUBLE_EQ(r.slo_ttft_s, 0.25);
  EXPECT_DOUBLE_EQ(r.slo_tpot_s, 0.0405);
  ParsedRequest none;
  EXPECT_FALSE(ParseSloHeaders("", "", "", "", &none).has_value());
  EXPECT_EQ(none.slo_ttft_s, 0.0);
  EXPECT_EQ(none.slo_tpot_s, 0.0);
}

TEST(SloHeaders, BadValuesAre400NamingTheHeader) {
  for (std::string_view v : {"fast", "-5", "0", "12ms", "nan", "inf", "1e999"}) {
    ParsedRequest r;
    auto e = ParseSloHeaders("", "", "", v, &r);
    ASSERT_TRUE(e.has_value()) << v;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->param, "x-slo-tpot-ms");
    EXPECT_NE(e->message.find("x-slo-tpot-ms"), std::string::npos);
  }
  // Bytes that are not printable ASCII are not echoed (the body must stay valid UTF-8 JSON:
  // a fuzz finding, the header value "\xff\"\n" in the OpenAI request target).
  {
    ParsedRequest r;
    auto e = ParseSloHeaders(std::string_view("\xff\"\x01", 3), "", "", "", &r);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->message, "Header x-llm-d-slo-ttft-ms must be a positive number of milliseconds, got '?\"?'.");
  }
  ParsedRequest r;
  auto e = ParseSloHeaders("x", "", "", "", &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "x-llm-d-slo-ttft-ms");
  EXPECT_EQ(ErrorBody(*e),
            "{\"error\":{\"message\":\"Header x-llm-d-slo-ttft-ms must be a positive number of "
            "milliseconds, got 'x'.\",\"type\":\"BadRequestError\",\"param\":\"x-llm-d-slo-ttft-ms\","
            "\"code\":400}}");
}

constexpr Endpoint kEmbed = Endpoint::kEmbeddings;
constexpr Endpoint kResp = Endpoint::kResponses;

TEST(ParseEmbeddings, EveryInputForm) {
  ParsedRequest one = ParseOk(kEmbed, R"({"model":"e5","input":"hello world"})");
  EXPECT_EQ(one.model, "e5");
  EXPECT_EQ(one.inputs, (std::vector<std::string>{"hello world"}));
  EXPECT_TRUE(one.input_token_ids.empty());
  EXPECT_EQ(one.prompt_text, "hello world");
  EXPECT_FALSE(one.base64);
  EXPECT_FALSE(one.dimensions.has_value());

  ParsedRequest many = ParseOk(kEmbed, R"({"model":"e5","input":["a","bc"],
      "encoding_format":"base64","dimensions":64,"priority":-1,"cache_salt":"s","user":"u"})");
  EXPECT_EQ(many.inputs, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(many.prompt_text, "a\nbc");
  EXPECT_TRUE(many.base64);
  EXPECT_EQ(many.dimensions, 64);
  EXPECT_EQ(many.priority, -1);
  EXPECT_EQ(many.cache_salt, "s");

  ParsedRequest ids = ParseOk(kEmbed, R"({"model":"e5","input":[1,2,4294967295]})");
  EXPECT_TRUE(ids.inputs.empty());
  EXPECT_EQ(ids.input_token_ids, (std::vector<std::vector<uint32_t>>{{1, 2, 4294967295u}}));
  EXPECT_EQ(ids.prompt_text, "");

  ParsedRequest batch = ParseOk(kEmbed, R"({"model":"e5","input":[[7],[8,9]]})");
  EXPECT_EQ(batch.input_token_ids, (std::vector<std::vector<uint32_t>>{{7}, {8, 9}}));
  EXPECT_FALSE(ParseOk(kEmbed, R"({"model":"e5","input":"x","stream":true})").stream);
}

TEST(ParseEmbeddings, BadInputsNameTheField) {
  EXPECT_EQ(ParseErr(kEmbed, R"({"model":"e5"})").param, "input");
  EXPECT_EQ(ParseErr(kEmbed, R"({"model":"e5","input":[]})").message, "'input' must not be empty");
  EXPECT_EQ(ParseErr(kEmbed, R"({"model":"e5","input":["a",3]})").param, "input[1]");
  EXPECT_EQ(ParseErr(kEmbed, R"({"model":"e5","input":[1,-2]})").param, "input");
  EXPECT_EQ(ParseErr(kEmbed, R"({"model":"e5","input":[[1],[]]})").param, "input[1]");
  EXPECT_EQ(ParseErr(kEmbed, R"({"model":"e5","input":{"a":1}})").param, "input");
  EXPECT_EQ(ParseErr(kEmbed, R"({"model":"e5","input":"x","encoding_format":"hex"})").param,
            "encoding_format");
  EXPECT_EQ(ParseErr(kEmbed, R"({"model":"e5","input":"x","dimensions":0})").param, "dimensions");
  EXPECT_EQ(ParseErr(kEmbed, R"({"input":"x"})").param, "model");
}

TEST(ParseResponses, InputRendersAsChatWithInstructionsFirst) {
  ParsedRequest s = ParseOk(kResp, R"({"model":"m","input":"Say hi","max_output_tokens":7,
      "stream":true,"instructions":"Be brief."})");
  EXPECT_EQ(s.prompt_text, "<|system|>\nBe brief.\n<|user|>\nSay hi\n<|assistant|>\n");
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_TRUE(s.stream);

  ParsedRequest items = ParseOk(kResp, R"({"model":"m","input":[
      {"type":"message","role":"user","content":[{"type":"input_text","text":"a"},
                                                 {"type":"input_text","text":"b"}]},
      {"type":"function_call_output","call_id":"c1","output":"42"},
      {"role":"assistant","content":[{"type":"output_text","text":"c"}]},
      {"role":"user","content":"d"}]})");
  EXPECT_EQ(items.prompt_text, "<|user|>\na\nb\n<|assistant|>\nc\n<|user|>\nd\n<|assistant|>\n");
  // The chat rendering of the same conversation: one prefix model for both APIs.
  EXPECT_EQ(ParseOk(kResp, R"({"model":"m","input":"q"})").prompt_text,
            ParseOk(kChat, R"({"model":"m","messages":[{"role":"user","content":"q"}]})").prompt_text);
}

TEST(ParseResponses, BadInputsNameTheField) {
  EXPECT_EQ(ParseErr(kResp, R"({"model":"m"})").param, "input");
  EXPECT_EQ(ParseErr(kResp, R"({"model":"m","input":5})").param, "input");
  EXPECT_EQ(ParseErr(kResp, R"({"model":"m","input":[{"content":"x"}]})").param, "input[0].role");
  EXPECT_EQ(ParseErr(kResp, R"({"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]})")
                .param,
            "input[0].content[0].type");
  EXPECT_EQ(ParseErr(kResp, R"({"model":"m","input":[{"type":"reasoning"}]})").message,
            "'input' holds no message");
  EXPECT_EQ(ParseErr(kResp, R"({"model":"m","input":"x","max_output_tokens":-1})").param,
            "max_output_tokens");
}

TEST(ScanRoutingFields, ModelAndTheFirstTextFieldOrNothing) {
  RoutingFields score = ScanRoutingFields(R"({"model":"r","text_1":"query","text_2":["a","b"]})");
  EXPECT_TRUE(score.json);
  EXPECT_EQ(score.model, "r");
  EXPECT_EQ(score.prompt_text, "query");
  EXPECT_EQ(ScanRoutingFields(R"({"model":"r","query":"q","documents":["x"]})").prompt_text, "q");
  EXPECT_EQ(ScanRoutingFields(R"({"input":["a","b",3,"c"]})").prompt_text, "a\nb");
  EXPECT_EQ(ScanRoutingFields(R"({"prompt":7,"input":"i"})").prompt_text, "i");
  EXPECT_EQ(ScanRoutingFields(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})").prompt_text,
            "<|user|>\nhi\n<|assistant|>\n");
  RoutingFields none = ScanRoutingFields(R"({"model":5})");
  EXPECT_TRUE(none.json);
  EXPECT_EQ(none.model, "");
  EXPECT_EQ(none.prompt_text, "");
  RoutingFields multipart = ScanRoutingFields("--boundary\r\nContent-Disposition: form-data\r\n");
  EXPECT_FALSE(multipart.json);
  EXPECT_FALSE(ScanRoutingFields("").json);
  EXPECT_FALSE(ScanRoutingFields("[1,2]").json);
}

TEST(EndpointKinds, PathsAndWhichMayBeSplit) {
  EXPECT_EQ(EndpointPath(Endpoint::kEmbeddings), "/v1/embeddings");
  EXPECT_EQ(EndpointPath(Endpoint::kResponses), "/v1/responses");
  EXPECT_EQ(EndpointPath(Endpoint::kOther), "");
  EXPECT_TRUE(Disaggregable(kCmpl));
  EXPECT_TRUE(Disaggregable(kChat));
  EXPECT_FALSE(Disaggregable(kEmbed));
  EXPECT_FALSE(Disaggregable(kResp));
  EXPECT_FALSE(Disaggregable(Endpoint::kOther));
}

}  // namespace
}  // namespace kvroute::api
