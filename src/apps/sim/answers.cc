#include "apps/sim/answers.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "core/api/openai.h"
#include "core/common/base64.h"

namespace kvroute::sim::answers {

namespace {

// splitmix64's finaliser: a well-mixed 64-bit value from any 64-bit input.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void AppendFloat(std::string& out, float v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, ec == std::errc() ? end : buf);
}

std::string_view Status(const Response& r) {
  if (r.finish_reason.empty()) return "in_progress";
  return r.finish_reason == "length" ? "incomplete" : "completed";
}

// {"id":msg_id,"type":"message","status":..,"role":"assistant","content":[part]} with the
// part's text `text` (no part when `with_part` is false).
void AppendMessage(std::string& out, const Response& r, std::string_view status, bool with_part,
                   std::string_view text) {
  out += "{\"id\":\"";
  out += r.msg_id;
  out += "\",\"type\":\"message\",\"status\":\"";
  out += status;
  out += "\",\"role\":\"assistant\",\"content\":[";
  if (with_part) {
    out += "{\"type\":\"output_text\",\"text\":";
    api::AppendJsonString(out, text);
    out += ",\"annotations\":[]}";
  }
  out += "]}";
}

void AppendPart(std::string& out, std::string_view text) {
  out += "{\"type\":\"output_text\",\"text\":";
  api::AppendJsonString(out, text);
  out += ",\"annotations\":[]}";
}

// "event: <type>\ndata: {"type":"<type>","sequence_number":N" (the caller closes it).
void OpenEvent(std::string& out, std::string_view type, int64_t& seq) {
  out += "event: ";
  out += type;
  out += "\ndata: {\"type\":\"";
  out += type;
  out += "\",\"sequence_number\":";
  out += std::to_string(seq++);
}

void AppendItemRef(std::string& out, const Response& r, bool content_index) {
  out += ",\"item_id\":\"";
  out += r.msg_id;
  out += "\",\"output_index\":0";
  if (content_index) out += ",\"content_index\":0";
}

}  // namespace

void EmbeddingVector(std::span<const uint32_t> tokens, std::size_t dims, std::vector<float>& out) {
  out.assign(dims, 0.0f);
  uint64_t h = 0x6a09e667f3bcc908ull;
  for (uint32_t t : tokens) h = Mix(h ^ t);
  double norm = 0.0;
  for (std::size_t j = 0; j < dims; ++j) {
    // Uniform in [-1, 1) from the top 53 bits.
    const double u = static_cast<double>(Mix(h + j) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
    out[j] = static_cast<float>(u);
    norm += u * u;
  }
  norm = std::sqrt(norm);
  if (norm > 0) {
    for (float& x : out) x = static_cast<float>(x / norm);
  }
}

std::string Base64(std::string_view bytes) { return EncodeBase64(bytes); }

std::string EmbeddingsBody(std::string_view id, int64_t created, std::string_view model_json,
                           std::span<const std::vector<uint32_t>> inputs, std::size_t dims,
                           bool base64, int64_t prompt_tokens) {
  std::string out;
  out.reserve(128 + inputs.size() * (base64 ? dims * 4 * 4 / 3 + 64 : dims * 12 + 64));
  out += "{\"id\":\"";
  out += id;
  out += "\",\"object\":\"list\",\"created\":";
  out += std::to_string(created);
  out += ",\"model\":";
  out += model_json;
  out += ",\"data\":[";
  std::vector<float> v;
  std::string raw;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    EmbeddingVector(inputs[i], dims, v);
    if (i > 0) out += ',';
    out += "{\"index\":";
    out += std::to_string(i);
    out += ",\"object\":\"embedding\",\"embedding\":";
    if (base64) {
      raw.resize(v.size() * 4);
      for (std::size_t j = 0; j < v.size(); ++j) {
        uint32_t bits = 0;
        std::memcpy(&bits, &v[j], 4);
        for (int b = 0; b < 4; ++b) raw[j * 4 + b] = static_cast<char>((bits >> (8 * b)) & 0xff);
      }
      out += '"';
      out += Base64(raw);
      out += '"';
    } else {
      out += '[';
      for (std::size_t j = 0; j < v.size(); ++j) {
        if (j > 0) out += ',';
        AppendFloat(out, v[j]);
      }
      out += ']';
    }
    out += '}';
  }
  out += "],\"usage\":{\"prompt_tokens\":";
  out += std::to_string(prompt_tokens);
  out += ",\"total_tokens\":";
  out += std::to_string(prompt_tokens);
  out += ",\"completion_tokens\":0,\"prompt_tokens_details\":null}}";
  return out;
}

std::string ResponseObject(const Response& r, bool with_output) {
  const std::string_view status = Status(r);
  std::string out;
  out.reserve(512 + r.text.size());
  out += "{\"id\":\"";
  out += r.id;
  out += "\",\"object\":\"response\",\"created_at\":";
  out += std::to_string(r.created);
  out += ",\"status\":\"";
  out += status;
  out += "\",\"error\":null,\"incomplete_details\":";
  out += status == "incomplete" ? "{\"reason\":\"max_output_tokens\"}" : "null";
  out += ",\"instructions\":null,\"max_output_tokens\":";
  out += r.max_output_tokens >= 0 ? std::to_string(r.max_output_tokens) : "null";
  out += ",\"model\":";
  out += r.model_json;
  out += ",\"output\":[";
  if (with_output) AppendMessage(out, r, status == "in_progress" ? "in_progress" : "completed", true, r.text);
  out += "],\"parallel_tool_calls\":true,\"previous_response_id\":null,"
         "\"reasoning\":null,\"store\":false,\"temperature\":1.0,"
         "\"text\":{\"format\":{\"type\":\"text\"}},\"tool_choice\":\"auto\",\"tools\":[],"
         "\"top_p\":1.0,\"truncation\":\"disabled\",\"metadata\":{},\"usage\":";
  if (status == "in_progress") {
    out += "null";
  } else {
    out += "{\"input_tokens\":";
    out += std::to_string(r.input_tokens);
    out += ",\"input_tokens_details\":{\"cached_tokens\":";
    out += std::to_string(r.cached_tokens);
    out += "},\"output_tokens\":";
    out += std::to_string(r.output_tokens);
    out += ",\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":";
    out += std::to_string(r.input_tokens + r.output_tokens);
    out += '}';
  }
  out += '}';
  return out;
}

void AppendResponseStart(std::string& out, const Response& r, int64_t& seq) {
  for (std::string_view type : {"response.created", "response.in_progress"}) {
    OpenEvent(out, type, seq);
    out += ",\"response\":";
    out += ResponseObject(r, false);
    out += "}\n\n";
  }
  OpenEvent(out, "response.output_item.added", seq);
  out += ",\"output_index\":0,\"item\":";
  AppendMessage(out, r, "in_progress", false, {});
  out += "}\n\n";
  OpenEvent(out, "response.content_part.added", seq);
  AppendItemRef(out, r, true);
  out += ",\"part\":";
  AppendPart(out, {});
  out += "}\n\n";
}

void AppendResponseDelta(std::string& out, const Response& r, std::string_view delta, int64_t& seq) {
  OpenEvent(out, "response.output_text.delta", seq);
  AppendItemRef(out, r, true);
  out += ",\"delta\":";
  api::AppendJsonString(out, delta);
  out += ",\"logprobs\":[]}\n\n";
}

void AppendResponseEnd(std::string& out, const Response& r, int64_t& seq) {
  OpenEvent(out, "response.output_text.done", seq);
  AppendItemRef(out, r, true);
  out += ",\"text\":";
  api::AppendJsonString(out, r.text);
  out += ",\"logprobs\":[]}\n\n";
  OpenEvent(out, "response.content_part.done", seq);
  AppendItemRef(out, r, true);
  out += ",\"part\":";
  AppendPart(out, r.text);
  out += "}\n\n";
  OpenEvent(out, "response.output_item.done", seq);
  out += ",\"output_index\":0,\"item\":";
  AppendMessage(out, r, "completed", true, r.text);
  out += "}\n\n";
  OpenEvent(out, Status(r) == "incomplete" ? "response.incomplete" : "response.completed", seq);
  out += ",\"response\":";
  out += ResponseObject(r, true);
  out += "}\n\n";
}

}  // namespace kvroute::sim::answers
