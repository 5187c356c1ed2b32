#include "core/api/pd_legs.h"

#include <simdjson.h>

#include <charconv>
#include <initializer_list>

#include "core/api/openai.h"
#include "core/api/raw_json.h"

namespace kvroute::api {
namespace {

struct Field {
  std::string_view key;  // unescaped (valid until the next field)
  std::string_view raw;
};

// Calls `fn(Field)` for each top-level field of the object `body`; false when `body` is
// not a JSON object.
template <typename Fn>
bool ForEachField(std::string_view body, Fn&& fn) {
  const simdjson::padded_string padded(body);
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  simdjson::ondemand::object obj;
  if (parser.iterate(padded).get(doc) || doc.get_object().get(obj)) return false;
  for (auto field : obj) {
    Field f;
    if (field.unescaped_key().get(f.key)) return false;
    simdjson::ondemand::value v;
    if (field.value().get(v) || RawJson(v, f.raw)) return false;
    fn(f);
  }
  // Nothing may follow the object (the on-demand parser stops at its closing brace): the
  // document's position is then past its last structural character.
  const char* rest = nullptr;
  return doc.current_location().get(rest) == simdjson::OUT_OF_BOUNDS;
}

void AppendField(std::string& out, bool& first, std::string_view key, std::string_view raw) {
  if (!first) out.push_back(',');
  first = false;
  AppendJsonString(out, key);  // keys with escapes are written escaped afresh
  out.push_back(':');
  out += raw;
}

bool IsOneOf(std::string_view k, std::initializer_list<std::string_view> names) {
  for (std::string_view n : names) {
    if (k == n) return true;
  }
  return false;
}

constexpr std::string_view kPrefillParams =
    "{\"do_remote_decode\":true,\"do_remote_prefill\":false,\"remote_engine_id\":null,"
    "\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null}";

}  // namespace

std::optional<std::string> BuildPrefillBody(std::string_view body) {
  std::string out;
  out.reserve(body.size() + kPrefillParams.size() + 96);
  out.push_back('{');
  bool first = true;
  bool had_max_completion = false;
  bool ok = ForEachField(body, [&](const Field& f) {
    if (f.key == "max_completion_tokens") had_max_completion = true;
    if (IsOneOf(f.key, {"stream", "stream_options", "min_tokens", "max_tokens",
                        "max_completion_tokens", "kv_transfer_params"})) {
      return;
    }
    AppendField(out, first, f.key, f.raw);
  });
  if (!ok) return std::nullopt;
  AppendField(out, first, "stream", "false");
  AppendField(out, first, "max_tokens", "1");
  if (had_max_completion) AppendField(out, first, "max_completion_tokens", "1");
  AppendField(out, first, "kv_transfer_params", kPrefillParams);
  out.push_back('}');
  return out;
}

std::optional<std::string> ReplaceModel(std::string_view body, std::string_view model) {
  std::string value;
  AppendJsonString(value, model);
  std::string out;
  out.reserve(body.size() + value.size() + 16);
  out.push_back('{');
  bool first = true;
  bool seen = false;
  const bool ok = ForEachField(body, [&](const Field& f) {
    if (f.key == "model") {
      if (!seen) AppendField(out, first, f.key, value);
      seen = true;
      return;
    }
    AppendField(out, first, f.key, f.raw);
  });
  if (!ok) return std::nullopt;
  if (!seen) {
    // At the front: the object is rebuilt with "model" first.
    std::string front = "{";
    bool f = true;
    AppendField(front, f, "model", value);
    if (out.size() > 1) front.push_back(',');
    front.append(out, 1);
    out = std::move(front);
  }
  out.push_back('}');
  return out;
}

std::optional<std::string> BuildDecodeBody(std::string_view body, std::string_view kv_raw) {
  std::string out;
  out.reserve(body.size() + kv_raw.size() + 32);
  out.push_back('{');
  bool first = true;
  bool ok = ForEachField(body, [&](const Field& f) {
    if (f.key != "kv_transfer_params") AppendField(out, first, f.key, f.raw);
  });
  if (!ok) return std::nullopt;
  AppendField(out, first, "kv_transfer_params", kv_raw);
  out.push_back('}');
  return out;
}

PrefillAnswer ReadPrefillAnswer(std::string_view body) {
  PrefillAnswer a;
  // The whole answer must be valid JSON (it is small: one token): the parameters go on
  // verbatim, and a broken answer must mean "prefill locally", not a broken decode leg.
  thread_local simdjson::dom::parser validator;
  simdjson::dom::element root;
  if (validator.parse(body.data(), body.size()).get(root)) return a;
  ForEachField(body, [&](const Field& f) {
    if (f.key == "kv_transfer_params") {
      a.kv_raw = f.raw == "null" ? std::string() : std::string(f.raw);
    } else if (f.key == "usage") {
      std::string_view u = f.raw;
      std::size_t at = u.find("\"cached_tokens\"");
      if (at == std::string_view::npos) return;
      at += 15;
      while (at < u.size() && (u[at] == ' ' || u[at] == ':' || u[at] == '\t' || u[at] == '\n')) ++at;
      int64_t v = -1;
      auto [ptr, ec] = std::from_chars(u.data() + at, u.data() + u.size(), v);
      if (ec == std::errc()) a.cached_tokens = v;
    }
  });
  return a;
}

int RewriteCachedTokens(std::string& text, int64_t value) {
  static constexpr std::string_view kKey = "\"cached_tokens\"";
  const std::string repl = std::to_string(value);
  int n = 0;
  std::size_t at = 0;
  while ((at = text.find(kKey, at)) != std::string::npos) {
    at += kKey.size();
    while (at < text.size() && (text[at] == ' ' || text[at] == ':' || text[at] == '\t')) ++at;
    std::size_t end = at;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end == at) continue;
    text.replace(at, end - at, repl);
    at += repl.size();
    ++n;
  }
  return n;
}

}  // namespace kvroute::api
