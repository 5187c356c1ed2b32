// `kvroute serve`: the OpenAI-compatible proxy that picks an endpoint per request.
//
// Request path (on the worker thread that owns the client connection):
//   parse the body once (api::ParseRequest) -> SchedRequest -> Pick (ranked endpoints)
//   -> forward the original body to ranked[0] through that worker's UpstreamClient
//   -> stream the response back piece by piece as it arrives.
// A connect failure (or a reset before any response byte) moves on to the next ranked
// endpoint, up to retries.max_attempts attempts. Every Pick handle gets OnDispatched per
// attempt, OnFirstToken at the first body byte, and OnFinished once, whatever happens.
//
// Threads and state:
//   - N worker threads (an IoPool); each has its own UpstreamClient (connection pool), so
//     forwarding takes no locks.
//   - One Scheduler per configuration generation, shared by all workers and serialised by
//     a mutex. Why not one per worker: each would learn its own prefix affinity and send
//     the same prefix to up to N different replicas (the "active-active loses affinity"
//     problem of GIE's EPP), and the in-flight accounting would see only 1/N of the
//     load. A pick costs microseconds, so the lock is held briefly.
//   - The scraper runs on worker 0 and publishes immutable snapshots; after each scrape
//     it updates the scheduler's EndpointState under the same mutex.
//   - Reload builds a complete new generation (endpoints, scheduler, scraper) and swaps
//     it in atomically; requests in flight finish on the generation that picked them.
//     listen address, threads and request limits apply at start only.
//
// Endpoint health: an endpoint whose last scrape could not connect, or that refused a
// proxied connection since, is down (never picked) until a scrape succeeds. Otherwise an
// endpoint whose metrics are stale (failed scrape or older than pool.staleness) is
// excluded (stale_policy exclude, unless every reachable endpoint is stale) or counted as
// saturated: kv usage 1, waiting +1000 (stale_policy saturated).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "config/router_config.h"

namespace kvroute::router {

struct RouterOptions {
  // Where Reload() reads the configuration from (empty: Reload fails).
  std::string config_path;
  // Command-line overrides; they win over the file at start and on every reload.
  std::optional<config::HostPort> listen;
  std::optional<int> threads;
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

  // Starts the workers, binds the listen address and starts scraping. Returns "" or an
  // error. Thread: any; once.
  std::string Start();
  // Stops accepting, scraping and the workers (in-flight requests are dropped).
  // Thread: any but a worker; idempotent.
  void Stop();

  // The bound port (after Start).
  uint16_t port() const;

  // Reads options.config_path and, if it is valid, swaps in a new generation. Returns ""
  // on success, else the error ("file:line: field: message"); the running configuration
  // is then unchanged. Thread: any (SIGHUP calls it on worker 0).
  std::string Reload();
  // Swaps in `config` (already validated). Returns "" or why it could not be applied.
  std::string Apply(config::RouterConfig config);

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
