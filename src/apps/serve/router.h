// `kvroute serve`: the OpenAI-compatible proxy. A thin HTTP front end over the routing
// core (src/core/routing, wired by src/adapters/pool): it parses the request, asks the core for a
// pick, forwards to the winner through its worker's upstream client, relays the response
// as it arrives, and reports dispatched / first token / finished back to the core.
//
// Request path (on the worker thread that owns the client connection):
//   parse the body once (api::ParseRequest) -> PickRequest -> RoutingCore::Pick (ranked
//   endpoints and a handle) -> forward the original body to ranked[0] -> stream back.
// A connect failure (or a reset before any response byte) moves on to the next ranked
// endpoint, up to retries.max_attempts attempts; a connect failure also marks the
// endpoint down in the core until a scrape reaches it again.
//
// Flow control (`flow.enabled`, off by default; core/flow/flow_queue.h): before the pick,
// a request is admitted against the routing core's saturation verdict (Load(now)):
// dispatched at once while the pool has room and nothing of its priority or higher waits;
// else queued in its priority's band, or refused with 429 + Retry-After (sheddable:
// priority below 0; a band over max_requests/max_bytes). Waiting requests are picked and
// forwarded when capacity frees: after every request's OnFinished and every scrape result
// (Expire, then NextToDispatch while the pool is not saturated). One timer, armed at the
// queue's NextExpiry, answers those past flow.ttl with 429 (flow.no_endpoint_ttl: 503). A
// client that disconnects while waiting is cancelled at once (the server's pending read
// sees the close: Exchange::OnClientGone). Admission and release are flow::FlowGate's
// (core/flow/flow_gate.h), the gate epp and simulate use too: releases bind late, the
// replica that freed taking the waiting request whose prefix it holds (the core's prefix
// probe, RoutingCore::PrefixKey / HeldBlocks).
//
// Threads: N worker threads (an IoPool), each with its own UpstreamClient, so forwarding
// takes no locks; the core serialises only its scheduler (see routing_core.h). Scraping
// runs on worker 0. /metrics is rendered from atomics, published snapshots and the
// core's exposition (routing_core.h says which of its sections take which lock).
//
// Reload (SIGHUP or Reload()): the file is parsed whole; a valid one is applied to the
// pool (endpoints that survive keep their prefix-index entries, in-flight accounting and
// scraped state) and to the front end's own settings (timeouts, retries, routing
// headers). listen, threads, request limits and the auth block apply at start only; SIGHUP
// (and Reload()) also re-reads the API key files.
//
// API keys (`auth:`; apps/serve/api_key_auth.h): a request whose path starts with /v1 needs
// `Authorization: Bearer <a loaded key>`, else 401 {"error":"Unauthorized"} at once,
// before any parsing or routing; upstream_authorization forwards, replaces or drops the
// Authorization header replicas see (proxied and fanned-out requests alike).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "config/router_config.h"
#include "core/common/status.h"

namespace kvroute::router {

struct RouterOptions {
  // Where Reload() reads the configuration from (empty: Reload fails).
  std::string config_path;
  // Command-line overrides; they win over the file at start and on every reload.
  std::optional<config::HostPort> listen;
  // The HTTPS listener's address (listen_tls.address; port 0: any free port), when the
  // file configures one.
  std::optional<config::HostPort> listen_tls;
  std::optional<int> threads;
  // --region: the router's region (locality.region); "" turns locality off.
  std::optional<std::string> region;
  // Install SIGHUP (reload) and SIGINT/SIGTERM (WaitForShutdown returns) handlers.
  bool handle_signals = false;
  // Log lines (reloads, errors) go to stderr unless false.
  bool log = true;
};

class Router {
 public:
  Router(config::RouterConfig config, RouterOptions options);
  // Stops.
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Starts the workers, binds the listen address and starts scraping. Thread: any; once.
  Status Start();
  // Stops accepting, scraping and the workers (in-flight requests are dropped).
  // Thread: any but a worker; idempotent.
  void Stop();

  // The bound port (after Start); 0 with `listen: off`.
  uint16_t port() const;
  // The HTTPS listener's bound port (listen_tls); 0 without one.
  uint16_t tls_port() const;
  // Looks at listen_tls's certificate files now (as every listen_tls.poll does); true
  // when a changed pair was applied. Thread: any but while a poll runs on worker 0 (tests
  // call it with a long poll interval).
  bool PollCertificates();

  // Reads options.config_path and, if it is valid, applies it. On error ("file:line:
  // field: message") the running configuration is unchanged. Thread: any (SIGHUP calls it
  // on worker 0).
  Status Reload();
  // Applies `config` (already validated), or says why it could not be applied.
  Status Apply(config::RouterConfig config);

  // Checks the API key files (auth.api_keys_file and the upstream key file) now, as the
  // auth.api_keys_poll timer does: re-read when their stat changed. Thread: any.
  void PollApiKeys();

  // The router's own /metrics exposition. Thread: any.
  std::string MetricsText();
  // True when at least one endpoint has fresh metrics (GET /readyz).
  bool Ready();
  // Successful reloads so far (configuration generations minus one).
  uint64_t reloads() const;

  // Blocks until SIGINT/SIGTERM (with handle_signals) or RequestShutdown().
  void WaitForShutdown();
  void RequestShutdown();

  struct Impl;  // implementation detail (public so the .cc's request objects can name it)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvroute::router
