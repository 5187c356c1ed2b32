#include "config/router_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <set>
#include <span>
#include <sstream>
#include <utility>

#include "core/sched/registry.h"

namespace kvroute::config {

std::string HostPort::ToString() const {
  std::string s;
  if (host.find(':') != std::string::npos) {
    s = "[" + host + "]";
  } else {
    s = host;
  }
  return s + ":" + std::to_string(port);
}

std::optional<HostPort> ParseHostPort(std::string_view s, std::string* error) {
  auto fail = [&](std::string msg) -> std::optional<HostPort> {
    if (error != nullptr) *error = std::move(msg);
    return std::nullopt;
  };
  std::string_view host, port;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return fail("expected [ipv6]:port");
    }
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string_view::npos) return fail("expected host:port");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  if (host.empty()) return fail("missing host");
  for (char c : host) {
    if (c == ' ' || c == '\t' || c == '/' || c == '@' || c == '[' || c == ']') {
      return fail("invalid character '" + std::string(1, c) + "' in host");
    }
  }
  if (s.front() != '[' && host.find(':') != std::string_view::npos) {
    return fail("IPv6 addresses must be written [addr]:port");
  }
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || ptr != port.data() + port.size() || value == 0 ||
      value > 65535) {
    return fail("port must be a number from 1 to 65535");
  }
  return HostPort{std::string(host), static_cast<uint16_t>(value)};
}

namespace {

// A plain decimal (sign, digits, optional fraction/exponent); rejects hex, inf, nan.
std::optional<double> ParseDecimal(std::string_view s) {
  if (s.empty()) return std::nullopt;
  const char* first = s.data();
  if (*first == '+') ++first;
  double v = 0;
  auto [ptr, ec] = std::from_chars(first, s.data() + s.size(), v, std::chars_format::general);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

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
    const auto it = std::find_if(units.begin(), units.end(),
                                 [&](const Unit& u) { return u.name == unit; });
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
  static constexpr Unit kUnits[] = {{"B", 1},         {"KB", 1e3},       {"MB", 1e6},
                                    {"GB", 1e9},      {"KiB", 1 << 10},  {"MiB", 1 << 20},
                                    {"GiB", 1 << 30}};
  const std::optional<double> v = ParseScaled(s, kUnits);
  if (!v) return std::nullopt;
  const double bytes = *v;
  if (bytes != std::floor(bytes) || bytes > 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

std::string ConfigError::ToString() const {
  std::string s = file;
  if (line > 0) s += ":" + std::to_string(line);
  s += ": ";
  if (!field.empty()) s += field + ": ";
  s += message;
  return s;
}

namespace {

// Loading throws this internally (yaml-cpp throws anyway); ParseRouterConfig turns it into
// a value, so nothing escapes the public API.
struct Failure {
  ConfigError error;
};

int LineOf(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.is_null() ? 0 : m.line + 1;
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

// " (did you mean 'x'?)" for a near miss, else the list of known keys.
std::string Suggest(std::string_view key, std::initializer_list<std::string_view> known) {
  // A near miss: at most one edit per three characters (so "foo" does not suggest "pool").
  std::string_view best;
  size_t best_d = std::max<size_t>(1, key.size() / 3) + 1;
  for (std::string_view k : known) {
    const size_t d = EditDistance(key, k);
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

std::string Join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string Index(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

bool IsPlain(const YAML::Node& n) { return n.Tag() != "!"; }  // "!" marks a quoted scalar

class Loader {
 public:
  explicit Loader(std::string_view file) : file_(file) {}

  RouterConfig Load(const YAML::Node& root) {
    RouterConfig cfg;
    if (root.IsNull()) return cfg;
    if (!root.IsMap()) Fail(LineOf(root), "", "the top level must be a mapping");
    Sched top, nested;
    nested.path = "scheduling";
    ForEachKey(root, "",
               {"listen", "threads", "pool", "scheduling", "limits", "timeouts", "retries",
                "allow_routing_headers", "policy", "plugins", "schedulingProfiles",
                "schedulingProfile"},
               [&](const std::string& key, const YAML::Node& v, const std::string& field,
                   int line) {
                 if (key == "listen") {
                   cfg.listen = String(v, field, line);
                   cfg.listen_addr = Address(cfg.listen, field, ValueLine(v, line));
                 } else if (key == "threads") {
                   cfg.threads = static_cast<int>(Int(v, field, line, 0, 4096));
                 } else if (key == "pool") {
                   LoadPool(v, field, cfg.pool);
                 } else if (key == "scheduling") {
                   nested.line = line;
                   ForEachKey(v, field, {"policy", "plugins", "schedulingProfiles", "schedulingProfile"},
                              [&](const std::string& k, const YAML::Node& sv,
                                  const std::string& f, int l) { SchedKey(nested, k, sv, f, l); });
                 } else if (key == "limits") {
                   LoadLimits(v, field, cfg.limits);
                 } else if (key == "timeouts") {
                   LoadTimeouts(v, field, cfg.timeouts);
                 } else if (key == "retries") {
                   ForEachKey(v, field, {"max_attempts"},
                              [&](const std::string&, const YAML::Node& rv, const std::string& f,
                                  int l) {
                                cfg.retries.max_attempts = static_cast<int>(Int(rv, f, l, 1, 100));
                              });
                 } else if (key == "allow_routing_headers") {
                   cfg.allow_routing_headers = Bool(v, field, line);
                 } else {
                   if (top.line == 0) top.line = line;
                   SchedKey(top, key, v, field, line);
                 }
               });
    if (top.line != 0 && nested.line != 0) {
      Fail(std::max(top.line, nested.line), top.line > nested.line ? top.first_key : "scheduling",
           "scheduling keys given both at top level and under 'scheduling'; use one");
    }
    cfg.scheduling = FinishSched(nested.line != 0 ? nested : top);
    return cfg;
  }

 private:
  // One place that may hold the scheduling keys (top level or under `scheduling:`).
  struct Sched {
    std::string path;
    int line = 0;  // where the section (or its first key) is; 0 = absent
    std::string first_key;
    sched::SchedulingSpec spec;
    int policy_line = 0;
    int profiles_line = 0;      // schedulingProfiles
    int seed_profile_line = 0;  // schedulingProfile
  };

  [[noreturn]] void Fail(int line, std::string field, std::string message) {
    throw Failure{ConfigError{file_, line, std::move(field), std::move(message)}};
  }

  // A value's own line, or its key's when the value has no position (empty values).
  static int ValueLine(const YAML::Node& v, int key_line) {
    const int l = LineOf(v);
    return l > 0 ? l : key_line;
  }

  // Walks a mapping in file order, rejecting unknown and repeated keys. A null node
  // (`key:` with nothing) is an empty mapping.
  template <typename F>
  void ForEachKey(const YAML::Node& map, const std::string& path,
                  std::initializer_list<std::string_view> known, F&& f) {
    if (map.IsNull()) return;
    if (!map.IsMap()) Fail(LineOf(map), path, "must be a mapping");
    std::set<std::string> seen;
    for (const auto& kv : map) {
      const YAML::Node k = kv.first;
      const int line = LineOf(k);
      if (!k.IsScalar()) Fail(line, path, "keys must be strings");
      const std::string key = k.Scalar();
      const std::string field = Join(path, key);
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        Fail(line, field, "unknown key '" + key + "'" + Suggest(key, known));
      }
      if (!seen.insert(key).second) Fail(line, field, "duplicate key '" + key + "'");
      f(key, kv.second, field, line);
    }
  }

  std::string Scalar(const YAML::Node& v, const std::string& field, int line,
                     std::string_view what) {
    if (!v.IsScalar()) Fail(ValueLine(v, line), field, "must be " + std::string(what));
    return v.Scalar();
  }

  std::string String(const YAML::Node& v, const std::string& field, int line) {
    return Scalar(v, field, line, "a string");
  }

  int64_t Int(const YAML::Node& v, const std::string& field, int line, int64_t min,
              int64_t max) {
    const std::string s = Scalar(v, field, line, "an integer");
    int64_t x = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (!IsPlain(v) || s.empty() || ec != std::errc() || ptr != s.data() + s.size()) {
      Fail(ValueLine(v, line), field, "must be an integer (got '" + s + "')");
    }
    if (x < min) {
      Fail(ValueLine(v, line), field, "must be >= " + std::to_string(min) + " (got " + s + ")");
    }
    if (x > max) {
      Fail(ValueLine(v, line), field, "must be <= " + std::to_string(max) + " (got " + s + ")");
    }
    return x;
  }

  bool Bool(const YAML::Node& v, const std::string& field, int line) {
    const std::string s = Scalar(v, field, line, "true or false");
    if (IsPlain(v)) {
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
    }
    Fail(ValueLine(v, line), field, "must be true or false (got '" + s + "')");
  }

  // A number; YAML's .inf / .nan are recognised so range checks can name them.
  double Number(const YAML::Node& v, const std::string& field, int line) {
    const std::string s = Scalar(v, field, line, "a number");
    if (IsPlain(v)) {
      if (s == ".inf" || s == "+.inf" || s == ".Inf" || s == "+.Inf") return HUGE_VAL;
      if (s == "-.inf" || s == "-.Inf") return -HUGE_VAL;
      if (s == ".nan" || s == ".NaN") return NAN;
      if (const auto d = ParseDecimal(s)) return *d;
    }
    Fail(ValueLine(v, line), field, "must be a number (got '" + s + "')");
  }

  // A positive duration in seconds.
  double Duration(const YAML::Node& v, const std::string& field, int line) {
    const std::string s = Scalar(v, field, line, "a duration");
    const std::optional<double> d = ParseDuration(s);
    if (!d) {
      Fail(ValueLine(v, line), field,
           "must be a duration such as 50ms, 2s or 0.5 (seconds) (got '" + s + "')");
    }
    if (*d <= 0) Fail(ValueLine(v, line), field, "must be > 0 (got '" + s + "')");
    return *d;
  }

  uint64_t ByteSize(const YAML::Node& v, const std::string& field, int line) {
    const std::string s = Scalar(v, field, line, "a size");
    const std::optional<uint64_t> b = ParseByteSize(s);
    if (!b) {
      Fail(ValueLine(v, line), field,
           "must be a size such as 16MiB, 64KiB or 1048576 (got '" + s + "')");
    }
    if (*b == 0) Fail(ValueLine(v, line), field, "must be > 0");
    return *b;
  }

  HostPort Address(const std::string& s, const std::string& field, int line) {
    std::string why;
    std::optional<HostPort> hp = ParseHostPort(s, &why);
    if (!hp) Fail(line, field, "bad address '" + s + "': " + why);
    return *hp;
  }

  void LoadPool(const YAML::Node& node, const std::string& path, PoolConfig& pool) {
    std::vector<std::tuple<std::string, std::string, int, std::string>> overrides;
    int scrape_line = 0;
    int staleness_line = 0;
    ForEachKey(
        node, path,
        {"endpoints", "engine_type", "model", "metric_names", "scrape_interval", "staleness",
         "stale_policy"},
        [&](const std::string& key, const YAML::Node& v, const std::string& field, int line) {
          if (key == "endpoints") {
            LoadEndpoints(v, field, line, pool.endpoints);
          } else if (key == "engine_type") {
            const std::string s = String(v, field, line);
            const auto t = metrics::ParseEngineType(s);
            if (!t) {
              Fail(ValueLine(v, line), field,
                   "unknown engine type '" + s + "' (known: vllm, sglang)");
            }
            pool.engine_type = *t;
          } else if (key == "model") {
            pool.model = String(v, field, line);
          } else if (key == "metric_names") {
            if (v.IsNull()) return;
            if (!v.IsMap()) Fail(ValueLine(v, line), field, "must be a mapping");
            for (const auto& kv : v) {
              const int kl = LineOf(kv.first);
              const std::string k = Scalar(kv.first, field, kl, "a string");
              overrides.emplace_back(k, String(kv.second, Join(field, k), kl), kl,
                                     Join(field, k));
            }
          } else if (key == "scrape_interval") {
            pool.scrape_interval_s = Duration(v, field, line);
            scrape_line = line;
          } else if (key == "staleness") {
            pool.staleness_s = Duration(v, field, line);
            staleness_line = line;
          } else if (key == "stale_policy") {
            const std::string s = String(v, field, line);
            if (s == "exclude") {
              pool.stale_policy = StalePolicy::kExclude;
            } else if (s == "saturated") {
              pool.stale_policy = StalePolicy::kSaturated;
            } else {
              Fail(ValueLine(v, line), field,
                   "unknown stale policy '" + s + "' (known: exclude, saturated)");
            }
          }
        });
    // Overrides apply on top of the engine type's names, whatever the key order.
    pool.metric_names = metrics::MetricNames::For(pool.engine_type);
    for (auto& [key, value, line, field] : overrides) {
      if (!pool.metric_names.Set(key, value)) {
        Fail(line, field,
             "unknown metric name key '" + key +
                 "'" +
                 Suggest(key, {"running", "waiting", "kv_usage", "kv_usage_old",
                               "prefix_queries", "prefix_queries_old", "prefix_hits",
                               "prefix_hits_old", "preemptions", "cache_info",
                               "block_size_label", "num_blocks_label", "engine_label",
                               "model_label"}));
      }
    }
    if (pool.staleness_s < pool.scrape_interval_s) {
      Fail(staleness_line ? staleness_line : scrape_line, Join(path, "staleness"),
           "staleness (" + std::to_string(pool.staleness_s) +
               "s) must be >= scrape_interval (" + std::to_string(pool.scrape_interval_s) +
               "s)");
    }
  }

  void LoadEndpoints(const YAML::Node& v, const std::string& path, int line,
                     std::vector<EndpointConfig>& out) {
    if (v.IsNull()) return;
    if (!v.IsSequence()) Fail(ValueLine(v, line), path, "must be a list of endpoints");
    std::map<std::string, int> names, addresses;
    for (size_t i = 0; i < v.size(); ++i) {
      const YAML::Node item = v[i];
      const std::string field = Index(path, i);
      EndpointConfig ep;
      ep.line = LineOf(item);
      int address_line = ep.line;
      if (item.IsScalar()) {
        ep.address = item.Scalar();
      } else {
        if (!item.IsMap()) Fail(ep.line, field, "must be an address or a mapping");
        ForEachKey(item, field, {"address", "name", "labels"},
                   [&](const std::string& key, const YAML::Node& ev, const std::string& f,
                       int l) {
                     if (key == "address") {
                       ep.address = String(ev, f, l);
                       address_line = ValueLine(ev, l);
                     } else if (key == "name") {
                       ep.name = String(ev, f, l);
                       if (ep.name.empty()) Fail(ValueLine(ev, l), f, "must not be empty");
                     } else {
                       if (ev.IsNull()) return;
                       if (!ev.IsMap()) Fail(ValueLine(ev, l), f, "must be a mapping");
                       for (const auto& kv : ev) {
                         const int kl = LineOf(kv.first);
                         const std::string k = Scalar(kv.first, f, kl, "a string");
                         ep.labels[k] = String(kv.second, Join(f, k), kl);
                       }
                     }
                   });
        if (ep.address.empty()) Fail(ep.line, Join(field, "address"), "missing address");
      }
      ep.host_port = Address(ep.address, item.IsScalar() ? field : Join(field, "address"),
                             address_line);
      if (ep.name.empty()) ep.name = ep.address;
      if (auto [it, fresh] = names.emplace(ep.name, ep.line); !fresh) {
        Fail(ep.line, field,
             "duplicate endpoint name '" + ep.name + "' (first at line " +
                 std::to_string(it->second) + ")");
      }
      if (auto [it, fresh] = addresses.emplace(ep.host_port.ToString(), ep.line); !fresh) {
        Fail(address_line, field,
             "duplicate endpoint address '" + ep.address + "' (first at line " +
                 std::to_string(it->second) + ")");
      }
      out.push_back(std::move(ep));
    }
  }

  void LoadLimits(const YAML::Node& v, const std::string& path, LimitsConfig& limits) {
    ForEachKey(v, path, {"max_body_bytes", "max_header_bytes", "max_headers"},
               [&](const std::string& key, const YAML::Node& lv, const std::string& f, int l) {
                 if (key == "max_body_bytes") {
                   limits.max_body_bytes = ByteSize(lv, f, l);
                 } else if (key == "max_header_bytes") {
                   limits.max_header_bytes = ByteSize(lv, f, l);
                 } else {
                   limits.max_headers = static_cast<uint32_t>(Int(lv, f, l, 1, 1 << 20));
                 }
               });
  }

  void LoadTimeouts(const YAML::Node& v, const std::string& path, TimeoutsConfig& t) {
    ForEachKey(v, path, {"connect", "first_byte", "idle"},
               [&](const std::string& key, const YAML::Node& tv, const std::string& f, int l) {
                 const double d = Duration(tv, f, l);
                 if (key == "connect") {
                   t.connect_s = d;
                 } else if (key == "first_byte") {
                   t.first_byte_s = d;
                 } else {
                   t.idle_s = d;
                 }
               });
  }

  void SchedKey(Sched& s, const std::string& key, const YAML::Node& v, const std::string& field,
                int line) {
    if (s.first_key.empty()) s.first_key = field;
    if (key == "policy") {
      s.spec.policy = String(v, field, line);
      s.policy_line = line;
    } else if (key == "plugins") {
      LoadPlugins(v, field, line, s.spec.plugins);
    } else if (key == "schedulingProfiles") {
      if (s.seed_profile_line != 0) {
        Fail(line, field, "use either schedulingProfiles or schedulingProfile, not both");
      }
      s.profiles_line = line;
      LoadProfiles(v, field, line, s.spec.profiles);
    } else {  // schedulingProfile: the seed article's single-profile form
      if (s.profiles_line != 0) {
        Fail(line, field, "use either schedulingProfiles or schedulingProfile, not both");
      }
      s.seed_profile_line = line;
      sched::ProfileSpec prof;
      prof.line = line;
      LoadRefs(v, field, line, prof.plugins);
      s.spec.profiles.push_back(std::move(prof));
    }
  }

  void LoadPlugins(const YAML::Node& v, const std::string& path, int line,
                   std::vector<sched::PluginSpec>& out) {
    if (v.IsNull()) return;
    if (!v.IsSequence()) Fail(ValueLine(v, line), path, "must be a list of plugins");
    for (size_t i = 0; i < v.size(); ++i) {
      const YAML::Node item = v[i];
      const std::string field = Index(path, i);
      sched::PluginSpec p;
      p.line = LineOf(item);
      if (!item.IsMap()) Fail(p.line, field, "must be a mapping with a type");
      ForEachKey(item, field, {"type", "name", "parameters"},
                 [&](const std::string& key, const YAML::Node& pv, const std::string& f, int l) {
                   if (key == "type") {
                     p.type = String(pv, f, l);
                   } else if (key == "name") {
                     p.name = String(pv, f, l);
                   } else if (!pv.IsNull()) {
                     if (!pv.IsMap()) Fail(ValueLine(pv, l), f, "must be a mapping");
                     for (const auto& kv : pv) {
                       const int kl = LineOf(kv.first);
                       const std::string k = Scalar(kv.first, f, kl, "a string");
                       p.parameters[k] = Param(kv.second, Join(f, k), kl);
                     }
                   }
                 });
      if (p.type.empty()) Fail(p.line, Join(field, "type"), "missing plugin type");
      out.push_back(std::move(p));
    }
  }

  // Plain true/false -> bool, plain numbers -> double, anything else scalar -> string;
  // the scheduler's registry checks what each parameter needs.
  sched::ParamValue Param(const YAML::Node& v, const std::string& field, int line) {
    const std::string s = Scalar(v, field, line, "a scalar");
    if (IsPlain(v)) {
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (const auto d = ParseDecimal(s)) return *d;
    }
    return s;
  }

  void LoadProfiles(const YAML::Node& v, const std::string& path, int line,
                    std::vector<sched::ProfileSpec>& out) {
    if (v.IsNull()) return;
    if (!v.IsSequence()) Fail(ValueLine(v, line), path, "must be a list of profiles");
    for (size_t i = 0; i < v.size(); ++i) {
      const YAML::Node item = v[i];
      const std::string field = Index(path, i);
      sched::ProfileSpec prof;
      prof.line = LineOf(item);
      prof.name.clear();
      if (!item.IsMap()) Fail(prof.line, field, "must be a mapping with name and plugins");
      ForEachKey(item, field, {"name", "plugins"},
                 [&](const std::string& key, const YAML::Node& pv, const std::string& f, int l) {
                   if (key == "name") {
                     prof.name = String(pv, f, l);
                   } else {
                     LoadRefs(pv, f, l, prof.plugins);
                   }
                 });
      if (prof.name.empty()) Fail(prof.line, Join(field, "name"), "missing profile name");
      for (const sched::ProfileSpec& other : out) {
        if (other.name == prof.name) {
          Fail(prof.line, Join(field, "name"),
               "duplicate profile name '" + prof.name + "' (first at line " +
                   std::to_string(other.line) + ")");
        }
      }
      out.push_back(std::move(prof));
    }
  }

  void LoadRefs(const YAML::Node& v, const std::string& path, int line,
                std::vector<sched::ProfilePluginRef>& out) {
    if (v.IsNull()) return;
    if (!v.IsSequence()) Fail(ValueLine(v, line), path, "must be a list of {pluginRef, weight}");
    for (size_t i = 0; i < v.size(); ++i) {
      const YAML::Node item = v[i];
      const std::string field = Index(path, i);
      sched::ProfilePluginRef ref;
      ref.line = LineOf(item);
      if (!item.IsMap()) Fail(ref.line, field, "must be a mapping with pluginRef and weight");
      ForEachKey(item, field, {"pluginRef", "weight"},
                 [&](const std::string& key, const YAML::Node& rv, const std::string& f, int l) {
                   if (key == "pluginRef") {
                     ref.plugin_ref = String(rv, f, l);
                   } else {
                     ref.weight = Number(rv, f, l);
                     const std::string as_written = rv.Scalar();
                     if (!std::isfinite(ref.weight)) {
                       Fail(ValueLine(rv, l), f,
                            "weight must be a finite number (got " + as_written + ")");
                     }
                     if (ref.weight < 0) {
                       Fail(ValueLine(rv, l), f, "weight must be >= 0 (got " + as_written + ")");
                     }
                   }
                 });
      if (ref.plugin_ref.empty()) Fail(ref.line, Join(field, "pluginRef"), "missing pluginRef");
      out.push_back(std::move(ref));
    }
  }

  // Runs the scheduler's own validation and maps its field names back to the file's: the
  // seed form's "schedulingProfile[i]" is "schedulingProfiles[0].plugins[i]" to it.
  sched::SchedulingSpec FinishSched(Sched& s) {
    if (std::optional<sched::SpecError> err = sched::ValidateSchedulingSpec(s.spec)) {
      std::string field = err->field;
      if (s.seed_profile_line != 0) {
        static constexpr std::string_view kProfile0 = "schedulingProfiles[0].plugins";
        if (field.starts_with(kProfile0)) {
          field = "schedulingProfile" + field.substr(kProfile0.size());
        } else if (field.starts_with("schedulingProfiles[0]")) {
          field = "schedulingProfile" + field.substr(std::string_view("schedulingProfiles[0]").size());
        }
      }
      int line = err->line;
      if (line == 0) line = field == "policy" && s.policy_line ? s.policy_line : s.line;
      Fail(line, Join(s.path, field), err->message);
    }
    return std::move(s.spec);
  }

  std::string file_;
};

}  // namespace

ConfigResult ParseRouterConfig(std::string_view text, std::string_view filename) {
  ConfigResult result;
  result.error.file = std::string(filename);
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    result.config = Loader(filename).Load(root);
  } catch (const Failure& f) {
    result.error = f.error;
  } catch (const YAML::Exception& e) {
    result.error.line = e.mark.is_null() ? 0 : e.mark.line + 1;
    result.error.message = "YAML syntax error: " + e.msg;
    if (!e.mark.is_null()) result.error.message += " (column " + std::to_string(e.mark.column + 1) + ")";
  } catch (const std::exception& e) {
    result.error.message = std::string("cannot load config: ") + e.what();
  }
  return result;
}

ConfigResult LoadRouterConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ConfigResult r;
    r.error.file = path;
    r.error.message = std::string("cannot read file: ") + std::strerror(errno);
    return r;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseRouterConfig(ss.str(), path);
}

}  // namespace kvroute::config
