// OpenAI-compatible request parsing and error bodies, shared by the simulator (which
// serves the API) and the router (which reads just enough of it to pick an endpoint).
// Pure logic: bytes in, values out. No exceptions escape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvroute::api {

enum class Endpoint { kCompletions, kChatCompletions };

// What kvroute needs from a request body. Strings are owned copies: a request is
// parsed once and the result outlives the body buffer.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // The prompt as text: `prompt` for completions, or `messages` rendered through
  // RenderChat for chat. The simulator tokenizes it; the router hashes it.
  std::string prompt_text;
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage
  std::optional<int64_t> max_tokens;  // max_tokens, or chat's max_completion_tokens
  std::string cache_salt;           // vLLM extra; empty when absent
  int64_t priority = 0;             // vLLM extra; lower is more important
  bool ignore_eos = false;
};

// An error in the shape vLLM and OpenAI use:
// {"error":{"message":...,"type":...,"param":...,"code":<status>}}.
struct ApiError {
  int status = 400;          // HTTP status, also the body's "code"
  std::string type;          // "BadRequestError", "NotFoundError", ...
  std::string message;
  std::string param;         // empty renders as null
};

// The error type name for an HTTP status: 400 BadRequestError, 404 NotFoundError,
// 413 RequestEntityTooLarge... (see openai.cc for the table).
std::string_view ErrorTypeForStatus(int status);

// Makes an ApiError with the type that fits `status`.
ApiError MakeError(int status, std::string message, std::string param = {});

// Serialises `e` as the JSON error body (no trailing newline).
std::string ErrorBody(const ApiError& e);

// Result of parsing: either a request or an error (status 400 for malformed JSON,
// missing or wrong-typed fields). Never throws.
struct ParseResult {
  std::optional<ParsedRequest> request;
  ApiError error;
  bool ok() const { return request.has_value(); }
};

// Parses a POST body for `endpoint`. `body` need not be padded; the function copies
// it into simdjson's padded buffer only when it must.
ParseResult ParseRequest(Endpoint endpoint, std::string_view body);

// Appends `s` to `out` as a JSON string literal (quotes and escapes included).
void AppendJsonString(std::string& out, std::string_view s);

}  // namespace kvroute::api
