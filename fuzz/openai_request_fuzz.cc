// Fuzz target: a client's POST body through the OpenAI request parser, as the router and
// the simulator call it: ParseRequest (unpadded) and ParseRequestPadded (the body in a
// buffer with exactly kJsonPadding spare bytes, like a receive buffer), for completions
// chat, embeddings and responses, then the scheduler's view of a parsed request
// (sched::FromParsed); and ScanRoutingFields, the router's read of any other path's body.
//
// Invariants: both entry points agree on every input; an error is a 400 BadRequestError
// with a message whose ErrorBody is valid JSON that carries the message back; a parsed
// request has what the contract promises (a model, non-negative max_tokens, a chat prompt
// ending with the generation prompt; kv_transfer_params whose raw copy is a JSON object and
// whose ids and port are non-negative) and FromParsed views exactly its strings. The first
// line of the input is also read as the value of every latency objective header
// (ParseSloHeaders): either a 400 naming the header, or finite positive seconds. And the
// input is a response stream for ChoiceChunkCounter: the count does not depend on where
// reads split it.
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "core/api/json_scan.h"
#include "core/api/openai.h"
#include "core/sched/types.h"

namespace {

using namespace kvroute;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

bool Same(const api::ParseResult& a, const api::ParseResult& b) {
  if (a.ok() != b.ok()) return false;
  if (!a.ok()) {
    return a.error.status == b.error.status && a.error.message == b.error.message &&
           a.error.param == b.error.param;
  }
  const api::ParsedRequest& x = *a.request;
  const api::ParsedRequest& y = *b.request;
  return x.endpoint == y.endpoint && x.model == y.model && x.prompt_text == y.prompt_text &&
         x.stream == y.stream && x.include_usage == y.include_usage &&
         x.max_tokens == y.max_tokens && x.cache_salt == y.cache_salt &&
         x.priority == y.priority && x.ignore_eos == y.ignore_eos &&
         x.kv_transfer_params.has_value() == y.kv_transfer_params.has_value() &&
         (!x.kv_transfer_params || x.kv_transfer_params->raw == y.kv_transfer_params->raw);
}

void CheckError(const api::ApiError& e) {
  Check(e.status == 400, "a parse error that is not 400");
  Check(e.type == "BadRequestError", "a 400 that is not a BadRequestError");
  Check(!e.message.empty(), "an error without a message");
  // The body the client gets must be JSON and say the same thing.
  const std::string body = api::ErrorBody(e);
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(body).get(root)) {
    std::fprintf(stderr, "bad error body: %s\n", body.c_str());
    Check(false, "ErrorBody is not valid JSON");
  }
  std::string_view message;
  Check(!root["error"]["message"].get_string().get(message) && message == e.message,
        "ErrorBody's message differs");
  int64_t code = 0;
  Check(!root["error"]["code"].get_int64().get(code) && code == e.status, "ErrorBody's code");
}

void CheckRequest(const api::ParsedRequest& r, api::Endpoint endpoint) {
  Check(r.endpoint == endpoint, "endpoint not kept");
  Check(!r.max_tokens || *r.max_tokens >= 0, "negative max_tokens accepted");
  if (endpoint == api::Endpoint::kEmbeddings) {
    Check(!r.inputs.empty() || !r.input_token_ids.empty(), "embeddings without an input");
    for (const auto& ids : r.input_token_ids) Check(!ids.empty(), "an empty token-id input");
    Check(!r.dimensions || *r.dimensions > 0, "dimensions that are not positive");
    Check(!r.stream, "a streamed embeddings request");
  }
  if (endpoint == api::Endpoint::kChatCompletions || endpoint == api::Endpoint::kResponses) {
    constexpr std::string_view kTail = "<|assistant|>\n";
    Check(r.prompt_text.size() >= kTail.size() &&
              r.prompt_text.compare(r.prompt_text.size() - kTail.size(), kTail.size(), kTail) == 0,
          "chat prompt without the generation prompt");
  }
  if (r.kv_transfer_params) {
    // P/D params: the raw copy is one JSON object that parses back to the same fields.
    const api::KvTransferParams& p = *r.kv_transfer_params;
    thread_local simdjson::dom::parser raw_parser;
    simdjson::dom::object obj;
    Check(!raw_parser.parse(p.raw).get_object().get(obj), "kv_transfer_params.raw is no object");
    if (p.remote_block_ids) {
      for (int64_t id : *p.remote_block_ids) Check(id >= 0, "a negative remote block id");
    }
    Check(!p.remote_port || *p.remote_port >= 0, "a negative remote_port");
  }
  const sched::SchedRequest s = sched::FromParsed(r);
  Check(s.model.data() == r.model.data() && s.model.size() == r.model.size(), "model view");
  Check(s.prompt.data() == r.prompt_text.data() && s.prompt.size() == r.prompt_text.size(),
        "prompt view");
  Check(s.cache_salt == r.cache_salt, "cache_salt view");
  Check(s.priority == r.priority, "priority");
  Check(s.max_tokens == r.max_tokens.value_or(-1), "max_tokens");
  Check(s.EstimatedPromptTokens() >= 0, "negative prompt-token estimate");
  Check(s.disaggregable == api::Disaggregable(endpoint), "disaggregable");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  // Exactly kJsonPadding spare bytes, so ASan sees any read past what the contract allows.
  std::unique_ptr<char[]> padded(new char[size + api::kJsonPadding]);
  if (size > 0) std::memcpy(padded.get(), data, size);
  std::memset(padded.get() + size, 0, api::kJsonPadding);
  const std::string_view padded_body(padded.get(), size);

  for (api::Endpoint ep : {api::Endpoint::kCompletions, api::Endpoint::kChatCompletions,
                           api::Endpoint::kEmbeddings, api::Endpoint::kResponses}) {
    const api::ParseResult a = api::ParseRequest(ep, body);
    const api::ParseResult b = api::ParseRequestPadded(ep, padded_body);
    Check(Same(a, b), "ParseRequest and ParseRequestPadded disagree");
    if (a.ok()) {
      CheckRequest(*a.request, ep);
    } else {
      CheckError(a.error);
    }
  }
  // Any other path's body: never fails; a JSON object says so, and its fields are what a
  // full parse of the same body as that kind would see.
  const api::RoutingFields f = api::ScanRoutingFields(body);
  Check(f.json || (f.model.empty() && f.prompt_text.empty()), "fields read from a non-object");
  const api::ParseResult as_completion = api::ParseRequest(api::Endpoint::kCompletions, body);
  if (as_completion.ok()) Check(f.model == as_completion.request->model, "scanned model differs");
  const std::string_view header = body.substr(0, std::min(body.find('\n'), body.size()));
  for (int which = 0; which < 4; ++which) {
    std::string_view v[4] = {};
    v[which] = header;
    api::ParsedRequest r;
    if (const auto e = api::ParseSloHeaders(v[0], v[1], v[2], v[3], &r)) {
      CheckError(*e);
      Check(!e->param.empty(), "an SLO header error that names no header");
      Check(r.slo_ttft_s == 0.0 && r.slo_tpot_s == 0.0, "an SLO set from a refused header");
    } else {
      const double s = which < 2 ? r.slo_ttft_s : r.slo_tpot_s;
      Check(header.empty() ? s == 0.0 : (std::isfinite(s) && s > 0), "an SLO that is not finite and positive");
    }
  }
  // The input as a response stream the front ends relay: the choice chunks counted in one
  // read, in reads cut where the input's first byte says, and a byte at a time agree.
  api::ChoiceChunkCounter whole, cut, bytes;
  whole.Feed(body);
  const size_t step = size > 0 ? 1 + data[0] % 17 : 1;
  for (size_t at = 0; at < size; at += step) cut.Feed(body.substr(at, step));
  for (size_t at = 0; at < size; ++at) bytes.Feed(body.substr(at, 1));
  Check(whole.chunks() == cut.chunks() && whole.chunks() == bytes.chunks(),
        "choice chunks counted differently when the stream is split");
  return 0;
}
