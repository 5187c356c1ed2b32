// Fuzz target: the vLLM tokenizer shapes of core/api/tokenize.h on outside bytes, as both
// sides meet them: a /tokenize and a /detokenize body the sim reads, a /tokenize answer the
// router's HttpTokenizer reads, a client's chat body the router forwards (BuildTokenizeBody),
// and the UTF-8 repair of text the sim sends back.
//
// Invariants: errors are 400 BadRequestErrors with a message; a chat-form text is the chat
// completion's rendering of the same body (cut only as its flags say); a body built from
// valid JSON is valid JSON that the server side reads back as the same conversation; an
// answer read has count == its ids; AppendValidUtf8 always yields valid UTF-8 and keeps
// valid input as it is; the answer bodies are valid JSON.
#include <simdjson.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/api/openai.h"
#include "core/api/tokenize.h"

namespace {

using namespace kvroute;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

bool IsJson(std::string_view s) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  return !parser.parse(s.data(), s.size()).get(root);
}

void CheckApiError(const api::ApiError& e) {
  Check(e.status == 400 && e.type == "BadRequestError", "a body error that is not a 400");
  Check(!e.message.empty(), "an error without a message");
  Check(IsJson(api::ErrorBody(e)), "an error body that is not JSON");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  // The sim's /tokenize.
  const api::TokenizeParse t = api::ParseTokenizeRequest(in);
  if (!t.ok()) {
    CheckApiError(t.error);
  } else if (t.request->form == api::TokenizeForm::kChat) {
    const api::ParseResult chat = api::ParseRequest(api::Endpoint::kChatCompletions, in);
    Check(chat.ok(), "a chat form read that a chat completion refuses");
    const std::string& full = chat.request->prompt_text;
    Check(full.compare(0, t.request->text.size(), t.request->text) == 0,
          "a chat-form text that is not a prefix of the chat completion's");
    Check(t.request->add_generation_prompt == (t.request->text == full),
          "the generation prompt kept or cut against the flag");
  }
  const std::string answer_strs_src(in.substr(0, 16));
  const std::vector<std::string> strs = {answer_strs_src};
  const std::vector<uint32_t> some_ids = {0, 1, 4294967295u};
  Check(IsJson(api::TokenizeAnswerBody(some_ids, 1, &strs)), "a tokenize answer that is not JSON");

  // The sim's /detokenize.
  const api::DetokenizeParse d = api::ParseDetokenizeRequest(in);
  if (!d.ok()) CheckApiError(d.error);

  // The router reading a replica's answer.
  const Result<api::TokenizeAnswer> a = api::ParseTokenizeAnswer(in);
  if (!a.ok()) {
    Check(a.status().code() == StatusCode::kInvalidArgument, "an answer error of another kind");
    Check(!a.status().message().empty(), "an answer error without a message");
  }

  // The router forwarding a client's chat body.
  api::TokenizeSource src;
  src.endpoint = api::Endpoint::kChatCompletions;
  src.model = "m";
  src.body = in;
  const Result<std::string> body = api::BuildTokenizeBody(src);
  if (body.ok() && IsJson(in)) {
    Check(IsJson(*body), "a tokenize body built from JSON that is not JSON");
    const api::ParseResult client = api::ParseRequest(api::Endpoint::kChatCompletions, in);
    const api::TokenizeParse server = api::ParseTokenizeRequest(*body);
    if (client.ok() && server.ok()) {
      Check(server.request->form == api::TokenizeForm::kChat, "a chat body sent in another form");
      Check(client.request->prompt_text.compare(0, server.request->text.size(),
                                                server.request->text) == 0,
            "the replica would render another conversation");
    }
  }

  // UTF-8 repair, and the detokenize answer around it.
  std::string valid;
  api::AppendValidUtf8(valid, in);
  Check(simdjson::validate_utf8(valid.data(), valid.size()), "AppendValidUtf8 left bad UTF-8");
  if (simdjson::validate_utf8(in.data(), in.size())) Check(valid == in, "valid UTF-8 changed");
  Check(IsJson(api::DetokenizeAnswerBody(in)), "a detokenize answer that is not JSON");
  return 0;
}
