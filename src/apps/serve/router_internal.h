// Internal to apps/serve (not for use outside this folder): Router::Impl, the router's
// state and the methods its files share, defined in
//   router.cc           start (listeners, workers, API keys, signals), stop, the Router façade
//   router_settings.cc  Apply and Reload: the front end's settings from a configuration
//   router_requests.cc  Handle (every request's way in), parsing, routing, forwarded paths
//   proxy_call.cc       one proxied request: attempts, retries, the prefill leg
//   fan_out.cc          GET /v1/models and runtime LoRA loading, sent to every endpoint
//   header_rules.cc     which request and response headers pass through
//   router_flow.cc      flow control: admission, waiting requests, the expiry timer
//   router_metrics.cc   the router's own /metrics exposition
// and, in namespace detail, the wire constants, the reloadable FrontSettings and the small
// helpers those files share (inline: they sit on the request path).
#pragma once

#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "adapters/capture/capture_log.h"
#include "adapters/certs/listener_certs.h"
#include "adapters/http/client.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/server.h"
#include "adapters/pool/poll_timer.h"
#include "adapters/pool/pool.h"
#include "adapters/tokenize/http_tokenizer.h"
#include "apps/pd/pd_counters.h"
#include "apps/serve/api_key_auth.h"
#include "apps/serve/router.h"
#include "config/router_config.h"
#include "core/api/openai.h"
#include "core/common/published.h"
#include "core/common/status.h"
#include "core/flow/flow_gate.h"
#include "core/routing/routing_core.h"

namespace kvroute::router {

namespace detail {

inline constexpr std::string_view kEndpointHeader = "x-kvroute-endpoint";
inline constexpr std::string_view kAttemptsHeader = "x-kvroute-attempts";
inline constexpr std::string_view kRoutingHeader = "x-gateway-destination-endpoint";
// On a disaggregated answer whose decode leg pulled a prefill: the prefill endpoint's name.
inline constexpr std::string_view kPrefillHeader = "x-kvroute-prefill";
// Complete (non-streamed) upstream responses up to this size are relayed in one write
// with Content-Length; anything else is streamed chunk by chunk.
inline constexpr uint64_t kMaxBufferedResponse = 1u << 20;
// The InferenceObjective a request names (the Gateway API Inference Extension's header,
// then llm-d's older one): its priority band and, unless flow.flow_header says otherwise,
// its flow.
inline constexpr std::string_view kObjectiveHeaders[] = {"x-gateway-inference-objective",
                                                         "x-llm-d-inference-objective"};

inline std::chrono::milliseconds Ms(double s) {
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::llround(s * 1000))));
}

// vLLM's AuthenticationMiddleware answer to a request without a valid key, to the byte;
// the key is never echoed.
inline constexpr std::string_view kUnauthorizedBody = R"({"error":"Unauthorized"})";
// The target without its query.
inline std::string_view Path(std::string_view target) {
  return target.substr(0, target.find('?'));
}
// Like vLLM, only paths under /v1 need a key, and never an OPTIONS preflight.
inline bool NeedsKey(std::string_view path, boost::beast::http::verb method) {
  return path.substr(0, 3) == "/v1" && method != boost::beast::http::verb::options;
}

inline std::string ErrorJson(int status, std::string message) {
  return api::ErrorBody(api::MakeError(status, std::move(message)));
}

// The 503 when no endpoint can take a request, saying so in x-llm-d-request-dropped-reason.
inline void RespondNoEndpoint(http::Exchange& ex, std::string message) {
  ex.Respond(503, ErrorJson(503, std::move(message)), "application/json",
             {{std::string(api::kDroppedReasonHeader), std::string(api::kDroppedNoEndpoints)}});
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

inline std::string_view HeaderValue(const http::Request& req, std::string_view name) {
  auto it = req.find(boost::beast::string_view(name.data(), name.size()));
  return it == req.end() ? std::string_view() : std::string_view(it->value().data(), it->value().size());
}

// The objective the request names (the first of kObjectiveHeaders present); "" when none.
inline std::string_view ObjectiveOf(const http::Request& req) {
  for (std::string_view h : kObjectiveHeaders) {
    if (std::string_view v = HeaderValue(req, h); !v.empty()) return v;
  }
  return {};
}

// header_rules.cc: the request headers a replica sees, appended to `out`.
void CollectForwardHeaders(const http::Request& req, const FrontSettings& fs,
                           std::vector<std::pair<std::string, std::string>>& out);
// header_rules.cc: a replica's response headers the client sees, appended to `out`.
void CollectResponseHeaders(const boost::beast::http::fields& fields, const FrontSettings& fs,
                            http::Fields& out);

}  // namespace detail

struct Router::Impl {
  Impl(config::RouterConfig cfg, RouterOptions opts)
      : options(std::move(opts)), initial(std::move(cfg)) {}

  double Now() const { return core_pool->Now(); }
  routing::RoutingCore& core() { return core_pool->core(); }

  void Log(std::string_view line) {
    if (options.log) std::fprintf(stderr, "kvroute serve: %.*s\n", static_cast<int>(line.size()), line.data());
  }

  // ---- configuration (router_settings.cc) ----

  Status Apply(config::RouterConfig cfg);
  Status Reload();

  // ---- lifecycle (router.cc) ----

  Status Start();
  void WaitSignal();
  void Stop();
  void RequestShutdown();

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
  void Route(std::shared_ptr<http::Exchange> ex, std::shared_ptr<const detail::FrontSettings> fs,
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
  void StartPicked(std::shared_ptr<http::Exchange> ex, std::shared_ptr<const detail::FrontSettings> fs,
                   routing::PickResult pick, api::ParsedRequest* parsed = nullptr);

  // ---- flow control (flow_gate set: flow.enabled at start; router_flow.cc) ----

  // A request waiting in the flow gate: what its pick and dispatch need later.
  struct Waiting;

  // The request's priority band (InferenceObjective convention: higher goes first) and flow.
  std::pair<int64_t, uint64_t> FlowKeys(const http::Request& req, const detail::FrontSettings& fs,
                                        const api::ParsedRequest& parsed);
  // Admits a parsed request. True: it was answered (429) or queued; false: dispatch it now.
  bool AdmitFlow(const std::shared_ptr<http::Exchange>& ex, const detail::FrontSettings& fs,
                 api::ParsedRequest& parsed, std::string_view hint);
  // capture: the line of a request answered without a pick (flow control's 429s and
  // expiries), when the sample takes it.
  void CaptureUnpicked(const http::Exchange& ex, const detail::FrontSettings& fs,
                       const api::ParsedRequest& parsed, int status);
  // Capacity may have freed (a request finished on `freed`, a scrape arrived, the timer
  // fired): the gate expires what is due and dispatches what fits (core/flow/flow_gate.h), then
  // the timer is armed for the next expiry. Thread: any.
  void PumpFlow(uint32_t freed = routing::RoutingCore::kNoEndpoint);
  // Arms the one timer for `at` (Now() seconds) unless it is armed for earlier.
  void ArmFlowTimer(double at);
  void OnFlowTimer(double at);

  // ---- the router's own /metrics (router_metrics.cc) ----

  std::string MetricsText();
  bool Ready() { return core_pool && core().Ready(Now()); }

  // kvroute_tokenize_*: every worker's tokenizer calls, failures and latency, summed.
  void AppendTokenizerMetrics(std::string& out);

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
  std::shared_ptr<boost::asio::ssl::context> upstream_tls;  // what the clients were given last
  std::unique_ptr<boost::asio::signal_set> signals;
  config::AuthConfig started_auth;          // the auth block read at start
  std::unique_ptr<ApiKeyAuth> auth;         // null: auth off
  std::unique_ptr<pool::PollTimer> auth_poll;  // on worker 0
  Published<detail::FrontSettings> settings;
  pd::PdCounters pd_counters;
  // capture: (read at start); null: off. Written by its own thread; outlives the workers'
  // requests (declared after io: destroyed before it, after Stop has joined the workers).
  std::unique_ptr<capture::CaptureLog> capture_log;
  // Flow control; the gate holds the queue and the waiting requests (requests arrive on
  // every worker). Nothing does I/O under it; the prefix probe and the release by
  // predicted TTFT read the core under it (the scheduler lock's shared side: gate, then
  // core, never the reverse). Declared after io:
  // destroyed first (the waiting requests pin their connections' sockets).
  std::unique_ptr<flow::FlowGate> flow_gate;          // null: flow control off
  std::unique_ptr<boost::asio::steady_timer> flow_timer;  // on worker 0
  std::mutex flow_timer_mu;
  double flow_timer_at = std::numeric_limits<double>::infinity();  // flow_timer_mu; inf: not armed
  bool stopped = false;
  std::mutex shutdown_mu;
  std::condition_variable shutdown_cv;
  bool shutdown_requested = false;
};

}  // namespace kvroute::router
