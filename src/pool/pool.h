// The pool adapter: a RoutingCore wired to its inputs. It turns a router configuration
// into the core's options and endpoint set (the static endpoint list today; the file and
// Kubernetes discovery sources of later issues plug in here), runs one MetricsScraper
// over the current endpoints and feeds its results into the core, and owns the clock the
// front ends pass to the core. Every front end (`kvroute serve`'s HTTP proxy, the
// ext_proc picker) holds one Pool and drives its core().
//
// Threads: scraping runs on the io_context given at construction. Apply may be called
// from any thread (serialised internally); core() and Now() from any.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "config/router_config.h"
#include "core/common/status.h"
#include "core/routing/routing_core.h"
#include "metrics/scrape/scraper.h"

namespace kvroute::pool {

// The core's options from a router configuration (scheduling, staleness, stale policy).
routing::CoreOptions CoreOptionsFrom(const config::RouterConfig& config);
// The endpoint set of a static pool.endpoints list.
std::vector<routing::EndpointSpec> StaticEndpoints(const config::PoolConfig& pool);

class Pool {
 public:
  // `log` receives health transitions and reloads (may be empty).
  Pool(boost::asio::io_context& scrape_context, std::function<void(std::string_view)> log);
  // Stops scraping.
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Applies `config`'s pool and scheduling: Configure on the core (state of surviving
  // endpoints kept), then a scraper over the new endpoint set with the new interval.
  // On error nothing changes. Thread: any.
  Status Apply(const config::RouterConfig& config);
  // Stops scraping; the core stays usable. Idempotent.
  void Stop();

  routing::RoutingCore& core() { return core_; }
  // Seconds on a monotonic clock since the pool was made: the time every core call takes.
  double Now() const;

 private:
  boost::asio::io_context& ctx_;
  routing::RoutingCore core_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::unique_ptr<metrics::MetricsScraper> scraper_;  // guarded by mu_
  bool stopped_ = false;                               // guarded by mu_
};

}  // namespace kvroute::pool
