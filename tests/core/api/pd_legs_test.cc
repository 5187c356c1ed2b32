// serve's and the sidecar's prefill/decode leg bodies (issue 25; REFERENCE.md section 20):
// what each leg sends and what is read back from prefill's answer.
#include "core/api/pd_legs.h"

#include <gtest/gtest.h>

#include <string>

namespace kvroute::api {
namespace {

TEST(PdLegs, PrefillBodyForcesOneTokenNoStreamAndAsksForARemoteDecode) {
  std::string body =
      R"({"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true},)"
      R"("max_tokens":50,"min_tokens":3,"temperature":0.5,"kv_transfer_params":{"x":1}})";
  EXPECT_EQ(BuildPrefillBody(body).value(),
            R"({"model":"m","prompt":"hi","temperature":0.5,"stream":false,"max_tokens":1,)"
            R"("kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,)"
            R"("remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}})");
  // Chat with max_completion_tokens: both limits become 1.
  std::string chat = R"({"model":"m","messages":[{"role":"user","content":"a"}],"max_completion_tokens":9})";
  std::string p = BuildPrefillBody(chat).value();
  EXPECT_NE(p.find(R"("max_tokens":1,"max_completion_tokens":1,)"), std::string::npos) << p;
  EXPECT_NE(p.find(R"("messages":[{"role":"user","content":"a"}])"), std::string::npos) << p;
  EXPECT_FALSE(BuildPrefillBody("[1,2]").has_value());
  EXPECT_FALSE(BuildPrefillBody("{\"a\":").has_value());
  // Bytes after the object make it no JSON object (a fuzz finding: they were dropped).
  EXPECT_FALSE(BuildPrefillBody(R"({"a":{"b":true}},"max_tokens":5})").has_value());
  EXPECT_FALSE(BuildPrefillBody(R"({"a":1} x)").has_value());
  EXPECT_FALSE(BuildDecodeBody(R"({"a":1}})", "{}").has_value());
  EXPECT_TRUE(BuildPrefillBody("{\"a\":1} \n").has_value());
}

TEST(PdLegs, DecodeBodyIsTheClientsPlusPrefillsParametersVerbatim) {
  std::string body = R"({"model":"m", "prompt":"hi","stream":true,"max_tokens":50})";
  std::string kv = R"({"do_remote_prefill":true,"remote_block_ids":[1,2],"future":{"a":null}})";
  EXPECT_EQ(BuildDecodeBody(body, kv).value(),
            R"({"model":"m","prompt":"hi","stream":true,"max_tokens":50,"kv_transfer_params":)" + kv + "}");
  // A client's own kv_transfer_params gives way to prefill's.
  EXPECT_EQ(BuildDecodeBody(R"({"model":"m","kv_transfer_params":{"do_remote_decode":true}})", kv).value(),
            R"({"model":"m","kv_transfer_params":)" + kv + "}");
}

TEST(PdLegs, PrefillAnswerAndCachedTokensRewrite) {
  PrefillAnswer a = ReadPrefillAnswer(
      R"({"id":"c","choices":[{"text":"x"}],"usage":{"prompt_tokens":40,"prompt_tokens_details":)"
      R"({"cached_tokens":16}},"kv_transfer_params":{"do_remote_prefill":true, "remote_port":1}})");
  EXPECT_EQ(a.kv_raw, R"({"do_remote_prefill":true, "remote_port":1})");
  EXPECT_EQ(a.cached_tokens, 16);
  a = ReadPrefillAnswer(R"({"id":"c","usage":{"prompt_tokens":4},"kv_transfer_params":null})");
  EXPECT_EQ(a.kv_raw, "");
  EXPECT_EQ(a.cached_tokens, -1);
  // A broken answer gives nothing to pass on (a fuzz finding: its parameters went verbatim).
  a = ReadPrefillAnswer(R"({"usage":{"prompt_tokens_details":{"cached_tokens":3}},"kv_transfer_params":{ream_}})");
  EXPECT_EQ(a.kv_raw, "");
  EXPECT_EQ(a.cached_tokens, -1);
  std::string chunk = R"(data: {"usage":{"prompt_tokens_details":{"cached_tokens": 1024}}})";
  EXPECT_EQ(RewriteCachedTokens(chunk, 16), 1);
  EXPECT_EQ(chunk, R"(data: {"usage":{"prompt_tokens_details":{"cached_tokens": 16}}})");
}

// x-llm-d-model-name-rewrite's body: the first "model" replaced (escaped afresh), later
// repeats dropped, the rest byte for byte; added first when absent; no object, no body.
TEST(PdLegs, ReplaceModelSetsTheTopLevelModelOnly) {
  EXPECT_EQ(ReplaceModel(R"({"model":"a","prompt":"p","extra":{"model":"x"},"model":"b"})", "new/m"),
            R"({"model":"new/m","prompt":"p","extra":{"model":"x"}})");
  EXPECT_EQ(ReplaceModel(R"({"prompt": [1, 2]})", "q\"uote"), R"({"model":"q\"uote","prompt":[1, 2]})");
  EXPECT_EQ(ReplaceModel("{}", "m"), R"({"model":"m"})");
  EXPECT_EQ(ReplaceModel("[1]", "m"), std::nullopt);
  EXPECT_EQ(ReplaceModel(R"({"model":"a"} x)", "m"), std::nullopt);
}

}  // namespace
}  // namespace kvroute::api
