#include "core/api/openai.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iterator>
#include <limits>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/common/enum_names.h"

namespace kvroute::api {

static_assert(simdjson::SIMDJSON_PADDING <= kJsonPadding, "kJsonPadding must cover simdjson's padding");

std::string_view ErrorTypeForStatus(int status) {
  switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 403: return "PermissionDeniedError";
    case 404: return "NotFoundError";
    case 408: return "RequestTimeoutError";
    case 405: return "MethodNotAllowed";
    case 409: return "ConflictError";
    case 413: return "RequestEntityTooLarge";
    case 422: return "UnprocessableEntityError";
    case 429: return "RateLimitError";
    case 431: return "RequestHeaderFieldsTooLarge";
    case 503: return "ServiceUnavailableError";
    default: break;
  }
  if (status >= 500) return "InternalServerError";
  return "BadRequestError";
}

ApiError MakeError(int status, std::string message, std::string param) {
  ApiError e;
  e.status = status;
  e.type = std::string(ErrorTypeForStatus(status));
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

void AppendJsonString(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.reserve(out.size() + s.size() + 2);
  out.push_back('"');
  // Copy runs of plain bytes in one append: prompts are long and mostly plain.
  size_t run_start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.data() + run_start, i - run_start);
    run_start = i + 1;
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      default: {
        const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
        out.append(esc, 6);
      }
    }
  }
  out.append(s.data() + run_start, s.size() - run_start);
  out.push_back('"');
}

std::string ErrorBody(const ApiError& e) {
  std::string out;
  out.reserve(64 + e.message.size() + e.type.size() + e.param.size());
  out.append("{\"error\":{\"message\":");
  AppendJsonString(out, e.message);
  out.append(",\"type\":");
  AppendJsonString(out, e.type);
  out.append(",\"param\":");
  if (e.param.empty()) {
    out.append("null");
  } else {
    AppendJsonString(out, e.param);
  }
  out.append(",\"code\":");
  out.append(std::to_string(e.status));
  out.append("}}");
  return out;
}

std::string ErrorBodyFor(int status, std::string_view message) {
  return ErrorBody(MakeError(status, std::string(message)));
}

void AppendChatMessage(std::string& out, std::string_view role, std::string_view content) {
  out.append("<|").append(role).append("|>\n").append(content).push_back('\n');
}

void AppendChatGenerationPrompt(std::string& out) { out.append("<|assistant|>\n"); }

std::string RenderChat(std::span<const ChatMessage> messages) {
  size_t n = 14;
  for (const ChatMessage& m : messages) n += m.role.size() + m.content.size() + 5;
  std::string out;
  out.reserve(n);
  for (const ChatMessage& m : messages) AppendChatMessage(out, m.role, m.content);
  AppendChatGenerationPrompt(out);
  return out;
}

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// Fills `err` and returns false; lets the field handlers be one-liners.
bool Fail(ApiError& err, std::string message, std::string param) {
  err = MakeError(400, std::move(message), std::move(param));
  return false;
}

bool WrongType(ApiError& err, std::string_view param, std::string_view expected) {
  std::string msg = "'";
  msg.append(param).append("' must be ").append(expected);
  return Fail(err, std::move(msg), std::string(param));
}

bool ReadString(element v, std::string_view param, std::string& out, ApiError& err) {
  std::string_view s;
  if (v.get_string().get(s)) return WrongType(err, param, "a string");
  out.assign(s);
  return true;
}

bool ReadBool(element v, std::string_view param, bool& out, ApiError& err) {
  if (v.get_bool().get(out)) return WrongType(err, param, "a boolean");
  return true;
}

// Integers only: 7.0 and "7" are rejected like OpenAI's schema does.
bool ReadInt(element v, std::string_view param, int64_t& out, ApiError& err) {
  switch (v.type()) {
    case element_type::INT64:
      out = v.get_int64().value_unsafe();
      return true;
    case element_type::UINT64:  // only values above INT64_MAX land here
      out = std::numeric_limits<int64_t>::max();
      return true;
    default:
      return WrongType(err, param, "an integer");
  }
}

bool ReadNonNegativeInt(element v, std::string_view param, std::optional<int64_t>& out,
                        ApiError& err) {
  int64_t x = 0;
  if (!ReadInt(v, param, x, err)) return false;
  if (x < 0) {
    std::string msg = "'";
    msg.append(param).append("' must be a non-negative integer (got ");
    msg.append(std::to_string(x)).append(")");
    return Fail(err, std::move(msg), std::string(param));
  }
  out = x;
  return true;
}

bool ReadPrompt(element v, std::string& out, ApiError& err) {
  if (v.is_string()) return ReadString(v, "prompt", out, err);
  simdjson::dom::array arr;
  if (v.get_array().get(arr)) {
    return WrongType(err, "prompt", "a string or an array of one string");
  }
  const size_t n = arr.size();
  if (n == 0) return Fail(err, "'prompt' must not be an empty array", "prompt");
  element first = arr.at(0).value_unsafe();
  if (first.is_int64() || first.is_uint64() || first.is_array()) {
    return Fail(err, "token-id prompts are not supported; send 'prompt' as text", "prompt");
  }
  if (!first.is_string()) return WrongType(err, "prompt", "a string or an array of one string");
  if (n != 1) {
    return Fail(err, "batched prompts are not supported; send one prompt per request",
                "prompt");
  }
  return ReadString(first, "prompt", out, err);
}

// "messages[3].content"; built only on the error path.
std::string MessageParam(size_t i, std::string_view field) {
  std::string p = "messages[" + std::to_string(i) + "]";
  if (!field.empty()) p.append(".").append(field);
  return p;
}

// "messages[i].content[j]" + suffix; built only on the error path.
std::string PartParam(size_t i, size_t j, std::string_view suffix) {
  std::string p = MessageParam(i, "content");
  p.push_back('[');
  p.append(std::to_string(j));
  p.push_back(']');
  p.append(suffix);
  return p;
}

bool ReadContentParts(simdjson::dom::array parts, size_t msg_index, std::string& out,
                      ApiError& err) {
  size_t j = 0;
  for (element part : parts) {
    simdjson::dom::object obj;
    if (part.get_object().get(obj)) {
      return WrongType(err, PartParam(msg_index, j, ""), "an object");
    }
    std::string_view type;
    if (obj["type"].get_string().get(type)) {
      return WrongType(err, PartParam(msg_index, j, ".type"), "a string");
    }
    if (type != "text") {
      return Fail(err,
                  "unsupported content part type '" + std::string(type) +
                      "'; only 'text' parts are supported",
                  PartParam(msg_index, j, ".type"));
    }
    std::string_view text;
    if (obj["text"].get_string().get(text)) {
      return WrongType(err, PartParam(msg_index, j, ".text"), "a string");
    }
    if (j > 0) out.push_back('\n');
    out.append(text);
    ++j;
  }
  return true;
}

// Renders `messages` straight into `out` (no intermediate ChatMessage vector): the same
// bytes RenderChat would produce, with text parts joined by "\n".
bool ReadMessages(element v, std::string& out, ApiError& err) {
  simdjson::dom::array arr;
  if (v.get_array().get(arr)) return WrongType(err, "messages", "an array");
  if (arr.size() == 0) return Fail(err, "'messages' must not be empty", "messages");
  size_t i = 0;
  for (element m : arr) {
    simdjson::dom::object obj;
    if (m.get_object().get(obj)) return WrongType(err, MessageParam(i, ""), "an object");
    element role_el;
    if (obj["role"].get(role_el)) {
      return Fail(err, "Missing required field '" + MessageParam(i, "role") + "'",
                  MessageParam(i, "role"));
    }
    std::string_view role;
    if (role_el.get_string().get(role)) {
      return WrongType(err, MessageParam(i, "role"), "a string");
    }
    out.append("<|").append(role).append("|>\n");
    element content;
    if (obj["content"].get(content) == simdjson::SUCCESS) {
      switch (content.type()) {
        case element_type::STRING:
          out.append(content.get_string().value_unsafe());
          break;
        case element_type::NULL_VALUE:  // e.g. an assistant turn that only called tools
          break;
        case element_type::ARRAY:
          if (!ReadContentParts(content.get_array().value_unsafe(), i, out, err)) return false;
          break;
        default:
          return WrongType(err, MessageParam(i, "content"),
                           "a string or an array of content parts");
      }
    }
    out.push_back('\n');
    ++i;
  }
  AppendChatGenerationPrompt(out);
  return true;
}

bool ReadStreamOptions(element v, ParsedRequest& req, ApiError& err) {
  simdjson::dom::object obj;
  if (v.get_object().get(obj)) return WrongType(err, "stream_options", "an object");
  for (auto [key, value] : obj) {
    if (key == "include_usage" && !value.is_null()) {
      if (!ReadBool(value, "stream_options.include_usage", req.include_usage, err)) return false;
    }
  }
  return true;
}

bool ReadOptString(element v, std::string_view param, std::optional<std::string>& out,
                   ApiError& err) {
  out.emplace();
  return ReadString(v, param, *out, err);
}

// A scalar field of kv_transfer_params: its key, its name in errors, and the member it sets.
struct KvTransferField {
  std::string_view key;
  std::string_view param;
  std::variant<bool KvTransferParams::*, std::optional<std::string> KvTransferParams::*,
               std::optional<int64_t> KvTransferParams::*>
      member;
};

constexpr KvTransferField kKvTransferScalars[] = {
    {"do_remote_decode", "kv_transfer_params.do_remote_decode",
     &KvTransferParams::do_remote_decode},
    {"do_remote_prefill", "kv_transfer_params.do_remote_prefill",
     &KvTransferParams::do_remote_prefill},
    {"remote_engine_id", "kv_transfer_params.remote_engine_id",
     &KvTransferParams::remote_engine_id},
    {"remote_request_id", "kv_transfer_params.remote_request_id",
     &KvTransferParams::remote_request_id},
    {"remote_host", "kv_transfer_params.remote_host", &KvTransferParams::remote_host},
    {"remote_port", "kv_transfer_params.remote_port", &KvTransferParams::remote_port},
    {"tp_size", "kv_transfer_params.tp_size", &KvTransferParams::tp_size},
    {"remote_prefill_cached_tokens", "kv_transfer_params.remote_prefill_cached_tokens",
     &KvTransferParams::remote_prefill_cached_tokens},
};

// Reads `v` into the member of `p` that `f` names: a boolean, a string, or a non-negative
// integer.
bool ReadKvTransferField(element v, const KvTransferField& f, KvTransferParams& p,
                         ApiError& err) {
  return std::visit(
      [&](auto member) {
        auto& out = p.*member;
        using T = std::remove_reference_t<decltype(out)>;
        if constexpr (std::is_same_v<T, bool>) {
          return ReadBool(v, f.param, out, err);
        } else if constexpr (std::is_same_v<T, std::optional<std::string>>) {
          return ReadOptString(v, f.param, out, err);
        } else {
          return ReadNonNegativeInt(v, f.param, out, err);
        }
      },
      f.member);
}

bool ReadKvTransferParams(element v, ParsedRequest& req, ApiError& err) {
  simdjson::dom::object obj;
  if (v.get_object().get(obj)) return WrongType(err, "kv_transfer_params", "an object");
  KvTransferParams p;
  for (auto [key, value] : obj) {
    if (value.is_null()) continue;
    const std::string_view name = key;  // clang 14 cannot capture a structured binding
    const auto scalar = std::find_if(std::begin(kKvTransferScalars), std::end(kKvTransferScalars),
                                     [name](const KvTransferField& f) { return f.key == name; });
    if (scalar != std::end(kKvTransferScalars)) {
      if (!ReadKvTransferField(value, *scalar, p, err)) return false;
    } else if (key == "remote_block_ids") {
      simdjson::dom::array arr;
      if (value.get_array().get(arr)) {
        return WrongType(err, "kv_transfer_params.remote_block_ids", "an array of integers");
      }
      std::vector<int64_t>& ids = p.remote_block_ids.emplace();
      ids.reserve(arr.size());
      size_t i = 0;
      for (element id : arr) {
        int64_t x = 0;
        if (id.get_int64().get(x) || x < 0) {  // the param is built on the error path only
          return WrongType(err,
                           "kv_transfer_params.remote_block_ids[" + std::to_string(i) + "]",
                           "a non-negative integer");
        }
        ids.push_back(x);
        ++i;
      }
    }
  }
  p.raw = simdjson::minify(v);
  req.kv_transfer_params = std::move(p);
  return true;
}

// Embeddings' `input`: a string, an array of strings, an array of token ids, or an array
// of token-id arrays (ParsedRequest::inputs / input_token_ids).
bool ReadTokenIds(simdjson::dom::array arr, std::string_view param, std::vector<uint32_t>& out,
                  ApiError& err) {
  out.reserve(arr.size());
  for (element t : arr) {
    int64_t x = 0;
    if (t.get_int64().get(x) || x < 0 || x > static_cast<int64_t>(UINT32_MAX)) {
      return WrongType(err, param, "an array of token ids (integers from 0 to 4294967295)");
    }
    out.push_back(static_cast<uint32_t>(x));
  }
  return true;
}

bool ReadEmbeddingInput(element v, ParsedRequest& req, ApiError& err) {
  req.inputs.clear();
  req.input_token_ids.clear();
  req.prompt_text.clear();
  static constexpr std::string_view kShape =
      "a string, an array of strings, an array of token ids or an array of token-id arrays";
  if (v.is_string()) {
    req.inputs.emplace_back();
    if (!ReadString(v, "input", req.inputs.back(), err)) return false;
    req.prompt_text = req.inputs.back();
    return true;
  }
  simdjson::dom::array arr;
  if (v.get_array().get(arr)) return WrongType(err, "input", kShape);
  if (arr.size() == 0) return Fail(err, "'input' must not be empty", "input");
  element first = arr.at(0).value_unsafe();
  if (first.is_int64() || first.is_uint64()) {
    req.input_token_ids.emplace_back();
    return ReadTokenIds(arr, "input", req.input_token_ids.back(), err);
  }
  size_t i = 0;
  for (element item : arr) {
    std::string param = "input[" + std::to_string(i) + "]";
    if (first.is_string()) {
      std::string_view text;
      if (item.get_string().get(text)) return WrongType(err, param, "a string");
      if (i > 0) req.prompt_text.push_back('\n');
      req.prompt_text.append(text);
      req.inputs.emplace_back(text);
    } else {
      simdjson::dom::array ids;
      if (item.get_array().get(ids)) return WrongType(err, "input", kShape);
      if (ids.size() == 0) return Fail(err, "'" + param + "' must not be empty", param);
      req.input_token_ids.emplace_back();
      if (!ReadTokenIds(ids, param, req.input_token_ids.back(), err)) return false;
    }
    ++i;
  }
  return true;
}

// One Responses message's content: a string, null, or parts whose text is joined by "\n".
bool ReadResponseContent(element content, const std::string& param, std::string& out,
                         ApiError& err) {
  if (content.is_null()) return true;
  if (content.is_string()) {
    out.append(content.get_string().value_unsafe());
    return true;
  }
  simdjson::dom::array parts;
  if (content.get_array().get(parts)) {
    return WrongType(err, param, "a string or an array of content parts");
  }
  size_t j = 0;
  for (element part : parts) {
    const std::string pp = param + "[" + std::to_string(j) + "]";
    simdjson::dom::object obj;
    if (part.get_object().get(obj)) return WrongType(err, pp, "an object");
    std::string_view type;
    if (obj["type"].get_string().get(type)) return WrongType(err, pp + ".type", "a string");
    if (type != "input_text" && type != "output_text" && type != "text") {
      return Fail(err,
                  "unsupported content part type '" + std::string(type) +
                      "'; only input_text and output_text parts are supported",
                  pp + ".type");
    }
    std::string_view text;
    if (obj["text"].get_string().get(text)) return WrongType(err, pp + ".text", "a string");
    if (j > 0) out.push_back('\n');
    out.append(text);
    ++j;
  }
  return true;
}

// Responses' `input` as (role, text) messages: a string is one user message.
bool ReadResponsesInput(element v, std::vector<std::pair<std::string, std::string>>& msgs,
                        ApiError& err) {
  msgs.clear();
  if (v.is_string()) {
    msgs.emplace_back("user", std::string(v.get_string().value_unsafe()));
    return true;
  }
  simdjson::dom::array arr;
  if (v.get_array().get(arr)) return WrongType(err, "input", "a string or an array of items");
  size_t i = 0;
  for (element item : arr) {
    const std::string param = "input[" + std::to_string(i++) + "]";
    simdjson::dom::object obj;
    if (item.get_object().get(obj)) return WrongType(err, param, "an object");
    std::string_view type = "message";
    element type_el;
    if (obj["type"].get(type_el) == simdjson::SUCCESS && !type_el.is_null() &&
        type_el.get_string().get(type)) {
      return WrongType(err, param + ".type", "a string");
    }
    if (type != "message") continue;  // tool calls, their outputs, reasoning: not text
    std::string_view role;
    element role_el;
    if (obj["role"].get(role_el)) {
      return Fail(err, "Missing required field '" + param + ".role'", param + ".role");
    }
    if (role_el.get_string().get(role)) return WrongType(err, param + ".role", "a string");
    msgs.emplace_back(std::string(role), std::string());
    element content;
    if (obj["content"].get(content) == simdjson::SUCCESS &&
        !ReadResponseContent(content, param + ".content", msgs.back().second, err)) {
      return false;
    }
  }
  if (msgs.empty()) return Fail(err, "'input' holds no message", "input");
  return true;
}

ParseResult ParseImpl(Endpoint endpoint, std::string_view body, bool padded) {
  // One parser per thread: simdjson parsers are not thread-safe, and reusing one keeps
  // its buffers warm so steady-state parsing allocates nothing inside simdjson.
  thread_local simdjson::dom::parser parser;
  ParseResult result;
  element root;
  if (auto ec = parser.parse(body.data(), body.size(), /*realloc_if_needed=*/!padded).get(root)) {
    result.error =
        MakeError(400, std::string("Invalid JSON body: ") + simdjson::error_message(ec));
    return result;
  }
  simdjson::dom::object obj;
  if (root.get_object().get(obj)) {
    result.error = MakeError(400, "Request body must be a JSON object");
    return result;
  }

  ParsedRequest req;
  req.endpoint = endpoint;
  ApiError& err = result.error;
  const bool chat = endpoint == Endpoint::kChatCompletions;
  const bool completions = endpoint == Endpoint::kCompletions;
  const bool embeddings = endpoint == Endpoint::kEmbeddings;
  const bool responses = endpoint == Endpoint::kResponses;
  std::vector<std::pair<std::string, std::string>> messages;  // responses
  std::optional<std::string> instructions;                    // responses
  bool have_model = false;
  bool have_input = false;
  std::optional<int64_t> max_tokens;
  std::optional<int64_t> max_completion_tokens;

  // One pass over the fields; a repeated key overwrites the earlier one.
  for (auto [key, value] : obj) {
    if (key == "model") {
      if (!ReadString(value, "model", req.model, err)) return result;
      have_model = true;
    } else if (completions && key == "prompt") {
      req.prompt_text.clear();
      if (!ReadPrompt(value, req.prompt_text, err)) return result;
      have_input = true;
    } else if (chat && key == "messages") {
      req.prompt_text.clear();
      if (!ReadMessages(value, req.prompt_text, err)) return result;
      have_input = true;
    } else if (embeddings && key == "input") {
      if (!ReadEmbeddingInput(value, req, err)) return result;
      have_input = true;
    } else if (responses && key == "input") {
      if (!ReadResponsesInput(value, messages, err)) return result;
      have_input = true;
    } else if (value.is_null()) {
      continue;  // optional fields: null means "not set"
    } else if (key == "stream") {
      if (!ReadBool(value, "stream", req.stream, err)) return result;
    } else if (key == "stream_options") {
      if (!ReadStreamOptions(value, req, err)) return result;
    } else if (embeddings && key == "encoding_format") {
      std::string_view f;
      if (value.get_string().get(f) || (f != "float" && f != "base64")) {
        Fail(err, "'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
        return result;
      }
      req.base64 = f == "base64";
    } else if (embeddings && key == "dimensions") {
      std::optional<int64_t> d;
      if (!ReadNonNegativeInt(value, "dimensions", d, err)) return result;
      if (*d == 0) {
        Fail(err, "'dimensions' must be a positive integer", "dimensions");
        return result;
      }
      req.dimensions = d;
    } else if (responses && key == "instructions") {
      if (!ReadString(value, "instructions", instructions.emplace(), err)) return result;
    } else if (responses && key == "max_output_tokens") {
      if (!ReadNonNegativeInt(value, "max_output_tokens", max_tokens, err)) return result;
    } else if (embeddings || responses) {
      if (key == "priority") {
        if (!ReadInt(value, "priority", req.priority, err)) return result;
      } else if (key == "cache_salt") {
        if (!ReadString(value, "cache_salt", req.cache_salt, err)) return result;
      } else if (responses && key == "stream") {
        if (!ReadBool(value, "stream", req.stream, err)) return result;
      }
      continue;  // the generation extras below are not theirs
    } else if (key == "max_tokens") {
      if (!ReadNonNegativeInt(value, "max_tokens", max_tokens, err)) return result;
    } else if (chat && key == "max_completion_tokens") {
      if (!ReadNonNegativeInt(value, "max_completion_tokens", max_completion_tokens, err)) {
        return result;
      }
    } else if (key == "cache_salt") {
      if (!ReadString(value, "cache_salt", req.cache_salt, err)) return result;
    } else if (key == "priority") {
      if (!ReadInt(value, "priority", req.priority, err)) return result;
    } else if (key == "ignore_eos") {
      if (!ReadBool(value, "ignore_eos", req.ignore_eos, err)) return result;
    } else if (key == "add_special_tokens") {
      bool add = false;
      if (!ReadBool(value, "add_special_tokens", add, err)) return result;
      req.add_special_tokens = add;
    } else if (key == "kv_transfer_params") {
      if (!ReadKvTransferParams(value, req, err)) return result;
    }
  }
  if (!have_model) {
    Fail(err, "Missing required field 'model'", "model");
    return result;
  }
  if (!have_input) {
    const char* field = chat ? "messages" : completions ? "prompt" : "input";
    Fail(err, std::string("Missing required field '") + field + "'", field);
    return result;
  }
  req.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (embeddings) req.stream = req.include_usage = false;  // answered whole
  if (responses) {
    req.prompt_text.clear();
    if (instructions) AppendChatMessage(req.prompt_text, "system", *instructions);
    for (const auto& [role, text] : messages) AppendChatMessage(req.prompt_text, role, text);
    AppendChatGenerationPrompt(req.prompt_text);
  }
  result.request = std::move(req);
  return result;
}

}  // namespace

std::string_view EndpointPath(Endpoint e) {
  static constexpr EnumName<Endpoint> kNames[] = {
      {Endpoint::kCompletions, "/v1/completions"},
      {Endpoint::kChatCompletions, "/v1/chat/completions"},
      {Endpoint::kEmbeddings, "/v1/embeddings"},
      {Endpoint::kResponses, "/v1/responses"}};
  return NameOf(kNames, e, "");
}

RoutingFields ScanRoutingFields(std::string_view body) {
  RoutingFields out;
  thread_local simdjson::dom::parser parser;
  element root;
  simdjson::dom::object obj;
  if (parser.parse(body.data(), body.size(), /*realloc_if_needed=*/true).get(root) ||
      root.get_object().get(obj)) {
    return out;
  }
  out.json = true;
  for (auto [key, value] : obj) {  // a repeated key: the last one, as ParseRequest reads it
    std::string_view model;
    if (key == "model") out.model = value.get_string().get(model) == simdjson::SUCCESS ? model : "";
  }
  static constexpr std::string_view kTextFields[] = {"prompt", "input", "query", "text_1", "text"};
  for (std::string_view field : kTextFields) {
    element v;
    if (obj[field].get(v)) continue;
    std::string_view text;
    if (v.get_string().get(text) == simdjson::SUCCESS) {
      out.prompt_text = text;
      return out;
    }
    simdjson::dom::array arr;
    if (v.get_array().get(arr) == simdjson::SUCCESS) {
      bool any = false;
      for (element item : arr) {
        if (item.get_string().get(text)) break;
        if (any) out.prompt_text.push_back('\n');
        out.prompt_text.append(text);
        any = true;
      }
      if (any) return out;
    }
  }
  element messages;
  if (obj["messages"].get(messages) == simdjson::SUCCESS) {
    ApiError ignored;
    if (!ReadMessages(messages, out.prompt_text, ignored)) out.prompt_text.clear();
  }
  return out;
}

ParseResult ParseRequest(Endpoint endpoint, std::string_view body) {
  return ParseImpl(endpoint, body, /*padded=*/false);
}

ParseResult ParseRequestPadded(Endpoint endpoint, std::string_view body) {
  return ParseImpl(endpoint, body, /*padded=*/true);
}

std::optional<ApiError> ParseSloHeaders(std::string_view ttft_ms, std::string_view ttft_ms_old,
                                        std::string_view tpot_ms, std::string_view tpot_ms_old,
                                        ParsedRequest* out) {
  auto one = [](std::string_view v, std::string_view old, std::string_view name,
                std::string_view old_name, double* seconds) -> std::optional<ApiError> {
    const std::string_view value = !v.empty() ? v : old;
    const std::string_view header = !v.empty() ? name : old_name;
    if (value.empty()) return std::nullopt;
    double ms = 0.0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
    if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(ms) || ms <= 0) {
      // Echo at most 64 bytes, printable ASCII only: a header may carry any byte, and the
      // error body must stay valid JSON (UTF-8).
      std::string shown;
      for (char c : value.substr(0, 64)) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
      return MakeError(400, "Header " + std::string(header) +
                                " must be a positive number of milliseconds, got '" + shown + "'.",
                       std::string(header));
    }
    *seconds = ms / 1000.0;
    return std::nullopt;
  };
  if (auto e = one(ttft_ms, ttft_ms_old, kSloTtftHeader, kSloTtftHeaderOld, &out->slo_ttft_s)) return e;
  return one(tpot_ms, tpot_ms_old, kSloTpotHeader, kSloTpotHeaderOld, &out->slo_tpot_s);
}

}  // namespace kvroute::api
