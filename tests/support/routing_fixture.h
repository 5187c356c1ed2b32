// Virtual-time fixtures for the tests of the routing core and of what runs on it (the
// flow gate): endpoint specs, and scrape results as the scraper adapter hands them to
// RoutingCore::OnScrape. No sockets: the addresses are never dialled.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "metrics/testdata_util.h"
#include "core/routing/routing_core.h"
#include "core/metrics/engine_metrics.h"

namespace kvroute::test_support {

// The endpoint `name` at 127.0.0.1:`port`, with `labels`.
inline routing::EndpointSpec TestEndpoint(
    const std::string& name, int port,
    std::vector<std::pair<std::string, std::string>> labels = {}) {
  routing::EndpointSpec e;
  e.name = name;
  e.host = "127.0.0.1";
  e.port = static_cast<uint16_t>(port);
  e.address = "127.0.0.1:" + std::to_string(port);
  e.labels = std::move(labels);
  return e;
}

// A successful scrape, sent at `at`, of the vLLM exposition `text` (vLLM's metric names,
// every model).
inline routing::ScrapeResult Scraped(const std::string& text, double at) {
  routing::ScrapeResult r;
  r.ok = true;
  r.sent_at_s = at;
  metrics::ExtractEngineMetrics(text, metrics::MetricNames::For(metrics::EngineType::kVllm), "",
                                r.metrics);
  return r;
}

// A scrape at `at` of the vLLM v0.10 fixture with engine 0's running and waiting requests
// and KV usage replaced by the given sample values (metrics::testing::V010With). The core
// calls an endpoint saturated from 5 waiting or KV usage 0.8.
inline routing::ScrapeResult ScrapedLoad(const std::string& running, const std::string& waiting,
                                         const std::string& kv, double at) {
  return Scraped(metrics::testing::V010With(running, waiting, kv), at);
}

}  // namespace kvroute::test_support
