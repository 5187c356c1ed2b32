// Scrapes every endpoint's /metrics over keep-alive connections and publishes, per
// endpoint, an immutable snapshot of the last result. Two ways to drive it, usable
// together: Start() scrapes on a fixed interval (the router), ScrapeAll() scrapes every
// endpoint once and reports when all have answered (the load generator's before / during /
// after rounds).
//
// Threads: all scraping (timers, HTTP, parsing) runs on the one io_context given to the
// constructor. Snapshots are published with an atomic shared_ptr swap, so any thread may
// read them without locks. OnScrape and ScrapeAll callbacks run on the scraper's context.
//
// Failure handling: a failed attempt (connect error, timeout, non-200, text without any
// of the expected series) keeps the last good values but marks the snapshot !ok (and
// `down` for connect failures); how a stale or failed endpoint is treated is the
// caller's business (the router's config stale_policy). At most one scrape per endpoint
// is in flight: a slow endpoint skips ticks instead of piling up requests.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "adapters/http/client.h"
#include "core/metrics/engine_metrics.h"

namespace kvroute::metrics {

struct EndpointSnapshot {
  // Values of the last successful scrape, raw counters included (prefix_queries,
  // prefix_hits, preemptions: cumulative as the engine reports them).
  EngineMetrics metrics;
  double scraped_at_s = -1.0;      // when that scrape was sent (scraper clock); < 0: never
  double attempted_at_s = -1.0;    // when the last attempt was sent
  // The last successful scrape's round trip: from sending the request to its response
  // head (seconds; < 0: unknown). round_trip_connected: that scrape opened its connection,
  // so the round trip includes the TCP handshake (about one more network round trip).
  double round_trip_s = -1.0;
  bool round_trip_connected = false;
  bool ok = false;                 // the last attempt succeeded
  bool down = false;               // the last attempt could not connect
  http::UpstreamError last_error = http::UpstreamError::kNone;
  std::string error;               // why the last attempt failed ("" when ok)
  uint64_t successes = 0;          // attempts so far that succeeded
  uint64_t failures = 0;           // attempts so far that failed

  // Seconds since the last successful scrape was sent; +inf when never.
  double Age(double now_s) const;
};

struct ScrapeTarget {
  std::string host;
  uint16_t port = 0;
  bool tls = false;  // https://: scraped over TLS (ScraperOptions::tls)
};

struct ScraperOptions {
  double interval_s = 0.050;
  // Bounds each phase of a scrape (connect, first byte, between body pieces); a phase
  // taking longer than this fails the scrape.
  double timeout_s = 2.0;
  double connect_timeout_s = 2.0;
  MetricNames names = MetricNames::For(EngineType::kVllm);
  std::string model;                        // model_name filter ("" = all)
  std::size_t max_body_bytes = 16u << 20;   // larger expositions fail
  // TLS context for https targets (adapters/http/tls.h MakeClientTls); null: the system's store.
  std::shared_ptr<boost::asio::ssl::context> tls;
};

class MetricsScraper {
 public:
  // Called on the scraper's thread after endpoint `index`'s snapshot was replaced.
  using OnScrape = std::function<void(uint32_t index, const EndpointSnapshot& snapshot)>;
  // `clock` returns the caller's time in seconds (monotonic); called on the scraper thread.
  // Nothing is scraped until Start or ScrapeAll.
  MetricsScraper(boost::asio::io_context& ctx, std::vector<ScrapeTarget> targets,
                 ScraperOptions options, std::function<double()> clock, OnScrape on_scrape);
  // Stops (see Stop).
  ~MetricsScraper();
  MetricsScraper(const MetricsScraper&) = delete;
  MetricsScraper& operator=(const MetricsScraper&) = delete;

  // Starts scraping every endpoint now, then every interval. Thread: any; once.
  void Start();
  // Scrapes every endpoint once, then calls `done` on the scraper's context when each has
  // finished (succeeded or failed) an attempt sent after this call, after that attempt's
  // OnScrape. An endpoint with a scrape already in flight is scraped again when that one
  // ends, so a ScrapeAll issued after some event never reports data sent before it.
  // Calls may overlap; each `done` runs once, in the order their rounds complete. With no
  // endpoints `done` is posted at once. Independent of Start (works with or without it).
  // After Stop, `done` is never called.
  // Thread: any.
  void ScrapeAll(std::function<void()> done);
  // Stops scraping and cancels scrapes in flight. After Stop no OnScrape or ScrapeAll
  // callback begins (one already running on the scraper thread may finish).
  // Thread: any; idempotent.
  void Stop();

  std::size_t size() const;
  // The current snapshot of endpoint `index` (never null). Thread: any.
  std::shared_ptr<const EndpointSnapshot> Snapshot(uint32_t index) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvroute::metrics
