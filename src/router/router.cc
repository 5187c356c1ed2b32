#include "router/router.h"

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <limits>
#include <map>
#include <thread>

#include "core/api/openai.h"
#include "core/sched/builtin_plugins.h"
#include "core/sched/dynamo_cost.h"
#include "core/sched/profile_scheduler.h"
#include "core/sched/registry.h"
#include "core/sched/scheduler.h"
#include "http/client.h"
#include "http/io_pool.h"
#include "http/server.h"
#include "metrics/prom_writer.h"
#include "metrics/scrape/scraper.h"

namespace kvroute::router {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::string_view kEndpointHeader = "x-kvroute-endpoint";
constexpr std::string_view kRoutingHeader = "x-gateway-destination-endpoint";
// Complete (non-streamed) upstream responses up to this size are relayed in one write
// with Content-Length; anything else is streamed chunk by chunk.
constexpr uint64_t kMaxBufferedResponse = 1u << 20;
// What a stale endpoint's queue counts as under stale_policy saturated.
constexpr double kSaturatedWaiting = 1000.0;
constexpr std::size_t kMaxRanked = 8;
// A streamed response whose client reads slower than the upstream writes stops reading
// the upstream once this much is queued for the client, and resumes when it drained.
constexpr std::size_t kMaxClientBacklog = 1u << 20;

std::chrono::milliseconds Ms(double s) {
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::llround(s * 1000))));
}

std::string ErrorJson(int status, std::string message) {
  return api::ErrorBody(api::MakeError(status, std::move(message)));
}

// Fixed-bound histogram for the router's own latencies.
struct Histogram {
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1) {}
  void Observe(double v) {
    std::size_t i = std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin();
    ++counts[i];
    sum += v;
  }
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  double sum = 0;
};

// The router's counters. One mutex: every request updates it once or twice, briefly.
// Lock order: a generation's mutex may be held while taking this one, never the reverse.
struct RouterMetrics {
  std::mutex mu;
  std::map<std::pair<std::string, int>, uint64_t> requests;             // (endpoint, code)
  std::map<std::pair<std::string, std::string>, uint64_t> upstream_errors;  // (endpoint, kind)
  uint64_t retries = 0;
  Histogram sched_seconds{{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                           2.5e-3, 5e-3, 1e-2, 2.5e-2}};
  struct ScoreSummary {
    double sum = 0;
    uint64_t count = 0;
  };
  std::map<std::string, ScoreSummary, std::less<>> plugin_scores;  // chosen endpoint's raw score
  ScoreSummary prefix_hit;  // prefix scorer's score of the chosen endpoint
  uint64_t picks_failed = 0;
  uint64_t reloads_ok = 0;
  uint64_t reloads_failed = 0;
};

struct EndpointInfo {
  std::string name;
  std::string address;
  std::string host;
  uint16_t port = 0;
  http::Fields head_fields;  // x-kvroute-endpoint: name, built once
};

// One configuration and everything built from it. Immutable except what `mu` guards.
struct Generation {
  config::RouterConfig config;
  std::vector<EndpointInfo> endpoints;
  std::chrono::milliseconds connect_timeout{0}, first_byte_timeout{0}, idle_timeout{0};

  std::mutex mu;
  std::unique_ptr<sched::Scheduler> scheduler;  // guarded by mu
  std::vector<sched::EndpointState> states;     // guarded by mu
  std::vector<uint8_t> down;                    // guarded by mu: not reachable
  std::unique_ptr<metrics::MetricsScraper> scraper;
  // The scheduler's approximate prefix index, if its policy has one (nullptr otherwise);
  // read under mu for /metrics.
  const sched::ApproxPrefixIndex* prefix_index = nullptr;
  // Per scorer (in PickResult::scorer_names order): its summary in RouterMetrics (map
  // nodes are stable) and whether it is a prefix scorer. Filled on the first pick, under
  // RouterMetrics::mu, so later picks skip the name lookups.
  std::vector<std::pair<void*, bool>> score_slots;
  const std::string* score_slots_names = nullptr;  // the scorer_names they were built for

  ~Generation() {
    if (scraper) scraper->Stop();
  }

  // Sets `healthy` (and, under stale_policy saturated, the load of stale endpoints) for
  // the pick at `now`. Caller holds mu.
  void RefreshHealth(double now) {
    const bool saturate = config.pool.stale_policy == config::StalePolicy::kSaturated;
    const double staleness = config.pool.staleness_s;
    bool any = false;
    for (std::size_t i = 0; i < states.size(); ++i) {
      sched::EndpointState& s = states[i];
      if (down[i]) {
        s.healthy = false;
        continue;
      }
      if (s.MetricsFresh(now, staleness)) {
        s.healthy = true;
      } else if (saturate) {
        s.healthy = true;
        s.kv_usage = 1.0;
        s.waiting = std::max(s.waiting, kSaturatedWaiting);
      } else {
        s.healthy = false;
      }
      any = any || s.healthy;
    }
    if (!any) {
      // stale_policy exclude: when every reachable endpoint is stale, use them all rather
      // than refuse traffic the fleet may well be able to serve.
      for (std::size_t i = 0; i < states.size(); ++i) states[i].healthy = !down[i];
    }
  }
};

}  // namespace

struct Router::Impl {
  Impl(config::RouterConfig cfg, RouterOptions opts)
      : options(std::move(opts)), start(Clock::now()), initial(std::move(cfg)) {}

  double Now() const { return std::chrono::duration<double>(Clock::now() - start).count(); }

  void Log(const std::string& line) {
    if (options.log) std::fprintf(stderr, "kvroute serve: %s\n", line.c_str());
  }

  // ---- generations ----

  std::shared_ptr<Generation> Build(config::RouterConfig cfg, std::string* error) {
    auto g = std::make_shared<Generation>();
    sched::SchedulerOptions so;
    so.max_ranked = kMaxRanked;
    sched::BuildResult built = sched::BuildScheduler(cfg.scheduling, so);
    if (!built.ok()) {
      *error = built.error ? built.error->field + ": " + built.error->message : "scheduler";
      return nullptr;
    }
    g->scheduler = std::move(built.scheduler);
    if (auto* ps = dynamic_cast<const sched::ProfileScheduler*>(g->scheduler.get())) {
      for (const sched::Plugin* p : ps->plugins()) {
        if (auto* pc = dynamic_cast<const sched::PrefixCacheScorer*>(p)) {
          g->prefix_index = &pc->prefix_index();
          break;
        }
      }
    } else if (auto* dc = dynamic_cast<const sched::DynamoCostScheduler*>(g->scheduler.get())) {
      g->prefix_index = &dc->index();
    }
    for (std::size_t i = 0; i < cfg.pool.endpoints.size(); ++i) {
      const config::EndpointConfig& e = cfg.pool.endpoints[i];
      g->endpoints.push_back({e.name, e.address, e.host_port.host, e.host_port.port,
                              {{std::string(kEndpointHeader), e.name}}});
      sched::EndpointState s;
      s.id = static_cast<uint32_t>(i);
      s.name = e.name;
      for (const auto& [k, v] : e.labels) s.labels.emplace_back(k, v);
      g->states.push_back(std::move(s));
    }
    g->down.assign(g->states.size(), 0);
    g->connect_timeout = Ms(cfg.timeouts.connect_s);
    g->first_byte_timeout = Ms(cfg.timeouts.first_byte_s);
    g->idle_timeout = Ms(cfg.timeouts.idle_s);
    g->config = std::move(cfg);
    return g;
  }

  // Carries the last scraped values of endpoints that survive a reload (same address), so
  // the new generation does not start blind.
  static void CarryOver(Generation& from, Generation& to) {
    std::lock_guard<std::mutex> a(from.mu);
    std::lock_guard<std::mutex> b(to.mu);
    for (std::size_t j = 0; j < to.endpoints.size(); ++j) {
      for (std::size_t i = 0; i < from.endpoints.size(); ++i) {
        if (from.endpoints[i].address != to.endpoints[j].address) continue;
        const sched::EndpointState& o = from.states[i];
        sched::EndpointState& n = to.states[j];
        n.CopyScrapedFrom(o);
        to.down[j] = from.down[i];
        if (o.scraped_at_s >= 0) to.scheduler->OnMetricsUpdated(n.id, o.scraped_at_s);
      }
    }
  }

  void StartScraper(const std::shared_ptr<Generation>& g) {
    std::vector<metrics::ScrapeTarget> targets;
    for (const EndpointInfo& e : g->endpoints) targets.push_back({e.host, e.port});
    metrics::ScraperOptions so;
    so.interval_s = g->config.pool.scrape_interval_s;
    so.timeout_s = g->config.pool.staleness_s;
    so.connect_timeout_s = g->config.timeouts.connect_s;
    so.names = g->config.pool.metric_names;
    so.model = g->config.pool.model;
    std::weak_ptr<Generation> weak = g;
    g->scraper = std::make_unique<metrics::MetricsScraper>(
        pool->context(0), std::move(targets), std::move(so), [this] { return Now(); },
        [weak](uint32_t i, const metrics::EndpointSnapshot& snap) {
          auto gen = weak.lock();
          if (!gen) return;
          std::lock_guard<std::mutex> lock(gen->mu);
          sched::EndpointState& s = gen->states[i];
          if (snap.ok) {
            const metrics::EngineMetrics& m = snap.metrics;
            s.kv_usage = m.Has(metrics::EngineMetrics::kKvUsage) ? m.kv_usage : 0.0;
            s.waiting = m.Has(metrics::EngineMetrics::kWaiting) ? m.waiting : 0.0;
            s.running = m.Has(metrics::EngineMetrics::kRunning) ? m.running : 0.0;
            if (m.Has(metrics::EngineMetrics::kNumGpuBlocks)) s.num_gpu_blocks = m.num_gpu_blocks;
            if (m.Has(metrics::EngineMetrics::kBlockSize)) s.block_size = m.block_size;
            s.scraped_at_s = snap.scraped_at_s;
            s.scrape_ok = true;
            gen->down[i] = 0;
            gen->scheduler->OnMetricsUpdated(s.id, snap.scraped_at_s);
          } else {
            s.scrape_ok = false;
            if (snap.down) gen->down[i] = 1;
          }
        });
    g->scraper->Start();
  }

  std::string Apply(config::RouterConfig cfg) {
    if (options.listen) {
      cfg.listen_addr = *options.listen;
      cfg.listen = options.listen->ToString();
    }
    if (options.threads) cfg.threads = *options.threads;
    std::string error;
    auto g = Build(std::move(cfg), &error);
    if (!g) return error;
    auto old = current.load();
    if (old) {
      if (old->config.listen_addr.ToString() != g->config.listen_addr.ToString()) {
        Log("listen address change to " + g->config.listen + " needs a restart; ignored");
      }
      CarryOver(*old, *g);
    }
    StartScraper(g);
    current.store(g);
    if (old && old->scraper) old->scraper->Stop();
    return {};
  }

  std::string Reload() {
    if (options.config_path.empty()) return "no configuration file to reload";
    config::ConfigResult r = config::LoadRouterConfig(options.config_path);
    std::string error;
    if (!r.ok()) {
      error = r.error.ToString();
    } else {
      error = Apply(std::move(*r.config));
    }
    {
      std::lock_guard<std::mutex> lock(metrics.mu);
      ++(error.empty() ? metrics.reloads_ok : metrics.reloads_failed);
    }
    if (error.empty()) {
      reloads.fetch_add(1);
      Log("configuration reloaded from " + options.config_path);
    } else {
      Log("reload failed, keeping the running configuration: " + error);
    }
    return error;
  }

  // ---- lifecycle ----

  std::string Start() {
    config::RouterConfig cfg = std::move(initial);
    if (options.listen) cfg.listen_addr = *options.listen;
    if (options.threads) cfg.threads = *options.threads;
    int threads = cfg.threads > 0 ? cfg.threads
                                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    pool = std::make_unique<http::IoPool>(threads);
    for (int i = 0; i < threads; ++i) {
      clients.push_back(std::make_unique<http::UpstreamClient>(pool->context(i)));
    }
    http::ServerOptions so;
    so.host = cfg.listen_addr.host;
    so.port = cfg.listen_addr.port;
    so.max_body_bytes = cfg.limits.max_body_bytes;
    so.max_header_bytes = cfg.limits.max_header_bytes;
    so.max_header_count = cfg.limits.max_headers;
    so.error_body = [](int status, std::string_view message) {
      return ErrorJson(status, std::string(message));
    };
    server = std::make_unique<http::Server>(pool->contexts(), so,
                                            [this](std::shared_ptr<http::Exchange> ex) { Handle(std::move(ex)); });
    pool->Start();
    std::string error = Apply(std::move(cfg));
    if (!error.empty()) return error;
    error = server->Listen();
    if (!error.empty()) return error;
    if (options.handle_signals) {
      signals = std::make_unique<asio::signal_set>(pool->context(0), SIGHUP, SIGINT, SIGTERM);
      WaitSignal();
    }
    return {};
  }

  void WaitSignal() {
    signals->async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGHUP) {
        Reload();
      } else {
        RequestShutdown();
      }
      WaitSignal();
    });
  }

  void Stop() {
    if (stopped || !pool) return;
    stopped = true;
    if (server) server->StopAccepting();
    if (signals) {
      asio::post(pool->context(0), [s = signals.get()] {
        boost::system::error_code ignored;
        s->cancel(ignored);
      });
    }
    if (auto g = current.load(); g && g->scraper) g->scraper->Stop();
    pool->Stop();
  }

  void RequestShutdown() {
    std::lock_guard<std::mutex> lock(shutdown_mu);
    shutdown_requested = true;
    shutdown_cv.notify_all();
  }

  // ---- requests ----

  void Handle(std::shared_ptr<http::Exchange> ex);
  void Generate(std::shared_ptr<http::Exchange> ex, api::Endpoint kind);
  void Models(std::shared_ptr<http::Exchange> ex);
  void CountRequest(const std::string& endpoint, int code) {
    std::lock_guard<std::mutex> lock(metrics.mu);
    ++metrics.requests[{endpoint, code}];
  }

  std::string MetricsText();
  bool Ready() {
    auto g = current.load();
    if (!g || !g->scraper) return false;
    double now = Now();
    for (uint32_t i = 0; i < g->scraper->size(); ++i) {
      auto s = g->scraper->Snapshot(i);
      if (s->ok && s->Age(now) <= g->config.pool.staleness_s) return true;
    }
    return false;
  }

  RouterOptions options;
  Clock::time_point start;
  config::RouterConfig initial;
  // Declared first, destroyed last: everything below owns sockets or timers on it.
  std::unique_ptr<http::IoPool> pool;
  std::vector<std::unique_ptr<http::UpstreamClient>> clients;  // one per worker
  std::unique_ptr<http::Server> server;
  std::unique_ptr<asio::signal_set> signals;
  std::atomic<std::shared_ptr<Generation>> current;
  RouterMetrics metrics;
  std::atomic<uint64_t> reloads{0};
  std::atomic<uint64_t> models_rr{0};
  bool stopped = false;
  std::mutex shutdown_mu;
  std::condition_variable shutdown_cv;
  bool shutdown_requested = false;
};

namespace {

// One proxied request: tries the ranked endpoints in order and relays the response.
// Lives as long as its upstream call or its exchange needs it; runs on one worker.
struct ProxyCall : std::enable_shared_from_this<ProxyCall> {
  Router::Impl* router = nullptr;
  std::shared_ptr<Generation> gen;
  std::shared_ptr<http::Exchange> ex;
  http::UpstreamClient* client = nullptr;
  bhttp::verb method = bhttp::verb::post;
  sched::RequestHandle handle = sched::kNoHandle;  // kNoHandle: not scheduled (/v1/models)
  std::array<uint32_t, kMaxRanked> ranked{};
  std::size_t n_ranked = 0;
  std::size_t attempt = 0;
  std::size_t max_attempts = 1;
  http::UpstreamCall call;
  std::vector<std::pair<std::string, std::string>> forward_headers;
  bool streaming = false;
  bool first_byte = false;
  int status = 0;
  std::string_view content_type;  // a constant, or content_type_copy
  std::string content_type_copy;
  std::string buffered;
  char tail[2] = {'\n', '\n'};  // last two bytes streamed to the client

  ~ProxyCall() {
    if (ex) ex->OnClientGone({});  // its callback points here
  }

  const EndpointInfo& endpoint() const { return gen->endpoints[ranked[attempt]]; }
  const http::Fields& head_fields() const { return endpoint().head_fields; }

  void Dispatch() {
    uint32_t id = ranked[attempt];
    if (handle != sched::kNoHandle) {
      std::lock_guard<std::mutex> lock(gen->mu);
      gen->scheduler->OnDispatched(handle, id, router->Now());
    }
    const EndpointInfo& ep = gen->endpoints[id];
    http::UpstreamRequest req;
    req.method = method;
    req.target = std::string_view(ex->request().target().data(), ex->request().target().size());
    const std::string& body = ex->request().body();
    req.body = body;
    req.headers = forward_headers.empty() ? nullptr : &forward_headers;
    req.connect_timeout = gen->connect_timeout;
    req.first_byte_timeout = gen->first_byte_timeout;
    req.idle_timeout = gen->idle_timeout;
    // Plain-pointer captures (no allocation per callback); cb.owner keeps this alive.
    http::UpstreamCallbacks cb;
    cb.on_head = [this](const http::ResponseHead& h) { OnHead(h); };
    cb.on_data = [this](std::string_view d) { OnData(d); };
    cb.on_done = [this](http::UpstreamResult&& r) { OnDone(std::move(r)); };
    cb.owner = shared_from_this();
    call = client->Start(ep.host, ep.port, req, std::move(cb));
  }

  void OnHead(const http::ResponseHead& h) {
    status = h.status;
    static constexpr std::string_view kJson = "application/json";
    static constexpr std::string_view kSse = "text/event-stream";
    if (h.content_type == kJson) {
      content_type = kJson;
    } else if (h.content_type == kSse) {
      content_type = kSse;
    } else {
      content_type_copy.assign(h.content_type);
      content_type = content_type_copy;
    }
    bool sse = content_type.substr(0, kSse.size()) == kSse;
    streaming = sse || !h.content_length || *h.content_length > kMaxBufferedResponse;
    if (streaming) {
      ex->BeginStream(status, content_type, head_fields());
    } else {
      buffered.reserve(*h.content_length);
    }
  }

  void OnData(std::string_view d) {
    if (!first_byte) {
      first_byte = true;
      if (handle != sched::kNoHandle) {
        std::lock_guard<std::mutex> lock(gen->mu);
        gen->scheduler->OnFirstToken(handle, router->Now());
      }
    }
    if (streaming) {
      if (d.size() >= 2) {
        tail[0] = d[d.size() - 2];
        tail[1] = d[d.size() - 1];
      } else {
        tail[0] = tail[1];
        tail[1] = d[0];
      }
      if (ex->pending_write_bytes() + d.size() <= kMaxClientBacklog) {
        ex->SendChunk(std::string(d));
      } else {
        // Slow client: read no more from the upstream until this chunk (and so
        // everything before it) has been written; the upstream's own flow control
        // then holds the replica's output back.
        call.Pause();
        ex->SendChunk(std::string(d), [weak = weak_from_this()](bool) {
          if (auto self = weak.lock()) self->call.Resume();
        });
      }
    } else {
      buffered.append(d);
    }
  }

  void OnDone(http::UpstreamResult&& r) {
    call = {};
    const std::string& name = endpoint().name;
    if (r.ok()) {
      if (streaming) {
        ex->EndStream();
      } else {
        ex->Respond(status, std::move(buffered), content_type, head_fields());
      }
      return Finish(name, status);
    }
    if (r.error == http::UpstreamError::kCancelled) return Finish(name, 499);  // client left
    {
      std::lock_guard<std::mutex> lock(router->metrics.mu);
      ++router->metrics.upstream_errors[{name, std::string(http::UpstreamErrorName(r.error))}];
    }
    if (http::IsConnectError(r.error)) {
      // Passive health: do not pick it again until a scrape reaches it.
      std::lock_guard<std::mutex> lock(gen->mu);
      gen->down[ranked[attempt]] = 1;
    }
    bool retryable = !r.head_received &&
                     (http::IsConnectError(r.error) || r.error == http::UpstreamError::kReset ||
                      r.error == http::UpstreamError::kSendFailed);
    if (retryable && attempt + 1 < std::min(n_ranked, max_attempts) && !ex->client_gone()) {
      {
        std::lock_guard<std::mutex> lock(router->metrics.mu);
        ++router->metrics.retries;
      }
      ++attempt;
      return Dispatch();
    }
    bool timeout = r.error == http::UpstreamError::kFirstByteTimeout ||
                   r.error == http::UpstreamError::kIdleTimeout;
    int code = timeout ? 504 : 502;
    std::string message = "upstream " + name + " " +
                          (timeout ? "timed out: " : "failed: ") +
                          std::string(http::UpstreamErrorName(r.error));
    if (streaming) {
      // The client already has a 200 and part of the stream: end it with an SSE error
      // frame and [DONE] so it never waits for bytes that will not come.
      std::string frame;
      if (tail[0] != '\n' || tail[1] != '\n') frame = tail[1] == '\n' ? "\n" : "\n\n";
      frame += "data: ";
      frame += ErrorJson(code, std::move(message));
      frame += "\n\ndata: [DONE]\n\n";
      ex->SendChunk(std::move(frame));
      ex->EndStream();
      return Finish(name, status);
    }
    ex->Respond(code, ErrorJson(code, std::move(message)), "application/json", head_fields());
    Finish(name, code);
  }

  void Finish(const std::string& endpoint_name, int code) {
    if (handle != sched::kNoHandle) {
      std::lock_guard<std::mutex> lock(gen->mu);
      gen->scheduler->OnFinished(handle, router->Now());
      handle = sched::kNoHandle;
    }
    router->CountRequest(endpoint_name, code);
  }
};

std::string_view Path(std::string_view target) {
  return target.substr(0, target.find('?'));
}

void CollectForwardHeaders(const http::Request& req,
                           std::vector<std::pair<std::string, std::string>>& out) {
  static constexpr std::string_view kForward[] = {"authorization", "x-request-id", "traceparent"};
  for (std::string_view name : kForward) {
    auto it = req.find(boost::beast::string_view(name.data(), name.size()));
    if (it != req.end()) out.emplace_back(std::string(name), std::string(it->value()));
  }
}

}  // namespace

void Router::Impl::Handle(std::shared_ptr<http::Exchange> ex) {
  const http::Request& req = ex->request();
  std::string_view path = Path(std::string_view(req.target().data(), req.target().size()));
  bhttp::verb method = req.method();
  auto only = [&](bhttp::verb v) {
    if (method == v || (v == bhttp::verb::get && method == bhttp::verb::head)) return true;
    ex->Respond(405, ErrorJson(405, "Method not allowed."));
    return false;
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!only(bhttp::verb::post)) return;
    return Generate(std::move(ex), path == "/v1/completions" ? api::Endpoint::kCompletions
                                                             : api::Endpoint::kChatCompletions);
  }
  if (path == "/v1/models") {
    if (!only(bhttp::verb::get)) return;
    return Models(std::move(ex));
  }
  if (path == "/healthz") {
    if (!only(bhttp::verb::get)) return;
    ex->Respond(200, "ok\n", "text/plain");
    return;
  }
  if (path == "/readyz") {
    if (!only(bhttp::verb::get)) return;
    bool ready = Ready();
    ex->Respond(ready ? 200 : 503, ready ? "ready\n" : "no endpoint has fresh metrics\n",
                "text/plain");
    return;
  }
  if (path == "/metrics") {
    if (!only(bhttp::verb::get)) return;
    ex->Respond(200, MetricsText(), "text/plain; version=0.0.4; charset=utf-8");
    return;
  }
  ex->Respond(404, ErrorJson(404, "Not found: " + std::string(path)));
}

void Router::Impl::Generate(std::shared_ptr<http::Exchange> ex, api::Endpoint kind) {
  auto g = current.load();
  // The server leaves padding after the body: simdjson parses it in place (no copy).
  static_assert(http::kRequestBodyPadding >= api::kJsonPadding);
  const std::string& body = ex->request().body();
  api::ParseResult parsed = body.capacity() >= body.size() + api::kJsonPadding
                                ? api::ParseRequestPadded(kind, body)
                                : api::ParseRequest(kind, body);
  if (!parsed.ok()) {
    ex->Respond(parsed.error.status, api::ErrorBody(parsed.error));
    CountRequest("", parsed.error.status);
    return;
  }
  sched::SchedRequest sr = sched::FromParsed(*parsed.request);

  auto pc = std::make_shared<ProxyCall>();
  pc->router = this;
  pc->gen = g;
  pc->client = clients[ex->worker()].get();
  pc->max_attempts = static_cast<std::size_t>(std::max(1, g->config.retries.max_attempts));

  // Client routing hint (EPP style), honoured only when configured.
  std::string_view hint;
  if (g->config.allow_routing_headers) {
    auto it = ex->request().find(boost::beast::string_view(kRoutingHeader.data(), kRoutingHeader.size()));
    if (it != ex->request().end()) hint = std::string_view(it->value().data(), it->value().size());
  }

  sched::PickStatus pick_status;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    double now = Now();
    g->RefreshHealth(now);
    Clock::time_point t0 = Clock::now();
    sched::PickResult r = g->scheduler->Pick(sr, g->states, now);
    double pick_s = std::chrono::duration<double>(Clock::now() - t0).count();
    pick_status = r.status;
    if (r.ok()) {
      pc->handle = r.handle;
      // Hinted endpoints first (in the hint's order), then the scheduler's ranking.
      while (!hint.empty() && pc->n_ranked < kMaxRanked) {
        std::size_t comma = hint.find(',');
        std::string_view item = hint.substr(0, comma);
        hint = comma == std::string_view::npos ? std::string_view() : hint.substr(comma + 1);
        while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
        while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
        for (uint32_t i = 0; i < g->endpoints.size(); ++i) {
          if (g->down[i] || (g->endpoints[i].address != item && g->endpoints[i].name != item)) continue;
          if (std::find(pc->ranked.begin(), pc->ranked.begin() + pc->n_ranked, i) ==
              pc->ranked.begin() + pc->n_ranked) {
            pc->ranked[pc->n_ranked++] = i;
          }
        }
      }
      for (uint32_t id : r.ranked) {
        if (pc->n_ranked == kMaxRanked) break;
        if (std::find(pc->ranked.begin(), pc->ranked.begin() + pc->n_ranked, id) ==
            pc->ranked.begin() + pc->n_ranked) {
          pc->ranked[pc->n_ranked++] = id;
        }
      }
    }
    // Observability, while the result's spans are valid.
    std::lock_guard<std::mutex> mlock(metrics.mu);
    metrics.sched_seconds.Observe(pick_s);
    if (r.ok() && !r.ranked.empty()) {
      std::size_t c = 0;
      while (c < r.candidates.size() && r.candidates[c] != r.ranked[0]) ++c;
      if (c < r.candidates.size()) {
        if (g->score_slots_names != r.scorer_names.data() ||
            g->score_slots.size() != r.scorer_names.size()) {
          g->score_slots.clear();
          g->score_slots_names = r.scorer_names.data();
          for (const auto& name : r.scorer_names) {
            auto it = metrics.plugin_scores.find(name);
            if (it == metrics.plugin_scores.end()) {
              it = metrics.plugin_scores.emplace(std::string(name), RouterMetrics::ScoreSummary{}).first;
            }
            g->score_slots.emplace_back(&it->second, name.find("prefix") != std::string::npos);
          }
        }
        for (std::size_t s = 0; s < g->score_slots.size(); ++s) {
          double v = r.Score(s, c);
          auto* summary = static_cast<RouterMetrics::ScoreSummary*>(g->score_slots[s].first);
          summary->sum += v;
          ++summary->count;
          if (g->score_slots[s].second) {
            metrics.prefix_hit.sum += v;
            ++metrics.prefix_hit.count;
          }
        }
      }
    } else {
      ++metrics.picks_failed;
    }
  }
  if (pc->n_ranked == 0) {
    if (pc->handle != sched::kNoHandle) {
      std::lock_guard<std::mutex> lock(g->mu);
      g->scheduler->OnFinished(pc->handle, Now());
    }
    std::string why = pick_status == sched::PickStatus::kAllFiltered
                          ? "every endpoint is saturated or filtered out"
                          : "no healthy endpoint is available";
    ex->Respond(503, ErrorJson(503, "No usable endpoint: " + why + "."));
    CountRequest("", 503);
    return;
  }
  CollectForwardHeaders(ex->request(), pc->forward_headers);
  pc->ex = std::move(ex);
  // The replica sees us leave and aborts. A plain pointer (no allocation): ~ProxyCall
  // clears the callback.
  ProxyCall* raw = pc.get();
  pc->ex->OnClientGone([raw] { raw->call.Cancel(); });
  pc->Dispatch();
}

void Router::Impl::Models(std::shared_ptr<http::Exchange> ex) {
  auto g = current.load();
  auto pc = std::make_shared<ProxyCall>();
  pc->router = this;
  pc->gen = g;
  pc->client = clients[ex->worker()].get();
  pc->method = bhttp::verb::get;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    g->RefreshHealth(Now());
    std::size_t n = g->states.size();
    std::size_t first = n ? models_rr.fetch_add(1) % n : 0;
    for (std::size_t k = 0; k < n && pc->n_ranked < 3; ++k) {
      std::size_t i = (first + k) % n;
      if (g->states[i].healthy) pc->ranked[pc->n_ranked++] = static_cast<uint32_t>(i);
    }
  }
  pc->max_attempts = pc->n_ranked;
  if (pc->n_ranked == 0) {
    ex->Respond(503, ErrorJson(503, "No usable endpoint: no healthy endpoint is available."));
    CountRequest("", 503);
    return;
  }
  pc->ex = std::move(ex);
  ProxyCall* raw = pc.get();
  pc->ex->OnClientGone([raw] { raw->call.Cancel(); });
  pc->Dispatch();
}

std::string Router::Impl::MetricsText() {
  using metrics::AppendCounter;
  using metrics::AppendGauge;
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  std::string out;
  out.reserve(8192);
  {
    std::lock_guard<std::mutex> lock(metrics.mu);
    AppendHeader(out, "kvroute_requests_total",
                 "Requests answered, by endpoint used (empty: none) and HTTP status.",
                 MetricType::kCounter);
    for (const auto& [key, n] : metrics.requests) {
      std::string code = std::to_string(key.second);
      Label labels[] = {{"endpoint", key.first}, {"code", code}};
      AppendSample(out, "kvroute_requests_total", labels, static_cast<double>(n));
    }
    AppendHeader(out, "kvroute_upstream_errors_total",
                 "Failed upstream attempts, by endpoint and kind.", MetricType::kCounter);
    for (const auto& [key, n] : metrics.upstream_errors) {
      Label labels[] = {{"endpoint", key.first}, {"kind", key.second}};
      AppendSample(out, "kvroute_upstream_errors_total", labels, static_cast<double>(n));
    }
    AppendCounter(out, "kvroute_retries_total", "Attempts sent to a fallback endpoint.", {},
                  static_cast<double>(metrics.retries));
    AppendCounter(out, "kvroute_pick_failures_total", "Picks that found no usable endpoint.", {},
                  static_cast<double>(metrics.picks_failed));
    AppendHeader(out, "kvroute_scheduling_duration_seconds",
                 "Time spent in Scheduler::Pick (health refresh excluded).", MetricType::kHistogram);
    metrics::AppendHistogramSeries(out, "kvroute_scheduling_duration_seconds", {},
                                   metrics.sched_seconds.bounds, metrics.sched_seconds.counts,
                                   metrics.sched_seconds.sum);
    AppendHeader(out, "kvroute_plugin_score",
                 "Raw score (0..1) each scorer gave the chosen endpoint.", MetricType::kSummary);
    for (const auto& [name, s] : metrics.plugin_scores) {
      Label labels[] = {{"plugin", name}};
      AppendSample(out, "kvroute_plugin_score_count", labels, static_cast<double>(s.count));
      AppendSample(out, "kvroute_plugin_score_sum", labels, s.sum);
    }
    AppendGauge(out, "kvroute_prefix_estimated_hit_ratio",
                "Mean prefix-scorer score of the chosen endpoint: the share of each prompt's "
                "blocks the router expects cached there.",
                {}, metrics.prefix_hit.count ? metrics.prefix_hit.sum / metrics.prefix_hit.count : 0.0);
    AppendCounter(out, "kvroute_config_reloads_total", "Successful configuration reloads.", {},
                  static_cast<double>(metrics.reloads_ok));
    AppendCounter(out, "kvroute_config_reload_failures_total",
                  "Rejected configuration reloads (the old configuration stayed).", {},
                  static_cast<double>(metrics.reloads_failed));
  }
  auto g = current.load();
  if (!g) return out;
  double now = Now();
  struct Row {
    double kv, kv_adj, waiting, waiting_adj, running, inflight, age, up, fresh, ok_scrapes,
        failed_scrapes, prefix_entries;
  };
  std::vector<Row> rows(g->endpoints.size());
  {
    std::lock_guard<std::mutex> lock(g->mu);
    const sched::InflightTracker& t = g->scheduler->inflight();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const sched::EndpointState& s = g->states[i];
      auto snap = g->scraper->Snapshot(static_cast<uint32_t>(i));
      double capacity = s.num_gpu_blocks > 0 ? static_cast<double>(s.num_gpu_blocks)
                                             : static_cast<double>(sched::SchedulerOptions{}.default_num_gpu_blocks);
      sched::EndpointLoad adj = t.Load(s, capacity, true);
      const metrics::EngineMetrics& m = snap->metrics;
      rows[i] = Row{m.kv_usage, adj.kv_usage, m.waiting, adj.waiting, m.running,
                    static_cast<double>(adj.inflight), snap->Age(now),
                    g->down[i] ? 0.0 : 1.0,
                    s.MetricsFresh(now, g->config.pool.staleness_s) ? 1.0 : 0.0,
                    static_cast<double>(snap->successes), static_cast<double>(snap->failures),
                    g->prefix_index ? static_cast<double>(g->prefix_index->Size(static_cast<uint32_t>(i)))
                                    : 0.0};
    }
  }
  auto family = [&](std::string_view name, std::string_view help, MetricType type,
                    double Row::*field) {
    AppendHeader(out, name, help, type);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      Label labels[] = {{"endpoint", g->endpoints[i].name}};
      double v = rows[i].*field;
      AppendSample(out, name, labels, std::isinf(v) ? -1.0 : v);
    }
  };
  family("kvroute_endpoint_kv_usage", "KV-cache usage as last scraped (0..1).", MetricType::kGauge, &Row::kv);
  family("kvroute_endpoint_kv_usage_adjusted",
         "KV-cache usage plus the router's in-flight estimate since the scrape.", MetricType::kGauge,
         &Row::kv_adj);
  family("kvroute_endpoint_waiting", "Queued requests as last scraped.", MetricType::kGauge, &Row::waiting);
  family("kvroute_endpoint_waiting_adjusted", "Queued requests plus dispatched-not-started ones.",
         MetricType::kGauge, &Row::waiting_adj);
  family("kvroute_endpoint_running", "Running requests as last scraped.", MetricType::kGauge, &Row::running);
  family("kvroute_endpoint_inflight", "Requests the router has in flight there.", MetricType::kGauge,
         &Row::inflight);
  family("kvroute_endpoint_scrape_age_seconds",
         "Seconds since the last successful scrape was sent (-1: never).", MetricType::kGauge, &Row::age);
  family("kvroute_endpoint_up", "1 unless the endpoint refused connections since its last good scrape.",
         MetricType::kGauge, &Row::up);
  family("kvroute_endpoint_metrics_fresh", "1 when the endpoint's metrics are within pool.staleness.",
         MetricType::kGauge, &Row::fresh);
  family("kvroute_endpoint_scrapes_ok_total", "Successful scrapes (this configuration generation).",
         MetricType::kCounter, &Row::ok_scrapes);
  family("kvroute_endpoint_scrapes_failed_total", "Failed scrapes (this configuration generation).",
         MetricType::kCounter, &Row::failed_scrapes);
  if (g->prefix_index) {
    family("kvroute_prefix_index_entries",
           "Prompt blocks the router's approximate prefix index assumes cached on the endpoint.",
           MetricType::kGauge, &Row::prefix_entries);
  }
  return out;
}

// ---- Router ----

Router::Router(config::RouterConfig config, RouterOptions options)
    : impl_(std::make_shared<Impl>(std::move(config), std::move(options))) {}
Router::~Router() { Stop(); }
std::string Router::Start() { return impl_->Start(); }
void Router::Stop() { impl_->Stop(); }
uint16_t Router::port() const { return impl_->server ? impl_->server->port() : 0; }
std::string Router::Reload() { return impl_->Reload(); }
std::string Router::Apply(config::RouterConfig config) { return impl_->Apply(std::move(config)); }
std::string Router::MetricsText() { return impl_->MetricsText(); }
bool Router::Ready() { return impl_->Ready(); }
uint64_t Router::reloads() const { return impl_->reloads.load(); }
void Router::WaitForShutdown() {
  std::unique_lock<std::mutex> lock(impl_->shutdown_mu);
  impl_->shutdown_cv.wait(lock, [this] { return impl_->shutdown_requested; });
}
void Router::RequestShutdown() { impl_->RequestShutdown(); }

}  // namespace kvroute::router
