// The pool adapter: a RoutingCore wired to its inputs. It turns a router configuration
// into the core's options and endpoint set (the static pool.endpoints list, or file
// discovery: pool.endpoints_file, watched; or Kubernetes discovery:
// pool.discovery.kubernetes, the pods of an InferencePool), runs one MetricsScraper
// over the current endpoints and feeds its results into the core, and owns the clock the
// front ends pass to the core. Every front end (`kvroute serve`'s HTTP proxy, the
// ext_proc picker) holds one Pool and drives its core().
//
// File discovery: Apply reads pool.endpoints_file (a broken file fails Apply, so a SIGHUP
// reload with one is rejected whole) and then polls its metadata every
// pool.endpoints_file_poll on the scrape io_context (adapters/pool/endpoints_watch.h decides). A
// changed, valid file is applied with Configure under the options of the last Apply
// (surviving addresses keep ids, scraped state, prefix entries and in-flight accounting)
// and the scraper follows the new set; a broken one keeps the last good set, logs one
// line naming file:line per distinct error and counts it.
//
// Kubernetes discovery (adapters/pool/kubernetes_discovery.h): Apply loads the kubeconfig (or the
// in-cluster service account; a bad one fails Apply) and starts following the pool; the
// core starts with no endpoints and gets each set the discovery delivers, with the options
// of the last Apply. A reload with the same pool.discovery.kubernetes keeps the running
// discovery and its endpoints. The InferenceObjectives' priorities are objectives().
//
// Measured round trips (locality.measure_rtt, on by default): every successful scrape over
// a kept-alive connection times its request to the response head; the round trips of a
// region's endpoints are smoothed together (routing::RegionRttEstimator, alpha 0.2) and
// pushed into the core with SetRegionRtt at most once a second per region. Endpoints
// without a region are not measured; a region in locality.rtt keeps its configured value.
//
// Threads: scraping and polling run on the io_context given at construction. Apply may be
// called from any thread (serialised internally); core(), Now() and AppendMetrics from any.
#pragma once

#include <boost/asio/io_context.hpp>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "config/router_config.h"
#include "core/common/status.h"
#include "core/routing/region_rtt.h"
#include "core/routing/routing_core.h"
#include "core/common/published.h"
#include "adapters/scrape/scraper.h"
#include "adapters/pool/kubernetes_discovery.h"

namespace kvroute::pool {

// The endpoint set of a static pool.endpoints list.
std::vector<routing::EndpointSpec> StaticEndpoints(const config::PoolConfig& pool);
// The endpoint set of parsed entries (pool.endpoints or an endpoints file).
std::vector<routing::EndpointSpec> EndpointSpecs(const std::vector<config::EndpointConfig>& entries);
// Fills in KV-event addresses from pool.kv_events for endpoints without their own: with
// `port`, tcp://<host>:<port> (and the replay port); with `bind`, the bind address
// (centralized: the subscriber finds the endpoint by the host in its topic).
void ApplyKvEvents(const config::KvEventsConfig& kv_events, std::vector<routing::EndpointSpec>& endpoints);

class EndpointsFileWatch;
class PollTimer;
class KvEventsFeed;

// upstream_tls's files read and made into the upstream clients' TLS context, or
// InvalidArgument naming the setting ("upstream_tls.ca: ...", "upstream_tls: client
// certificate: ...").
Result<std::shared_ptr<boost::asio::ssl::context>> LoadUpstreamTls(const config::UpstreamTlsConfig& t);

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
  // Stops scraping and file polling; the core stays usable. Idempotent.
  void Stop();

  // Appends kvroute_discovery_* (reloads, errors, endpoints, file_valid) when an
  // endpoints file is configured, kvroute_k8s_* with Kubernetes discovery; nothing
  // otherwise. Thread: any.
  void AppendMetrics(std::string& out) const;

  // Why discovery yields no endpoints ("InferencePool ns/p not found"), "" when it does or
  // when there is no discovery. For readiness messages. Thread: any.
  std::string DiscoveryStatus() const;

  // The InferenceObjectives' priorities from Kubernetes (empty without it). Thread: any.
  std::shared_ptr<const Priorities> objectives() const { return objectives_.load(); }
  // Called (on the scrape io_context) after objectives() changed. Set before Apply.
  void set_objectives_listener(std::function<void()> f) { objectives_listener_ = std::move(f); }
  // Called on the scrape io_context after each scrape result reached the core (flow
  // control dispatches waiting requests then). Set before Apply.
  void set_scrape_listener(std::function<void()> f) { scrape_listener_ = std::move(f); }
  // Options for the Kubernetes discovery Apply starts (tests shorten the backoff). Set
  // before Apply.
  void set_kubernetes_options(const KubernetesDiscoveryOptions& o) { k8s_base_options_ = o; }

  // The TLS context for https:// endpoints from the last applied upstream_tls (never null
  // after a successful Apply). Thread: any.
  std::shared_ptr<boost::asio::ssl::context> upstream_tls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return upstream_tls_;
  }

  routing::RoutingCore& core() { return core_; }
  // Seconds on a monotonic clock since the pool was made: the time every core call takes.
  double Now() const;

 private:
  boost::asio::io_context& ctx_;
  routing::RoutingCore core_;
  std::function<void(std::string_view)> log_;
  std::shared_ptr<boost::asio::ssl::context> upstream_tls_;  // guarded by mu_
  const std::chrono::steady_clock::time_point start_;
  mutable std::mutex mu_;
  std::unique_ptr<metrics::MetricsScraper> scraper_;  // guarded by mu_
  std::unique_ptr<KvEventsFeed> kv_feed_;  // KV-cache events into the core; synced under mu_
  bool stopped_ = false;                               // guarded by mu_

  // Scrapes the core's current endpoint table with scrape_options_. Caller holds mu_.
  void RestartScraperLocked();
  // Configure with options_ and restart the scraper; `change` = "N added, M removed".
  // Caller holds mu_.
  Status ReconfigureLocked(const std::vector<routing::EndpointSpec>& eps, std::string& change);
  // A scrape round trip of an endpoint in `region` (scrape thread).
  void ObserveRtt(const std::string& region, double rtt_s, double now_s);
  // One poll of the endpoints file, from the PollTimer of generation `generation`.
  void PollEndpointsFile(uint64_t generation);

  // Guarded by mu_: what the last successful Apply configured, for discovery's Configure.
  routing::CoreOptions options_;
  config::KvEventsConfig kv_events_;  // pool.kv_events of the applied configuration
  metrics::ScraperOptions scrape_options_;
  bool measure_rtt_ = true;  // locality.measure_rtt of the last Apply
  // Measured round trips; rtt_mu_ is taken by scrape callbacks (never with mu_ held
  // inside it: Apply takes mu_ then rtt_mu_, callbacks only rtt_mu_).
  std::mutex rtt_mu_;
  routing::RegionRttEstimator rtt_;
  std::unique_ptr<EndpointsFileWatch> watch_;  // null: no endpoints file
  std::unique_ptr<PollTimer> watch_timer_;
  uint64_t generation_ = 0;  // bumped by every Apply: stale ticks do nothing

  // Kubernetes discovery: the running one (null: none), the config it follows, and the
  // last endpoint set it delivered (kept for reloads). Guarded by mu_.
  std::unique_ptr<KubernetesDiscovery> k8s_;
  config::KubernetesDiscoveryConfig k8s_config_;
  std::vector<routing::EndpointSpec> k8s_endpoints_;
  KubernetesDiscoveryOptions k8s_base_options_;
  void OnKubernetesEndpoints(const KubernetesDiscovery* from, std::vector<routing::EndpointSpec> eps);
  Published<Priorities> objectives_{std::make_shared<const Priorities>()};
  std::function<void()> objectives_listener_;
  std::function<void()> scrape_listener_;

  struct DiscoveryStats {
    std::atomic<bool> configured{false};
    std::atomic<uint64_t> reloads{0};
    std::atomic<uint64_t> errors{0};
    std::atomic<uint64_t> endpoints{0};
    std::atomic<bool> valid{false};
  };
  DiscoveryStats discovery_;
};

}  // namespace kvroute::pool
