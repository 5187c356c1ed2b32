// Scans of JSON bytes a front end relays without parsing them: one integer field, the
// usage of an answer (whole or in its final stream chunk), the choice chunks of a stream.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvroute::api {

// The integer after the first `key` (written with its quotes, e.g. "\"cached_tokens\"") in
// `text`, skipping quotes, spaces, tabs and the colon between; -1 when the key is absent
// or no integer follows.
inline int64_t IntAfterKey(std::string_view text, std::string_view key) {
  std::size_t at = text.find(key);
  if (at == std::string_view::npos) return -1;
  at += key.size();
  while (at < text.size() && (text[at] == '"' || text[at] == ' ' || text[at] == ':' || text[at] == '\t')) ++at;
  int64_t v = -1;
  auto [ptr, ec] = std::from_chars(text.data() + at, text.data() + text.size(), v);
  if (ec != std::errc()) return -1;
  return v;
}

// Counts the chunks of a streamed completion that carry a choice (`"choices":[{`, as vLLM
// and kvroute sim write them, without spaces), across reads that split a chunk anywhere.
// A usage-only final chunk (`"choices":[]`) is not counted; vLLM's role-only first chat
// chunk is (one chunk more than tokens: the approximation llm-d's TPOT sample makes too).
// Each chunk is usually one token; the latency model takes TPOT as (end - first token) /
// (chunks - 1).
class ChoiceChunkCounter {
 public:
  static constexpr std::string_view kMark = "\"choices\":[{";
  void Feed(std::string_view data) {
    // Marks that straddle the previous read: the carried tail plus this read's head.
    if (carry_len_ > 0) {
      char joined[2 * kMark.size()];
      const std::size_t head = std::min(data.size(), kMark.size() - 1);
      std::copy(carry_, carry_ + carry_len_, joined);
      std::copy(data.data(), data.data() + head, joined + carry_len_);
      const std::string_view j(joined, carry_len_ + head);
      // Only matches that begin in the carry (the rest are found in `data` below).
      for (std::size_t at = j.find(kMark); at != std::string_view::npos && at < carry_len_;
           at = j.find(kMark, at + 1)) {
        ++chunks_;
      }
    }
    for (std::size_t at = data.find(kMark); at != std::string_view::npos;
         at = data.find(kMark, at + 1)) {
      ++chunks_;
    }
    // Keep the last kMark.size() - 1 bytes seen (from the carry when this read is short).
    const std::size_t keep = kMark.size() - 1;
    if (data.size() >= keep) {
      std::copy(data.end() - keep, data.end(), carry_);
      carry_len_ = keep;
    } else {
      const std::size_t from_carry = std::min(carry_len_, keep - data.size());
      std::copy(carry_ + carry_len_ - from_carry, carry_ + carry_len_, carry_);
      std::copy(data.begin(), data.end(), carry_ + from_carry);
      carry_len_ = from_carry + data.size();
    }
  }
  int64_t chunks() const { return chunks_; }
  void Reset() { *this = ChoiceChunkCounter{}; }

 private:
  char carry_[kMark.size()] = {};
  std::size_t carry_len_ = 0;
  int64_t chunks_ = 0;
};

// The usage a response body reports in its last "usage" object (the final SSE chunk of a
// stream, or a JSON body). Fields are -1 when absent.
struct Usage {
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens
};
inline Usage FindUsage(std::string_view body_tail) {
  Usage u;
  const std::size_t at = body_tail.rfind("\"usage\"");
  if (at == std::string_view::npos) return u;
  std::string_view rest = body_tail.substr(at);
  const std::size_t end = rest.find('}');
  if (end != std::string_view::npos) rest = rest.substr(0, end);
  u.prompt_tokens = IntAfterKey(rest, "\"prompt_tokens\"");
  u.completion_tokens = IntAfterKey(rest, "\"completion_tokens\"");
  // Nested (prompt_tokens_details): past the first '}' the cut above stops at.
  u.cached_tokens = IntAfterKey(body_tail.substr(at), "\"cached_tokens\"");
  return u;
}

// The last kSize bytes of a relayed response, where its usage is (FindUsage).
class ResponseTail {
 public:
  static constexpr std::size_t kSize = 8192;
  void Feed(std::string_view chunk) {
    if (chunk.size() >= kSize) {
      tail_.assign(chunk.substr(chunk.size() - kSize));
      return;
    }
    if (tail_.size() + chunk.size() > kSize) tail_.erase(0, tail_.size() + chunk.size() - kSize);
    tail_.append(chunk);
  }
  std::string_view view() const { return tail_; }
  void Clear() { tail_.clear(); }

 private:
  std::string tail_;
};

}  // namespace kvroute::api
