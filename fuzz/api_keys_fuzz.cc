// Fuzz target: an API keys file (auth.api_keys_file) through ParseApiKeys and the same
// bytes as an upstream key file through ParseUpstreamApiKey: what `kvroute serve` parses
// at start, at every change the watch sees and on SIGHUP.
//
// Invariants: an error names the file and a line or field, with a message, and never
// holds a key the input would have given (a message quotes names and line numbers
// only); a list that loads is not empty, every entry has a valid name, a key of printable
// ASCII without spaces, a line within the input, and no two entries share a key or a
// name; an upstream key is non-empty, trimmed and free of control characters and
// newlines.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "config/api_keys.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvroute;
  using fuzz::Check;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kFile = "keys.txt";
  std::size_t lines = 1;
  for (char c : text) lines += c == '\n';

  const config::ConfigOr<std::vector<config::ApiKeyEntry>> r = config::ParseApiKeys(text, kFile);
  if (!r.ok()) {
    fuzz::CheckConfigError(r.error, kFile);
    Check(r.error.line >= 0 && static_cast<std::size_t>(r.error.line) <= lines, "error line past the input");
  } else {
    Check(!r.value->empty(), "an empty key list loaded");
    std::set<std::string> keys, names;
    for (const config::ApiKeyEntry& e : *r.value) {
      Check(e.line >= 1 && static_cast<std::size_t>(e.line) <= lines, "entry line past the input");
      Check(!e.name.empty() && e.name.size() <= config::kMaxApiKeyNameBytes, "bad name length");
      for (char c : e.name) {
        Check((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                  c == '.' || c == '-',
              "name character outside [A-Za-z0-9_.-]");
      }
      Check(!e.key.empty() && e.key.size() <= config::kMaxApiKeyBytes, "bad key length");
      for (char c : e.key) Check(c > ' ' && c < 0x7f, "key character outside printable ASCII");
      Check(e.key.front() != '#' || e.name != "line-" + std::to_string(e.line),
            "a comment line loaded as a key");
      Check(keys.insert(e.key).second, "duplicate key accepted");
      Check(names.insert(e.name).second, "duplicate name accepted");
    }
  }

  const config::ConfigOr<std::string> up = config::ParseUpstreamApiKey(text, "up.key");
  if (!up.ok()) {
    fuzz::CheckConfigError(up.error, "up.key");
  } else {
    const std::string& k = *up.value;
    Check(!k.empty(), "empty upstream key");
    Check(k.front() != ' ' && k.front() != '\t' && k.back() != ' ' && k.back() != '\t', "untrimmed upstream key");
    for (char c : k) {
      Check(c == '\t' || (static_cast<unsigned char>(c) >= ' ' && c != 0x7f), "control character in upstream key");
    }
  }
  return 0;
}
