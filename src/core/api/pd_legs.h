// The bodies of serve's two prefill/decode legs (issue 25; REFERENCE.md section 20) and the
// bits of the prefill answer the decode leg and the client need. Pure functions over JSON
// bytes: no I/O, no lock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvroute::api {

// The prefill leg's body: the client's JSON object with `stream: false`, `stream_options`
// and `min_tokens` removed, `max_tokens: 1` (and `max_completion_tokens: 1` when the client
// sent it), and `kv_transfer_params` asking for a remote decode. Every other field is kept
// byte for byte (the last of a repeated key wins in vLLM; all are kept). nullopt when
// `body` is not a JSON object.
std::optional<std::string> BuildPrefillBody(std::string_view body);

// The decode leg's body: the client's JSON object with `kv_transfer_params` set to
// `kv_raw` (prefill's, verbatim; the client's own kv_transfer_params, if any, dropped).
// nullopt when `body` is not a JSON object.
std::optional<std::string> BuildDecodeBody(std::string_view body, std::string_view kv_raw);

// The client's JSON object with its top-level "model" set to `model` (x-llm-d-model-name-
// rewrite): the first "model" field's value replaced, later repeats dropped, every other
// field kept byte for byte; added first when absent. nullopt when `body` is not a JSON
// object.
std::optional<std::string> ReplaceModel(std::string_view body, std::string_view model);

// What serve takes from the prefill leg's answer.
struct PrefillAnswer {
  // The answer's top-level kv_transfer_params as written (minified by nothing: verbatim);
  // empty when absent or null (the decode endpoint then prefills locally).
  std::string kv_raw;
  // usage.prompt_tokens_details.cached_tokens; -1 when absent.
  int64_t cached_tokens = -1;
};
// An answer that is not valid JSON reads as empty (no parameters, no cached tokens).
PrefillAnswer ReadPrefillAnswer(std::string_view body);

// Replaces the integer after every `"cached_tokens":` in `text` by `value`. Returns how
// many were replaced. For the decode leg's final usage (whole body or one stream chunk).
int RewriteCachedTokens(std::string& text, int64_t value);

}  // namespace kvroute::api
