#include "config/router_config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <cmath>
#include <filesystem>
#include <tuple>
#include <utility>

#include "config/endpoints_file.h"
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

namespace {

// RFC 1123 subdomain (dots allowed) of at most `max` characters.
bool IsDnsName(const std::string& s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  return s.front() != '-' && s.front() != '.' && s.back() != '-' && s.back() != '.';
}

Status CheckPoolName(const std::string& name) {
  if (IsDnsName(name, 253)) return Status::Ok();
  return Status::InvalidArgument(
      "'" + name + "' is not a Kubernetes object name (lower-case letters, digits, '-' and '.')");
}

Status CheckNamespace(const std::string& ns) {
  if (IsDnsName(ns, 63) && ns.find('.') == std::string::npos) return Status::Ok();
  return Status::InvalidArgument("'" + ns + "' is not a Kubernetes namespace name");
}

Status CheckPoolGroup(const std::string& group) {
  if (group == kPoolGroupV1 || group == kPoolGroupV1Alpha2) return Status::Ok();
  return Status::InvalidArgument("unknown InferencePool group '" + group + "' (use " +
                                 std::string(kPoolGroupV1) + " or " +
                                 std::string(kPoolGroupV1Alpha2) + ")");
}

}  // namespace

Status CheckKvEventsUrl(std::string_view url, bool bind) {
  constexpr std::string_view kTcp = "tcp://";
  if (url.substr(0, kTcp.size()) != kTcp) {
    return Status::InvalidArgument("'" + std::string(url) + "' is not a tcp://HOST:PORT address");
  }
  std::string host_port(url.substr(kTcp.size()));
  // A bound socket may listen on every interface; an endpoint's address names one host.
  if (host_port.substr(0, 2) == "*:") {
    if (!bind) {
      return Status::InvalidArgument("'" + std::string(url) +
                                     "': host '*' is for pool.kv_events.bind; name the replica's host");
    }
    host_port = "0.0.0.0" + host_port.substr(1);
  }
  std::string why;
  if (!ParseHostPort(host_port, &why)) {
    return Status::InvalidArgument("bad address '" + std::string(url) + "': " + why);
  }
  return Status::Ok();
}

Status CheckRegionName(std::string_view region) {
  for (char c : region) {
    if (std::isspace(static_cast<unsigned char>(c)) || std::iscntrl(static_cast<unsigned char>(c)) ||
        c == ',' || c == '"') {
      return Status::InvalidArgument("'" + std::string(region) +
                                     "' is not a region name (no spaces, commas or quotes)");
    }
  }
  return Status::Ok();
}

Status CheckKubernetesDiscovery(const KubernetesDiscoveryConfig& k) {
  if (Status st = CheckPoolName(k.inference_pool); !st.ok()) {
    return Status::InvalidArgument("inference_pool: " + st.message());
  }
  if (!k.namespace_name.empty()) {
    if (Status st = CheckNamespace(k.namespace_name); !st.ok()) {
      return Status::InvalidArgument("namespace: " + st.message());
    }
  }
  if (Status st = CheckPoolGroup(k.group); !st.ok()) {
    return Status::InvalidArgument("group: " + st.message());
  }
  return Status::Ok();
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

std::string Join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

// An RFC 9110 token: what a header field name may be.
bool IsHeaderName(std::string_view s) {
  static constexpr std::string_view kSpecials = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || kSpecials.find(c) != std::string_view::npos;
  });
}

// epp's reading: the first serve-only key present (in kServeOnlyKeys' order) fails the load.
void RefuseServeOnlyKeys(const ConfigNode& root) {
  if (!root.IsMap()) return;
  for (std::string_view key : kServeOnlyKeys) {
    const std::size_t dot = key.find('.');
    ConfigNode n = root.Get(key.substr(0, dot));
    if (!n.present()) continue;
    if (dot != std::string_view::npos) {
      if (!n.IsMap()) continue;  // the section's own reader names the shape error
      n = n.Get(key.substr(dot + 1));
      if (!n.present()) continue;
    }
    root.FailAt(n.key_line(), std::string(key),
                "only `kvroute serve` honours this key; `kvroute epp` would ignore it, so it "
                "refuses it: remove it from the picker's configuration");
  }
}

// Walks the document; every check fails through ConfigNode, which ends the load.
class Loader {
 public:
  explicit Loader(std::string_view filename) : filename_(filename) {}

  RouterConfig Load(const ConfigNode& root) {
    RouterConfig cfg;
    if (root.IsNull()) return cfg;
    Sched top, nested;
    nested.path = "scheduling";
    root.ForEachKey(
        {"listen", "listen_tls", "upstream_tls", "threads", "pool", "scheduling", "limits", "timeouts", "retries",
         "outlier_detection", "allow_routing_headers", "epp", "flow", "locality", "sessions", "auth", "capture", "policy", "plugins", "schedulingProfiles", "schedulingProfile"},
        [&](const std::string& key, const ConfigNode& v) {
          if (key == "listen") {
            cfg.listen = v.String();
            cfg.listen_plain = cfg.listen != "off";
            if (cfg.listen_plain) cfg.listen_addr = Address(v, cfg.listen, v.field(), v.line());
            listen_line = v.line();
          } else if (key == "listen_tls") {
            LoadListenTls(v, cfg.listen_tls);
          } else if (key == "upstream_tls") {
            LoadUpstreamTls(v, cfg.upstream_tls);
          } else if (key == "threads") {
            cfg.threads = static_cast<int>(v.Int(0, 4096));
          } else if (key == "pool") {
            LoadPool(v, cfg.pool);
          } else if (key == "scheduling") {
            nested.line = v.key_line();
            v.ForEachKey(
                {"policy", "plugins", "schedulingProfiles", "schedulingProfile", "slo", "pd"},
                [&](const std::string& k, const ConfigNode& sv) {
                  if (k == "slo") {
                    LoadSlo(sv, cfg.slo);
                  } else if (k == "pd") {
                    sv.ForEachKey({"non_cached_tokens", "prompt_tokens"},
                                  [&](const std::string& pk, const ConfigNode& pv) {
                                    (pk == "non_cached_tokens" ? cfg.pd.non_cached_tokens
                                                               : cfg.pd.prompt_tokens) =
                                        pv.Int(0, int64_t{1} << 40);
                                  });
                  } else {
                    SchedKey(nested, k, sv);
                  }
                });
          } else if (key == "limits") {
            LoadLimits(v, cfg.limits);
          } else if (key == "timeouts") {
            LoadTimeouts(v, cfg.timeouts);
          } else if (key == "retries") {
            LoadRetries(v, cfg.retries);
          } else if (key == "outlier_detection") {
            LoadOutlier(v, cfg.outlier);
          } else if (key == "allow_routing_headers") {
            cfg.allow_routing_headers = v.Bool();
          } else if (key == "epp") {
            LoadEpp(v, cfg.epp);
          } else if (key == "flow") {
            LoadFlow(v, cfg.flow);
          } else if (key == "locality") {
            LoadLocality(v, cfg.locality);
          } else if (key == "sessions") {
            LoadSessions(v, cfg.sessions);
          } else if (key == "auth") {
            LoadAuth(v, cfg.auth);
          } else if (key == "capture") {
            LoadCapture(v, cfg.capture);
          } else {
            if (top.line == 0) top.line = v.key_line();
            SchedKey(top, key, v);
          }
        });
    if (top.line != 0 && nested.line != 0) {
      root.FailAt(std::max(top.line, nested.line),
                  top.line > nested.line ? top.first_key : "scheduling",
                  "scheduling keys given both at top level and under 'scheduling'; use one");
    }
    cfg.scheduling = FinishSched(root, nested.line != 0 ? nested : top);
    if (!cfg.listen_plain && cfg.listen_tls.address.empty()) {
      root.FailAt(listen_line, "listen", "'off' needs listen_tls: there would be no listener");
    }
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

  // `path` as written, relative ones against the config file's directory.
  std::string ResolvePath(const std::string& path) const {
    const std::filesystem::path p(path);
    if (p.is_absolute()) return path;
    return (std::filesystem::path(filename_).parent_path() / p).lexically_normal().string();
  }

  std::string filename_;
  int listen_line = 0;

  void LoadListenTls(const ConfigNode& v, ListenTlsConfig& t) {
    int address_line = v.line();
    v.ForEachKey({"address", "cert", "key", "poll"}, [&](const std::string& key, const ConfigNode& tv) {
      if (key == "address") {
        t.address = tv.String();
        t.addr = Address(tv, t.address, tv.field(), tv.line());
      } else if (key == "cert" || key == "key") {
        std::string path = tv.String();
        if (path.empty()) tv.Fail("must name a PEM file");
        (key == "cert" ? t.cert : t.key) = path;
        (key == "cert" ? t.cert_path : t.key_path) = ResolvePath(path);
      } else {
        t.poll_s = tv.Duration();
        if (t.poll_s < 0.01) tv.Fail("must be at least 10ms");
      }
    });
    if (t.address.empty()) v.FailAt(address_line, v.field() + ".address", "missing address");
    if (t.cert.empty()) v.FailAt(address_line, v.field() + ".cert", "missing cert (a PEM certificate file)");
    if (t.key.empty()) v.FailAt(address_line, v.field() + ".key", "missing key (a PEM private key file)");
  }

  void LoadUpstreamTls(const ConfigNode& v, UpstreamTlsConfig& t) {
    v.ForEachKey({"ca", "cert", "key", "verify"}, [&](const std::string& key, const ConfigNode& tv) {
      if (key == "verify") {
        t.verify = tv.Bool();
        return;
      }
      std::string path = tv.String();
      if (path.empty()) tv.Fail("must name a PEM file");
      (key == "ca" ? t.ca_path : key == "cert" ? t.cert_path : t.key_path) = ResolvePath(path);
    });
    if (t.cert_path.empty() != t.key_path.empty()) {
      v.FailAt(v.line(), v.field() + (t.cert_path.empty() ? ".cert" : ".key"),
               "a client certificate needs both cert and key");
    }
  }

  static HostPort Address(const ConfigNode& at, const std::string& s, const std::string& field,
                          int line) {
    std::string why;
    std::optional<HostPort> hp = ParseHostPort(s, &why);
    if (!hp) at.FailAt(line, field, "bad address '" + s + "': " + why);
    return *hp;
  }

  static void LoadSlo(const ConfigNode& node, SloConfig& slo) {
    node.ForEachKey({"ttft", "tpot"}, [&](const std::string& key, const ConfigNode& v) {
      (key == "ttft" ? slo.ttft_s : slo.tpot_s) = v.Duration();
    });
  }

  void LoadDiscovery(const ConfigNode& node, KubernetesDiscoveryConfig& k) {
    node.ForEachKey({"kubernetes"}, [&](const std::string&, const ConfigNode& kn) {
      kn.ForEachKey({"inference_pool", "namespace", "group", "kubeconfig", "context", "objectives"},
                    [&](const std::string& key, const ConfigNode& v) {
                      if (key == "inference_pool") {
                        k.inference_pool = v.String();
                        if (Status st = CheckPoolName(k.inference_pool); !st.ok()) v.Fail(st.message());
                      } else if (key == "namespace") {
                        k.namespace_name = v.String();
                        if (Status st = CheckNamespace(k.namespace_name); !st.ok()) v.Fail(st.message());
                      } else if (key == "group") {
                        k.group = v.String();
                        if (Status st = CheckPoolGroup(k.group); !st.ok()) v.Fail(st.message());
                      } else if (key == "kubeconfig") {
                        k.kubeconfig = v.String();
                        if (k.kubeconfig.empty()) v.Fail("must not be empty (omit it for in-cluster)");
                        k.kubeconfig_path = ResolvePath(k.kubeconfig);
                      } else if (key == "context") {
                        k.context = v.String();
                      } else if (key == "objectives") {
                        k.objectives = v.Bool();
                      }
                    });
      if (!k.enabled()) kn.Fail("inference_pool is required");
    });
  }

  void LoadPool(const ConfigNode& node, PoolConfig& pool) {
    std::vector<std::tuple<std::string, std::string, int, std::string>> overrides;
    int scrape_line = 0;
    int staleness_line = 0;
    int endpoints_line = 0;
    int endpoints_file_line = 0;
    int discovery_line = 0;
    node.ForEachKey({"endpoints", "endpoints_file", "endpoints_file_poll", "discovery", "engine_type",
                     "model", "metric_names", "scrape_interval", "staleness", "stale_policy",
                     "kv_events"},
                    [&](const std::string& key, const ConfigNode& v) {
                      if (key == "kv_events") {
                        LoadKvEvents(v, pool.kv_events);
                      } else if (key == "discovery") {
                        LoadDiscovery(v, pool.kubernetes);
                        if (pool.kubernetes.enabled()) discovery_line = v.key_line();
                      } else if (key == "endpoints") {
                        ReadEndpoints(v, pool.endpoints);
                        endpoints_line = v.key_line();
                      } else if (key == "endpoints_file") {
                        pool.endpoints_file = v.String();
                        if (pool.endpoints_file.empty()) v.Fail("must not be empty");
                        pool.endpoints_file_path = ResolvePath(pool.endpoints_file);
                        endpoints_file_line = v.key_line();
                      } else if (key == "endpoints_file_poll") {
                        pool.endpoints_file_poll_s = v.Duration();
                      } else if (key == "engine_type") {
                        pool.engine_type = v.Enum<metrics::EngineType>(
                            "engine type", {{"vllm", metrics::EngineType::kVllm},
                                            {"sglang", metrics::EngineType::kSglang}});
                      } else if (key == "model") {
                        pool.model = v.String();
                      } else if (key == "metric_names") {
                        for (const ConfigNode& m : v.Entries()) {
                          overrides.emplace_back(m.key(), m.String(), m.key_line(), m.field());
                        }
                      } else if (key == "scrape_interval") {
                        pool.scrape_interval_s = v.Duration();
                        scrape_line = v.key_line();
                      } else if (key == "staleness") {
                        pool.staleness_s = v.Duration();
                        staleness_line = v.key_line();
                      } else if (key == "stale_policy") {
                        pool.stale_policy = v.Enum<StalePolicy>(
                            "stale policy", {{"exclude", StalePolicy::kExclude},
                                             {"saturated", StalePolicy::kSaturated}});
                      }
                    });
    if (endpoints_line != 0 && endpoints_file_line != 0) {
      node.FailAt(std::max(endpoints_line, endpoints_file_line),
                  Join(node.field(), endpoints_line > endpoints_file_line ? "endpoints"
                                                                          : "endpoints_file"),
                  "pool.endpoints and pool.endpoints_file are mutually exclusive; use one");
    }
    if (discovery_line != 0 && (endpoints_line != 0 || endpoints_file_line != 0)) {
      node.FailAt(discovery_line, Join(node.field(), "discovery"),
                  std::string("Kubernetes discovery replaces pool.") +
                      (endpoints_line != 0 ? "endpoints" : "endpoints_file") + "; use one");
    }
    // Overrides apply on top of the engine type's names, whatever the key order.
    pool.metric_names = metrics::MetricNames::For(pool.engine_type);
    for (auto& [key, value, line, field] : overrides) {
      if (!pool.metric_names.Set(key, value)) {
        node.FailAt(line, field,
                    "unknown metric name key '" + key + "'" + Suggest(key, metrics::MetricNames::Keys()));
      }
    }
    if (pool.staleness_s < pool.scrape_interval_s) {
      node.FailAt(staleness_line ? staleness_line : scrape_line, Join(node.field(), "staleness"),
                  "staleness (" + std::to_string(pool.staleness_s) +
                      "s) must be >= scrape_interval (" + std::to_string(pool.scrape_interval_s) +
                      "s)");
    }
  }

  static void LoadKvEvents(const ConfigNode& node, KvEventsConfig& k) {
    int port_line = 0, bind_line = 0, replay_line = 0;
    node.ForEachKey({"port", "replay_port", "bind", "block_size", "speculative_ttl", "stale_after",
                     "resync", "replay_timeout", "tokenizer", "tokenize_timeout"},
                    [&](const std::string& key, const ConfigNode& v) {
                      if (key == "tokenizer") {
                        k.tokenizer = Address(v, v.String(), v.field(), v.line());
                      } else if (key == "tokenize_timeout") {
                        k.tokenize_timeout_s = v.Duration();
                      } else if (key == "port") {
                        k.port = static_cast<uint16_t>(v.Int(1, 65535));
                        port_line = v.key_line();
                      } else if (key == "replay_port") {
                        k.replay_port = static_cast<uint16_t>(v.Int(1, 65535));
                        replay_line = v.key_line();
                      } else if (key == "bind") {
                        k.bind = v.String();
                        if (Status st = CheckKvEventsUrl(k.bind, /*bind=*/true); !st.ok()) v.Fail(st.message());
                        bind_line = v.key_line();
                      } else if (key == "block_size") {
                        k.block_size = static_cast<int>(v.Int(1, 4096));
                      } else if (key == "speculative_ttl") {
                        k.speculative_ttl_s = v.Duration();
                      } else if (key == "stale_after") {
                        k.stale_after_s = v.Duration();
                      } else if (key == "resync") {
                        k.resync_s = v.Duration();
                      } else {
                        k.replay_timeout_s = v.Duration();
                      }
                    });
    if (port_line != 0 && bind_line != 0) {
      node.FailAt(std::max(port_line, bind_line), Join(node.field(), port_line > bind_line ? "port" : "bind"),
                  "port (replicas publish, the router connects) and bind (replicas connect to the "
                  "router) are exclusive; use one");
    }
    if (replay_line != 0 && port_line == 0) {
      node.FailAt(replay_line, Join(node.field(), "replay_port"), "replay_port needs port");
    }
  }

  static double Fraction(const ConfigNode& v) {
    const double f = v.Number();
    if (f < 0 || f > 1) v.Fail("must be between 0 and 1 (got " + v.Scalar() + ")");
    return f;
  }

  void LoadRetries(const ConfigNode& v, RetryConfig& r) {
    v.ForEachKey({"max_attempts", "budget_ratio", "budget_min_retries", "budget_window"},
                 [&](const std::string& key, const ConfigNode& rv) {
                   if (key == "max_attempts") {
                     r.max_attempts = static_cast<int>(rv.Int(1, 100));
                   } else if (key == "budget_ratio") {
                     r.budget_ratio = Fraction(rv);
                   } else if (key == "budget_min_retries") {
                     r.budget_min_retries = static_cast<int>(rv.Int(0, 1000000));
                   } else {
                     r.budget_window_s = rv.Duration();
                   }
                 });
  }

  void LoadOutlier(const ConfigNode& v, OutlierConfig& o) {
    v.ForEachKey({"consecutive_failures", "base_ejection", "max_ejection", "max_ejection_percent"},
                 [&](const std::string& key, const ConfigNode& ov) {
                   if (key == "consecutive_failures") {
                     o.consecutive_failures = static_cast<int>(ov.Int(0, 1000000));
                   } else if (key == "base_ejection") {
                     o.base_ejection_s = ov.Duration();
                   } else if (key == "max_ejection") {
                     o.max_ejection_s = ov.Duration();
                   } else {
                     const double pct = ov.Number();
                     if (pct < 0 || pct > 100) {
                       ov.Fail("must be between 0 and 100 (got " + ov.Scalar() + ")");
                     }
                     o.max_ejection_percent = pct;
                   }
                 });
    if (o.max_ejection_s < o.base_ejection_s) {
      v.Fail("max_ejection must be >= base_ejection");
    }
  }

  void LoadLimits(const ConfigNode& v, LimitsConfig& limits) {
    v.ForEachKey({"max_connections", "max_body_bytes", "max_header_bytes", "max_headers"},
                 [&](const std::string& key, const ConfigNode& lv) {
                   if (key == "max_connections") {
                     limits.max_connections = static_cast<uint32_t>(lv.Int(0, 10000000));
                   } else if (key == "max_body_bytes") {
                     limits.max_body_bytes = lv.ByteSize();
                   } else if (key == "max_header_bytes") {
                     limits.max_header_bytes = lv.ByteSize();
                   } else {
                     limits.max_headers = static_cast<uint32_t>(lv.Int(1, 1 << 20));
                   }
                 });
  }

  void LoadTimeouts(const ConfigNode& v, TimeoutsConfig& t) {
    v.ForEachKey({"connect", "first_byte", "idle", "request_read", "keepalive_idle"},
                 [&](const std::string& key, const ConfigNode& tv) {
                   const double d = tv.Duration();
                   if (key == "connect") {
                     t.connect_s = d;
                   } else if (key == "first_byte") {
                     t.first_byte_s = d;
                   } else if (key == "idle") {
                     t.idle_s = d;
                   } else if (key == "request_read") {
                     t.request_read_s = d;
                   } else {
                     t.keepalive_idle_s = d;
                   }
                 });
  }

  void LoadEpp(const ConfigNode& v, EppConfig& e) {
    v.ForEachKey({"body_mode", "fallbacks", "stream_timeout", "objectives"},
                 [&](const std::string& key, const ConfigNode& ev) {
                   if (key == "body_mode") {
                     e.body_mode = ev.Enum<EppBodyMode>(
                         "body mode", {{"full_duplex_streamed", EppBodyMode::kFullDuplexStreamed},
                                       {"streamed", EppBodyMode::kStreamed},
                                       {"buffered", EppBodyMode::kBuffered}});
                   } else if (key == "fallbacks") {
                     e.fallbacks = static_cast<int>(ev.Int(0, 7));
                   } else if (key == "stream_timeout") {
                     e.stream_timeout_s = ev.Duration();
                     if (e.stream_timeout_s <= 0) ev.Fail("must be > 0");
                   } else {
                     for (const ConfigNode& o : ev.Entries()) {
                       if (!o.IsMap()) {
                         e.objectives[o.key()] = o.Int(-1000000, 1000000);
                         continue;
                       }
                       // NAME: {priority: P, slo: {ttft: D, tpot: D}}
                       int64_t priority = 0;
                       o.ForEachKey({"priority", "slo"}, [&](const std::string& k,
                                                             const ConfigNode& ov) {
                         if (k == "priority") {
                           priority = ov.Int(-1000000, 1000000);
                         } else {
                           SloConfig slo;
                           LoadSlo(ov, slo);
                           if (slo.ttft_s < 0 || slo.tpot_s < 0) ov.Fail("must be >= 0");
                           e.objective_slos[o.key()] = slo;
                         }
                       });
                       e.objectives[o.key()] = priority;
                     }
                   }
                 });
  }

  void LoadFlow(const ConfigNode& v, FlowConfig& f) {
    flow::FlowOptions& o = f.options;
    std::map<std::string, int, std::less<>> lines;  // key -> line, to place Validate's verdict
    v.ForEachKey({"enabled", "max_requests", "max_bytes", "ttl", "no_endpoint_ttl", "fairness",
                  "ordering", "flow_header", "affinity_window", "max_affinity_skips",
                  "sheddable_reserve", "slo_aware", "slo_admit_fraction",
                  "slo_release_fraction"},
                 [&](const std::string& key, const ConfigNode& fv) {
                   lines[key] = fv.line();
                   if (key == "enabled") {
                     f.enabled = fv.Bool();
                   } else if (key == "max_requests") {
                     o.max_requests = static_cast<uint64_t>(fv.Int(1, int64_t{1} << 40));
                   } else if (key == "max_bytes") {
                     o.max_bytes = fv.ByteSize();
                   } else if (key == "ttl") {
                     o.default_ttl_s = fv.Duration();
                   } else if (key == "no_endpoint_ttl") {
                     o.no_endpoint_ttl_s = fv.Duration();
                   } else if (key == "fairness") {
                     o.fairness = fv.Enum<flow::Fairness>(
                         "fairness", {{"round_robin", flow::Fairness::kRoundRobin},
                                      {"global", flow::Fairness::kGlobal}});
                   } else if (key == "ordering") {
                     o.ordering = fv.Enum<flow::Ordering>(
                         "ordering", {{"fcfs", flow::Ordering::kFcfs},
                                      {"earliest_deadline", flow::Ordering::kEarliestDeadline}});
                   } else if (key == "flow_header") {
                     f.flow_header = fv.String();
                     if (f.flow_header.empty() || !IsHeaderName(f.flow_header)) {
                       fv.Fail("must be an HTTP header name (got '" + f.flow_header + "')");
                     }
                   } else if (key == "affinity_window") {
                     o.affinity_window = static_cast<uint32_t>(fv.Int(1, flow::kMaxAffinityWindow));
                   } else if (key == "sheddable_reserve") {
                     o.sheddable_reserve = fv.Int(0, 4);
                   } else if (key == "slo_aware") {
                     o.slo_aware = fv.Bool();
                   } else if (key == "slo_admit_fraction") {
                     o.slo_admit_fraction = Fraction(fv);
                   } else if (key == "slo_release_fraction") {
                     o.slo_release_fraction = Fraction(fv);
                   } else {
                     o.max_affinity_skips = static_cast<uint32_t>(fv.Int(0, 1000000));
                   }
                 });
    // The queue's own check, its field names mapped back to the file's keys and lines.
    Status st = flow::Validate(o);
    if (st.ok()) return;
    static constexpr std::pair<std::string_view, std::string_view> kKeys[] = {
        {"max_requests", "max_requests"}, {"max_bytes", "max_bytes"},
        {"default_ttl_s", "ttl"},         {"no_endpoint_ttl_s", "no_endpoint_ttl"},
        {"affinity_window", "affinity_window"}};
    const std::string& message = st.message();
    for (const auto& [option, key] : kKeys) {
      if (message.rfind(std::string(option) + " ", 0) != 0) continue;
      auto it = lines.find(key);
      v.FailAt(it != lines.end() ? it->second : v.line(), Join(v.field(), key),
               message.substr(option.size() + 1));
    }
    v.Fail(message);
  }

  void LoadSessions(const ConfigNode& v, routing::SessionOptions& o) {
    v.ForEachKey({"enabled", "ttl", "max_sessions", "header", "token_header"},
                 [&](const std::string& key, const ConfigNode& sv) {
                   if (key == "enabled") {
                     o.enabled = sv.Bool();
                   } else if (key == "ttl") {
                     o.ttl_s = sv.Duration();
                   } else if (key == "max_sessions") {
                     o.max_sessions = static_cast<std::size_t>(sv.Int(1, int64_t{1} << 32));
                   } else {
                     std::string name = sv.String();
                     if (name.empty() || !IsHeaderName(name)) {
                       sv.Fail("must be an HTTP header name (got '" + name + "')");
                     }
                     // Front ends compare lower-case names (HTTP/2 and ext_proc send them so).
                     for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                     (key == "header" ? o.header : o.token_header) = std::move(name);
                   }
                 });
    if (o.header == o.token_header) {
      v.Fail("header and token_header must differ (both '" + o.header + "')");
    }
  }

  void LoadCapture(const ConfigNode& v, capture::CaptureOptions& c) {
    v.ForEachKey({"path", "block_size", "max_bytes", "max_files", "sample", "buffer_lines"},
                 [&](const std::string& key, const ConfigNode& cv) {
                   if (key == "path") {
                     const std::string path = cv.String();
                     if (path.empty()) cv.Fail("must not be empty");
                     c.path = ResolvePath(path);
                   } else if (key == "block_size") {
                     c.block_size = cv.Int(1, 1 << 20);
                   } else if (key == "max_bytes") {
                     c.max_bytes = ByteSize(cv);
                   } else if (key == "max_files") {
                     c.max_files = static_cast<int>(cv.Int(1, 1000));
                   } else if (key == "sample") {
                     c.sample = cv.Number();
                     if (!(c.sample > 0.0 && c.sample <= 1.0)) {
                       cv.Fail("must be in (0, 1] (got '" + cv.Scalar() + "')");
                     }
                   } else {
                     c.buffer_lines = cv.Int(1, int64_t{1} << 24);
                   }
                 });
    if (!c.enabled()) v.Fail("path is required in the capture block");
  }

  // A size in bytes: a whole number with an optional K, M, G (powers of 1000) or KiB, MiB,
  // GiB (powers of 1024) suffix; at least 4096 (one line must fit).
  static int64_t ByteSize(const ConfigNode& v) {
    const std::string text = v.Scalar("a size in bytes");
    static constexpr std::pair<std::string_view, int64_t> kUnits[] = {
        {"KiB", int64_t{1} << 10}, {"MiB", int64_t{1} << 20}, {"GiB", int64_t{1} << 30},
        {"K", 1000}, {"M", 1000000}, {"G", 1000000000}, {"KB", 1000}, {"MB", 1000000},
        {"GB", 1000000000}, {"", 1}};
    std::string_view t = text;
    for (const auto& [suffix, unit] : kUnits) {
      if (t.size() <= suffix.size() || t.substr(t.size() - suffix.size()) != suffix) continue;
      std::string_view digits = t.substr(0, t.size() - suffix.size());
      int64_t n = 0;
      auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
      if (ec != std::errc() || ptr != digits.data() + digits.size() || n <= 0 ||
          n > (int64_t{1} << 50) / unit) {
        break;
      }
      if (n * unit < 4096) v.Fail("must be at least 4096 bytes (got '" + text + "')");
      return n * unit;
    }
    v.Fail("must be a size in bytes such as 268435456, 256MiB or 1G (got '" + text + "')");
  }

  void LoadAuth(const ConfigNode& v, AuthConfig& a) {
    int upstream_line = 0, upstream_key_line = 0;
    v.ForEachKey({"api_keys_file", "api_keys_poll", "upstream_authorization", "upstream_api_key_file"},
                 [&](const std::string& key, const ConfigNode& av) {
                   if (key == "api_keys_file") {
                     a.api_keys_file = av.String();
                     if (a.api_keys_file.empty()) av.Fail("must not be empty");
                     a.api_keys_file_path = ResolvePath(a.api_keys_file);
                   } else if (key == "api_keys_poll") {
                     a.api_keys_poll_s = av.Duration();
                   } else if (key == "upstream_authorization") {
                     a.upstream_authorization = av.Enum<UpstreamAuthorization>(
                         "upstream authorization", {{"forward", UpstreamAuthorization::kForward},
                                                    {"replace", UpstreamAuthorization::kReplace},
                                                    {"drop", UpstreamAuthorization::kDrop}});
                     upstream_line = av.key_line();
                   } else {
                     a.upstream_api_key_file = av.String();
                     if (a.upstream_api_key_file.empty()) av.Fail("must not be empty");
                     a.upstream_api_key_file_path = ResolvePath(a.upstream_api_key_file);
                     upstream_key_line = av.key_line();
                   }
                 });
    if (!a.enabled()) v.Fail("api_keys_file is required in the auth block");
    const bool replace = a.upstream_authorization == UpstreamAuthorization::kReplace;
    if (replace && upstream_key_line == 0) {
      v.FailAt(upstream_line, Join(v.field(), "upstream_authorization"),
               "replace needs upstream_api_key_file (the key sent to the replicas)");
    }
    if (!replace && upstream_key_line != 0) {
      v.FailAt(upstream_key_line, Join(v.field(), "upstream_api_key_file"),
               "only used with upstream_authorization: replace");
    }
  }

  void LoadLocality(const ConfigNode& v, LocalityConfig& l) {
    v.ForEachKey({"region", "rtt", "measure_rtt"}, [&](const std::string& key, const ConfigNode& lv) {
      if (key == "region") {
        l.region = lv.String();
        if (Status st = CheckRegionName(l.region); !st.ok()) lv.Fail(st.message());
      } else if (key == "rtt") {
        if (!lv.IsMap() && !lv.IsNull()) lv.Fail("must be a mapping of region to round trip");
        for (const ConfigNode& r : lv.Entries()) {
          if (Status st = CheckRegionName(r.key()); !st.ok() || r.key().empty()) {
            r.FailAt(r.key_line(), r.field(), st.ok() ? "region must not be empty" : st.message());
          }
          // A round trip may be 0 (the same site); Duration() insists on > 0.
          const std::optional<double> d = ParseDuration(r.Scalar("a duration"));
          if (!d || !std::isfinite(*d)) {
            r.Fail("must be a duration such as 80ms (got '" + r.Scalar() + "')");
          }
          l.rtt_s.emplace_back(r.key(), *d);
        }
      } else {
        l.measure_rtt = lv.Bool();
      }
    });
  }

  void SchedKey(Sched& s, const std::string& key, const ConfigNode& v) {
    if (s.first_key.empty()) s.first_key = v.field();
    if (key == "policy") {
      s.spec.policy = v.String();
      s.policy_line = v.key_line();
    } else if (key == "plugins") {
      LoadPlugins(v, s.spec.plugins);
    } else if (key == "schedulingProfiles") {
      if (s.seed_profile_line != 0) {
        v.FailAt(v.key_line(), v.field(),
                 "use either schedulingProfiles or schedulingProfile, not both");
      }
      s.profiles_line = v.key_line();
      LoadProfiles(v, s.spec.profiles);
    } else {  // schedulingProfile: the seed article's single-profile form
      if (s.profiles_line != 0) {
        v.FailAt(v.key_line(), v.field(),
                 "use either schedulingProfiles or schedulingProfile, not both");
      }
      s.seed_profile_line = v.key_line();
      sched::ProfileSpec prof;
      prof.line = v.key_line();
      LoadRefs(v, prof.plugins);
      s.spec.profiles.push_back(std::move(prof));
    }
  }

  void LoadPlugins(const ConfigNode& v, std::vector<sched::PluginSpec>& out) {
    for (const ConfigNode& item : v.Items("a list of plugins")) {
      sched::PluginSpec p;
      p.line = item.line();
      if (!item.IsMap()) item.Fail("must be a mapping with a type");
      item.ForEachKey({"type", "name", "parameters"},
                      [&](const std::string& key, const ConfigNode& pv) {
                        if (key == "type") {
                          p.type = pv.String();
                        } else if (key == "name") {
                          p.name = pv.String();
                        } else {
                          for (const ConfigNode& param : pv.Entries()) {
                            p.parameters[param.key()] = Param(param);
                          }
                        }
                      });
      if (p.type.empty()) item.FailAt(p.line, Join(item.field(), "type"), "missing plugin type");
      out.push_back(std::move(p));
    }
  }

  // Plain true/false -> bool, plain numbers -> double, anything else scalar -> string;
  // the scheduler's registry checks what each parameter needs.
  static sched::ParamValue Param(const ConfigNode& v) {
    const std::string s = v.Scalar();
    if (v.IsPlain()) {
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (const auto d = ParseDecimal(s)) return *d;
    }
    return s;
  }

  void LoadProfiles(const ConfigNode& v, std::vector<sched::ProfileSpec>& out) {
    for (const ConfigNode& item : v.Items("a list of profiles")) {
      sched::ProfileSpec prof;
      prof.line = item.line();
      prof.name.clear();
      if (!item.IsMap()) item.Fail("must be a mapping with name and plugins");
      item.ForEachKey({"name", "plugins"}, [&](const std::string& key, const ConfigNode& pv) {
        if (key == "name") {
          prof.name = pv.String();
        } else {
          LoadRefs(pv, prof.plugins);
        }
      });
      const std::string name_field = Join(item.field(), "name");
      if (prof.name.empty()) item.FailAt(prof.line, name_field, "missing profile name");
      for (const sched::ProfileSpec& other : out) {
        if (other.name == prof.name) {
          item.FailAt(prof.line, name_field,
                      "duplicate profile name '" + prof.name + "' (first at line " +
                          std::to_string(other.line) + ")");
        }
      }
      out.push_back(std::move(prof));
    }
  }

  void LoadRefs(const ConfigNode& v, std::vector<sched::ProfilePluginRef>& out) {
    for (const ConfigNode& item : v.Items("a list of {pluginRef, weight}")) {
      sched::ProfilePluginRef ref;
      ref.line = item.line();
      if (!item.IsMap()) item.Fail("must be a mapping with pluginRef and weight");
      item.ForEachKey({"pluginRef", "weight"}, [&](const std::string& key, const ConfigNode& rv) {
        if (key == "pluginRef") {
          ref.plugin_ref = rv.String();
        } else {
          ref.weight = rv.Float();
          const std::string as_written = rv.Scalar();
          if (!std::isfinite(ref.weight)) {
            rv.Fail("weight must be a finite number (got " + as_written + ")");
          }
          if (ref.weight < 0) rv.Fail("weight must be >= 0 (got " + as_written + ")");
        }
      });
      if (ref.plugin_ref.empty()) {
        item.FailAt(ref.line, Join(item.field(), "pluginRef"), "missing pluginRef");
      }
      out.push_back(std::move(ref));
    }
  }

  // Runs the scheduler's own validation and maps its field names back to the file's: the
  // seed form's "schedulingProfile[i]" is "schedulingProfiles[0].plugins[i]" to it.
  sched::SchedulingSpec FinishSched(const ConfigNode& root, Sched& s) {
    if (std::optional<sched::SpecError> err = sched::ValidateSchedulingSpec(s.spec)) {
      std::string field = err->field;
      if (s.seed_profile_line != 0) {
        static constexpr std::string_view kProfile0 = "schedulingProfiles[0].plugins";
        static constexpr std::string_view kProfile0Only = "schedulingProfiles[0]";
        if (field.starts_with(kProfile0)) {
          field = "schedulingProfile" + field.substr(kProfile0.size());
        } else if (field.starts_with(kProfile0Only)) {
          field = "schedulingProfile" + field.substr(kProfile0Only.size());
        }
      }
      int line = err->line;
      if (line == 0) line = field == "policy" && s.policy_line ? s.policy_line : s.line;
      root.FailAt(line, Join(s.path, field), err->message);
    }
    return std::move(s.spec);
  }
};

}  // namespace

ConfigOr<RouterConfig> ParseRouterConfig(std::string_view text, std::string_view filename,
                                         ConfigReader reader) {
  return ParseYaml<RouterConfig>(text, filename, [&](const ConfigNode& root) {
    if (reader == ConfigReader::kEpp) RefuseServeOnlyKeys(root);
    return Loader(filename).Load(root);
  });
}

ConfigOr<RouterConfig> LoadRouterConfig(const std::string& path, ConfigReader reader) {
  ConfigOr<std::string> text = ReadConfigFile(path);
  if (!text.ok()) return {std::nullopt, std::move(text.error)};
  return ParseRouterConfig(*text.value, path, reader);
}

}  // namespace kvroute::config
