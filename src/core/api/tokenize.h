// vLLM's tokenizer endpoints (REFERENCE.md section 21) as pure logic, for both sides:
//   - a server (the simulator) reads POST /tokenize and POST /detokenize bodies and
//     writes their answers;
//   - a client (the router's tokenizer, src/adapters/tokenize) builds a /tokenize body from a
//     client's completion or chat request and reads the answer.
// Bytes in, values out; no exceptions escape. Thread: any (each thread reuses its own
// simdjson parsers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/api/openai.h"
#include "core/common/status.h"

namespace kvroute::api {

// ---- Server side: reading /tokenize and /detokenize ----

// Which of vLLM's two request shapes a /tokenize body has: the chat form when it has a
// "messages" key, else the completion form.
enum class TokenizeForm { kCompletion, kChat };

struct TokenizeRequest {
  TokenizeForm form = TokenizeForm::kCompletion;
  std::string model;
  // The text the engine tokenizes for the same request: the completion form's `prompt`
  // (a string, or an array of exactly one string, as ParseRequest reads it); the chat
  // form's `messages` rendered with the chat template of AppendChatMessage, by
  // ParseRequest itself (so a chat completion with the same messages gets the same
  // text), then cut per add_generation_prompt / continue_final_message (below).
  std::string text;
  // vLLM's defaults: true for the completion form, false for the chat form. kvroute's
  // engine has no special tokens (no BOS), so the value changes nothing; it is read and
  // type-checked only.
  bool add_special_tokens = true;
  bool return_token_strs = false;
  // Chat form: without the generation prompt the text ends after the last message; with
  // continue_final_message it also lacks the last message's closing "\n" (the reply
  // continues that message). Both true is a 400, as in vLLM.
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

struct TokenizeParse {
  std::optional<TokenizeRequest> request;
  ApiError error;  // status 400 when !ok()
  bool ok() const { return request.has_value(); }
};

// Parses a POST /tokenize body. Fields of the completion form: model, prompt,
// add_special_tokens, return_token_strs. Of the chat form: model, messages,
// add_generation_prompt, continue_final_message, add_special_tokens, chat_template
// (string), chat_template_kwargs (object), tools (array), return_token_strs. Booleans must
// be booleans, `null` is "not set"; chat_template, chat_template_kwargs and tools are
// type-checked and otherwise ignored (one fixed template). Other keys are ignored. Errors
// are 400 BadRequestError with `param` naming the field (empty for malformed JSON).
TokenizeParse ParseTokenizeRequest(std::string_view body);

struct DetokenizeRequest {
  std::string model;
  std::vector<uint32_t> tokens;
};

struct DetokenizeParse {
  std::optional<DetokenizeRequest> request;
  ApiError error;
  bool ok() const { return request.has_value(); }
};

// Parses a POST /detokenize body {"model", "tokens": [ids]}: ids are integers in
// [0, 2^32); anything else is a 400 naming "tokens" (or "tokens[i]").
DetokenizeParse ParseDetokenizeRequest(std::string_view body);

// {"count":N,"max_model_len":M,"tokens":[...],"token_strs":null}, or with token_strs the
// strings given (each made valid UTF-8 as AppendValidUtf8 does).
std::string TokenizeAnswerBody(std::span<const uint32_t> tokens, int64_t max_model_len,
                               const std::vector<std::string>* token_strs);
// {"prompt":"..."} (`prompt` made valid UTF-8 first).
std::string DetokenizeAnswerBody(std::string_view prompt);

// Appends `bytes` to `out` with every ill-formed UTF-8 sequence replaced by U+FFFD, one
// per maximal ill-formed subpart, as Python's bytes.decode("utf-8", "replace") does (what
// a Hugging Face tokenizer's decode shows for a cut multi-byte character).
void AppendValidUtf8(std::string& out, std::string_view bytes);

// ---- Client side: building a /tokenize body, reading the answer ----

// What to tokenize: one client request as the router holds it.
struct TokenizeSource {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string_view model;
  // Completions: the prompt text (ParsedRequest::prompt_text). Unused for chat.
  std::string_view prompt;
  // Chat: the client's original request body; its `messages` and chat-template fields
  // (add_generation_prompt, continue_final_message, chat_template, chat_template_kwargs,
  // tools) go into the /tokenize body verbatim (byte for byte). Unused for completions.
  std::string_view body;
  // The client's add_special_tokens (ParsedRequest::add_special_tokens): forwarded when
  // set, because the engine honours it for that request; unset: the endpoint's default.
  std::optional<bool> add_special_tokens;
};

// The /tokenize body for `source`: the completion form {"model","prompt",
// "add_special_tokens":true} for completions, the chat form {"model","messages",<template
// fields as sent>,"add_special_tokens":false} for chat (defaults as vLLM's serving path
// uses them, unless the client set add_special_tokens). InvalidArgument when a chat
// body is not a JSON object with a "messages" array.
Result<std::string> BuildTokenizeBody(const TokenizeSource& source);

struct TokenizeAnswer {
  std::vector<uint32_t> tokens;
  int64_t max_model_len = 0;  // 0 when the answer did not say
};

// Reads a /tokenize answer: a JSON object whose "tokens" is an array of integers in
// [0, 2^32); "count", when present, must equal their number; "max_model_len" is read when
// it is an integer. Anything else (not JSON, not an object, no tokens, a wrong type, a
// count that disagrees) is InvalidArgument saying what was wrong. `padded`: body.data() is
// followed by at least kJsonPadding readable bytes, so it is parsed in place (no copy).
Result<TokenizeAnswer> ParseTokenizeAnswer(std::string_view body, bool padded = false);

}  // namespace kvroute::api
