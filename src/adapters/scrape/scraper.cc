#include "adapters/scrape/scraper.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cmath>
#include <limits>

namespace kvroute::metrics {

namespace asio = boost::asio;

double EndpointSnapshot::Age(double now_s) const {
  if (scraped_at_s < 0) return std::numeric_limits<double>::infinity();
  return now_s - scraped_at_s;
}

namespace {
std::chrono::milliseconds Ms(double s) {
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::llround(s * 1000))));
}
}  // namespace

struct MetricsScraper::Impl : std::enable_shared_from_this<MetricsScraper::Impl> {
  // One ScrapeAll: done when `pending` endpoints have reported.
  struct Round {
    std::size_t pending = 0;
    std::function<void()> done;
  };
  struct Endpoint {
    ScrapeTarget target;
    bool in_flight = false;
    http::UpstreamCall call;
    std::string text;  // reused receive buffer
    // Rounds the attempt in flight completes, and rounds that need a fresh attempt
    // because they began while an older one was already in flight.
    std::vector<std::shared_ptr<Round>> rounds_now, rounds_next;
  };

  static http::ClientOptions ClientOptionsFor(const ScraperOptions& o) {
    http::ClientOptions co;
    co.tls = o.tls;
    return co;
  }

  Impl(asio::io_context& c, std::vector<ScrapeTarget> targets, ScraperOptions o,
       std::function<double()> clk, OnScrape cb)
      : ctx(c),
        options(std::move(o)),
        clock(std::move(clk)),
        on_scrape(std::move(cb)),
        client(c, ClientOptionsFor(options)),
        timer(c),
        snapshots(targets.size()) {
    endpoints.resize(targets.size());
    for (std::size_t i = 0; i < targets.size(); ++i) {
      endpoints[i].target = std::move(targets[i]);
      snapshots[i].store(std::make_shared<const EndpointSnapshot>());
    }
  }

  void Tick() {
    if (stopped.load()) return;
    for (uint32_t i = 0; i < endpoints.size(); ++i) {
      if (!endpoints[i].in_flight) ScrapeOne(i);
    }
    timer.expires_after(Ms(options.interval_s));
    timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->Tick();
    });
  }

  void BeginRound(std::function<void()> done) {
    if (stopped.load()) return;
    if (endpoints.empty()) {
      asio::post(ctx, std::move(done));
      return;
    }
    auto round = std::make_shared<Round>();
    round->pending = endpoints.size();
    round->done = std::move(done);
    for (uint32_t i = 0; i < endpoints.size(); ++i) {
      Endpoint& ep = endpoints[i];
      if (ep.in_flight) {
        ep.rounds_next.push_back(round);
      } else {
        ep.rounds_now.push_back(round);
        ScrapeOne(i);
      }
    }
  }

  void ScrapeOne(uint32_t i) {
    Endpoint& ep = endpoints[i];
    ep.in_flight = true;
    ep.text.clear();
    double sent_at = clock();
    http::UpstreamRequest req;
    req.method = boost::beast::http::verb::get;
    req.target = "/metrics";
    req.connect_timeout = Ms(std::min(options.connect_timeout_s, options.timeout_s));
    req.first_byte_timeout = Ms(options.timeout_s);
    req.idle_timeout = Ms(options.timeout_s);
    auto self = shared_from_this();
    auto status = std::make_shared<Head>();
    http::UpstreamCallbacks cb;
    cb.on_head = [self, status](const http::ResponseHead& h) {
      status->status = h.status;
      status->at_s = self->clock();
    };
    cb.on_data = [self, i](std::string_view d) {
      Endpoint& e = self->endpoints[i];
      if (e.text.size() + d.size() > self->options.max_body_bytes) {
        e.text.clear();
        e.call.Cancel();  // reported below as a failure
        return;
      }
      e.text.append(d);
    };
    cb.on_done = [self, i, sent_at, status](http::UpstreamResult&& r) {
      self->OnDone(i, sent_at, *status, std::move(r));
    };
    req.tls = ep.target.tls;
    ep.call = client.Start(ep.target.host, ep.target.port, req, std::move(cb));
  }

  // The response head of one scrape: its status and when it arrived (scraper clock).
  struct Head {
    int status = 0;
    double at_s = -1.0;
  };

  void OnDone(uint32_t i, double sent_at, const Head& head, http::UpstreamResult&& r) {
    const int status = head.status;
    Endpoint& ep = endpoints[i];
    ep.in_flight = false;
    ep.call = {};
    if (stopped.load()) return;
    auto prev = snapshots[i].load();
    auto next = std::make_shared<EndpointSnapshot>(*prev);
    next->attempted_at_s = sent_at;
    next->last_error = r.error;
    bool ok = false;
    if (!r.ok()) {
      next->error = r.error == http::UpstreamError::kCancelled
                        ? "exposition larger than " + std::to_string(options.max_body_bytes) + " bytes"
                        : std::move(r.message);
    } else if (status != 200) {
      next->error = "status " + std::to_string(status);
    } else {
      EngineMetrics m;
      ParseReport report = ExtractEngineMetrics(ep.text, options.names, options.model, m);
      constexpr uint32_t kLoad = EngineMetrics::kKvUsage |
                                 EngineMetrics::kWaiting |
                                 EngineMetrics::kRunning;
      if (report.aborted || (m.present & kLoad) == 0) {
        next->error = report.aborted ? "not a Prometheus exposition"
                                     : "no kv-usage/waiting/running series in the exposition";
      } else {
        next->metrics = m;
        next->scraped_at_s = sent_at;
        next->round_trip_s = head.at_s >= sent_at ? head.at_s - sent_at : -1.0;
        next->round_trip_connected = !r.reused_connection;
        next->error.clear();
        ok = true;
      }
    }
    next->ok = ok;
    next->down = !ok && http::IsConnectError(r.error);
    if (ok) {
      ++next->successes;
    } else {
      ++next->failures;
    }
    std::shared_ptr<const EndpointSnapshot> published = std::move(next);
    snapshots[i].store(published);
    if (on_scrape) on_scrape(i, *published);
    if (stopped.load()) return;
    // Moved out first: a round's callback may start another round.
    std::vector<std::shared_ptr<Round>> finished = std::move(ep.rounds_now);
    ep.rounds_now = std::move(ep.rounds_next);
    ep.rounds_next.clear();
    if (!ep.rounds_now.empty()) ScrapeOne(i);
    for (const std::shared_ptr<Round>& round : finished) {
      if (--round->pending == 0 && !stopped.load()) {
        auto done = std::move(round->done);
        done();
      }
    }
  }

  void StopOnThread() {
    timer.cancel();
    for (Endpoint& ep : endpoints) {
      ep.call.Cancel();
      ep.call = {};
      ep.rounds_now.clear();
      ep.rounds_next.clear();
    }
    client.CloseIdle();
  }

  asio::io_context& ctx;
  ScraperOptions options;
  std::function<double()> clock;
  OnScrape on_scrape;
  http::UpstreamClient client;
  asio::steady_timer timer;
  std::vector<Endpoint> endpoints;
  std::vector<std::atomic<std::shared_ptr<const EndpointSnapshot>>> snapshots;
  std::atomic<bool> stopped{false};
};

MetricsScraper::MetricsScraper(asio::io_context& ctx, std::vector<ScrapeTarget> targets,
                               ScraperOptions options, std::function<double()> clock,
                               OnScrape on_scrape)
    : impl_(std::make_shared<Impl>(ctx, std::move(targets), std::move(options), std::move(clock),
                                   std::move(on_scrape))) {}

MetricsScraper::~MetricsScraper() { Stop(); }

void MetricsScraper::Start() {
  asio::post(impl_->ctx, [impl = impl_] { impl->Tick(); });
}

void MetricsScraper::ScrapeAll(std::function<void()> done) {
  asio::post(impl_->ctx, [impl = impl_, done = std::move(done)]() mutable {
    impl->BeginRound(std::move(done));
  });
}

void MetricsScraper::Stop() {
  if (impl_->stopped.exchange(true)) return;
  // The timer and the calls belong to the scraper's thread: cancel them there. Holding
  // impl keeps the client alive until then.
  asio::post(impl_->ctx, [impl = impl_] { impl->StopOnThread(); });
}

std::size_t MetricsScraper::size() const { return impl_->endpoints.size(); }

std::shared_ptr<const EndpointSnapshot> MetricsScraper::Snapshot(uint32_t index) const {
  return impl_->snapshots[index].load();
}

}  // namespace kvroute::metrics
