#include "core/api/tokenize.h"

#include <simdjson.h>

#include <charconv>
#include <limits>
#include <utility>

#include "core/api/raw_json.h"

namespace kvroute::api {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

constexpr std::string_view kGenerationPrompt = "<|assistant|>\n";

ApiError BadRequest(std::string message, std::string param = {}) {
  return MakeError(400, std::move(message), std::move(param));
}

ApiError WrongType(std::string_view param, std::string_view expected) {
  std::string msg = "'";
  msg.append(param).append("' must be ").append(expected);
  return BadRequest(std::move(msg), std::string(param));
}

// A token id: an integer in [0, 2^32). UINT64 elements are above INT64_MAX: out of range.
bool ReadTokenId(element v, uint32_t& out) {
  if (v.type() != element_type::INT64) return false;
  const int64_t x = v.get_int64().value_unsafe();
  if (x < 0 || x > static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) return false;
  out = static_cast<uint32_t>(x);
  return true;
}

void AppendUint(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, end);
}

}  // namespace

// ---- Server side ----

namespace {

// `body` as a JSON object (parsed by this thread's parser: valid until its next use), or
// false with the 400 saying why.
bool ParseObject(std::string_view body, simdjson::dom::object* obj, ApiError* error) {
  thread_local simdjson::dom::parser parser;
  element root;
  if (auto ec = parser.parse(body.data(), body.size(), /*realloc_if_needed=*/true).get(root)) {
    *error = BadRequest(std::string("Invalid JSON body: ") + simdjson::error_message(ec));
    return false;
  }
  if (root.get_object().get(*obj)) {
    *error = BadRequest("Request body must be a JSON object");
    return false;
  }
  return true;
}

}  // namespace

TokenizeParse ParseTokenizeRequest(std::string_view body) {
  TokenizeParse result;
  simdjson::dom::object obj;
  if (!ParseObject(body, &obj, &result.error)) return result;
  element ignored;
  const bool chat = obj["messages"].get(ignored) == simdjson::SUCCESS;

  TokenizeRequest req;
  req.form = chat ? TokenizeForm::kChat : TokenizeForm::kCompletion;
  req.add_special_tokens = !chat;
  for (auto [key, value] : obj) {
    if (value.is_null()) continue;  // optional fields: null means "not set"
    bool* flag = nullptr;
    if (key == "add_special_tokens") {
      flag = &req.add_special_tokens;
    } else if (key == "return_token_strs") {
      flag = &req.return_token_strs;
    } else if (chat && key == "add_generation_prompt") {
      flag = &req.add_generation_prompt;
    } else if (chat && key == "continue_final_message") {
      flag = &req.continue_final_message;
    } else if (chat && key == "chat_template") {
      if (!value.is_string()) {
        result.error = WrongType(key, "a string");
        return result;
      }
    } else if (chat && key == "chat_template_kwargs") {
      if (!value.is_object()) {
        result.error = WrongType(key, "an object");
        return result;
      }
    } else if (chat && key == "tools") {
      if (!value.is_array()) {
        result.error = WrongType(key, "an array");
        return result;
      }
    }
    if (flag && value.get_bool().get(*flag)) {
      result.error = WrongType(key, "a boolean");
      return result;
    }
  }
  if (chat && req.add_generation_prompt && req.continue_final_message) {
    result.error = BadRequest(
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
    return result;
  }

  // model, prompt and messages exactly as a completion or chat request reads them: the
  // text is then the engine's for the same request by construction.
  ParseResult parsed = ParseRequest(chat ? Endpoint::kChatCompletions : Endpoint::kCompletions, body);
  if (!parsed.ok()) {
    result.error = std::move(parsed.error);
    return result;
  }
  req.model = std::move(parsed.request->model);
  req.text = std::move(parsed.request->prompt_text);
  if (chat && !req.add_generation_prompt) {
    // ParseRequest always ends a chat text with the generation prompt.
    req.text.resize(req.text.size() - kGenerationPrompt.size());
    // The reply continues the last message: it stays open (no closing newline).
    if (req.continue_final_message && !req.text.empty() && req.text.back() == '\n') {
      req.text.pop_back();
    }
  }
  result.request = std::move(req);
  return result;
}

DetokenizeParse ParseDetokenizeRequest(std::string_view body) {
  DetokenizeParse result;
  simdjson::dom::object obj;
  if (!ParseObject(body, &obj, &result.error)) return result;
  DetokenizeRequest req;
  bool have_model = false, have_tokens = false;
  for (auto [key, value] : obj) {
    if (key == "model") {
      std::string_view s;
      if (value.get_string().get(s)) {
        result.error = WrongType("model", "a string");
        return result;
      }
      req.model.assign(s);
      have_model = true;
    } else if (key == "tokens") {
      simdjson::dom::array arr;
      if (value.get_array().get(arr)) {
        result.error = WrongType("tokens", "an array of token ids");
        return result;
      }
      req.tokens.clear();
      req.tokens.reserve(arr.size());
      std::size_t i = 0;
      for (element t : arr) {
        uint32_t id = 0;
        if (!ReadTokenId(t, id)) {
          const std::string param = "tokens[" + std::to_string(i) + "]";
          result.error = WrongType(param, "a token id (an integer from 0 to 4294967295)");
          return result;
        }
        req.tokens.push_back(id);
        ++i;
      }
      have_tokens = true;
    }
  }
  if (!have_model) {
    result.error = BadRequest("Missing required field 'model'", "model");
    return result;
  }
  if (!have_tokens) {
    result.error = BadRequest("Missing required field 'tokens'", "tokens");
    return result;
  }
  result.request = std::move(req);
  return result;
}

void AppendValidUtf8(std::string& out, std::string_view bytes) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  std::size_t run = 0;  // start of the well-formed bytes not yet copied
  while (i < n) {
    const unsigned char c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Length and allowed range of the second byte (Unicode 15, table 3-7).
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c == 0xE0) {
      len = 3, lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      len = 3;
    } else if (c == 0xED) {
      len = 3, hi = 0x9F;
    } else if (c == 0xF0) {
      len = 4, lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
      len = 4;
    } else if (c == 0xF4) {
      len = 4, hi = 0x8F;
    }
    // How many bytes from i form a well-formed prefix of a sequence.
    std::size_t good = len == 0 ? 0 : 1;
    if (len > 0 && i + 1 < n && b[i + 1] >= lo && b[i + 1] <= hi) {
      good = 2;
      while (good < len && i + good < n && b[i + good] >= 0x80 && b[i + good] <= 0xBF) ++good;
    }
    if (len > 0 && good == len) {
      i += len;
      continue;
    }
    // Ill-formed: the maximal subpart (at least one byte) becomes one U+FFFD.
    out.append(bytes.data() + run, i - run);
    out.append(kReplacement);
    i += good == 0 ? 1 : good;
    run = i;
  }
  out.append(bytes.data() + run, n - run);
}

std::string TokenizeAnswerBody(std::span<const uint32_t> tokens, int64_t max_model_len,
                               const std::vector<std::string>* token_strs) {
  std::string out;
  out.reserve(64 + tokens.size() * 7);
  out += "{\"count\":";
  AppendUint(out, tokens.size());
  out += ",\"max_model_len\":";
  out += std::to_string(max_model_len);
  out += ",\"tokens\":[";
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendUint(out, tokens[i]);
  }
  out += "],\"token_strs\":";
  if (!token_strs) {
    out += "null}";
    return out;
  }
  out.push_back('[');
  std::string valid;
  for (std::size_t i = 0; i < token_strs->size(); ++i) {
    if (i > 0) out.push_back(',');
    valid.clear();
    AppendValidUtf8(valid, (*token_strs)[i]);
    AppendJsonString(out, valid);
  }
  out += "]}";
  return out;
}

std::string DetokenizeAnswerBody(std::string_view prompt) {
  std::string valid;
  AppendValidUtf8(valid, prompt);
  std::string out = "{\"prompt\":";
  AppendJsonString(out, valid);
  out.push_back('}');
  return out;
}

// ---- Client side ----

namespace {

// The fields of a chat request that shape its rendered prompt, forwarded as sent.
constexpr std::string_view kChatTemplateFields[] = {
    "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs",
    "tools"};

}  // namespace

simdjson::error_code RawJson(simdjson::ondemand::value v, std::string_view& out) {
  simdjson::ondemand::json_type type;
  if (auto ec = v.type().get(type)) return ec;
  if (type == simdjson::ondemand::json_type::array) {
    simdjson::ondemand::array a;
    if (auto ec = v.get_array().get(a)) return ec;
    if (auto ec = a.raw_json().get(out)) return ec;
  } else if (type == simdjson::ondemand::json_type::object) {
    simdjson::ondemand::object o;
    if (auto ec = v.get_object().get(o)) return ec;
    if (auto ec = o.raw_json().get(out)) return ec;
  } else {
    out = v.raw_json_token();
  }
  // raw_json may run on to the next token: drop the whitespace after the value.
  while (!out.empty() &&
         (out.back() == ' ' || out.back() == '\n' || out.back() == '\r' || out.back() == '\t')) {
    out.remove_suffix(1);
  }
  return simdjson::SUCCESS;
}

Result<std::string> BuildTokenizeBody(const TokenizeSource& source) {
  const bool chat = source.endpoint == Endpoint::kChatCompletions;
  std::string out;
  out.reserve(64 + source.model.size() + (chat ? source.body.size() : source.prompt.size() + 8));
  out += "{\"model\":";
  AppendJsonString(out, source.model);
  if (!chat) {
    out += ",\"prompt\":";
    AppendJsonString(out, source.prompt);
    out += ",\"add_special_tokens\":";
    out += source.add_special_tokens.value_or(true) ? "true" : "false";
    out.push_back('}');
    return out;
  }
  // Chat: `messages` and the template fields byte for byte (the last of a repeated key).
  const simdjson::padded_string padded(source.body);
  thread_local simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  simdjson::ondemand::object obj;
  if (parser.iterate(padded).get(doc) || doc.get_object().get(obj)) {
    return Status::InvalidArgument("chat request body is not a JSON object");
  }
  std::string_view messages;
  std::string_view fields[std::size(kChatTemplateFields)];
  for (auto field : obj) {
    std::string_view key;
    simdjson::ondemand::value value;
    if (field.unescaped_key().get(key) || field.value().get(value)) {
      return Status::InvalidArgument("chat request body is not valid JSON");
    }
    std::string_view* slot = nullptr;
    if (key == "messages") {
      slot = &messages;
    } else {
      for (std::size_t i = 0; i < std::size(kChatTemplateFields); ++i) {
        if (key == kChatTemplateFields[i]) slot = &fields[i];
      }
    }
    if (!slot) continue;  // skipped by the iteration
    std::string_view raw;
    if (RawJson(value, raw)) return Status::InvalidArgument("chat request body is not valid JSON");
    if (slot == &messages && (raw.empty() || raw.front() != '[')) {
      return Status::InvalidArgument("chat request 'messages' is not an array");
    }
    *slot = raw;
  }
  if (messages.empty()) return Status::InvalidArgument("chat request has no 'messages'");
  out += ",\"messages\":";
  out += messages;
  for (std::size_t i = 0; i < std::size(kChatTemplateFields); ++i) {
    if (fields[i].empty()) continue;
    out += ",\"";
    out += kChatTemplateFields[i];
    out += "\":";
    out += fields[i];
  }
  out += ",\"add_special_tokens\":";
  out += source.add_special_tokens.value_or(false) ? "true" : "false";
  out.push_back('}');
  return out;
}

Result<TokenizeAnswer> ParseTokenizeAnswer(std::string_view body, bool padded) {
  static_assert(kJsonPadding >= simdjson::SIMDJSON_PADDING);
  thread_local simdjson::dom::parser parser;
  element root;
  if (auto ec = parser.parse(body.data(), body.size(), /*realloc_if_needed=*/!padded).get(root)) {
    return Status::InvalidArgument(std::string("tokenize answer is not JSON: ") +
                                   simdjson::error_message(ec));
  }
  simdjson::dom::object obj;
  if (root.get_object().get(obj)) {
    return Status::InvalidArgument("tokenize answer is not a JSON object");
  }
  simdjson::dom::array tokens;
  if (obj["tokens"].get_array().get(tokens)) {
    return Status::InvalidArgument("tokenize answer has no 'tokens' array");
  }
  TokenizeAnswer answer;
  answer.tokens.reserve(tokens.size());
  std::size_t i = 0;
  for (element t : tokens) {
    uint32_t id = 0;
    if (!ReadTokenId(t, id)) {
      return Status::InvalidArgument("tokenize answer: tokens[" + std::to_string(i) +
                                     "] is not a token id");
    }
    answer.tokens.push_back(id);
    ++i;
  }
  element count;
  if (obj["count"].get(count) == simdjson::SUCCESS && !count.is_null()) {
    int64_t n = 0;
    if (count.get_int64().get(n) || n != static_cast<int64_t>(answer.tokens.size())) {
      return Status::InvalidArgument("tokenize answer: count " + simdjson::to_string(count) +
                                     " but " + std::to_string(answer.tokens.size()) + " tokens");
    }
  }
  int64_t max_len = 0;
  if (obj["max_model_len"].get_int64().get(max_len) == simdjson::SUCCESS) {
    answer.max_model_len = max_len;
  }
  return answer;
}

}  // namespace kvroute::api
