// The one YAML reading layer under every kvroute config format (router config, sim
// fleet files, simulate/bench scenarios): yaml-cpp below, typed and located values above.
//
// A loader is a function of the document's root ConfigNode. Each node knows its file, its
// 1-based line and its field path ("pool.endpoints[2].address"); its getters return typed
// values or stop the load with a ConfigError naming file, line and field:
//
//   ConfigOr<Limits> r = ParseYaml<Limits>(text, "router.yaml", [](const ConfigNode& root) {
//     root.CheckKeys({"max_body_bytes", "max_headers"});   // unknown keys: did-you-mean
//     Limits l;
//     if (ConfigNode n = root.Get("max_body_bytes")) l.max_body_bytes = n.ByteSize();
//     if (ConfigNode n = root.Get("max_headers")) l.max_headers = n.Int(1, 1 << 20);
//     return l;
//   });
//   // r.ok() ? *r.value : r.error.ToString() == "router.yaml:3: max_headers: must be >= 1 (got 0)"
//
// Errors are values: ParseYaml/ReadYaml return the first error and never throw. Inside a
// load, a failing getter or Fail() unwinds to ParseYaml (an exception private to this
// layer carries the error there), so loaders read straight-line and must not catch (...).
// YAML syntax errors become ConfigErrors with yaml-cpp's line and column. Loaders never
// see yaml-cpp: this header does not include it.
//
// Scalars, as every format reads them (plain = written without quotes):
//   String      any scalar (quoted or not)
//   Int/Uint    plain decimal integer, optional sign ("12", "-3"; not "0x10", "1e3", "12.0")
//   Number      plain finite decimal ("0.5", "1e-3", "7"); Float also takes .inf/.nan
//   Bool        plain true/false (also True/TRUE/False/FALSE)
//   Duration    ParseDuration ("50ms", "2s", "0.5"), > 0
//   ByteSize    ParseByteSize ("16MiB", "64KiB", "1048576"), > 0
//   Enum        one of a list of names; unknown names get a did-you-mean or the list
//
// Thread: values; a ConfigNode is used only inside the load that produced it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/common/status.h"

namespace YAML {
class Node;
}

namespace kvroute::config {

// Where a config is wrong and why.
struct ConfigError {
  std::string file;
  int line = 0;       // 1-based; 0 when the error is not tied to a line
  std::string field;  // e.g. "pool.endpoints[2].address"; empty for syntax errors
  std::string message;
  // "file:line: field: message" (parts that are empty are left out).
  std::string ToString() const;
};

// A loaded T, or the error that stopped the load; exactly one of the two. The one result
// of every config load (router config, endpoints file, fleet, scenario, kubeconfig):
//
//   ConfigOr<RouterConfig> r = LoadRouterConfig(path);
//   if (!r.ok()) return Fail(r.error.ToString());  // file, line, field and message
//   Use(*r.value);
//
// A failed load returns {std::nullopt, error}.
template <typename T>
struct ConfigOr {
  std::optional<T> value;
  ConfigError error;  // meaningful only when !ok()
  bool ok() const { return value.has_value(); }
  // The outcome in the tree's vocabulary (core/common/status.h): ok, or InvalidArgument
  // whose message is error.ToString().
  Status status() const { return ok() ? Status() : Status::InvalidArgument(error.ToString()); }
};

// "50ms", "2s", "1.5s", "250us", "1m", "1h", or a bare number of seconds. Returns seconds,
// nullopt when malformed or negative.
std::optional<double> ParseDuration(std::string_view s);

// "16MiB", "64KiB", "1GiB", "500KB", "2MB", "1024", "1024B". Returns bytes, nullopt when
// malformed or not a whole number of bytes.
std::optional<uint64_t> ParseByteSize(std::string_view s);

// A plain decimal (sign, digits, optional fraction/exponent). Nullopt for hex, inf, nan,
// empty or trailing text.
std::optional<double> ParseDecimal(std::string_view s);

// Levenshtein distance (insertions, deletions, substitutions).
size_t EditDistance(std::string_view a, std::string_view b);

// The hint after an unknown name: " (did you mean 'x'?)" when one of `known` is a near
// miss (at most one edit per three characters, at least one), else " (known: a, b, c)".
std::string Suggest(std::string_view name, std::span<const std::string_view> known);
std::string Suggest(std::string_view name, std::initializer_list<std::string_view> known);

class ConfigNode {
 public:
  // --- Where it is -------------------------------------------------------------------
  const std::string& file() const { return *file_; }
  // The field path: "" for the document, "a.b" for a mapping value, "a[2]" for a list item.
  const std::string& field() const { return field_; }
  // The value's line; the key's line when the value has no position of its own (`key:`
  // with nothing); the enclosing node's line for an absent key. 0 for an empty document.
  int line() const { return line_; }
  // For a mapping value: its key and the key's line. "" and line() otherwise.
  const std::string& key() const { return key_; }
  int key_line() const { return key_line_; }

  // --- What it is --------------------------------------------------------------------
  // False for a key the mapping does not have (Get); such a node is also IsNull().
  bool present() const { return present_; }
  explicit operator bool() const { return present_; }
  bool IsNull() const;    // absent, empty (`key:`), `~` or `null`
  bool IsScalar() const;  // a non-null scalar
  bool IsMap() const;
  bool IsList() const;
  bool IsPlain() const;  // a scalar written without quotes

  // --- Mappings ----------------------------------------------------------------------
  // A null node reads as an empty mapping; any other non-mapping fails "must be a
  // mapping" ("the top level must be a mapping" for the document). Keys must be scalars;
  // a repeated key fails "duplicate key 'k'" at its second occurrence.
  //
  // The values in file order; each knows its key().
  std::vector<ConfigNode> Entries() const;
  // Fails at the first key (in file order) not in `allowed`:
  // "unknown key 'scrape_intervl' (did you mean 'scrape_interval'?)".
  void CheckKeys(std::initializer_list<std::string_view> allowed) const;
  void CheckKeys(std::span<const std::string_view> allowed) const;
  // Checks each key against `allowed` and calls f(key, value) in file order, so that the
  // first error in the file is the one reported.
  template <typename F>
  void ForEachKey(std::span<const std::string_view> allowed, F&& f) const {
    for (const ConfigNode& v : Entries()) {
      v.CheckKeyIn(allowed);
      f(v.key(), v);
    }
  }
  template <typename F>
  void ForEachKey(std::initializer_list<std::string_view> allowed, F&& f) const {
    ForEachKey(std::span<const std::string_view>(allowed.begin(), allowed.size()),
               std::forward<F>(f));
  }
  bool Has(std::string_view key) const { return Get(key).present(); }
  // The value under `key`, or an absent node (field "<this>.<key>", this node's line).
  ConfigNode Get(std::string_view key) const;
  // Get(key), failing "required" when the key is absent.
  ConfigNode Require(std::string_view key) const;

  // --- Lists -------------------------------------------------------------------------
  // The items in order. A null node is an empty list; any other non-list fails "must be
  // <what>" (e.g. "must be a list of endpoints").
  std::vector<ConfigNode> Items(std::string_view what = "a list") const;

  // --- Scalars (fail "required" when absent; else on null, non-scalar, malformed) -----
  // The scalar as written, of any kind ("must be <what>" otherwise).
  std::string Scalar(std::string_view what = "a scalar") const;
  std::string String() const;  // "must be a string"
  // "must be an integer (got 'x')", "must be >= min (got v)", "must be <= max (got v)".
  int64_t Int(int64_t min = std::numeric_limits<int64_t>::min(),
              int64_t max = std::numeric_limits<int64_t>::max()) const;
  uint64_t Uint(uint64_t max = std::numeric_limits<uint64_t>::max()) const;
  // A finite number: "must be a number (got 'x')", "must be a finite number (got '.inf')".
  double Number() const;
  // A number, YAML's .inf/-.inf/.nan included (for loaders that word their own checks).
  double Float() const;
  bool Bool() const;          // "must be true or false (got 'x')"
  double Duration() const;    // seconds, > 0
  uint64_t ByteSize() const;  // bytes, > 0
  // The value of the name written, among `names` (several names may share a value: the
  // first is the one listed in errors). "unknown <what> 'x' (known: a, b)" otherwise.
  template <typename E>
  E Enum(std::string_view what, std::initializer_list<std::pair<std::string_view, E>> names) const {
    std::vector<std::string_view> all;
    std::vector<bool> listed;  // the first name of each value
    for (auto it = names.begin(); it != names.end(); ++it) {
      all.push_back(it->first);
      listed.push_back(std::none_of(names.begin(), it,
                                    [&](const auto& prev) { return prev.second == it->second; }));
    }
    return (names.begin() + Choice(what, all, listed))->second;
  }

  // --- Errors ------------------------------------------------------------------------
  // Stops the load: "<file>:<line()>: <field()>: <message>".
  [[noreturn]] void Fail(std::string message) const;
  // Stops the load with an error at another place of the same file.
  [[noreturn]] void FailAt(int line, std::string field, std::string message) const;

  // Fails "unknown key '<key()>'<Suggest>" unless key() is in `allowed`.
  void CheckKeyIn(std::span<const std::string_view> allowed) const;
  void CheckKeyIn(std::initializer_list<std::string_view> allowed) const;

 private:
  friend struct YamlAccess;
  ConfigNode() = default;
  size_t Choice(std::string_view what, const std::vector<std::string_view>& names,
                const std::vector<bool>& listed) const;
  // A non-null scalar's text, or Fail("must be <what>").
  const std::string& ScalarText(std::string_view what) const;
  // `s`, the scalar's text, as a whole number of type T (a leading '+' allowed), or
  // Fail("must be <what> (got 's')").
  template <typename T>
  T WholeNumber(const std::string& s, std::string_view what) const;

  std::shared_ptr<const std::string> file_;
  std::shared_ptr<const YAML::Node> node_;  // null when absent
  std::string field_;
  std::string key_;
  int line_ = 0;
  int key_line_ = 0;
  bool present_ = false;
};

// Parses `text` as YAML and runs `read` on the document's root. `file` names the file in
// errors. Returns nullopt when `read` returned, else the first error: a YAML syntax error
// ("<file>:<line>: YAML syntax error: <what> (column <c>)"), a failed getter or Fail().
// Never throws (an unexpected std::exception becomes "cannot load: <what>").
std::optional<ConfigError> ReadYaml(std::string_view text, std::string_view file,
                                    const std::function<void(const ConfigNode& root)>& read);

// ReadYaml with a loader that returns the value.
template <typename T>
ConfigOr<T> ParseYaml(std::string_view text, std::string_view file,
                      const std::function<T(const ConfigNode& root)>& load) {
  ConfigOr<T> out;
  if (std::optional<ConfigError> e =
          ReadYaml(text, file, [&](const ConfigNode& root) { out.value.emplace(load(root)); })) {
    out.value.reset();
    out.error = std::move(*e);
  }
  return out;
}

// The whole file at `path`, or "<path>: cannot read file: <strerror>".
ConfigOr<std::string> ReadConfigFile(const std::string& path);

}  // namespace kvroute::config
