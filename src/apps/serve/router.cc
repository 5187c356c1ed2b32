// `kvroute serve`'s start and stop: the workers, the listeners (plaintext and HTTPS, with
// the API-key check on each request head), the certificate and key-file polls, the
// signals; and the Router façade over Router::Impl (router_internal.h).
#include "apps/serve/router.h"

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>

#include "adapters/certs/listener_certs.h"
#include "adapters/http/client.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/server.h"
#include "adapters/pool/poll_timer.h"
#include "adapters/pool/pool.h"
#include "adapters/tokenize/http_tokenizer.h"
#include "apps/serve/api_key_auth.h"
#include "apps/serve/router_internal.h"
#include "core/flow/flow_gate.h"

namespace kvroute::router {

namespace asio = boost::asio;
using detail::ErrorJson;
using detail::HeaderValue;
using detail::kUnauthorizedBody;
using detail::Ms;
using detail::NeedsKey;
using detail::Path;

// ---- lifecycle ----

Status Router::Impl::Start() {
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
  if (cfg.capture.enabled()) {
    auto log = capture::CaptureLog::Open(cfg.capture, Now());
    if (!log.ok()) return log.status();
    capture_log = std::move(log).value();
    Log("capturing routed requests to " + cfg.capture.path);
  }
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

void Router::Impl::WaitSignal() {
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

void Router::Impl::Stop() {
  if (stopped || !io) return;
  stopped = true;
  if (server) server->StopAccepting();
  if (tls_server) tls_server->StopAccepting();
  if (cert_timer) cert_timer->Stop();
  http::CancelSignalWait(*io, signals.get());
  if (core_pool) core_pool->Stop();
  if (auth_poll) auth_poll->Stop();
  io->Stop();
}

void Router::Impl::RequestShutdown() {
  std::lock_guard<std::mutex> lock(shutdown_mu);
  shutdown_requested = true;
  shutdown_cv.notify_all();
}

// ---- API keys (auth:) ----

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
