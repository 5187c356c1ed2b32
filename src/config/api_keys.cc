#include "config/api_keys.h"

#include <map>
#include <utility>

namespace kvroute::config {

namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

bool IsNameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '.' || c == '-';
}

// Printable ASCII without the space: what a bearer token may hold here (RFC 6750's
// b64token is narrower; vLLM accepts whatever follows "Bearer ").
bool IsKeyChar(char c) { return c > ' ' && c < 0x7f; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsBlank(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsBlank(s.back())) s.remove_suffix(1);
  return s;
}

ConfigError Error(std::string_view file, int line, std::string message) {
  ConfigError e;
  e.file = std::string(file);
  e.line = line;
  e.field = "api_keys";
  e.message = std::move(message);
  return e;
}

}  // namespace

ConfigOr<std::vector<ApiKeyEntry>> ParseApiKeys(std::string_view text, std::string_view filename) {
  ConfigOr<std::vector<ApiKeyEntry>> out;
  std::vector<ApiKeyEntry> entries;
  std::map<std::string_view, int> by_key, by_name;  // views of `text` / entries: line
  int line = 0;
  while (!text.empty()) {
    ++line;
    const std::size_t nl = text.find('\n');
    std::string_view raw = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    std::string_view rest = Trim(raw);
    if (rest.empty() || rest.front() == '#') continue;
    std::string_view fields[3];
    int n = 0;
    while (!rest.empty() && n < 3) {
      std::size_t end = 0;
      while (end < rest.size() && !IsBlank(rest[end])) ++end;
      fields[n++] = rest.substr(0, end);
      rest = Trim(rest.substr(end));
    }
    if (n == 3) {
      out.error = Error(filename, line, "expected KEY or NAME KEY, got more than two fields");
      return out;
    }
    const std::string_view key = fields[n - 1];
    if (key.size() > kMaxApiKeyBytes) {
      out.error = Error(filename, line, "key longer than " + std::to_string(kMaxApiKeyBytes) + " bytes");
      return out;
    }
    for (char c : key) {
      if (!IsKeyChar(c)) {
        out.error = Error(filename, line, "key holds a character that is not printable ASCII");
        return out;
      }
    }
    ApiKeyEntry e;
    e.line = line;
    if (n == 2) {
      const std::string_view name = fields[0];
      bool ok = name.size() <= kMaxApiKeyNameBytes;
      for (char c : name) ok = ok && IsNameChar(c);
      if (!ok) {
        out.error = Error(filename, line,
                          "bad key name (1-64 of A-Z a-z 0-9 _ . -; the key itself comes second)");
        return out;
      }
      e.name = std::string(name);
    } else {
      e.name = "line-" + std::to_string(line);
    }
    e.key = std::string(key);
    if (auto it = by_key.find(key); it != by_key.end()) {
      out.error = Error(filename, line, "duplicate key (the same key as line " +
                                            std::to_string(it->second) + ")");
      return out;
    }
    by_key.emplace(key, line);
    entries.push_back(std::move(e));
  }
  for (const ApiKeyEntry& e : entries) {
    if (auto [it, fresh] = by_name.emplace(e.name, e.line); !fresh) {
      out.error = Error(filename, e.line, "duplicate key name '" + e.name + "' (also on line " +
                                              std::to_string(it->second) + ")");
      return out;
    }
  }
  if (entries.empty()) {
    out.error = Error(filename, 0, "no API key in the file (auth is configured: nobody could be let in)");
    return out;
  }
  out.value = std::move(entries);
  return out;
}

ConfigOr<std::string> ParseUpstreamApiKey(std::string_view text, std::string_view filename) {
  ConfigOr<std::string> out;
  int line = 0;
  while (!text.empty()) {
    ++line;
    const std::size_t nl = text.find('\n');
    std::string_view raw = Trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (raw.empty()) continue;
    for (char c : raw) {
      if (static_cast<unsigned char>(c) < ' ' ? c != '\t' : c == 0x7f) {
        out.error = Error(filename, line, "the upstream key holds a control character");
        out.error.field = "upstream_api_key";
        return out;
      }
    }
    out.value = std::string(raw);
    return out;
  }
  out.error = Error(filename, 0, "no key in the file (its first non-empty line is sent)");
  out.error.field = "upstream_api_key";
  return out;
}

}  // namespace kvroute::config
