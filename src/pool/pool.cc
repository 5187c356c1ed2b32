#include "pool/pool.h"

namespace kvroute::pool {

routing::CoreOptions CoreOptionsFrom(const config::RouterConfig& config) {
  routing::CoreOptions o;
  o.scheduling = config.scheduling;
  o.health.staleness_s = config.pool.staleness_s;
  o.health.stale_policy = config.pool.stale_policy == config::StalePolicy::kSaturated
                              ? health::StalePolicy::kSaturated
                              : health::StalePolicy::kExclude;
  o.outlier.consecutive_failures = config.outlier.consecutive_failures;
  o.outlier.base_ejection_s = config.outlier.base_ejection_s;
  o.outlier.max_ejection_s = config.outlier.max_ejection_s;
  o.outlier.max_ejection_percent = config.outlier.max_ejection_percent;
  o.retry_budget.ratio = config.retries.budget_ratio;
  o.retry_budget.min_retries = config.retries.budget_min_retries;
  o.retry_budget.window_s = config.retries.budget_window_s;
  return o;
}

std::vector<routing::EndpointSpec> StaticEndpoints(const config::PoolConfig& pool) {
  std::vector<routing::EndpointSpec> out;
  out.reserve(pool.endpoints.size());
  for (const config::EndpointConfig& e : pool.endpoints) {
    routing::EndpointSpec s;
    s.address = e.address;
    s.name = e.name;
    s.host = e.host_port.host;
    s.port = e.host_port.port;
    for (const auto& [k, v] : e.labels) s.labels.emplace_back(k, v);
    out.push_back(std::move(s));
  }
  return out;
}

Pool::Pool(boost::asio::io_context& scrape_context, std::function<void(std::string_view)> log)
    : ctx_(scrape_context), core_(std::move(log)), start_(std::chrono::steady_clock::now()) {
  core_.set_pick_timer([this] { return Now(); });
}

Pool::~Pool() { Stop(); }

double Pool::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

Status Pool::Apply(const config::RouterConfig& config) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return Status::FailedPrecondition("the pool is stopped");
  Status st = core_.Configure(CoreOptionsFrom(config), StaticEndpoints(config.pool), Now());
  if (!st.ok()) return st;

  // One scraper per endpoint set: index i of its targets is endpoint ids[i] of the core.
  auto table = core_.table();
  std::vector<metrics::ScrapeTarget> targets;
  std::vector<uint32_t> ids;
  for (const auto& ep : table->by_id) {
    if (!ep) continue;
    targets.push_back({ep->spec.host, ep->spec.port});
    ids.push_back(ep->id);
  }
  metrics::ScraperOptions so;
  so.interval_s = config.pool.scrape_interval_s;
  so.timeout_s = config.pool.staleness_s;
  so.connect_timeout_s = config.timeouts.connect_s;
  so.names = config.pool.metric_names;
  so.model = config.pool.model;
  routing::RoutingCore* core = &core_;
  auto next = std::make_unique<metrics::MetricsScraper>(
      ctx_, std::move(targets), std::move(so), [this] { return Now(); },
      [core, ids = std::move(ids), this](uint32_t index, const metrics::EndpointSnapshot& snap) {
        routing::ScrapeResult r;
        r.ok = snap.ok;
        r.connect_failed = snap.down;
        r.sent_at_s = snap.ok ? snap.scraped_at_s : snap.attempted_at_s;
        if (snap.ok) r.metrics = snap.metrics;
        core->OnScrape(ids[index], r, Now());
      });
  if (scraper_) scraper_->Stop();
  scraper_ = std::move(next);
  scraper_->Start();
  return Status::Ok();
}

void Pool::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  if (scraper_) scraper_->Stop();
}

}  // namespace kvroute::pool
