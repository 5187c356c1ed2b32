#include "adapters/k8s/kubeconfig.h"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "core/common/base64.h"

namespace kvroute::k8s {

namespace fs = std::filesystem;
using config::ConfigError;
using config::ConfigNode;
using config::ConfigOr;

namespace {

bool ReadWhole(const fs::path& p, std::string& out, std::string& why) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    std::error_code ec(errno, std::generic_category());
    why = ec.message();
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  return s;
}

// A file named by a kubeconfig field, relative to the kubeconfig's directory.
std::string ReadReferenced(const ConfigNode& n, const fs::path& dir) {
  std::string name = n.String();
  if (name.empty()) n.Fail("must not be empty");
  fs::path p(name);
  if (p.is_relative()) p = dir / p;
  std::string out, why;
  if (!ReadWhole(p, out, why)) n.Fail("cannot read '" + name + "': " + why);
  return out;
}

std::string DecodeData(const ConfigNode& n) {
  std::optional<std::string> d = DecodeBase64(n.String());
  if (!d) n.Fail("must be base64");
  return std::move(*d);
}

// The `what` (cluster, context, user) named `name` in the list under `key`.
ConfigNode FindNamed(const ConfigNode& root, std::string_view key, std::string_view what,
                     const std::string& name, const ConfigNode& referrer) {
  for (const ConfigNode& item : root.Get(key).Items()) {
    if (item.Require("name").String() == name) return item.Require(what);
  }
  referrer.Fail("no " + std::string(what) + " named '" + name + "' in " + std::string(key));
}

}  // namespace

TokenSource TokenSource::Fixed(std::string token) {
  TokenSource t;
  t.token_ = std::move(token);
  return t;
}

TokenSource TokenSource::File(std::string path) {
  TokenSource t;
  t.path_ = std::move(path);
  return t;
}

const std::string& TokenSource::Current(std::string* error) {
  if (path_.empty()) return token_;
  std::error_code ec;
  fs::file_time_type mtime = fs::last_write_time(path_, ec);
  uintmax_t size = ec ? 0 : fs::file_size(path_, ec);
  if (!ec && mtime_ && *mtime_ == mtime && size == size_) return token_;
  std::string text, why;
  if (ec || !ReadWhole(path_, text, why)) {
    if (error) *error = path_ + ": cannot read token: " + (ec ? ec.message() : why);
    return token_;
  }
  token_ = std::string(Trim(text));
  mtime_ = mtime;
  size_ = size;
  ++reloads_;
  return token_;
}

std::optional<std::string> DecodeBase64(std::string_view in) {
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0, pad = 0, digits = 0;
  for (char c : in) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      ++pad;
      continue;
    }
    int v = Base64DigitValue(c);
    if (v < 0 || pad > 0) return std::nullopt;  // bad character, or data after padding
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    ++digits;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  if (digits % 4 == 1 || pad > 2) return std::nullopt;
  if (pad > 0 && (digits + pad) % 4 != 0) return std::nullopt;
  return out;
}

Status ParseServerUrl(std::string_view url, ClusterAccess& a) {
  constexpr std::string_view kScheme = "https://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return Status::InvalidArgument("must be an https:// URL");
  }
  std::string_view rest = url.substr(kScheme.size());
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  std::string_view host = authority, port;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return Status::InvalidArgument("unterminated '[' in the host");
    }
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return Status::InvalidArgument("bad text after the IPv6 address");
      port = after.substr(1);
    }
  } else if (size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) return Status::InvalidArgument("has no host");
  uint32_t p = 443;
  if (!port.empty()) {
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc() || end != port.data() + port.size() || p == 0 || p > 65535)
      return Status::InvalidArgument("bad port '" + std::string(port) + "'");
  }
  a.server = std::string(url);
  a.host = std::string(host);
  a.port = static_cast<uint16_t>(p);
  a.base_path = std::string(path);
  return Status::Ok();
}

ConfigOr<ClusterAccess> ParseKubeconfig(std::string_view text, std::string_view file,
                                        const fs::path& dir, std::string_view context) {
  std::string file_name(file);
  return config::ParseYaml<ClusterAccess>(text, file, [&](const ConfigNode& root) {
    ClusterAccess a;
    std::string ctx_name(context);
    if (ctx_name.empty()) {
      ConfigNode cur = root.Get("current-context");
      if (!cur || cur.IsNull() || cur.String().empty())
        root.Fail("no current-context (and no context given)");
      ctx_name = cur.String();
    }
    ConfigNode ctx = FindNamed(root, "contexts", "context", ctx_name,
                               root.Has("current-context") ? root.Get("current-context") : root);
    a.source = "kubeconfig " + file_name + " (context " + ctx_name + ")";
    a.namespace_name = "default";
    if (ConfigNode ns = ctx.Get("namespace"); ns && !ns.IsNull()) a.namespace_name = ns.String();

    ConfigNode cluster_ref = ctx.Require("cluster");
    ConfigNode cluster = FindNamed(root, "clusters", "cluster", cluster_ref.String(), cluster_ref);
    ConfigNode server = cluster.Require("server");
    if (Status st = ParseServerUrl(server.String(), a); !st.ok()) server.Fail(st.message());
    if (ConfigNode n = cluster.Get("insecure-skip-tls-verify"); n && !n.IsNull())
      a.insecure_skip_tls_verify = n.Bool();
    if (ConfigNode n = cluster.Get("tls-server-name"); n && !n.IsNull()) a.tls_server_name = n.String();
    ConfigNode ca_file = cluster.Get("certificate-authority");
    ConfigNode ca_data = cluster.Get("certificate-authority-data");
    if (ca_data && !ca_data.IsNull()) {
      a.ca_pem = DecodeData(ca_data);  // kubectl: the data wins over the file
    } else if (ca_file && !ca_file.IsNull()) {
      a.ca_pem = ReadReferenced(ca_file, dir);
    }

    if (ConfigNode user_ref = ctx.Get("user"); user_ref && !user_ref.IsNull()) {
      ConfigNode user = FindNamed(root, "users", "user", user_ref.String(), user_ref);
      for (std::string_view unsupported : {"exec", "auth-provider", "username"}) {
        if (ConfigNode n = user.Get(unsupported); n && !n.IsNull())
          n.Fail("not supported (use token, tokenFile or a client certificate)");
      }
      if (ConfigNode n = user.Get("token"); n && !n.IsNull()) {
        a.token = TokenSource::Fixed(n.String());
      } else if (ConfigNode f = user.Get("tokenFile"); f && !f.IsNull()) {
        fs::path p(f.String());
        if (p.is_relative()) p = dir / p;
        ReadReferenced(f, dir);  // must exist now; re-read later as it rotates
        a.token = TokenSource::File(p.string());
      }
      ConfigNode cert_data = user.Get("client-certificate-data");
      ConfigNode cert_file = user.Get("client-certificate");
      ConfigNode key_data = user.Get("client-key-data");
      ConfigNode key_file = user.Get("client-key");
      if (cert_data && !cert_data.IsNull()) a.client_cert_pem = DecodeData(cert_data);
      else if (cert_file && !cert_file.IsNull()) a.client_cert_pem = ReadReferenced(cert_file, dir);
      if (key_data && !key_data.IsNull()) a.client_key_pem = DecodeData(key_data);
      else if (key_file && !key_file.IsNull()) a.client_key_pem = ReadReferenced(key_file, dir);
      if (a.client_cert_pem.empty() != a.client_key_pem.empty())
        user.Fail("a client certificate needs both the certificate and the key");
    }
    return a;
  });
}

ConfigOr<ClusterAccess> LoadKubeconfig(const std::string& path, std::string_view context) {
  ConfigOr<std::string> text = config::ReadConfigFile(path);
  if (!text.ok()) return {std::nullopt, text.error};
  fs::path dir = fs::path(path).parent_path();
  return ParseKubeconfig(*text.value, path, dir.empty() ? fs::path(".") : dir, context);
}

ConfigOr<ClusterAccess> LoadInCluster(const InClusterPaths& paths,
                                      const std::function<const char*(const char*)>& getenv) {
  auto env = [&](const char* name) -> std::string {
    const char* v = getenv ? getenv(name) : std::getenv(name);
    return v ? v : "";
  };
  auto fail = [](std::string message) {
    ConfigOr<ClusterAccess> r;
    r.error = ConfigError{"in-cluster", 0, "", std::move(message)};
    return r;
  };
  std::string host = env("KUBERNETES_SERVICE_HOST");
  std::string port = env("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty())
    return fail("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a "
                "cluster? give a kubeconfig)");
  ClusterAccess a;
  std::string url = "https://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
                    ":" + port;
  if (Status st = ParseServerUrl(url, a); !st.ok())
    return fail("KUBERNETES_SERVICE_HOST/PORT: " + url + " " + st.message());
  std::string why;
  if (!ReadWhole(paths.ca, a.ca_pem, why)) return fail(paths.ca + ": cannot read: " + why);
  a.token = TokenSource::File(paths.token);
  std::string token_error;
  a.token.Current(&token_error);
  if (!token_error.empty()) return fail(token_error);
  std::string ns;
  if (ReadWhole(paths.namespace_file, ns, why)) a.namespace_name = std::string(Trim(ns));
  if (a.namespace_name.empty()) a.namespace_name = "default";
  a.source = "in-cluster";
  return {std::move(a), {}};
}

}  // namespace kvroute::k8s
