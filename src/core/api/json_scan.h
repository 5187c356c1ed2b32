// A scan for one integer field in JSON bytes a front end relays without parsing them (the
// usage of an answer, whole or in its final stream chunk).
#pragma once

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

}  // namespace kvroute::api
