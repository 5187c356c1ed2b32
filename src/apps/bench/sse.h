// Reading an OpenAI-style streamed response (Server-Sent Events) as a load generator
// needs it: frames split out of arbitrarily cut body bytes, and each frame's JSON reduced
// to what a per-request record holds (generated text, usage, an error).
// No I/O; one object per request stream, used from one thread.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace kvroute::bench {

// Splits a text/event-stream body into the payloads of its `data:` fields. Events end
// at a blank line ("\n\n" or "\r\n\r\n"); several data lines of one event are joined with
// "\n"; other fields (event:, id:, comments) are ignored.
class SseSplitter {
 public:
  // Appends `bytes` and calls on_data(std::string_view payload) for every event
  // completed by them, in order. The view is valid during the call only.
  template <typename F>
  void Feed(std::string_view bytes, F&& on_data) {
    buffer_.append(bytes);
    std::string_view payload;
    while (NextEvent(&payload)) on_data(payload);
    Compact();
  }
  // Bytes received but not yet part of a complete event.
  size_t pending_bytes() const { return buffer_.size() - pos_; }
  void Reset() {
    buffer_.clear();
    pos_ = 0;
  }

 private:
  bool NextEvent(std::string_view* payload);
  void Compact();

  std::string buffer_;
  size_t pos_ = 0;     // start of the first incomplete event
  std::string data_;   // joined data lines of a multi-line event
};

// What one data payload of a completions/chat stream said.
struct StreamEvent {
  enum class Kind {
    kChunk,    // a completion chunk (may carry text and/or usage)
    kDone,     // "[DONE]"
    kError,    // {"error": {...}}
    kInvalid,  // not JSON, or not an object
  };
  Kind kind = Kind::kInvalid;
  std::string_view text;  // the chunk's generated text (choices[0].text or delta.content)
  bool finished = false;  // choices[0].finish_reason was a string
  bool has_usage = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens; -1 when absent
  int64_t error_code = 0;     // error.code when numeric
  std::string_view error_message;
};

// Parses stream payloads. Views in a returned event point into the parser's buffers and
// stay valid until the next Parse call. Reuses its buffers across calls.
class StreamEventParser {
 public:
  StreamEvent Parse(std::string_view payload);

 private:
  simdjson::dom::parser parser_;
};

}  // namespace kvroute::bench
