#include "apps/bench/sse.h"

#include "core/common/lines.h"

namespace kvroute::bench {

bool SseSplitter::NextEvent(std::string_view* payload) {
  const std::string_view rest(buffer_.data() + pos_, buffer_.size() - pos_);
  // An event ends at the first empty line. Find "\n\n" or "\n\r\n".
  size_t end = std::string_view::npos;
  size_t next = 0;
  for (size_t i = rest.find('\n'); i != std::string_view::npos; i = rest.find('\n', i + 1)) {
    if (i + 1 < rest.size() && rest[i + 1] == '\n') {
      end = i + 1;
      next = i + 2;
      break;
    }
    if (i + 2 < rest.size() && rest[i + 1] == '\r' && rest[i + 2] == '\n') {
      end = i + 1;
      next = i + 3;
      break;
    }
  }
  if (end == std::string_view::npos) return false;
  const std::string_view event = rest.substr(0, end);
  pos_ += next;

  // Most events have exactly one data line: hand out a view into the buffer then; only a
  // multi-line event is joined into data_.
  std::string_view single;
  int data_lines = 0;
  Lines lines(event);
  std::string_view line;
  while (lines.Next(line)) {
    if (line.substr(0, 5) != "data:") continue;
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (data_lines == 0) {
      single = line;
    } else {
      if (data_lines == 1) data_.assign(single);
      data_.push_back('\n');
      data_.append(line);
    }
    ++data_lines;
  }
  if (data_lines == 0) return NextEvent(payload);  // a comment or field-only event
  *payload = data_lines == 1 ? single : std::string_view(data_);
  return true;
}

void SseSplitter::Compact() {
  if (pos_ == buffer_.size()) {
    buffer_.clear();
    pos_ = 0;
  } else if (pos_ > 4096 && pos_ * 2 > buffer_.size()) {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
}

namespace {

int64_t IntOr(simdjson::dom::element e, int64_t fallback) {
  int64_t v;
  if (e.get_int64().get(v) == simdjson::SUCCESS) return v;
  uint64_t u;
  if (e.get_uint64().get(u) == simdjson::SUCCESS) return static_cast<int64_t>(u);
  double d;
  if (e.get_double().get(d) == simdjson::SUCCESS) return static_cast<int64_t>(d);
  return fallback;
}

}  // namespace

StreamEvent StreamEventParser::Parse(std::string_view payload) {
  StreamEvent ev;
  if (payload == "[DONE]") {
    ev.kind = StreamEvent::Kind::kDone;
    return ev;
  }
  simdjson::dom::element root;
  if (parser_.parse(payload.data(), payload.size()).get(root) != simdjson::SUCCESS) return ev;
  simdjson::dom::object obj;
  if (root.get_object().get(obj) != simdjson::SUCCESS) return ev;

  simdjson::dom::object err;
  if (obj["error"].get_object().get(err) == simdjson::SUCCESS) {
    ev.kind = StreamEvent::Kind::kError;
    simdjson::dom::element code;
    if (err["code"].get(code) == simdjson::SUCCESS) ev.error_code = IntOr(code, 0);
    std::string_view msg;
    if (err["message"].get_string().get(msg) == simdjson::SUCCESS) ev.error_message = msg;
    return ev;
  }

  ev.kind = StreamEvent::Kind::kChunk;
  simdjson::dom::array choices;
  if (obj["choices"].get_array().get(choices) == simdjson::SUCCESS) {
    for (simdjson::dom::element choice : choices) {
      simdjson::dom::object c;
      if (choice.get_object().get(c) != simdjson::SUCCESS) continue;
      std::string_view text;
      if (c["text"].get_string().get(text) == simdjson::SUCCESS) {
        ev.text = text;
      } else {
        simdjson::dom::object delta;
        if (c["delta"].get_object().get(delta) == simdjson::SUCCESS &&
            delta["content"].get_string().get(text) == simdjson::SUCCESS) {
          ev.text = text;
        }
      }
      std::string_view reason;
      if (c["finish_reason"].get_string().get(reason) == simdjson::SUCCESS) ev.finished = true;
      break;  // one choice per request (n = 1)
    }
  }
  simdjson::dom::object usage;
  if (obj["usage"].get_object().get(usage) == simdjson::SUCCESS) {
    ev.has_usage = true;
    simdjson::dom::element v;
    if (usage["prompt_tokens"].get(v) == simdjson::SUCCESS) ev.prompt_tokens = IntOr(v, 0);
    if (usage["completion_tokens"].get(v) == simdjson::SUCCESS) {
      ev.completion_tokens = IntOr(v, 0);
    }
    simdjson::dom::object details;
    if (usage["prompt_tokens_details"].get_object().get(details) == simdjson::SUCCESS &&
        details["cached_tokens"].get(v) == simdjson::SUCCESS) {
      ev.cached_tokens = IntOr(v, -1);
    }
  }
  return ev;
}

}  // namespace kvroute::bench
