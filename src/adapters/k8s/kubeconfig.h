// Where the Kubernetes API server is and how to authenticate to it: a kubeconfig file
// (out of cluster) or the pod's service account (in cluster), resolved to one
// ClusterAccess. REFERENCE.md 12.
//
// Loading reads every referenced file (CA, client certificate and key) once, at load
// time, so a bad path is a load error naming the kubeconfig's file, line and field. The
// bearer token is the exception: a tokenFile (and the in-cluster token, a projected token
// that the kubelet rotates) is re-read whenever the file changes, through TokenSource.
//
// Thread: values. TokenSource::Current is not thread-safe; one owner (the API client).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "config/yaml_reader.h"

namespace kvroute::k8s {

// A bearer token, fixed or read from a file that may change.
class TokenSource {
 public:
  TokenSource() = default;  // no token
  static TokenSource Fixed(std::string token);
  static TokenSource File(std::string path);

  // The token to send now ("" when none). For a file: re-read when its modification time
  // or size changed since the last read; on a read failure the last good token is kept
  // and `error` (when given) is set to "<path>: cannot read token: <why>".
  const std::string& Current(std::string* error = nullptr);
  bool has_token() const { return !path_.empty() || !token_.empty(); }
  const std::string& path() const { return path_; }
  uint64_t reloads() const { return reloads_; }  // times the file was (re)read

 private:
  std::string token_;
  std::string path_;
  std::optional<std::filesystem::file_time_type> mtime_;
  uintmax_t size_ = 0;
  uint64_t reloads_ = 0;
};

struct ClusterAccess {
  std::string server;  // as configured, e.g. "https://10.0.0.1:6443"
  std::string host;    // "10.0.0.1", "api.example.com", "::1" (no brackets)
  uint16_t port = 443;
  std::string base_path;  // path prefix of the server URL without a trailing '/' ("" usually)
  // PEM of the CAs to verify the server against; empty: the system's default CAs.
  std::string ca_pem;
  bool insecure_skip_tls_verify = false;
  // The name to verify the certificate against and send as SNI (default: host).
  std::string tls_server_name;
  TokenSource token;
  std::string client_cert_pem;  // both or neither
  std::string client_key_pem;
  std::string namespace_name;  // the context's namespace ("default" if unset)
  std::string source;          // "kubeconfig /path (context ctx)" or "in-cluster", for logs
};

// Loads `path`; `context` overrides current-context when non-empty. Relative file paths
// inside are relative to the kubeconfig's directory, as kubectl resolves them. Errors:
// "<path>:<line>: <field>: <message>", e.g.
// "kc.yaml:7: clusters[0].cluster.certificate-authority: cannot read 'ca.crt': No such file".
config::ConfigOr<ClusterAccess> LoadKubeconfig(const std::string& path,
                                               std::string_view context = "");

// The same from text; `file` names it in errors and `dir` anchors relative paths.
config::ConfigOr<ClusterAccess> ParseKubeconfig(std::string_view text, std::string_view file,
                                                const std::filesystem::path& dir,
                                                std::string_view context = "");

struct InClusterPaths {
  std::string token = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string namespace_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
};

// The in-cluster service account: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT
// from `getenv` (std::getenv when null), the token (re-read as it rotates), the CA and
// the namespace from `paths`. Fails, with line 0, when the variables are unset or a file
// cannot be read.
config::ConfigOr<ClusterAccess> LoadInCluster(
    const InClusterPaths& paths = {},
    const std::function<const char*(const char*)>& getenv = nullptr);

// Standard base64 (padding optional, whitespace ignored); nullopt when malformed.
std::optional<std::string> DecodeBase64(std::string_view in);

// "https://host[:port][/path]" into access's server, host, port, base_path. Returns ok,
// else InvalidArgument saying why it is not usable.
Status ParseServerUrl(std::string_view url, ClusterAccess& access);

}  // namespace kvroute::k8s
