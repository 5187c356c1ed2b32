#include "config/yaml_reader.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kvroute::config {

std::string ConfigError::ToString() const {
  std::string s = file;
  if (line > 0) {
    s += ':';
    s += std::to_string(line);
  }
  s += ": ";
  if (!field.empty()) {
    s += field;
    s += ": ";
  }
  s += message;
  return s;
}

std::optional<double> ParseDecimal(std::string_view s) {
  if (s.empty()) return std::nullopt;
  const char* first = s.data();
  if (*first == '+') ++first;
  double v = 0;
  auto [ptr, ec] = std::from_chars(first, s.data() + s.size(), v, std::chars_format::general);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

namespace {

struct Unit {
  std::string_view name;
  double scale;
};

// "<non-negative decimal><unit>" with `unit` one of `units` (or none: scale 1). The unit
// is the run of ASCII letters at the end. Returns the value times the unit's scale.
std::optional<double> ParseScaled(std::string_view s, std::span<const Unit> units) {
  size_t end = s.size();
  while (end > 0 && std::isalpha(static_cast<unsigned char>(s[end - 1]))) --end;
  const std::string_view unit = s.substr(end);
  double scale = 1.0;
  if (!unit.empty()) {
    const auto it =
        std::find_if(units.begin(), units.end(), [&](const Unit& u) { return u.name == unit; });
    if (it == units.end()) return std::nullopt;
    scale = it->scale;
  }
  const std::optional<double> v = ParseDecimal(s.substr(0, end));
  if (!v || *v < 0) return std::nullopt;
  return *v * scale;
}

}  // namespace

std::optional<double> ParseDuration(std::string_view s) {
  static constexpr Unit kUnits[] = {
      {"us", 1e-6}, {"ms", 1e-3}, {"s", 1.0}, {"m", 60.0}, {"h", 3600.0}};
  return ParseScaled(s, kUnits);
}

std::optional<uint64_t> ParseByteSize(std::string_view s) {
  static constexpr Unit kUnits[] = {{"B", 1},        {"KB", 1e3},      {"MB", 1e6},
                                    {"GB", 1e9},     {"KiB", 1 << 10}, {"MiB", 1 << 20},
                                    {"GiB", 1 << 30}};
  const std::optional<double> v = ParseScaled(s, kUnits);
  if (!v) return std::nullopt;
  const double bytes = *v;
  if (bytes != std::floor(bytes) || bytes > 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string Suggest(std::string_view name, std::span<const std::string_view> known) {
  // A near miss: at most one edit per three characters (so "foo" does not suggest "pool").
  std::string_view best;
  size_t best_d = std::max<size_t>(1, name.size() / 3) + 1;
  for (std::string_view k : known) {
    const size_t d = EditDistance(name, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  if (!best.empty()) return " (did you mean '" + std::string(best) + "'?)";
  std::string all;
  for (std::string_view k : known) all += (all.empty() ? "" : ", ") + std::string(k);
  return " (known: " + all + ")";
}

std::string Suggest(std::string_view name, std::initializer_list<std::string_view> known) {
  return Suggest(name, std::span<const std::string_view>(known.begin(), known.size()));
}

// The only code that builds nodes and the only place the load's exception is caught.
struct YamlAccess {
  // Carries a ConfigError from a getter or Fail() to ReadYaml; never leaves this layer.
  struct Abort {
    ConfigError error;
  };

  static int LineOf(const YAML::Node& n) {
    const YAML::Mark m = n.Mark();
    return m.is_null() || m.line < 0 ? 0 : m.line + 1;
  }

  static ConfigNode Make(std::shared_ptr<const std::string> file, const YAML::Node* node,
                         std::string field, std::string key, int fallback_line, int key_line) {
    ConfigNode c;
    c.file_ = std::move(file);
    c.field_ = std::move(field);
    c.key_ = std::move(key);
    c.present_ = node != nullptr;
    // A null value (`key:` with nothing) is positioned where the next token starts, often
    // a later line; its key's line is where the reader looks.
    int line = node != nullptr && !(node->IsNull() && key_line != 0) ? LineOf(*node) : 0;
    if (line == 0) line = fallback_line;
    c.line_ = line;
    c.key_line_ = key_line != 0 ? key_line : line;
    if (node != nullptr) c.node_ = std::make_shared<const YAML::Node>(*node);
    return c;
  }
};

namespace {

using Abort = YamlAccess::Abort;

std::string Join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

bool IsTrue(std::string_view s) { return s == "true" || s == "True" || s == "TRUE"; }
bool IsFalse(std::string_view s) { return s == "false" || s == "False" || s == "FALSE"; }

}  // namespace

bool ConfigNode::IsNull() const { return !node_ || node_->IsNull(); }
bool ConfigNode::IsScalar() const { return node_ && node_->IsScalar(); }
bool ConfigNode::IsMap() const { return node_ && node_->IsMap(); }
bool ConfigNode::IsList() const { return node_ && node_->IsSequence(); }
bool ConfigNode::IsPlain() const { return IsScalar() && node_->Tag() != "!"; }  // "!": quoted

void ConfigNode::Fail(std::string message) const { FailAt(line_, field_, std::move(message)); }

void ConfigNode::FailAt(int line, std::string field, std::string message) const {
  throw Abort{ConfigError{*file_, line, std::move(field), std::move(message)}};
}

std::vector<ConfigNode> ConfigNode::Entries() const {
  std::vector<ConfigNode> out;
  if (IsNull()) return out;
  if (!node_->IsMap())
    Fail(field_.empty() ? "the top level must be a mapping" : "must be a mapping");
  for (const auto& kv : *node_) {
    const int key_line = YamlAccess::LineOf(kv.first);
    if (!kv.first.IsScalar()) FailAt(key_line ? key_line : line_, field_, "keys must be strings");
    const std::string& key = kv.first.Scalar();
    for (const ConfigNode& seen : out) {
      if (seen.key_ == key) FailAt(key_line, Join(field_, key), "duplicate key '" + key + "'");
    }
    const YAML::Node value = kv.second;
    out.push_back(YamlAccess::Make(file_, &value, Join(field_, key), key, key_line, key_line));
  }
  return out;
}

void ConfigNode::CheckKeyIn(std::span<const std::string_view> allowed) const {
  if (std::find(allowed.begin(), allowed.end(), key_) != allowed.end()) return;
  FailAt(key_line_, field_, "unknown key '" + key_ + "'" + Suggest(key_, allowed));
}

void ConfigNode::CheckKeyIn(std::initializer_list<std::string_view> allowed) const {
  CheckKeyIn(std::span<const std::string_view>(allowed.begin(), allowed.size()));
}

void ConfigNode::CheckKeys(std::span<const std::string_view> allowed) const {
  for (const ConfigNode& v : Entries()) v.CheckKeyIn(allowed);
}

void ConfigNode::CheckKeys(std::initializer_list<std::string_view> allowed) const {
  CheckKeys(std::span<const std::string_view>(allowed.begin(), allowed.size()));
}

ConfigNode ConfigNode::Get(std::string_view key) const {
  if (!IsNull()) {
    if (!node_->IsMap())
      Fail(field_.empty() ? "the top level must be a mapping" : "must be a mapping");
    for (const auto& kv : *node_) {
      if (kv.first.IsScalar() && kv.first.Scalar() == key) {
        const int key_line = YamlAccess::LineOf(kv.first);
        const YAML::Node value = kv.second;
        return YamlAccess::Make(file_, &value, Join(field_, key), std::string(key), key_line,
                                key_line);
      }
    }
  }
  return YamlAccess::Make(file_, nullptr, Join(field_, key), std::string(key), line_, line_);
}

ConfigNode ConfigNode::Require(std::string_view key) const {
  ConfigNode n = Get(key);
  if (!n.present()) n.Fail("required");
  return n;
}

std::vector<ConfigNode> ConfigNode::Items(std::string_view what) const {
  std::vector<ConfigNode> out;
  if (IsNull()) return out;
  if (!node_->IsSequence()) Fail("must be " + std::string(what));
  out.reserve(node_->size());
  for (size_t i = 0; i < node_->size(); ++i) {
    const YAML::Node item = (*node_)[i];
    out.push_back(
        YamlAccess::Make(file_, &item, field_ + "[" + std::to_string(i) + "]", "", line_, 0));
  }
  return out;
}

const std::string& ConfigNode::ScalarText(std::string_view what) const {
  if (!present_) Fail("required");
  if (!IsScalar()) Fail("must be " + std::string(what));
  return node_->Scalar();
}

std::string ConfigNode::Scalar(std::string_view what) const { return ScalarText(what); }

std::string ConfigNode::String() const { return ScalarText("a string"); }

template <typename T>
T ConfigNode::WholeNumber(const std::string& s, std::string_view what) const {
  const char* first = s.data();
  const char* last = s.data() + s.size();
  if (first != last && *first == '+') ++first;
  T x = 0;
  auto [ptr, ec] = std::from_chars(first, last, x);
  if (!IsPlain() || first == last || ec != std::errc() || ptr != last) {
    Fail("must be " + std::string(what) + " (got '" + s + "')");
  }
  return x;
}

int64_t ConfigNode::Int(int64_t min, int64_t max) const {
  const std::string& s = ScalarText("an integer");
  const int64_t x = WholeNumber<int64_t>(s, "an integer");
  if (x < min) Fail("must be >= " + std::to_string(min) + " (got " + s + ")");
  if (x > max) Fail("must be <= " + std::to_string(max) + " (got " + s + ")");
  return x;
}

uint64_t ConfigNode::Uint(uint64_t max) const {
  const std::string& s = ScalarText("a non-negative integer");
  const uint64_t x = WholeNumber<uint64_t>(s, "a non-negative integer");
  if (x > max) Fail("must be <= " + std::to_string(max) + " (got " + s + ")");
  return x;
}

double ConfigNode::Float() const {
  const std::string& s = ScalarText("a number");
  if (IsPlain()) {
    if (s == ".inf" || s == "+.inf" || s == ".Inf" || s == "+.Inf" || s == ".INF") return HUGE_VAL;
    if (s == "-.inf" || s == "-.Inf" || s == "-.INF") return -HUGE_VAL;
    if (s == ".nan" || s == ".NaN" || s == ".NAN") return NAN;
    if (const std::optional<double> d = ParseDecimal(s)) return *d;
  }
  Fail("must be a number (got '" + s + "')");
}

double ConfigNode::Number() const {
  const double v = Float();
  if (!std::isfinite(v)) Fail("must be a finite number (got '" + node_->Scalar() + "')");
  return v;
}

bool ConfigNode::Bool() const {
  const std::string& s = ScalarText("true or false");
  if (IsPlain()) {
    if (IsTrue(s)) return true;
    if (IsFalse(s)) return false;
  }
  Fail("must be true or false (got '" + s + "')");
}

double ConfigNode::Duration() const {
  const std::string& s = ScalarText("a duration");
  const std::optional<double> d = ParseDuration(s);
  if (!d) Fail("must be a duration such as 50ms, 2s or 0.5 (seconds) (got '" + s + "')");
  if (*d <= 0) Fail("must be > 0 (got '" + s + "')");
  return *d;
}

uint64_t ConfigNode::ByteSize() const {
  const std::string& s = ScalarText("a size");
  const std::optional<uint64_t> b = ParseByteSize(s);
  if (!b) Fail("must be a size such as 16MiB, 64KiB or 1048576 (got '" + s + "')");
  if (*b == 0) Fail("must be > 0");
  return *b;
}

size_t ConfigNode::Choice(std::string_view what, const std::vector<std::string_view>& names,
                          const std::vector<bool>& listed) const {
  const std::string& s = ScalarText("a string");
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == s) return i;
  }
  std::vector<std::string_view> shown;
  for (size_t i = 0; i < names.size(); ++i) {
    if (listed[i]) shown.push_back(names[i]);
  }
  Fail("unknown " + std::string(what) + " '" + s + "'" + Suggest(s, shown));
}

std::optional<ConfigError> ReadYaml(std::string_view text, std::string_view file,
                                    const std::function<void(const ConfigNode& root)>& read) {
  auto name = std::make_shared<const std::string>(file);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    ConfigError err{*name, 0, "", "YAML syntax error: " + e.msg};
    if (!e.mark.is_null()) {
      err.line = e.mark.line + 1;
      err.message += " (column " + std::to_string(e.mark.column + 1) + ")";
    }
    return err;
  } catch (const std::exception& e) {
    return ConfigError{*name, 0, "", std::string("cannot parse: ") + e.what()};
  }
  try {
    read(YamlAccess::Make(name, &root, "", "", 0, 0));
    return std::nullopt;
  } catch (const YamlAccess::Abort& a) {
    return a.error;
  } catch (const std::exception& e) {
    return ConfigError{*name, 0, "", std::string("cannot load: ") + e.what()};
  }
}

ConfigOr<std::string> ReadConfigFile(const std::string& path) {
  ConfigOr<std::string> out;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    out.error = ConfigError{path, 0, "", std::string("cannot read file: ") + std::strerror(errno)};
    return out;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  out.value = ss.str();
  return out;
}

}  // namespace kvroute::config
