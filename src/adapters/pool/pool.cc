#include "adapters/pool/pool.h"

#include <set>

#include "config/core_options.h"
#include "adapters/http/tls.h"
#include "core/metrics/prom_writer.h"
#include "adapters/pool/endpoints_watch.h"
#include "adapters/pool/kv_events_feed.h"
#include "adapters/pool/poll_timer.h"
#include "adapters/k8s/kubeconfig.h"

namespace kvroute::pool {

std::vector<routing::EndpointSpec> StaticEndpoints(const config::PoolConfig& pool) {
  return EndpointSpecs(pool.endpoints);
}

std::vector<routing::EndpointSpec> EndpointSpecs(const std::vector<config::EndpointConfig>& entries) {
  std::vector<routing::EndpointSpec> out;
  out.reserve(entries.size());
  for (const config::EndpointConfig& e : entries) {
    routing::EndpointSpec s;
    s.address = e.address;
    s.name = e.name;
    s.host = e.host_port.host;
    s.port = e.host_port.port;
    s.tls = e.tls;
    for (const auto& [k, v] : e.labels) s.labels.emplace_back(k, v);
    s.kv_events = e.kv_events;
    s.kv_events_replay = e.kv_events_replay;
    out.push_back(std::move(s));
  }
  return out;
}

void ApplyKvEvents(const config::KvEventsConfig& k, std::vector<routing::EndpointSpec>& endpoints) {
  for (routing::EndpointSpec& e : endpoints) {
    if (!e.kv_events.empty()) continue;
    if (!k.bind.empty()) {
      e.kv_events = k.bind;  // centralized: the endpoint is found by its topic
      continue;
    }
    if (k.port == 0) continue;
    const std::string host = e.host.find(':') != std::string::npos ? "[" + e.host + "]" : e.host;
    e.kv_events = "tcp://" + host + ":" + std::to_string(k.port);
    if (k.replay_port != 0) e.kv_events_replay = "tcp://" + host + ":" + std::to_string(k.replay_port);
  }
}

Pool::Pool(boost::asio::io_context& scrape_context, std::function<void(std::string_view)> log)
    : ctx_(scrape_context),
      core_(log),
      log_(std::move(log)),
      start_(std::chrono::steady_clock::now()) {
  core_.set_pick_timer([this] { return Now(); });
  kv_feed_ = std::make_unique<KvEventsFeed>(core_, [this] { return Now(); }, log_);
}

Pool::~Pool() { Stop(); }

double Pool::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

namespace {

// Where the cluster is and how to talk to it: the kubeconfig, or in cluster the service
// account. The namespace defaults to the kubeconfig context's / the service account's.
Status LoadClusterAccess(const config::KubernetesDiscoveryConfig& k, k8s::ClusterAccess& access) {
  config::ConfigOr<k8s::ClusterAccess> loaded =
      k.kubeconfig_path.empty() ? k8s::LoadInCluster() : k8s::LoadKubeconfig(k.kubeconfig_path, k.context);
  if (!loaded.ok()) {
    std::string why = loaded.error.ToString();
    if (k.kubeconfig_path.empty()) why = "pool.discovery.kubernetes without a kubeconfig: " + why;
    return Status::InvalidArgument(why);
  }
  access = std::move(*loaded.value);
  return Status::Ok();
}

// One PEM file for upstream_tls, or "" when not configured.
Status ReadPem(const std::string& path, const char* what, std::string& out) {
  if (path.empty()) return Status::Ok();
  config::ConfigOr<std::string> text = config::ReadConfigFile(path);
  if (!text.ok()) return Status::InvalidArgument(std::string("upstream_tls.") + what + ": " + text.error.ToString());
  out = std::move(*text.value);
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<boost::asio::ssl::context>> LoadUpstreamTls(const config::UpstreamTlsConfig& t) {
  http::ClientTlsOptions o;
  o.verify = t.verify;
  if (Status st = ReadPem(t.ca_path, "ca", o.ca_pem); !st.ok()) return st;
  if (Status st = ReadPem(t.cert_path, "cert", o.cert_pem); !st.ok()) return st;
  if (Status st = ReadPem(t.key_path, "key", o.key_pem); !st.ok()) return st;
  auto ctx = http::MakeClientTls(o);
  if (!ctx.ok()) return Status::InvalidArgument("upstream_tls: " + ctx.status().message());
  return ctx;
}

Status Pool::Apply(const config::RouterConfig& config) {
  // Before anything changes: a TLS setting that does not load rejects the whole config.
  auto upstream_tls = LoadUpstreamTls(config.upstream_tls);
  if (!upstream_tls.ok()) return upstream_tls.status();
  std::unique_ptr<PollTimer> old_timer;
  std::unique_ptr<KubernetesDiscovery> old_k8s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return Status::FailedPrecondition("the pool is stopped");
    std::unique_ptr<EndpointsFileWatch> watch;
    std::unique_ptr<KubernetesDiscovery> k8s;
    std::vector<routing::EndpointSpec> endpoints;
    const config::KubernetesDiscoveryConfig& kc = config.pool.kubernetes;
    const bool keep_k8s = kc.enabled() && k8s_ && kc == k8s_config_;
    if (keep_k8s) {
      endpoints = k8s_endpoints_;
    } else if (kc.enabled()) {
      k8s::ClusterAccess access;
      if (Status st = LoadClusterAccess(kc, access); !st.ok()) return st;
      KubernetesDiscoveryOptions o = k8s_base_options_;
      o.pool_name = kc.inference_pool;
      o.namespace_name = kc.namespace_name.empty() ? access.namespace_name : kc.namespace_name;
      if (o.namespace_name.empty()) o.namespace_name = "default";
      o.group = kc.group;
      o.objectives = kc.objectives;
      if (log_) {
        log_("kubernetes: following InferencePool " + o.namespace_name + "/" + o.pool_name + " (" +
             o.group + ") through " + access.server + " (" + access.source + ")");
      }
      KubernetesDiscovery::Callbacks cb;
      cb.log = log_;
      // The discovery is identified by its address: a delivery from one replaced by a
      // reload is ignored.
      auto holder = std::make_shared<const KubernetesDiscovery*>(nullptr);
      cb.on_endpoints = [this, holder](std::vector<routing::EndpointSpec> eps) {
        OnKubernetesEndpoints(*holder, std::move(eps));
      };
      cb.on_objectives = [this](Priorities p) {
        objectives_.store(std::make_shared<const Priorities>(std::move(p)));
        if (objectives_listener_) objectives_listener_();
      };
      k8s = std::make_unique<KubernetesDiscovery>(ctx_, std::move(access), std::move(o), std::move(cb));
      *holder = k8s.get();
    } else if (!config.pool.endpoints_file_path.empty()) {
      watch = std::make_unique<EndpointsFileWatch>(config.pool.endpoints_file_path);
      WatchDecision d = watch->Poll(RealFileSystem());
      if (d.kind != WatchDecision::Kind::kApply) return Status::InvalidArgument(d.error);
      endpoints = EndpointSpecs(d.endpoints);
    } else {
      endpoints = StaticEndpoints(config.pool);
    }
    const std::size_t n = endpoints.size();
    kv_events_ = config.pool.kv_events;
    ApplyKvEvents(kv_events_, endpoints);
    routing::CoreOptions options = config::CoreOptionsFrom(config);
    Status st = core_.Configure(options, std::move(endpoints), Now());
    if (!st.ok()) return st;

    options_ = std::move(options);
    if (!config.locality.measure_rtt && measure_rtt_) {
      // Measuring turned off: the core forgets what was measured (configured values stay).
      std::lock_guard<std::mutex> rtt_lock(rtt_mu_);
      for (const auto& [region, seconds] : core_.measured_rtt()) core_.SetRegionRtt(region, -1.0);
      rtt_.Clear();
    }
    measure_rtt_ = config.locality.measure_rtt;
    if (!keep_k8s) {
      old_k8s = std::move(k8s_);
      k8s_endpoints_.clear();
      k8s_config_ = kc;
      if (k8s) {
        k8s_ = std::move(k8s);
        k8s_->Start();
      } else if (old_k8s) {
        objectives_.store(std::make_shared<const Priorities>());
      }
    }
    scrape_options_ = metrics::ScraperOptions{};
    scrape_options_.interval_s = config.pool.scrape_interval_s;
    scrape_options_.timeout_s = config.pool.staleness_s;
    scrape_options_.connect_timeout_s = config.timeouts.connect_s;
    scrape_options_.names = config.pool.metric_names;
    scrape_options_.model = config.pool.model;
    scrape_options_.tls = upstream_tls.value();
    upstream_tls_ = std::move(upstream_tls).value();
    RestartScraperLocked();
    kv_feed_->Sync(kv_events_);

    // The previous watch (if any) ends here; a tick of it already waiting for mu_ sees the
    // new generation and does nothing.
    ++generation_;
    old_timer = std::move(watch_timer_);
    discovery_.configured = watch != nullptr;
    if (watch) {
      watch->Applied();
      watch_ = std::move(watch);
      discovery_.endpoints = n;
      discovery_.valid = true;
      watch_timer_ = std::make_unique<PollTimer>(
          ctx_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::duration<double>(config.pool.endpoints_file_poll_s)),
          [this, generation = generation_] { PollEndpointsFile(generation); });
      watch_timer_->Start();
    } else {
      watch_.reset();
    }
  }
  // Outside mu_: Stop waits for a running tick (or delivery), which may be waiting for mu_.
  if (old_timer) old_timer->Stop();
  if (old_k8s) old_k8s->Stop();
  return Status::Ok();
}

void Pool::OnKubernetesEndpoints(const KubernetesDiscovery* from, std::vector<routing::EndpointSpec> eps) {
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || from == nullptr || from != k8s_.get()) return;
    const std::size_t n = eps.size();
    std::string change;
    Status st = ReconfigureLocked(eps, change);
    if (!st.ok()) {
      line = "kubernetes: endpoint set rejected by the routing core, keeping the last one: " + st.message();
    } else {
      k8s_endpoints_ = std::move(eps);
      const auto& opt = from->options();
      line = "kubernetes: InferencePool " + opt.namespace_name + "/" + opt.pool_name + ": " +
             std::to_string(n) + " endpoints (" + change + ")";
    }
  }
  if (log_) log_(line);
}

std::string Pool::DiscoveryStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return k8s_ ? k8s_->status() : std::string();
}

Status Pool::ReconfigureLocked(const std::vector<routing::EndpointSpec>& eps, std::string& change) {
  std::set<std::string> before;
  for (const auto& ep : core_.table()->by_id) {
    if (ep) before.insert(ep->spec.address);
  }
  std::size_t added = 0;
  for (const routing::EndpointSpec& e : eps) added += before.erase(e.address) == 0;
  std::vector<routing::EndpointSpec> with_events = eps;
  ApplyKvEvents(kv_events_, with_events);
  Status st = core_.Configure(options_, std::move(with_events), Now());
  if (!st.ok()) return st;
  RestartScraperLocked();
  kv_feed_->Sync(kv_events_);
  change = std::to_string(added) + " added, " + std::to_string(before.size()) + " removed";
  return Status::Ok();
}

void Pool::RestartScraperLocked() {
  // One scraper per endpoint set: index i of its targets is endpoint ids[i] of the core.
  auto table = core_.table();
  std::vector<metrics::ScrapeTarget> targets;
  std::vector<uint32_t> ids;
  std::vector<std::string> regions;  // by target index, for measured round trips
  for (const auto& ep : table->by_id) {
    if (!ep) continue;
    targets.push_back({ep->spec.host, ep->spec.port, ep->spec.tls});
    ids.push_back(ep->id);
    regions.emplace_back(sched::RegionOf(ep->spec.labels));
  }
  routing::RoutingCore* core = &core_;
  auto next = std::make_unique<metrics::MetricsScraper>(
      ctx_, std::move(targets), scrape_options_, [this] { return Now(); },
      [core, ids = std::move(ids), regions = std::move(regions), measure = measure_rtt_,
       this](uint32_t index, const metrics::EndpointSnapshot& snap) {
        routing::ScrapeResult r;
        r.ok = snap.ok;
        r.connect_failed = snap.down;
        r.sent_at_s = snap.ok ? snap.scraped_at_s : snap.attempted_at_s;
        if (snap.ok) r.metrics = snap.metrics;
        const double now = Now();
        core->OnScrape(ids[index], r, now);
        // A scrape that opened its connection also timed the handshake: not a sample.
        if (measure && snap.ok && !snap.round_trip_connected) ObserveRtt(regions[index], snap.round_trip_s, now);
        if (scrape_listener_) scrape_listener_();
      });
  if (scraper_) scraper_->Stop();
  scraper_ = std::move(next);
  scraper_->Start();
}

void Pool::ObserveRtt(const std::string& region, double rtt_s, double now_s) {
  std::lock_guard<std::mutex> lock(rtt_mu_);
  if (std::optional<double> push = rtt_.Observe(region, rtt_s, now_s)) core_.SetRegionRtt(region, *push);
}

void Pool::PollEndpointsFile(uint64_t generation) {
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || generation != generation_ || !watch_) return;
    WatchDecision d = watch_->Poll(RealFileSystem());
    if (d.kind == WatchDecision::Kind::kApply) {
      const std::size_t n = d.endpoints.size();
      std::string change;
      Status st = ReconfigureLocked(EndpointSpecs(d.endpoints), change);
      if (st.ok()) {
        watch_->Applied();
        discovery_.reloads.fetch_add(1, std::memory_order_relaxed);
        discovery_.endpoints = n;
        discovery_.valid = true;
        line = "endpoints file " + watch_->path() + " applied: " + std::to_string(n) + " endpoints (" +
               change + ")";
      } else {
        d = watch_->Rejected(watch_->path() + ": " + st.message());
      }
    } else if (d.recovered) {
      discovery_.valid = true;
      line = "endpoints file " + watch_->path() + " is back to the applied endpoint set";
    }
    if (d.kind == WatchDecision::Kind::kRejected) {
      discovery_.valid = false;
      if (d.log) {
        discovery_.errors.fetch_add(1, std::memory_order_relaxed);
        line = "endpoints file rejected, keeping the last good set (" +
               std::to_string(discovery_.endpoints.load()) + " endpoints): " + d.error;
      }
    }
  }
  if (!line.empty() && log_) log_(line);
}

void Pool::AppendMetrics(std::string& out) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (k8s_) k8s_->AppendMetrics(out);
  }
  kv_feed_->AppendMetrics(out);
  if (!discovery_.configured.load(std::memory_order_relaxed)) return;
  auto load = [](const auto& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  metrics::AppendCounter(out, "kvroute_discovery_reloads_total",
                         "Changed endpoints files applied by the watcher.", {},
                         load(discovery_.reloads));
  metrics::AppendCounter(out, "kvroute_discovery_errors_total",
                         "Broken endpoints files seen by the watcher (each distinct error once); "
                         "the last good set was kept.",
                         {}, load(discovery_.errors));
  metrics::AppendGauge(out, "kvroute_discovery_endpoints",
                       "Endpoints in the applied endpoints file.", {}, load(discovery_.endpoints));
  metrics::AppendGauge(out, "kvroute_discovery_file_valid",
                       "1 when the endpoints file as last read is the applied set, 0 while it "
                       "is broken.",
                       {}, load(discovery_.valid));
}

void Pool::Stop() {
  std::unique_ptr<PollTimer> timer;
  std::unique_ptr<KubernetesDiscovery> k8s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    if (scraper_) scraper_->Stop();
    kv_feed_->Stop();
    timer = std::move(watch_timer_);
    k8s = std::move(k8s_);
  }
  if (timer) timer->Stop();
  if (k8s) k8s->Stop();
}

}  // namespace kvroute::pool
