#include "apps/serve/router.h"

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <simdjson.h>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <functional>
#include <set>
#include <span>
#include <limits>
#include <thread>
#include <unordered_map>

#include "core/api/json_scan.h"
#include "core/api/openai.h"
#include "core/flow/flow_gate.h"
#include "core/flow/flow_metrics.h"
#include "core/flow/flow_queue.h"
#include "core/routing/routing_core.h"
#include "adapters/http/client.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/relay.h"
#include "adapters/http/server.h"
#include "core/metrics/prom_writer.h"
#include "adapters/pool/poll_timer.h"
#include "adapters/pool/pool.h"
#include "adapters/certs/listener_certs.h"
#include "core/api/pd_legs.h"
#include "apps/pd/pd_counters.h"
#include "apps/pd/request_id.h"
#include "apps/serve/api_key_auth.h"
#include "adapters/tokenize/http_tokenizer.h"
#include "adapters/tokenize/tokenize_metrics.h"

namespace kvroute::router {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using routing::kMaxRanked;
using api::BuildDecodeBody;
using api::BuildPrefillBody;
using api::PrefillAnswer;
using api::ReadPrefillAnswer;
using api::RewriteCachedTokens;
using pd::PdCounters;
using pd::PdFallback;
using pd::PdOutcome;

namespace {

constexpr std::string_view kEndpointHeader = "x-kvroute-endpoint";
constexpr std::string_view kAttemptsHeader = "x-kvroute-attempts";
constexpr std::string_view kRoutingHeader = "x-gateway-destination-endpoint";
// On a disaggregated answer whose decode leg pulled a prefill: the prefill endpoint's name.
constexpr std::string_view kPrefillHeader = "x-kvroute-prefill";
// Complete (non-streamed) upstream responses up to this size are relayed in one write
// with Content-Length; anything else is streamed chunk by chunk.
constexpr uint64_t kMaxBufferedResponse = 1u << 20;
// The InferenceObjective a request names (the Gateway API Inference Extension's header,
// then llm-d's older one): its priority band and, unless flow.flow_header says otherwise,
// its flow.
constexpr std::string_view kObjectiveHeaders[] = {"x-gateway-inference-objective",
                                                  "x-llm-d-inference-objective"};
// What a client refused by flow control (shed, over a bound, past its TTL) is told to
// wait before trying again, in seconds.
constexpr std::string_view kRetryAfterS = "1";

std::chrono::milliseconds Ms(double s) {
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::llround(s * 1000))));
}

// vLLM's AuthenticationMiddleware answer to a request without a valid key, to the byte;
// the key is never echoed.
constexpr std::string_view kUnauthorizedBody = R"({"error":"Unauthorized"})";
// Like vLLM, only paths under /v1 need a key, and never an OPTIONS preflight.
std::string_view Path(std::string_view target);  // below: the target without its query
bool NeedsKey(std::string_view path, boost::beast::http::verb method) {
  return path.substr(0, 3) == "/v1" && method != boost::beast::http::verb::options;
}

std::string ErrorJson(int status, std::string message) {
  return api::ErrorBody(api::MakeError(status, std::move(message)));
}

// The 503 when no endpoint can take a request, saying so in x-llm-d-request-dropped-reason.
void RespondNoEndpoint(http::Exchange& ex, std::string message) {
  ex.Respond(503, ErrorJson(503, std::move(message)), "application/json",
             {{std::string(api::kDroppedReasonHeader), std::string(api::kDroppedNoEndpoints)}});
}

// The client-facing servers' counters (limits and connections), as kvroute_http_*: the
// plaintext and the HTTPS listener summed.
void AppendServerMetrics(std::string& out, const http::Server* plain, const http::Server* tls) {
  const http::ServerStats* all[2] = {plain ? &plain->stats() : nullptr, tls ? &tls->stats() : nullptr};
  // A counter of every listener, summed; `field` picks it from a ServerStats.
  auto sum = [&](auto field) {
    double v = 0;
    for (const http::ServerStats* st : all) {
      if (st) v += static_cast<double>(field(*st).load(std::memory_order_relaxed));
    }
    return v;
  };
  struct {
    double open_connections, connections_accepted, connections_rejected, accept_errors, idle_closed,
        tls_handshake_failures;
    std::array<double, http::kRejectReasons> requests_rejected;
  } s{};
  s.open_connections = sum([](const http::ServerStats& st) -> const auto& { return st.open_connections; });
  s.connections_accepted = sum([](const http::ServerStats& st) -> const auto& { return st.connections_accepted; });
  s.connections_rejected = sum([](const http::ServerStats& st) -> const auto& { return st.connections_rejected; });
  s.accept_errors = sum([](const http::ServerStats& st) -> const auto& { return st.accept_errors; });
  s.idle_closed = sum([](const http::ServerStats& st) -> const auto& { return st.idle_closed; });
  s.tls_handshake_failures = sum([](const http::ServerStats& st) -> const auto& { return st.tls_handshake_failures; });
  for (std::size_t i = 0; i < http::kRejectReasons; ++i) {
    s.requests_rejected[i] = sum([i](const http::ServerStats& st) -> const auto& { return st.requests_rejected[i]; });
  }
  metrics::AppendGauge(out, "kvroute_http_open_connections", "Client connections open now.", {},
                       s.open_connections);
  metrics::AppendCounter(out, "kvroute_http_connections_accepted_total",
                         "Client connections accepted and served.", {}, s.connections_accepted);
  metrics::AppendCounter(out, "kvroute_http_connections_rejected_total",
                         "Client connections refused with 503 over limits.max_connections.", {},
                         s.connections_rejected);
  metrics::AppendCounter(out, "kvroute_http_accept_errors_total",
                         "Failed accepts (out of descriptors...), each retried after a back-off.",
                         {}, s.accept_errors);
  metrics::AppendCounter(out, "kvroute_http_idle_closed_total",
                         "Client connections closed silently with no request started "
                         "(timeouts.keepalive_idle, or nothing sent within timeouts.request_read).",
                         {}, s.idle_closed);
  metrics::AppendHeader(out, "kvroute_http_requests_rejected_total",
                        "Requests the server refused itself, then closed the connection, by reason.",
                        metrics::MetricType::kCounter);
  for (std::size_t i = 0; i < http::kRejectReasons; ++i) {
    const metrics::Label reason{"reason", http::RejectReasonName(static_cast<http::RejectReason>(i))};
    metrics::AppendSample(out, "kvroute_http_requests_rejected_total", {&reason, 1},
                          s.requests_rejected[i]);
  }
  if (tls) {
    metrics::AppendCounter(out, "kvroute_http_tls_handshake_failures_total",
                           "HTTPS connections closed because their TLS handshake failed or did not "
                           "complete within timeouts.request_read.",
                           {}, s.tls_handshake_failures);
  }
}

// What the front end itself takes from a configuration; replaced whole on reload.
struct FrontSettings {
  std::chrono::milliseconds connect_timeout{0}, first_byte_timeout{0}, idle_timeout{0};
  std::size_t max_attempts = 2;
  bool allow_routing_headers = false;
  // Flow control: objective name -> priority (epp.objectives; InferenceObjectives from
  // Kubernetes win), and the header naming a request's flow (empty: the objective's).
  std::map<std::string, int64_t, std::less<>> objectives;
  // An objective's latency objectives (epp.objectives NAME: {slo: ...}), for requests that
  // name it and state none in their headers.
  std::map<std::string, config::SloConfig, std::less<>> objective_slos;
  std::string flow_header;
  // Session affinity (sessions:): the request headers naming the session and carrying its
  // token, and the response header the token is written on; off: none is read or written.
  bool sessions = true;
  std::string session_header, token_header;
  // "x-kvroute-endpoint: <name>" (and, with sessions, "<token_header>: <token>") per
  // endpoint id of the table `version`, built once so a response costs no allocation for it.
  uint64_t version = 0;
  std::vector<http::Fields> head_fields;
};

std::string_view HeaderValue(const http::Request& req, std::string_view name) {
  auto it = req.find(boost::beast::string_view(name.data(), name.size()));
  return it == req.end() ? std::string_view() : std::string_view(it->value().data(), it->value().size());
}

// The objective the request names (the first of kObjectiveHeaders present); "" when none.
std::string_view ObjectiveOf(const http::Request& req) {
  for (std::string_view h : kObjectiveHeaders) {
    if (std::string_view v = HeaderValue(req, h); !v.empty()) return v;
  }
  return {};
}

}  // namespace

struct Router::Impl {
  Impl(config::RouterConfig cfg, RouterOptions opts)
      : options(std::move(opts)), initial(std::move(cfg)) {}

  double Now() const { return core_pool->Now(); }
  routing::RoutingCore& core() { return core_pool->core(); }

  void Log(std::string_view line) {
    if (options.log) std::fprintf(stderr, "kvroute serve: %.*s\n", static_cast<int>(line.size()), line.data());
  }

  // ---- configuration ----

  Status Apply(config::RouterConfig cfg) {
    if (options.listen) {
      cfg.listen_addr = *options.listen;
      cfg.listen = options.listen->ToString();
    }
    if (options.threads) cfg.threads = *options.threads;
    if (options.region) cfg.locality.region = *options.region;
    if (started_listen && started_listen->ToString() != cfg.listen_addr.ToString()) {
      Log("listen address change to " + cfg.listen_addr.ToString() + " needs a restart; ignored");
    }
    Status st = core_pool->Apply(cfg);
    if (!st.ok()) return st;
    // https:// endpoints: new connections use the applied upstream_tls (pooled ones keep
    // theirs until they close).
    if (auto tls = core_pool->upstream_tls(); tls != upstream_tls) {
      upstream_tls = tls;
      for (int i = 0; i < io->size(); ++i) {
        asio::post(io->context(i), [c = clients[i].get(), tls] { c->set_tls(tls); });
      }
    }
    auto fs = std::make_shared<FrontSettings>();
    fs->connect_timeout = Ms(cfg.timeouts.connect_s);
    fs->first_byte_timeout = Ms(cfg.timeouts.first_byte_s);
    fs->idle_timeout = Ms(cfg.timeouts.idle_s);
    fs->max_attempts = static_cast<std::size_t>(std::max(1, cfg.retries.max_attempts));
    fs->allow_routing_headers = cfg.allow_routing_headers;
    fs->objectives = cfg.epp.objectives;
    fs->objective_slos = cfg.epp.objective_slos;
    fs->flow_header = cfg.flow.flow_header;
    fs->sessions = cfg.sessions.enabled;
    fs->session_header = cfg.sessions.header;
    fs->token_header = cfg.sessions.token_header;
    if (started_listen && cfg.flow.enabled != (flow_gate != nullptr)) {
      Log("flow.enabled change needs a restart; ignored");
    }
    if (started_listen && cfg.auth != started_auth) {
      Log("auth change needs a restart; ignored (SIGHUP re-reads the key files)");
    }
    auto table = core().table();
    fs->version = table->version;
    fs->head_fields.resize(table->by_id.size());
    for (const auto& ep : table->by_id) {
      if (!ep) continue;
      fs->head_fields[ep->id] = {{std::string(kEndpointHeader), ep->spec.name}};
      if (fs->sessions) fs->head_fields[ep->id].emplace_back(fs->token_header, routing::SessionToken(*ep));
    }
    settings.store(std::move(fs));
    return Status::Ok();
  }

  Status Reload() {
    if (options.config_path.empty()) {
      return Status::FailedPrecondition("no configuration file to reload");
    }
    if (auth) auth->Reload();  // SIGHUP re-reads the key files too, whatever the config says
    config::ConfigOr<config::RouterConfig> loaded = config::LoadRouterConfig(options.config_path);
    Status st = loaded.ok() ? Apply(std::move(*loaded.value)) : loaded.status();
    if (st.ok()) {
      Log("configuration reloaded from " + options.config_path);
    } else {
      core().OnReloadFailed();
      Log("reload failed, keeping the running configuration: " + st.message());
    }
    return st;
  }

  // ---- lifecycle ----

  Status Start() {
    config::RouterConfig cfg = std::move(initial);
    if (options.listen) cfg.listen_addr = *options.listen;
    if (options.threads) cfg.threads = *options.threads;
    int threads = cfg.threads > 0 ? cfg.threads
                                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    io = std::make_unique<http::IoPool>(threads);
    started_auth = cfg.auth;
    if (Status st = StartAuth(cfg.auth, threads); !st.ok()) return st;
    for (int i = 0; i < threads; ++i) {
      clients.push_back(std::make_unique<http::UpstreamClient>(io->context(i)));
    }
    // Precise prefix routing: each worker tokenizes on its own loop, through its own
    // client (connections to the replicas reused). Used only while some endpoint has
    // KV events configured.
    tokenize::HttpTokenizerOptions to;
    to.timeout = Ms(cfg.pool.kv_events.tokenize_timeout_s);
    if (cfg.pool.kv_events.tokenizer) {
      to.default_host = cfg.pool.kv_events.tokenizer->host;
      to.default_port = cfg.pool.kv_events.tokenizer->port;
    }
    for (int i = 0; i < threads; ++i) {
      tokenizers.push_back(std::make_unique<tokenize::HttpTokenizer>(io->context(i), *clients[i], to));
    }
    core_pool = std::make_unique<pool::Pool>(io->context(0), [this](std::string_view l) { Log(l); });
    if (cfg.flow.enabled) {
      flow_gate = std::make_unique<flow::FlowGate>(cfg.flow.options, core(), [this] { return Now(); });
      flow_timer = std::make_unique<asio::steady_timer>(io->context(0));
      // A fresh scrape may show capacity the estimates did not: waiting requests go then.
      core_pool->set_scrape_listener([this] { PumpFlow(); });
    }
    http::ServerOptions so;
    so.host = cfg.listen_addr.host;
    so.port = cfg.listen_addr.port;
    so.max_body_bytes = cfg.limits.max_body_bytes;
    so.max_header_bytes = cfg.limits.max_header_bytes;
    so.max_header_count = cfg.limits.max_headers;
    so.max_connections = cfg.limits.max_connections;
    so.read_timeout = Ms(cfg.timeouts.request_read_s);
    so.keepalive_idle = Ms(cfg.timeouts.keepalive_idle_s);
    so.error_body = [](int status, std::string_view message) {
      return ErrorJson(status, std::string(message));
    };
    so.log = [this](std::string_view line) { Log(line); };
    if (auth) {
      // A request without a valid key is refused when its header is in, before its body
      // is read (a read whole is checked by Handle, which counts it).
      so.header_check = [this](const http::Request& head, int worker) -> std::optional<http::EarlyAnswer> {
        std::string_view target(head.target().data(), head.target().size());
        if (!NeedsKey(Path(target), head.method())) return std::nullopt;
        if (auth->Check(HeaderValue(head, "authorization"), worker, /*count_accepted=*/false) ==
            AuthVerdict::kAccepted) {
          return std::nullopt;
        }
        return http::EarlyAnswer{401, std::string(kUnauthorizedBody), "application/json",
                                 {{"www-authenticate", "Bearer"}}};
      };
    }
    auto handler = [this](std::shared_ptr<http::Exchange> ex) { Handle(std::move(ex)); };
    if (!cfg.listen_tls.address.empty()) {
      auto watch = ListenerCerts::Load(cfg.listen_tls.cert_path, cfg.listen_tls.key_path,
                                       pool::RealFileSystem(), [this](std::string_view l) { Log(l); });
      if (!watch.ok()) return watch.status();
      cert_watch = std::move(watch).value();
      http::ServerOptions tso = so;
      const config::HostPort at = options.listen_tls.value_or(cfg.listen_tls.addr);
      tso.host = at.host;
      tso.port = at.port;
      tso.tls = cert_watch->tls();
      tls_server = std::make_unique<http::Server>(io->contexts(), tso, handler);
      cert_timer = std::make_unique<pool::PollTimer>(
          io->context(0),
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(cfg.listen_tls.poll_s)),
          [w = cert_watch.get()] { w->Poll(); });
    }
    const bool plain = cfg.listen_plain || options.listen.has_value();
    if (plain) server = std::make_unique<http::Server>(io->contexts(), so, handler);
    io->Start();
    config::HostPort listen = cfg.listen_addr;
    if (Status st = Apply(std::move(cfg)); !st.ok()) return st;
    started_listen = listen;
    if (server) {
      if (Status st = server->Listen(); !st.ok()) return st;
    }
    if (tls_server) {
      if (Status st = tls_server->Listen(); !st.ok()) return st;
      cert_timer->Start();
    }
    if (options.handle_signals) {
      signals = std::make_unique<asio::signal_set>(io->context(0), SIGHUP, SIGINT, SIGTERM);
      WaitSignal();
    }
    return Status::Ok();
  }

  void WaitSignal() {
    signals->async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGHUP) {
        if (cert_watch) cert_watch->Poll(/*force=*/true);
        Reload();
      } else {
        RequestShutdown();
      }
      WaitSignal();
    });
  }

  void Stop() {
    if (stopped || !io) return;
    stopped = true;
    if (server) server->StopAccepting();
    if (tls_server) tls_server->StopAccepting();
    if (cert_timer) cert_timer->Stop();
    if (signals) {
      asio::post(io->context(0), [s = signals.get()] {
        boost::system::error_code ignored;
        s->cancel(ignored);
      });
    }
    if (core_pool) core_pool->Stop();
    if (auth_poll) auth_poll->Stop();
    io->Stop();
  }

  void RequestShutdown() {
    std::lock_guard<std::mutex> lock(shutdown_mu);
    shutdown_requested = true;
    shutdown_cv.notify_all();
  }

  // ---- API keys (auth:) ----

  // Loads the key files (a bad one fails the start: nobody could be let in) and polls them.
  Status StartAuth(const config::AuthConfig& cfg, int threads);
  // Paths under /v1 need a loaded key (vLLM's rule; OPTIONS, a CORS preflight, is free).
  // False: the request was refused with vLLM's 401.
  bool Authorized(http::Exchange& ex, std::string_view path);
  // upstream_authorization on the headers going to a replica.
  void RewriteAuthorization(int worker, std::vector<std::pair<std::string, std::string>>& headers);

  // ---- requests ----

  void Handle(std::shared_ptr<http::Exchange> ex);
  void Generate(std::shared_ptr<http::Exchange> ex, api::Endpoint kind);
  // After parsing (and tokenizing, for precise prefix routing): flow control, then pick.
  void Route(std::shared_ptr<http::Exchange> ex, std::shared_ptr<const FrontSettings> fs,
             api::ParsedRequest& parsed);
  void Models(std::shared_ptr<http::Exchange> ex, bool models = true);
  // Any other path vLLM serves (ForwardedPath): picked by the policy with the body's model
  // and text (api::ScanRoutingFields: prefix-aware where there is a prompt or input,
  // load-aware otherwise), forwarded as it came, never disaggregated.
  void Forward(std::shared_ptr<http::Exchange> ex);
  // Runtime LoRA loading and unloading: sent to every usable endpoint, so the adapter is
  // servable wherever the policy sends its requests.
  void FanOut(std::shared_ptr<http::Exchange> ex);
  // `parsed`: the request, moved from when the pick is disaggregated (the prefill leg may
  // need another prefill endpoint); may be null for other picks.
  void StartPicked(std::shared_ptr<http::Exchange> ex, std::shared_ptr<const FrontSettings> fs,
                   routing::PickResult pick, api::ParsedRequest* parsed = nullptr);

  // ---- flow control (flow_gate set: flow.enabled at start) ----

  // A request waiting in the flow gate: what its pick and dispatch need later.
  struct Waiting;

  // The request's priority band (InferenceObjective convention: higher goes first) and flow.
  std::pair<int64_t, uint64_t> FlowKeys(const http::Request& req, const FrontSettings& fs,
                                        const api::ParsedRequest& parsed);
  // Admits a parsed request. True: it was answered (429) or queued; false: dispatch it now.
  bool AdmitFlow(const std::shared_ptr<http::Exchange>& ex, const FrontSettings& fs,
                 api::ParsedRequest& parsed, std::string_view hint);
  // Capacity may have freed (a request finished on `freed`, a scrape arrived, the timer
  // fired): the gate expires what is due and dispatches what fits (core/flow/flow_gate.h), then
  // the timer is armed for the next expiry. Thread: any.
  void PumpFlow(uint32_t freed = routing::RoutingCore::kNoEndpoint);
  // Arms the one timer for `at` (Now() seconds) unless it is armed for earlier.
  void ArmFlowTimer(double at);
  void OnFlowTimer(double at);

  std::string MetricsText() {
    std::string out;
    out.reserve(16384);
    if (core_pool) core().AppendMetrics(out, Now());
    if (core_pool) core_pool->AppendMetrics(out);
    if (server || tls_server) AppendServerMetrics(out, server.get(), tls_server.get());
    if (cert_watch) cert_watch->AppendMetrics(out);
    if (flow_gate) flow::AppendFlowMetrics(out, flow_gate->stats());
    if (core_pool && core().kv_events_active()) AppendTokenizerMetrics(out);
    pd::AppendPdMetrics(out, pd_counters);
    if (auth) auth->AppendMetrics(out);
    return out;
  }
  bool Ready() { return core_pool && core().Ready(Now()); }

  // kvroute_tokenize_*: every worker's tokenizer calls, failures and latency, summed.
  void AppendTokenizerMetrics(std::string& out) {
    tokenize::TokenizerStats::Snapshot sum;
    for (const auto& t : tokenizers) tokenize::AddSnapshot(sum, t->stats().Read());
    tokenize::AppendTokenizerMetrics(out, sum);
  }

  RouterOptions options;
  config::RouterConfig initial;
  std::optional<config::HostPort> started_listen;
  // Declared first, destroyed last: everything below owns sockets or timers on it.
  std::unique_ptr<http::IoPool> io;
  std::vector<std::unique_ptr<http::UpstreamClient>> clients;  // one per worker
  std::vector<std::unique_ptr<tokenize::HttpTokenizer>> tokenizers;  // one per worker
  std::unique_ptr<pool::Pool> core_pool;
  std::unique_ptr<http::Server> server;      // plaintext; null with `listen: off`
  std::unique_ptr<http::Server> tls_server;  // listen_tls; null without it
  std::unique_ptr<ListenerCerts> cert_watch;  // listen_tls's certificate files
  std::unique_ptr<pool::PollTimer> cert_timer;  // polls cert_watch on worker 0
  std::shared_ptr<asio::ssl::context> upstream_tls;  // what the clients were given last
  std::unique_ptr<asio::signal_set> signals;
  config::AuthConfig started_auth;          // the auth block read at start
  std::unique_ptr<ApiKeyAuth> auth;         // null: auth off
  std::unique_ptr<pool::PollTimer> auth_poll;  // on worker 0
  Published<FrontSettings> settings;
  PdCounters pd_counters;
  // Flow control; the gate holds the queue and the waiting requests (requests arrive on
  // every worker). Nothing does I/O or calls the core under it. Declared after io:
  // destroyed first (the waiting requests pin their connections' sockets).
  std::unique_ptr<flow::FlowGate> flow_gate;          // null: flow control off
  std::unique_ptr<asio::steady_timer> flow_timer;     // on worker 0
  std::mutex flow_timer_mu;
  double flow_timer_at = std::numeric_limits<double>::infinity();  // flow_timer_mu; inf: not armed
  bool stopped = false;
  std::mutex shutdown_mu;
  std::condition_variable shutdown_cv;
  bool shutdown_requested = false;
};

namespace {

// vLLM's usage.prompt_tokens_details.cached_tokens in a body or the final usage chunk of a
// stream; -1 when there is none.
int64_t CachedTokensIn(std::string_view text) { return api::IntAfterKey(text, "\"cached_tokens\""); }

// The prefill leg of a disaggregated request and what the decode leg takes from it.
struct PdLegs {
  api::ParsedRequest parsed;  // PickPrefill's request when a leg moves
  std::shared_ptr<const routing::EndpointTable> table;  // holds the prefill endpoint alive
  uint32_t prefill_id = 0;
  double prefill_tokens = 0.0;
  std::vector<uint32_t> tried;  // prefill endpoints that failed
  std::string prefill_body;
  int status = 0;
  bool too_big = false;
  std::string answer;
  // The decode leg carries prefill's kv_transfer_params (decode_body); else the client's
  // body goes as it came (the decode endpoint prefills).
  bool remote = false;
  std::string decode_body;
  int64_t prefill_cached = -1;  // prefill's usage cached_tokens; -1: none
  bool decode_counted = false;
  const routing::Endpoint& prefill_endpoint() const { return *table->by_id[prefill_id]; }
};

void CollectResponseHeaders(const boost::beast::http::fields& fields, const FrontSettings& fs,
                            http::Fields& out);

// One proxied request: tries the ranked endpoints in order and relays the response.
// Lives as long as its upstream call or its exchange needs it; runs on one worker.
struct ProxyCall : std::enable_shared_from_this<ProxyCall> {
  Router::Impl* router = nullptr;
  std::shared_ptr<const FrontSettings> settings;
  std::shared_ptr<http::Exchange> ex;
  http::UpstreamClient* client = nullptr;
  bhttp::verb method = bhttp::verb::post;
  routing::PickResult pick;  // handle kNoHandle: not scheduled (/v1/models)
  std::size_t attempt = 0;
  std::size_t max_attempts = 1;
  http::UpstreamCall call;
  std::vector<std::pair<std::string, std::string>> forward_headers;
  http::Fields own_head_fields;  // only when the settings' table is older than the pick's
  http::Fields passthrough;      // the answering replica's end-to-end response fields
  bool streaming = false;
  bool first_byte = false;
  bool error_status = false;  // the endpoint answered 5xx: buffered, maybe retried elsewhere
  bool truncated = false;     // a buffered 5xx body exceeded kMaxBufferedResponse
  int status = 0;
  std::string_view content_type;  // a constant, or content_type_copy
  std::string content_type_copy;
  std::string buffered;
  char tail[2] = {'\n', '\n'};  // last two bytes streamed to the client
  // Route receipt: the engine's usage.prompt_tokens_details.cached_tokens (-1: not seen),
  // read only for picks with a prediction.
  int64_t reported_cached = -1;
  // Chunks with a choice streamed back: the token count the latency model takes TPOT from.
  api::ChoiceChunkCounter chunks;
  // Prefill/decode legs (issue 25): only for a disaggregated pick.
  std::unique_ptr<PdLegs> pd;

  ~ProxyCall() {
    if (ex) ex->OnClientGone({});  // its callback points here
  }

  routing::RoutingCore& core() { return router->core(); }
  uint32_t endpoint_id() const { return pick.ranked[attempt]; }
  const routing::Endpoint& endpoint() const { return pick.endpoint(attempt); }
  // "x-kvroute-endpoint: <name>", the session token of the endpoint that answered (with
  // sessions on), and "x-kvroute-attempts: <n>" when the answer came after a retry (n
  // attempts in all).
  const http::Fields& head_fields() {
    uint32_t id = endpoint_id();
    if (attempt == 0 && !pd && settings->version == pick.table->version &&
        id < settings->head_fields.size()) {
      return settings->head_fields[id];
    }
    own_head_fields = {{std::string(kEndpointHeader), endpoint().spec.name}};
    if (settings->sessions) own_head_fields.emplace_back(settings->token_header, routing::SessionToken(endpoint()));
    if (attempt > 0) own_head_fields.emplace_back(std::string(kAttemptsHeader), std::to_string(attempt + 1));
    if (pd && pd->remote && attempt == 0) {
      own_head_fields.emplace_back(std::string(kPrefillHeader), pd->prefill_endpoint().spec.name);
    }
    return own_head_fields;
  }
  // head_fields() and then the replica's own end-to-end response fields.
  const http::Fields& response_fields() {
    const http::Fields& own = head_fields();
    if (passthrough.empty()) return own;
    if (&own != &own_head_fields) own_head_fields = own;
    own_head_fields.insert(own_head_fields.end(), passthrough.begin(), passthrough.end());
    return own_head_fields;
  }

  void Dispatch() {
    const routing::Endpoint& ep = endpoint();
    streaming = error_status = truncated = false;
    status = 0;
    buffered.clear();
    passthrough.clear();
    chunks.Reset();
    if (attempt > 0 || !pick.dispatched) core().OnDispatched(pick.handle, ep.id, router->Now());
    http::UpstreamRequest req;
    req.method = method;
    req.target = std::string_view(ex->request().target().data(), ex->request().target().size());
    const std::string& body = ex->request().body();
    req.body = body;
    // As the client sent it (multipart audio uploads, a charset); JSON when it said none.
    if (std::string_view ct = HeaderValue(ex->request(), "content-type"); !ct.empty()) {
      req.content_type = ct;
    }
    if (pd && pd->remote && attempt == 0) req.body = pd->decode_body;
    req.headers = forward_headers.empty() ? nullptr : &forward_headers;
    req.connect_timeout = settings->connect_timeout;
    req.first_byte_timeout = settings->first_byte_timeout;
    req.idle_timeout = settings->idle_timeout;
    // Plain-pointer captures (no allocation per callback); cb.owner keeps this alive.
    http::UpstreamCallbacks cb;
    cb.on_head = [this](const http::ResponseHead& h) { OnHead(h); };
    cb.on_data = [this](std::string_view d) { OnData(d); };
    cb.on_done = [this](http::UpstreamResult&& r) { OnDone(std::move(r)); };
    cb.owner = shared_from_this();
    req.tls = ep.spec.tls;
    call = client->Start(ep.spec.host, ep.spec.port, req, std::move(cb));
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
    if (h.fields) CollectResponseHeaders(*h.fields, *settings, passthrough);
    if (status >= 500) {
      // Buffered whatever its framing: nothing reaches the client until the router knows
      // whether another endpoint will answer instead.
      error_status = true;
      return;
    }
    core().OnAttemptSucceeded(endpoint_id());
    streaming = sse || !h.content_length || *h.content_length > kMaxBufferedResponse;
    if (streaming) {
      ex->BeginStream(status, content_type, response_fields());
    } else {
      buffered.reserve(*h.content_length);
    }
  }

  void OnData(std::string_view d) {
    if (error_status) {
      if (buffered.size() + d.size() > kMaxBufferedResponse) {
        truncated = true;
      } else {
        buffered.append(d);
      }
      return;
    }
    if (!first_byte) {
      first_byte = true;
      core().OnFirstToken(pick.handle, router->Now());
    }
    if (streaming) {
      if (pick.predicted_cached_tokens >= 0 && reported_cached < 0) reported_cached = CachedTokensIn(d);
      chunks.Feed(d);
      if (d.size() >= 2) {
        tail[0] = d[d.size() - 2];
        tail[1] = d[d.size() - 1];
      } else {
        tail[0] = tail[1];
        tail[1] = d[0];
      }
      std::string chunk(d);
      if (RewritesUsage()) RewriteCachedTokens(chunk, pd->prefill_cached);
      http::RelayChunk(*ex, call, std::move(chunk), *this);
    } else {
      buffered.append(d);
    }
  }

  static std::string_view StatusKind(int code) {
    switch (code) {
      case 500: return "http_500";
      case 502: return "http_502";
      case 503: return "http_503";
      case 504: return "http_504";
      default: return "http_5xx";
    }
  }

  // The decode leg pulled prefill's KV: the client sees prefill's cached tokens (as
  // llm-d's sidecar rewrites them), not the pulled ones the decode engine reports.
  bool RewritesUsage() const { return pd && pd->remote && attempt == 0 && pd->prefill_cached >= 0; }

  void CountPd(PdOutcome o, bool decode) { router->pd_counters.Count(o, decode); }
  void CountFallback(PdFallback f) { router->pd_counters.Count(f); }
  // The decode leg (attempt 0 of a disaggregated request) ended or failed.
  void CountDecode(PdOutcome o) {
    if (!pd || attempt != 0 || pd->decode_counted) return;
    pd->decode_counted = true;
    CountPd(o, true);
  }
  // About to retry after a failed attempt: a failed decode leg goes on as an ordinary request.
  void Retry() {
    if (pd && attempt == 0) CountFallback(PdFallback::kDecodeRetry);
    ++attempt;
    Dispatch();
  }

  // ---- prefill leg (disaggregated picks) ----

  void StartPd(api::ParsedRequest parsed) {
    pd = std::make_unique<PdLegs>();
    pd->parsed = std::move(parsed);
    pd->table = pick.table;
    pd->prefill_id = pick.prefill;
    pd->prefill_tokens = pick.prefill_tokens;
    // One X-Request-Id on both legs (and any retry).
    bool has_id = false;
    for (const auto& [name, value] : forward_headers) has_id = has_id || name == "x-request-id";
    if (!has_id) forward_headers.emplace_back("x-request-id", pd::NewRequestId());
    std::optional<std::string> body = BuildPrefillBody(ex->request().body());
    if (!body) {  // parsed, so cannot happen; the decode endpoint serves it alone
      core().OnPrefillDone(pd->prefill_id, pd->prefill_tokens, pick.handle);
      CountFallback(PdFallback::kLocalPrefill);
      return Dispatch();
    }
    pd->prefill_body = std::move(*body);
    SendPrefill();
  }

  void SendPrefill() {
    const routing::Endpoint& ep = pd->prefill_endpoint();
    pd->status = 0;
    pd->too_big = false;
    pd->answer.clear();
    http::UpstreamRequest req;
    req.method = method;
    req.target = std::string_view(ex->request().target().data(), ex->request().target().size());
    req.body = pd->prefill_body;
    req.headers = &forward_headers;
    req.connect_timeout = settings->connect_timeout;
    req.first_byte_timeout = settings->first_byte_timeout;
    req.idle_timeout = settings->idle_timeout;
    http::UpstreamCallbacks cb;
    cb.on_head = [this](const http::ResponseHead& h) { pd->status = h.status; };
    cb.on_data = [this](std::string_view d) {
      if (pd->answer.size() + d.size() > kMaxBufferedResponse) {
        pd->too_big = true;
      } else {
        pd->answer.append(d);
      }
    };
    cb.on_done = [this](http::UpstreamResult&& r) { OnPrefillDone(std::move(r)); };
    cb.owner = shared_from_this();
    req.tls = ep.spec.tls;
    call = client->Start(ep.spec.host, ep.spec.port, req, std::move(cb));
  }

  void OnPrefillDone(http::UpstreamResult&& r) {
    call = {};
    const bool answered = r.ok() && pd->status >= 200 && pd->status < 300 && !pd->too_big;
    core().OnPrefillDone(pd->prefill_id, pd->prefill_tokens, pick.handle, answered, router->Now());
    if (r.error == http::UpstreamError::kCancelled) {
      CountPd(PdOutcome::kCancelled, false);
      return Finish(499);  // client left
    }
    const double now = router->Now();
    if (answered) {
      core().OnAttemptSucceeded(pd->prefill_id);
      PrefillAnswer a = ReadPrefillAnswer(pd->answer);
      std::optional<std::string> body;
      if (!a.kv_raw.empty()) body = BuildDecodeBody(ex->request().body(), a.kv_raw);
      if (body) {
        CountPd(PdOutcome::kOk, false);
        pd->remote = true;
        pd->decode_body = std::move(*body);
        pd->prefill_cached = a.cached_tokens;
      } else {
        // Prefill held nothing (null parameters): decode prefills locally.
        CountPd(PdOutcome::kNoParams, false);
        CountFallback(PdFallback::kLocalPrefill);
      }
      pd->answer.clear();
      pd->answer.shrink_to_fit();
      return Dispatch();
    }
    CountPd(PdOutcome::kError, false);
    // Failed before answering (or answered an error): the decode leg must not wait on it.
    // The core decides whether the leg moves to another prefill endpoint or the decode
    // endpoint prefills locally; a 4xx (the request itself) is not the endpoint's fault.
    routing::PrefillFailure f;
    f.prefill_id = pd->prefill_id;
    f.failure = {r.ok() ? StatusKind(pd->status) : http::UpstreamErrorName(r.error),
                 !r.ok() && http::IsConnectError(r.error)};
    f.server_fault = !r.ok() || pd->status >= 500 || pd->too_big;
    sched::SchedRequest request;
    if (f.server_fault) request = sched::FromParsed(pd->parsed);
    f.request = &request;
    f.decode_id = pick.ranked[0];
    f.tried = &pd->tried;
    f.client_gone = ex->client_gone();
    const routing::PrefillDecision d = core().OnPrefillFailed(f, now);
    if (d.move()) {
      pd->table = d.table;
      pd->prefill_id = d.prefill;
      pd->prefill_tokens = d.prefill_tokens;
      CountFallback(PdFallback::kPrefillRetry);
      return SendPrefill();
    }
    CountFallback(PdFallback::kLocalPrefill);
    pd->answer.clear();
    Dispatch();
  }

  // Reports the failed attempt to the core and carries out its decision: true when the
  // request went on to the next-ranked endpoint. `retryable`: nothing reached the client
  // and the transport may retry this failure.
  bool RetryAfter(routing::UpstreamFailure failure, bool retryable) {
    routing::AttemptFailure f;
    f.endpoint_id = endpoint_id();
    f.failure = failure;
    f.attempt = static_cast<uint32_t>(attempt);
    f.n_ranked = pick.n_ranked;
    f.max_attempts = static_cast<uint32_t>(max_attempts);
    f.retryable = retryable;
    f.client_gone = ex->client_gone();
    if (!core().OnAttemptFailed(f, router->Now()).retry()) return false;
    Retry();
    return true;
  }

  void OnDone(http::UpstreamResult&& r) {
    call = {};
    if (pd) {
      CountDecode(r.error == http::UpstreamError::kCancelled ? PdOutcome::kCancelled
                  : r.ok() && !error_status                 ? PdOutcome::kOk
                                                            : PdOutcome::kError);
    }
    if (r.ok() && error_status) {
      // The endpoint answered 5xx: a failure for outlier detection; another endpoint may
      // answer instead (generation has no side effects), within the retry budget.
      if (RetryAfter({StatusKind(status), false}, true)) return;
      if (truncated) {
        std::string message = "upstream " + endpoint().spec.name + " failed: HTTP " +
                              std::to_string(status) + " with an oversized body";
        ex->Respond(502, ErrorJson(502, std::move(message)), "application/json", head_fields());
        return Finish(502);
      }
      ex->Respond(status, std::move(buffered), content_type, response_fields());
      return Finish(status);
    }
    if (r.ok()) {
      if (streaming) {
        ex->EndStream();
      } else {
        if (pick.predicted_cached_tokens >= 0 && status == 200) reported_cached = CachedTokensIn(buffered);
        if (RewritesUsage() && status == 200) RewriteCachedTokens(buffered, pd->prefill_cached);
        ex->Respond(status, std::move(buffered), content_type, response_fields());
      }
      return Finish(status);
    }
    if (r.error == http::UpstreamError::kCancelled) return Finish(499);  // client left
    const bool connect_failed = http::IsConnectError(r.error);
    // Nothing reached the client yet (no head relayed): the next-ranked endpoint may answer.
    // A connect failure never reached an engine (free); a reset, failed send or first-byte
    // timeout may have cost the engine work, so those retries come out of the budget.
    const bool retryable = (!r.head_received || error_status) &&
                           (connect_failed || r.error == http::UpstreamError::kReset ||
                            r.error == http::UpstreamError::kSendFailed ||
                            r.error == http::UpstreamError::kFirstByteTimeout ||
                            r.error == http::UpstreamError::kProtocol);
    if (RetryAfter({http::UpstreamErrorName(r.error), connect_failed}, retryable)) return;
    bool timeout = r.error == http::UpstreamError::kFirstByteTimeout ||
                   r.error == http::UpstreamError::kIdleTimeout;
    int code = timeout ? 504 : 502;
    std::string message = "upstream " + endpoint().spec.name + " " +
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
      return Finish(status);
    }
    ex->Respond(code, ErrorJson(code, std::move(message)), "application/json", head_fields());
    Finish(code);
  }

  void Finish(int code) {
    if (pick.predicted_cached_tokens >= 0 && code == 200 && attempt == 0) {
      core().OnRouteReceipt(endpoint_id(), pick.predicted_cached_tokens, reported_cached);
    }
    core().OnFinished(pick.handle, endpoint_id(), code, router->Now(),
                      streaming && chunks.chunks() > 0 ? chunks.chunks() : -1);
    pick.handle = sched::kNoHandle;
    router->PumpFlow(endpoint_id());  // its slot is free: a waiting request may go
  }
};

std::string_view Path(std::string_view target) {
  return target.substr(0, target.find('?'));
}

// The other paths vLLM's OpenAI server answers, forwarded to one endpoint as they came
// (Router::Impl::Forward), with the one method each takes. nullopt: not one of them.
std::optional<bhttp::verb> ForwardedPath(std::string_view path) {
  static constexpr std::string_view kPost[] = {
      "/v1/score",    "/v1/rerank", "/v1/audio/transcriptions", "/v1/audio/translations",
      "/tokenize",    "/detokenize", "/pooling",                "/classify",
      "/score",       "/rerank",     "/v2/rerank",              "/invocations"};
  for (std::string_view p : kPost) {
    if (path == p) return bhttp::verb::post;
  }
  // /v1/responses/{id} (GET: a stored response) and /v1/responses/{id}/cancel (POST).
  static constexpr std::string_view kResponses = "/v1/responses/";
  if (path.size() > kResponses.size() && path.substr(0, kResponses.size()) == kResponses) {
    std::string_view rest = path.substr(kResponses.size());
    const auto slash = rest.find('/');
    if (slash == std::string_view::npos) return bhttp::verb::get;
    if (slash > 0 && rest.substr(slash) == "/cancel") return bhttp::verb::post;
  }
  return std::nullopt;
}

bool IEquals(std::string_view a, std::string_view b) {
  return boost::beast::iequals(boost::beast::string_view(a.data(), a.size()),
                               boost::beast::string_view(b.data(), b.size()));
}

// Whether `list` (a Connection header's value: comma-separated tokens) names `name`.
bool ConnectionNames(std::string_view list, std::string_view name) {
  while (!list.empty()) {
    const auto comma = list.find(',');
    std::string_view token = list.substr(0, comma);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\t')) token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
    if (IEquals(token, name)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

// Every end-to-end request header goes to the replica (tracing's traceparent, tracestate
// and baggage, vLLM's own, the application's), except (issue 29, item 4):
//   - hop-by-hop ones (RFC 9110 section 7.6.1: Connection, Proxy-Connection, Keep-Alive,
//     TE, Transfer-Encoding, Upgrade, Proxy-Authorization, Trailer) and those the
//     Connection header names;
//   - the framing the upstream client writes itself (Host, Content-Length, Content-Type,
//     Expect);
//   - the router's own control headers, consumed here: the routing hint, the latency
//     objectives, the session id and token, the model-name rewrite.
// Names are passed on lower-cased (HTTP/1.1 names are case-insensitive).
void CollectForwardHeaders(const http::Request& req, const FrontSettings& fs,
                           std::vector<std::pair<std::string, std::string>>& out) {
  static constexpr std::string_view kDropped[] = {
      "connection", "proxy-connection", "keep-alive", "te", "transfer-encoding", "upgrade",
      "proxy-authorization", "trailer", "host", "content-length", "content-type", "expect",
      kRoutingHeader, api::kSloTtftHeader, api::kSloTpotHeader, api::kSloTtftHeaderOld,
      api::kSloTpotHeaderOld, api::kModelRewriteHeader};
  const std::string_view connection = HeaderValue(req, "connection");
  for (const auto& f : req) {
    const std::string_view name(f.name_string().data(), f.name_string().size());
    bool drop = fs.sessions && (IEquals(name, fs.session_header) || IEquals(name, fs.token_header));
    for (std::string_view d : kDropped) drop = drop || IEquals(name, d);
    if (drop || (!connection.empty() && ConnectionNames(connection, name))) continue;
    std::string lower(name);
    for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    out.emplace_back(std::move(lower), std::string(f.value()));
  }
}

// The end-to-end header fields of a replica's response, for the client: every one but
// hop-by-hop fields (RFC 9110 7.6.1, and those Connection names), the framing the server
// writes itself (content-type, content-length, transfer-encoding), and the router's own
// (x-kvroute-*, the session token header), which it writes. Appended to `out`.
void CollectResponseHeaders(const boost::beast::http::fields& fields, const FrontSettings& fs,
                            http::Fields& out) {
  static constexpr std::string_view kDropped[] = {
      "connection", "proxy-connection", "keep-alive", "te", "transfer-encoding", "upgrade",
      "proxy-authenticate", "trailer", "content-length", "content-type", kEndpointHeader,
      kAttemptsHeader, kPrefillHeader};
  std::string_view connection;
  for (const auto& f : fields) {
    if (f.name() == bhttp::field::connection) connection = std::string_view(f.value().data(), f.value().size());
  }
  for (const auto& f : fields) {
    const std::string_view name(f.name_string().data(), f.name_string().size());
    bool drop = fs.sessions && IEquals(name, fs.token_header);
    for (std::string_view d : kDropped) drop = drop || IEquals(name, d);
    if (drop || (!connection.empty() && ConnectionNames(connection, name))) continue;
    std::string lower(name);
    for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    out.emplace_back(std::move(lower), std::string(f.value()));
  }
}

}  // namespace

Status Router::Impl::StartAuth(const config::AuthConfig& cfg, int threads) {
  if (!cfg.enabled()) return Status::Ok();
  auth = std::make_unique<ApiKeyAuth>(cfg, threads, pool::RealFileSystem(),
                                      [this](std::string_view l) { Log(l); });
  if (Status st = auth->Load(); !st.ok()) return Status::InvalidArgument("auth: " + st.message());
  auth_poll = std::make_unique<pool::PollTimer>(
      io->context(0), std::chrono::nanoseconds(static_cast<int64_t>(cfg.api_keys_poll_s * 1e9)),
      [this] { auth->Poll(); });
  auth_poll->Start();
  return Status::Ok();
}

bool Router::Impl::Authorized(http::Exchange& ex, std::string_view path) {
  if (!auth || !NeedsKey(path, ex.request().method())) return true;
  if (auth->Check(HeaderValue(ex.request(), "authorization"), ex.worker()) == AuthVerdict::kAccepted) {
    return true;
  }
  ex.Respond(401, std::string(kUnauthorizedBody), "application/json", {{"www-authenticate", "Bearer"}});
  return false;
}

void Router::Impl::RewriteAuthorization(int worker,
                                        std::vector<std::pair<std::string, std::string>>& headers) {
  if (!auth || auth->upstream_mode() == config::UpstreamAuthorization::kForward) return;
  std::erase_if(headers, [](const auto& h) { return h.first == "authorization"; });
  if (auth->upstream_mode() == config::UpstreamAuthorization::kReplace) {
    headers.emplace_back("authorization", std::string(auth->UpstreamAuthorization(worker)));
  }
}

void Router::Impl::Handle(std::shared_ptr<http::Exchange> ex) {
  const http::Request& req = ex->request();
  std::string_view path = Path(std::string_view(req.target().data(), req.target().size()));
  bhttp::verb method = req.method();
  if (!Authorized(*ex, path)) return;
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
  if (path == "/v1/embeddings" || path == "/v1/responses") {
    if (!only(bhttp::verb::post)) return;
    return Generate(std::move(ex), path == "/v1/embeddings" ? api::Endpoint::kEmbeddings
                                                            : api::Endpoint::kResponses);
  }
  if (path == "/v1/models") {
    if (!only(bhttp::verb::get)) return;
    return Models(std::move(ex));
  }
  if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter") {
    if (!only(bhttp::verb::post)) return;
    return FanOut(std::move(ex));
  }
  if (auto verb = ForwardedPath(path)) {
    if (!only(*verb)) return;
    return Forward(std::move(ex));
  }
  if (path == "/healthz") {
    if (!only(bhttp::verb::get)) return;
    ex->Respond(200, "ok\n", "text/plain");
    return;
  }
  if (path == "/readyz") {
    if (!only(bhttp::verb::get)) return;
    bool ready = Ready();
    std::string why;
    if (!ready) {
      why = core_pool ? core_pool->DiscoveryStatus() : std::string();
      why = (why.empty() ? std::string("no endpoint has fresh metrics") : why) + "\n";
    }
    ex->Respond(ready ? 200 : 503, ready ? std::string("ready\n") : why, "text/plain");
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
  auto fs = settings.load();
  // The server leaves padding after the body: simdjson parses it in place (no copy).
  static_assert(http::kRequestBodyPadding >= api::kJsonPadding);
  const std::string& body = ex->request().body();
  api::ParseResult parsed = body.capacity() >= body.size() + api::kJsonPadding
                                ? api::ParseRequestPadded(kind, body)
                                : api::ParseRequest(kind, body);
  if (!parsed.ok()) {
    ex->Respond(parsed.error.status, api::ErrorBody(parsed.error));
    core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint, parsed.error.status, Now());
    return;
  }
  // Latency objectives (issue 24): consumed here, never forwarded (only the headers in
  // the forwarding list reach a replica).
  const http::Request& req = ex->request();
  if (auto slo_error = api::ParseSloHeaders(
          HeaderValue(req, api::kSloTtftHeader), HeaderValue(req, api::kSloTtftHeaderOld),
          HeaderValue(req, api::kSloTpotHeader), HeaderValue(req, api::kSloTpotHeaderOld),
          &*parsed.request)) {
    ex->Respond(slo_error->status, api::ErrorBody(*slo_error));
    core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint, slo_error->status, Now());
    return;
  }
  // x-llm-d-model-name-rewrite: the request is scheduled and sent as that model (its
  // body's "model" replaced); the header itself is not forwarded (not in the forwarding
  // list).
  if (std::string_view rewrite = HeaderValue(req, api::kModelRewriteHeader); !rewrite.empty()) {
    std::optional<std::string> renamed = api::ReplaceModel(body, rewrite);
    if (renamed) {  // a parsed body is a JSON object: always
      parsed.request->model = std::string(rewrite);
      ex->mutable_request().body() = std::move(*renamed);
    }
  }
  // What the headers leave unstated, the named objective's own objectives give (the pool
  // default, scheduling.slo, fills in what is still missing, in the core).
  if (!fs->objective_slos.empty() &&
      (parsed.request->slo_ttft_s <= 0 || parsed.request->slo_tpot_s <= 0)) {
    if (auto it = fs->objective_slos.find(ObjectiveOf(req)); it != fs->objective_slos.end()) {
      if (parsed.request->slo_ttft_s <= 0) parsed.request->slo_ttft_s = it->second.ttft_s;
      if (parsed.request->slo_tpot_s <= 0) parsed.request->slo_tpot_s = it->second.tpot_s;
    }
  }
  // Precise routing tokenizes completions and chat (the engines' /tokenize takes those);
  // embeddings and responses go by the approximate model.
  if (!core().kv_events_active() || !api::Disaggregable(kind)) {
    return Route(std::move(ex), std::move(fs), *parsed.request);
  }
  // Precise prefix routing: the prompt's token ids from the engines' tokenizer (a ready
  // replica, or pool.kv_events.tokenizer), then the pick. Without them (no replica ready,
  // a failure, a timeout) the request is routed by the approximate model.
  auto held = std::make_shared<api::ParsedRequest>(std::move(*parsed.request));
  tokenize::TokenizeInput in;  // views of `held`, which the callback keeps
  in.endpoint = kind;
  in.model = held->model;
  in.prompt = held->prompt_text;
  in.body = body;
  in.add_special_tokens = held->add_special_tokens;
  auto table = core().table();
  if (tokenizers[0]->options().default_host.empty()) {
    if (const routing::Endpoint* ep = table->Find(core().AnyUp(Now()))) {
      in.target_host = ep->spec.host;
      in.target_port = ep->spec.port;
      in.target_tls = ep->spec.tls;
    }
  }
  tokenize::Tokenizer& tok = *tokenizers[ex->worker()];
  tok.Tokenize(in, [this, ex = std::move(ex), fs = std::move(fs), held](Result<tokenize::TokenIds> ids) mutable {
    if (ids.ok()) held->token_ids = std::move(ids).value();
    Route(std::move(ex), std::move(fs), *held);
  });
}

void Router::Impl::Route(std::shared_ptr<http::Exchange> ex, std::shared_ptr<const FrontSettings> fs,
                         api::ParsedRequest& parsed) {
  routing::PickRequest pr;
  pr.request = sched::FromParsed(parsed);
  pr.dispatch_first = true;
  // Client routing hint (EPP style), honoured only when configured.
  if (fs->allow_routing_headers) pr.hint = HeaderValue(ex->request(), kRoutingHeader);
  // Session affinity: the id (router-side binding) and the token the client carries.
  if (fs->sessions) {
    pr.session_id = HeaderValue(ex->request(), fs->session_header);
    pr.session_token = HeaderValue(ex->request(), fs->token_header);
  }
  if (flow_gate) {
    if (AdmitFlow(ex, *fs, parsed, pr.hint)) return;
    pr.request = sched::FromParsed(parsed);  // moved out and back: view it afresh
  }
  routing::PickResult pick = core().Pick(pr, Now());
  StartPicked(std::move(ex), std::move(fs), std::move(pick), &parsed);
}

// Forwards a picked request (at arrival, or a waiting one at dispatch time) on its
// connection's thread.
void Router::Impl::StartPicked(std::shared_ptr<http::Exchange> ex,
                               std::shared_ptr<const FrontSettings> fs, routing::PickResult pick,
                               api::ParsedRequest* parsed) {
  if (pick.ok() && pick.disaggregated() && (!parsed || ex->client_gone())) {
    core().OnPrefillDone(pick.prefill, pick.prefill_tokens, pick.handle);  // no leg will be sent
    pick.pd = routing::PdDecision::kNoPrefill;
  }
  if (!pick.ok()) {
    core().OnFinished(pick.handle, routing::RoutingCore::kNoEndpoint, 503, Now());
    RespondNoEndpoint(*ex, "No usable endpoint: " + pick.status.message() + ".");
    return;
  }
  if (ex->client_gone()) {  // left between a flow dispatch and this
    core().OnFinished(pick.handle, pick.ranked[0], 499, Now());
    PumpFlow(pick.ranked[0]);
    return;
  }
  auto pc = std::make_shared<ProxyCall>();
  pc->pick = std::move(pick);
  pc->router = this;
  pc->settings = std::move(fs);
  pc->client = clients[ex->worker()].get();
  pc->max_attempts = pc->settings->max_attempts;
  pc->method = ex->request().method() == bhttp::verb::head ? bhttp::verb::get : ex->request().method();
  CollectForwardHeaders(ex->request(), *pc->settings, pc->forward_headers);
  RewriteAuthorization(ex->worker(), pc->forward_headers);
  pc->ex = std::move(ex);
  // The replica sees us leave and aborts. A plain pointer (no allocation): ~ProxyCall
  // clears the callback.
  ProxyCall* raw = pc.get();
  pc->ex->OnClientGone([raw] { raw->call.Cancel(); });
  if (pc->pick.disaggregated()) return pc->StartPd(std::move(*parsed));
  pc->Dispatch();
}

namespace {

// One request sent to every usable endpoint, answered once all have answered (or failed).
// GET /v1/models: the union of what every endpoint lists, each model once (the first
// endpoint to list an id wins) and as that replica wrote it (`parent`, `root`,
// `max_model_len` kept). Otherwise (runtime LoRA loading): every endpoint's 2xx gives the
// first one's answer, else the first error answer; x-kvroute-fanout says "<2xx>/<sent>".
// All of it runs on the exchange's worker: no lock.
struct FanOutCall : std::enable_shared_from_this<FanOutCall> {
  std::shared_ptr<http::Exchange> ex;
  std::shared_ptr<const routing::EndpointTable> table;  // holds the endpoints alive
  bool models = true;
  std::vector<http::UpstreamCall> calls;
  std::vector<std::string> bodies;
  std::vector<std::string> content_types;
  std::vector<int> statuses;
  std::size_t pending = 0;

  ~FanOutCall() {
    if (ex) ex->OnClientGone({});
  }

  void Start(http::UpstreamClient& client, const FrontSettings& fs, std::span<const uint32_t> ids,
             const std::vector<std::pair<std::string, std::string>>* headers) {
    pending = ids.size();
    bodies.resize(ids.size());
    content_types.resize(ids.size());
    statuses.assign(ids.size(), 0);
    const http::Request& in = ex->request();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const routing::Endpoint& ep = *table->by_id[ids[i]];
      http::UpstreamRequest req;
      req.method = models ? bhttp::verb::get : in.method();
      req.target = models ? std::string_view("/v1/models")
                          : std::string_view(in.target().data(), in.target().size());
      if (!models) req.body = in.body();
      req.headers = headers;
      req.connect_timeout = fs.connect_timeout;
      req.first_byte_timeout = fs.first_byte_timeout;
      req.idle_timeout = fs.idle_timeout;
      http::UpstreamCallbacks cb;
      cb.on_head = [this, i](const http::ResponseHead& h) {
        statuses[i] = h.status;
        content_types[i].assign(h.content_type);
      };
      cb.on_data = [this, i](std::string_view d) {
        if (bodies[i].size() + d.size() <= kMaxBufferedResponse) bodies[i].append(d);
      };
      cb.on_done = [this, i](http::UpstreamResult&& r) {
        if (!r.ok()) statuses[i] = 0;
        if (--pending == 0) Finish();
      };
      cb.owner = shared_from_this();
      req.tls = ep.spec.tls;
      calls.push_back(client.Start(ep.spec.host, ep.spec.port, req, std::move(cb)));
    }
  }

  void Finish() {
    if (!models) return FinishAll();
    std::string out = "{\"object\":\"list\",\"data\":[";
    std::set<std::string, std::less<>> seen;
    bool any = false;
    simdjson::dom::parser dom;
    for (std::size_t i = 0; i < bodies.size(); ++i) {
      if (statuses[i] != 200) continue;
      simdjson::dom::element root;
      simdjson::dom::array data;
      if (dom.parse(bodies[i]).get(root) || root["data"].get_array().get(data)) continue;
      any = true;
      for (simdjson::dom::element m : data) {
        std::string_view id;
        if (m["id"].get_string().get(id) || seen.count(id)) continue;
        seen.emplace(id);
        if (out.back() != '[') out.push_back(',');
        out += simdjson::minify(m);
      }
    }
    out += "]}";
    if (!any) {
      ex->Respond(502, ErrorJson(502, "No endpoint answered GET /v1/models."));
      return;
    }
    ex->Respond(200, std::move(out));
  }

  void FinishAll() {
    std::size_t ok = 0;
    std::optional<std::size_t> first_ok, first_error;
    for (std::size_t i = 0; i < statuses.size(); ++i) {
      if (statuses[i] >= 200 && statuses[i] < 300) {
        ++ok;
        if (!first_ok) first_ok = i;
      } else if (statuses[i] != 0 && !first_error) {
        first_error = i;
      }
    }
    const std::string_view path = Path(std::string_view(ex->request().target().data(),
                                                        ex->request().target().size()));
    if (!first_ok && !first_error) {
      ex->Respond(502, ErrorJson(502, "No endpoint answered POST " + std::string(path) + "."));
      return;
    }
    const std::size_t i = first_error ? *first_error : *first_ok;
    ex->Respond(statuses[i], std::move(bodies[i]), content_types[i],
                {{"x-kvroute-fanout", std::to_string(ok) + "/" + std::to_string(statuses.size())}});
  }
};

}  // namespace

void Router::Impl::Forward(std::shared_ptr<http::Exchange> ex) {
  auto fs = settings.load();
  api::RoutingFields f = api::ScanRoutingFields(ex->request().body());
  api::ParsedRequest p;
  p.endpoint = api::Endpoint::kOther;
  p.model = std::move(f.model);
  p.prompt_text = std::move(f.prompt_text);
  p.stream = false;  // nothing for the latency model to learn from
  Route(std::move(ex), std::move(fs), p);
}

void Router::Impl::FanOut(std::shared_ptr<http::Exchange> ex) { Models(std::move(ex), false); }

void Router::Impl::Models(std::shared_ptr<http::Exchange> ex, bool models) {
  auto table = core().table();
  std::vector<uint32_t> ids(std::max<std::size_t>(1, table->by_id.size()));
  ids.resize(core().AnyUsable(Now(), ids.data(), ids.size()));
  if (ids.empty()) {
    RespondNoEndpoint(*ex, "No usable endpoint: no healthy endpoint is available.");
    core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint, 503, Now());
    return;
  }
  auto mc = std::make_shared<FanOutCall>();
  mc->ex = std::move(ex);
  mc->table = std::move(table);
  mc->models = models;
  FanOutCall* raw = mc.get();
  mc->ex->OnClientGone([raw] {
    for (auto& c : raw->calls) c.Cancel();
  });
  std::vector<std::pair<std::string, std::string>> headers;
  CollectForwardHeaders(mc->ex->request(), *settings.load(), headers);
  RewriteAuthorization(mc->ex->worker(), headers);
  mc->Start(*clients[mc->ex->worker()], *settings.load(), ids, headers.empty() ? nullptr : &headers);
}

// ---- flow control ----

namespace {

// The 429 flow control answers: an OpenAI-shaped RateLimitError with Retry-After, and why
// (x-llm-d-request-dropped-reason).
void RespondRateLimited(http::Exchange& ex, std::string message,
                        std::string_view dropped = api::kDroppedSaturated) {
  ex.Respond(429, ErrorJson(429, std::move(message)), "application/json",
             {{"retry-after", std::string(kRetryAfterS)},
              {std::string(api::kDroppedReasonHeader), std::string(dropped)}});
}

}  // namespace

std::pair<int64_t, uint64_t> Router::Impl::FlowKeys(const http::Request& req, const FrontSettings& fs,
                                                    const api::ParsedRequest& parsed) {
  const std::string_view objective = ObjectiveOf(req);
  // An objective's priority (unknown: 0) wins; else vLLM's `priority`, which orders the
  // other way (lower is more important).
  int64_t priority = -parsed.priority;
  if (!objective.empty()) {
    priority = 0;
    std::shared_ptr<const pool::Priorities> cluster = core_pool->objectives();
    if (auto it = cluster->find(objective); it != cluster->end()) {
      priority = it->second;
    } else if (auto jt = fs.objectives.find(objective); jt != fs.objectives.end()) {
      priority = jt->second;
    }
  }
  // The flow: the configured flow header's value; without one, the fairness id (llm-d's
  // header, then the older one), else the objective.
  std::string_view flow_name;
  if (!fs.flow_header.empty()) {
    flow_name = HeaderValue(req, fs.flow_header);
  } else {
    flow_name = HeaderValue(req, api::kFairnessHeader);
    if (flow_name.empty()) flow_name = HeaderValue(req, api::kFairnessHeaderOld);
    if (flow_name.empty()) flow_name = objective;
  }
  return {priority, flow_name.empty() ? 0 : std::hash<std::string_view>{}(flow_name)};
}

// A request waiting in the gate. Dispatch picks on the gate's thread (so the gate's next
// verdict counts it) and forwards on the connection's; Expire answers there.
struct Router::Impl::Waiting final : flow::FlowWaiter, std::enable_shared_from_this<Waiting> {
  Impl* router = nullptr;
  std::shared_ptr<http::Exchange> ex;
  api::ParsedRequest parsed;  // the SchedRequest built at dispatch time views its strings
  std::string hint;           // routing hint, when allowed
  std::string session_id, session_token;  // the session headers, when sessions are on

  void Dispatch(double now_s, double waited_s) override {
    routing::PickRequest pr;
    pr.request = sched::FromParsed(parsed);
    pr.request.queued_s = waited_s;
    pr.dispatch_first = true;
    pr.hint = hint;
    pr.session_id = session_id;
    pr.session_token = session_token;
    routing::PickResult pick = router->core().Pick(pr, now_s);
    asio::post(ex->executor(), [self = shared_from_this(), pick = std::move(pick)]() mutable {
      self->router->StartPicked(self->ex, self->router->settings.load(), std::move(pick), &self->parsed);
    });
  }

  void Expire(flow::ExpireReason reason) override {
    const bool no_endpoint = reason == flow::ExpireReason::kNoEndpointTtl;
    asio::post(ex->executor(), [self = shared_from_this(), no_endpoint] {
      Impl& r = *self->router;
      if (no_endpoint) {
        RespondNoEndpoint(*self->ex, "No usable endpoint: none became ready while the "
                                     "request waited (flow.no_endpoint_ttl).");
      } else {
        RespondRateLimited(*self->ex, "Too many requests: the pool stayed saturated for the "
                                      "request's whole wait (flow.ttl).",
                           api::kDroppedTtlExpired);
      }
      r.core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint,
                          no_endpoint ? 503 : 429, r.Now());
    });
  }
};

bool Router::Impl::AdmitFlow(const std::shared_ptr<http::Exchange>& ex, const FrontSettings& fs,
                             api::ParsedRequest& parsed, std::string_view hint) {
  auto [priority, flow_id] = FlowKeys(ex->request(), fs, parsed);
  flow::FlowRequest fr;
  fr.priority = priority;
  fr.flow_id = flow_id;
  fr.bytes = ex->request().body().size();
  auto w = std::make_shared<Waiting>();
  w->router = this;
  w->ex = ex;
  w->hint.assign(hint);
  if (fs.sessions) {
    w->session_id.assign(HeaderValue(ex->request(), fs.session_header));
    w->session_token.assign(HeaderValue(ex->request(), fs.token_header));
  }
  // The waiter owns the parsed request from before the admission: once queued, a pump on
  // another thread may dispatch it at once.
  w->parsed = std::move(parsed);
  const flow::AdmitResult admitted = flow_gate->Admit(fr, w, sched::FromParsed(w->parsed));
  switch (admitted.outcome) {
    case flow::AdmitOutcome::kDispatchNow:
      parsed = std::move(w->parsed);  // the caller picks it now
      return false;
    case flow::AdmitOutcome::kRejected: {
      std::string why =
          admitted.reason == flow::RejectReason::kSheddable
              ? "the pool is saturated and the request is sheddable (priority " +
                    std::to_string(priority) + ")"
          : admitted.reason == flow::RejectReason::kPredictedMiss
              ? "the request is sheddable (priority " + std::to_string(priority) +
                    ") and predicted to miss its time-to-first-token objective"
              : "the flow queue is full (" +
                    std::string(flow::RejectReasonName(admitted.reason)) + ")";
      RespondRateLimited(*ex, "Too many requests: " + why + ".");
      core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint, 429, Now());
      return true;
    }
    case flow::AdmitOutcome::kQueued:
      break;
  }
  // A client leaving while it waits is removed at once. Runs on this connection's thread,
  // the one we are on, so it cannot run before it is set.
  ex->OnClientGone([this, id = fr.id] {
    if (flow_gate->Cancel(id)) {
      core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint, 499, Now());
    }
  });
  // Capacity may have freed between the verdict and the queueing; arms the timer too.
  PumpFlow();
  return true;
}

void Router::Impl::PumpFlow(uint32_t freed) {
  if (!flow_gate || !flow_gate->waiting()) return;
  flow_gate->Pump(freed);
  ArmFlowTimer(flow_gate->next_expiry());
}

void Router::Impl::ArmFlowTimer(double at) {
  if (!std::isfinite(at)) return;
  {
    std::lock_guard<std::mutex> lock(flow_timer_mu);
    if (at >= flow_timer_at) return;
    flow_timer_at = at;
  }
  // Timers are not thread-safe: armed on their own thread. Posts run in order, and each
  // is for an earlier time than the one before, so the last armed is the earliest.
  asio::post(io->context(0), [this, at] {
    // A millisecond late rather than early: Expire removes what is due at `at`.
    const double delay = std::max(0.0, at - Now()) + 0.001;
    flow_timer->expires_after(std::chrono::microseconds(static_cast<int64_t>(std::ceil(delay * 1e6))));
    flow_timer->async_wait([this, at](boost::system::error_code ec) {
      if (!ec) OnFlowTimer(at);
    });
  });
}

void Router::Impl::OnFlowTimer(double at) {
  {
    std::lock_guard<std::mutex> lock(flow_timer_mu);
    if (flow_timer_at == at) flow_timer_at = std::numeric_limits<double>::infinity();
  }
  PumpFlow();  // expires what is due and re-arms for the next
}

// ---- Router ----

Router::Router(config::RouterConfig config, RouterOptions options)
    : impl_(std::make_shared<Impl>(std::move(config), std::move(options))) {}
Router::~Router() { Stop(); }
Status Router::Start() { return impl_->Start(); }
void Router::Stop() { impl_->Stop(); }
uint16_t Router::port() const { return impl_->server ? impl_->server->port() : 0; }
uint16_t Router::tls_port() const { return impl_->tls_server ? impl_->tls_server->port() : 0; }
bool Router::PollCertificates() {
  return impl_->cert_watch && impl_->cert_watch->Poll();
}
Status Router::Reload() { return impl_->Reload(); }
Status Router::Apply(config::RouterConfig config) { return impl_->Apply(std::move(config)); }
std::string Router::MetricsText() { return impl_->MetricsText(); }
bool Router::Ready() { return impl_->Ready(); }
uint64_t Router::reloads() const { return impl_->core_pool ? impl_->core_pool->core().reloads() : 0; }
void Router::PollApiKeys() {
  if (impl_->auth) impl_->auth->Poll();
}
void Router::WaitForShutdown() {
  std::unique_lock<std::mutex> lock(impl_->shutdown_mu);
  impl_->shutdown_cv.wait(lock, [this] { return impl_->shutdown_requested; });
}
void Router::RequestShutdown() { impl_->RequestShutdown(); }

}  // namespace kvroute::router
