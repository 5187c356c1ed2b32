// The API keys `kvroute serve` accepts (`auth.api_keys_file`) and the key it sends to the
// replicas (`auth.upstream_api_key_file`): text to validated values. Pure: no I/O, no
// clock (the router reads and watches the files; apps/serve/api_key_auth.h).
//
// Keys file: one entry per line; blank lines and lines whose first non-blank character
// is '#' are ignored. An entry is `KEY` or `NAME KEY` (spaces or tabs between):
//
//   # team keys
//   alice  sk-4f9a...             # not a comment: a third field is an error
//   sk-unnamed-one                # named line-3 (its line number)
//
// NAME is 1-64 of [A-Za-z0-9_.-]; KEY is any run of printable ASCII but space (at most
// 4096 bytes). Duplicate keys or names are errors, and so is a file with no entry (auth
// configured with no key would let nobody in: the router fails closed instead).
//
// Errors name the file and the line, never the key: "keys.txt:4: api_keys: duplicate key
// (the same key as line 2)".
//
// Thread: values only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/yaml_reader.h"

namespace kvroute::config {

struct ApiKeyEntry {
  std::string name;  // as written, or "line-N"
  std::string key;
  int line = 0;      // 1-based
  bool operator==(const ApiKeyEntry&) const = default;
};

inline constexpr std::size_t kMaxApiKeyNameBytes = 64;
inline constexpr std::size_t kMaxApiKeyBytes = 4096;

// Parses a keys file; `filename` names it in errors. Never throws.
ConfigOr<std::vector<ApiKeyEntry>> ParseApiKeys(std::string_view text, std::string_view filename);

// The replicas' key: the first non-empty line, trimmed of spaces, tabs and CR. An error
// (naming `filename`) when there is none or it holds a character a header value cannot
// carry (a control character).
ConfigOr<std::string> ParseUpstreamApiKey(std::string_view text, std::string_view filename);

}  // namespace kvroute::config
