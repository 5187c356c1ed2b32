#include "config/core_options.h"

namespace kvroute::config {

routing::CoreOptions CoreOptionsFrom(const RouterConfig& config) {
  routing::CoreOptions o;
  o.scheduling = config.scheduling;
  o.health.staleness_s = config.pool.staleness_s;
  o.health.stale_policy = config.pool.stale_policy == StalePolicy::kSaturated
                              ? health::StalePolicy::kSaturated
                              : health::StalePolicy::kExclude;
  o.outlier.consecutive_failures = config.outlier.consecutive_failures;
  o.outlier.base_ejection_s = config.outlier.base_ejection_s;
  o.outlier.max_ejection_s = config.outlier.max_ejection_s;
  o.outlier.max_ejection_percent = config.outlier.max_ejection_percent;
  o.retry_budget.ratio = config.retries.budget_ratio;
  o.retry_budget.min_retries = config.retries.budget_min_retries;
  o.retry_budget.window_s = config.retries.budget_window_s;
  o.default_slo_ttft_s = config.slo.ttft_s;
  o.default_slo_tpot_s = config.slo.tpot_s;
  o.pd = config.pd;
  o.sessions = config.sessions;
  o.region = config.locality.region;
  o.region_rtt_s = config.locality.rtt_s;
  const KvEventsConfig& k = config.pool.kv_events;
  o.kv_events.block_tokens = k.block_size;
  o.kv_events.speculative_ttl_s = k.speculative_ttl_s;
  o.kv_events.stale_after_s = k.stale_after_s;
  o.kv_events.resync_s = k.resync_s;
  return o;
}

}  // namespace kvroute::config
