// A scan for one integer field in JSON bytes a front end relays without parsing them (the
// usage of an answer, whole or in its final stream chunk).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
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

}  // namespace kvroute::api
