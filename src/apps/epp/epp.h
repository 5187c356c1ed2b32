// `kvroute epp`: the endpoint picker behind Envoy-based gateways (Gateway API Inference
// Extension). A second front end over the routing core, beside `kvroute serve`, reading
// the same configuration file: pool::Pool owns the core, the scraping and the clock (and
// later discovery); rpc::ExtProcServer speaks ext_proc and gRPC health; an http::Server
// answers /metrics and /healthz on the metrics port.
//
// Configuration: pool.*, scheduling (or the top-level EndpointPickerConfig keys),
// limits.max_body_bytes (413), timeouts.connect (scrapes), outlier_detection.* and
// retries.budget_* (core options), flow.* (flow control: streams wait at their pick
// while the pool is saturated, apps/epp/grpc/ext_proc_server.h; flow.enabled read at
// start) and epp.*. The keys only serve honours (config::kServeOnlyKeys: listen,
// listen_tls, threads, the proxy's limits and timeouts, retries.max_attempts,
// allow_routing_headers, auth) are refused: the load fails naming file, line and key.
//
// Reload (SIGHUP or Reload()): the pool is re-applied (surviving endpoints keep their
// state), new streams get the new epp settings and stream timeout; ports stay.
//
// Precise prefix routing: while some endpoint has kv_events, each completions or chat
// body is tokenized before its pick (docs/EPP.md "Precise prefix routing"; the tokenizer's
// options, pool.kv_events.tokenizer and tokenize_timeout, are read at start).
//
// TLS (EppOptions::tls): the ext_proc port serves TLS with a given or self-signed
// certificate; with reload, DIR is polled on the io thread (adapters/certs/served_certificate.h) and an
// accepted pair is written to a private directory gRPC watches. /metrics then has
// kvroute_tls_cert_reloads_total{result="applied"|"rejected"} and
// kvroute_tls_cert_expiry_timestamp_seconds (the serving certificate's notAfter).
//
// Threads: one IoPool thread for scraping, tokenizing, the metrics server and signals;
// gRPC's own threads for streams.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "config/router_config.h"
#include "core/common/status.h"
#include "apps/epp/extproc/epp_stats.h"
#include "apps/epp/extproc/exchange.h"
#include "core/routing/routing_core.h"

namespace kvroute::epp {

// TLS on the ext_proc port (--secure-serving, --cert-path, --enable-cert-reload). The
// health and metrics ports stay plaintext.
struct EppTlsOptions {
  bool secure_serving = false;  // the command line's default is true
  // A directory holding tls.crt (the certificate chain, PEM) and tls.key; empty: a
  // self-signed certificate for "kvroute-epp" (localhost, 127.0.0.1, ::1 and the host's
  // name) is made at start and served until the picker stops.
  std::string cert_path;
  // With cert_path: the files are polled every reload_interval_s; a changed pair that
  // loads and matches is served to new connections (within a second more), one that
  // does not is rejected with one log line until the next good one, the old pair staying.
  // The accepted pair is kept in a private directory made under $TMPDIR (else /tmp),
  // removed at Stop: reload needs it writable.
  bool enable_cert_reload = false;
  double reload_interval_s = 5.0;
  // A connection that has not completed its handshake within this time is closed.
  double handshake_timeout_s = 10.0;
};

struct EppOptions {
  std::string config_path;  // Reload() reads it (empty: Reload fails)
  std::string host = "0.0.0.0";
  uint16_t grpc_port = 9002;  // 0: any free port
  uint16_t health_port = 9003;
  uint16_t metrics_port = 9090;
  bool handle_signals = false;  // SIGHUP reloads; SIGINT/SIGTERM end WaitForShutdown
  bool log = true;              // log lines to stderr
  // With `log`: where log lines go instead of stderr (each without "kvroute epp: " and
  // newline), from any thread. Unset: stderr.
  std::function<void(std::string_view)> log_sink;
  // --pool-name / --pool-namespace / --pool-group / --kubeconfig: Kubernetes discovery
  // set on the command line, applied over every configuration loaded (start and
  // reloads). Off when pool_name is empty.
  config::KubernetesDiscoveryConfig kubernetes;
  // --region: the picker's region (locality.region) over every configuration loaded;
  // "" turns locality off. Unset: the file's.
  std::optional<std::string> region;
  EppTlsOptions tls;
};

// `config` with the command line's Kubernetes discovery applied (when flags.enabled()):
// the flags' fields win over pool.discovery.kubernetes; static or file endpoints in the
// file are an error naming the key. Returns ok, or InvalidArgument with that error.
Status ApplyKubernetesFlags(const config::KubernetesDiscoveryConfig& flags, config::RouterConfig& config);

class Epp {
 public:
  Epp(config::RouterConfig config, EppOptions options);
  ~Epp();  // Stops.
  Epp(const Epp&) = delete;
  Epp& operator=(const Epp&) = delete;

  // Applies the configuration, starts scraping and binds the three ports. Unavailable
  // with the reason when a port cannot be bound. Thread: any; once.
  Status Start();
  // Ends every stream, stops serving and scraping. Idempotent; not from a gRPC thread.
  void Stop();

  // The settings new streams use now (the objectives table merged with Kubernetes').
  std::shared_ptr<const extproc::ExchangeSettings> settings() const;
  uint16_t grpc_port() const;
  uint16_t health_port() const;
  uint16_t metrics_port() const;
  // The certificate the ext_proc port serves to new connections (PEM; the generated one
  // without --cert-path), "" in plaintext.
  std::string serving_cert_pem() const;

  // Re-reads options.config_path; on error ("file:line: field: message") nothing changes.
  Status Reload();
  Status Apply(config::RouterConfig config);

  // The metrics port's /metrics text.
  std::string MetricsText();
  bool Ready();
  routing::RoutingCore& core();
  const extproc::EppStats& stats() const;

  void WaitForShutdown();
  void RequestShutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute::epp
