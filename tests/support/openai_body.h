// OpenAI request bodies for the loopback tests (the sim, serve, epp and the fault matrix).
#pragma once

#include <string>
#include <string_view>

#include "core/api/openai.h"

namespace kvroute::test_support {

// The model name every test fleet serves.
inline constexpr std::string_view kTestModel = "test/model";

// A /v1/completions body: {"model","prompt","max_tokens"} then, when asked, "stream":true,
// "stream_options":{"include_usage":true} and "priority" (in that order).
inline std::string CompletionBody(std::string_view prompt, int max_tokens, bool stream = false,
                                  bool include_usage = false, int priority = 0,
                                  std::string_view model = kTestModel) {
  std::string body = "{\"model\":";
  api::AppendJsonString(body, model);
  body += ",\"prompt\":";
  api::AppendJsonString(body, prompt);
  body += ",\"max_tokens\":" + std::to_string(max_tokens);
  if (stream) body += ",\"stream\":true";
  if (include_usage) body += ",\"stream_options\":{\"include_usage\":true}";
  if (priority != 0) body += ",\"priority\":" + std::to_string(priority);
  return body + "}";
}

// A prompt of `tokens` tokens as the sim and the router count them (4 bytes a token);
// `seed` makes prompts distinct from their first block.
inline std::string TokensPrompt(int tokens, int seed) {
  std::string s = "seed" + std::to_string(seed) + " ";
  while (s.size() < static_cast<std::size_t>(tokens) * 4) s += "lorem ipsum dolor sit amet ";
  return s.substr(0, static_cast<std::size_t>(tokens) * 4);
}

}  // namespace kvroute::test_support
