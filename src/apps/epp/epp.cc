#include "apps/epp/epp.h"

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

#include "core/api/openai.h"
#include "core/flow/flow_gate.h"
#include "core/flow/flow_metrics.h"
#include "core/common/published.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/server.h"
#include "core/metrics/prom_writer.h"
#include "adapters/capture/capture_log.h"
#include "adapters/certs/cert_watch.h"
#include "adapters/certs/served_certificate.h"
#include "adapters/pool/poll_timer.h"
#include "adapters/pool/pool.h"
#include "apps/epp/grpc/ext_proc_server.h"
#include "adapters/tokenize/http_tokenizer.h"
#include "adapters/tokenize/tokenize_metrics.h"
#include "adapters/tls/pki.h"

namespace kvroute::epp {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;

namespace {

// The `name` label of the inference_pool_* gauges without Kubernetes (no InferencePool
// object); with it, the pool's name.
constexpr std::string_view kPoolName = "kvroute";

extproc::BodyMode ModeFrom(config::EppBodyMode m) {
  switch (m) {
    case config::EppBodyMode::kStreamed: return extproc::BodyMode::kStreamed;
    case config::EppBodyMode::kBuffered: return extproc::BodyMode::kBuffered;
    default: return extproc::BodyMode::kFullDuplexStreamed;
  }
}

// The configured objectives table with Kubernetes' InferenceObjectives over it (a name in
// both takes the cluster's priority).
std::shared_ptr<const extproc::ExchangeSettings> SettingsFrom(const config::RouterConfig& cfg,
                                                              const pool::Priorities& configured,
                                                              const pool::Priorities& cluster,
                                                              bool flow_control) {
  auto s = std::make_shared<extproc::ExchangeSettings>();
  // Flow control holds each stream's pick for the server's queue (ext_proc_server.h).
  s->defer_pick = flow_control;
  s->flow_header = cfg.flow.flow_header;
  s->sessions = cfg.sessions.enabled;
  s->session_header = cfg.sessions.header;
  s->token_header = cfg.sessions.token_header;
  for (char& c : s->flow_header) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  s->body_mode = ModeFrom(cfg.epp.body_mode);
  s->fallbacks = static_cast<std::size_t>(cfg.epp.fallbacks);
  s->max_body_bytes = cfg.limits.max_body_bytes;
  s->objectives = configured;
  for (const auto& [name, priority] : cluster) s->objectives[name] = priority;
  for (const auto& [name, slo] : cfg.epp.objective_slos) {
    s->objective_slos[name] = {slo.ttft_s, slo.tpot_s};
  }
  return s;
}

void AppendServerMetrics(std::string& out, const rpc::ServerStats& s) {
  auto load = [](const auto& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  metrics::AppendGauge(out, "kvroute_epp_streams_open", "ext_proc streams open now.", {}, load(s.open_streams));
  metrics::AppendCounter(out, "kvroute_epp_streams_total", "ext_proc streams started.", {}, load(s.streams));
  metrics::AppendCounter(out, "kvroute_epp_stream_timeouts_total",
                         "ext_proc streams ended by epp.stream_timeout.", {}, load(s.timeouts));
  metrics::AppendCounter(out, "kvroute_epp_streams_cancelled_total",
                         "ext_proc streams cancelled by the gateway (or at shutdown).", {},
                         load(s.cancelled));
  metrics::AppendCounter(out, "kvroute_epp_messages_received_total", "ProcessingRequest messages read.", {},
                         load(s.messages_in));
  metrics::AppendCounter(out, "kvroute_epp_messages_sent_total", "ProcessingResponse messages written.", {},
                         load(s.messages_out));
}

// The names a self-signed certificate is made for: loopback and this host's name (a pod's
// name in Kubernetes). Gateways do not verify the picker's certificate; a client that
// does trusts the certificate itself (--self-signed-cert-out).
std::string SelfSignedSan() {
  std::string san = "DNS:localhost,IP:127.0.0.1,IP:::1";
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0' && host[0] != '-') {
    std::string_view h(host);
    const bool dns_name = std::all_of(h.begin(), h.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
    });
    if (dns_name && h != "localhost") san += ",DNS:" + std::string(h);
  }
  return san;
}

// Writes `text` to `path` readable by this user only, by a rename over it: a reader sees
// the old file or the new one, never a mix.
Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".new";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Unavailable(tmp + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::Unavailable(tmp + ": " + std::strerror(e));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return Status::Unavailable(path + ": " + std::strerror(e));
  }
  return Status::Ok();
}

}  // namespace

Status ApplyKubernetesFlags(const config::KubernetesDiscoveryConfig& flags, config::RouterConfig& c) {
  if (!flags.enabled()) return Status::Ok();
  if (!c.pool.endpoints.empty()) {
    return Status::InvalidArgument(
        "--pool-name replaces the configuration's pool.endpoints; remove them (or the flag)");
  }
  if (!c.pool.endpoints_file.empty()) {
    return Status::InvalidArgument(
        "--pool-name replaces the configuration's pool.endpoints_file; remove it (or the flag)");
  }
  config::KubernetesDiscoveryConfig& k = c.pool.kubernetes;
  const bool same_pool = k.inference_pool == flags.inference_pool;
  k.inference_pool = flags.inference_pool;
  if (!flags.namespace_name.empty()) k.namespace_name = flags.namespace_name;
  else if (!same_pool) k.namespace_name.clear();
  if (!flags.group.empty()) k.group = flags.group;
  if (!flags.kubeconfig.empty()) {
    k.kubeconfig = flags.kubeconfig;
    k.kubeconfig_path = flags.kubeconfig_path.empty() ? flags.kubeconfig : flags.kubeconfig_path;
  }
  if (!flags.context.empty()) k.context = flags.context;
  Status st = config::CheckKubernetesDiscovery(k);
  if (st.ok()) return st;
  const std::string& e = st.message();
  for (auto [field, flag] : {std::pair{"inference_pool: ", "--pool-name: "}, std::pair{"namespace: ", "--pool-namespace: "},
                             std::pair{"group: ", "--pool-group: "}}) {
    if (e.rfind(field, 0) == 0) {
      return Status::InvalidArgument(flag + e.substr(std::string_view(field).size()));
    }
  }
  return st;
}

struct Epp::Impl {
  Impl(config::RouterConfig cfg, EppOptions opts) : options(std::move(opts)), initial(std::move(cfg)) {}

  void Log(std::string_view line) {
    if (options.log && options.log_sink) {
      options.log_sink(line);
      return;
    }
    if (options.log) std::fprintf(stderr, "kvroute epp: %.*s\n", static_cast<int>(line.size()), line.data());
  }

  Status Apply(config::RouterConfig cfg) {
    if (Status st = ApplyKubernetesFlags(options.kubernetes, cfg); !st.ok()) return st;
    if (options.region) cfg.locality.region = *options.region;
    Status st = pool->Apply(cfg);
    if (!st.ok()) return st;
    if (grpc && cfg.flow.enabled != flow_on) Log("flow.enabled change needs a restart; ignored");
    {
      std::lock_guard<std::mutex> lock(settings_mu);
      configured_objectives = cfg.epp.objectives;
      pool_label = cfg.pool.kubernetes.enabled() ? cfg.pool.kubernetes.inference_pool : std::string(kPoolName);
      settings.store(SettingsFrom(cfg, configured_objectives, *pool->objectives(), flow_on));
    }
    if (grpc) grpc->set_stream_timeout(cfg.epp.stream_timeout_s);
    return Status::Ok();
  }

  // The InferenceObjectives in the cluster moved: the same settings with the new table.
  void OnClusterObjectives() {
    std::shared_ptr<const pool::Priorities> cluster = pool->objectives();
    std::string names;
    {
      std::lock_guard<std::mutex> lock(settings_mu);
      std::shared_ptr<const extproc::ExchangeSettings> cur = settings.load();
      auto next = cur ? std::make_shared<extproc::ExchangeSettings>(*cur)
                      : std::make_shared<extproc::ExchangeSettings>();
      next->objectives = configured_objectives;
      for (const auto& [name, priority] : *cluster) {
        next->objectives[name] = priority;
        if (!names.empty()) names += ", ";
        names += name + "=" + std::to_string(priority);
      }
      settings.store(std::move(next));
    }
    Log("InferenceObjectives applied: " + std::to_string(cluster->size()) +
        (names.empty() ? std::string() : " (" + names + ")"));
  }

  Status Reload() {
    if (options.config_path.empty()) return Status::FailedPrecondition("no configuration file to reload");
    config::ConfigOr<config::RouterConfig> loaded =
        config::LoadRouterConfig(options.config_path, config::ConfigReader::kEpp);
    Status st = loaded.ok() ? Apply(std::move(*loaded.value)) : loaded.status();
    if (st.ok()) {
      Log("configuration reloaded from " + options.config_path);
    } else {
      pool->core().OnReloadFailed();
      Log("reload failed, keeping the running configuration: " + st.message());
    }
    return st;
  }

  Status Start() {
    config::RouterConfig cfg = std::move(initial);
    io = std::make_unique<http::IoPool>(1);
    pool = std::make_unique<pool::Pool>(io->context(0), [this](std::string_view l) { Log(l); });
    pool->set_objectives_listener([this] { OnClusterObjectives(); });
    // A scrape result may free capacity for streams waiting in the flow queue.
    pool->set_scrape_listener([this] {
      if (rpc::ExtProcServer* g = flow_server.load(std::memory_order_acquire)) g->PumpFlow();
    });
    io->Start();
    flow_on = cfg.flow.enabled;  // read at start, as serve does
    const flow::FlowOptions flow_options = cfg.flow.options;
    const double timeout_s = cfg.epp.stream_timeout_s;
    const uint64_t max_body = cfg.limits.max_body_bytes;
    // Precise prefix routing: prompts are tokenized on the io thread, through its own
    // client, while some endpoint has KV events configured (read at start, as serve does).
    tokenize::HttpTokenizerOptions to;
    to.timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(0.001, cfg.pool.kv_events.tokenize_timeout_s) * 1000.0));
    if (cfg.pool.kv_events.tokenizer) {
      to.default_host = cfg.pool.kv_events.tokenizer->host;
      to.default_port = cfg.pool.kv_events.tokenizer->port;
    }
    tokenize_client = std::make_unique<http::UpstreamClient>(io->context(0));
    tokenizer = std::make_unique<tokenize::HttpTokenizer>(io->context(0), *tokenize_client, to);
    const capture::CaptureOptions capture_options = cfg.capture;
    if (Status st = Apply(std::move(cfg)); !st.ok()) return st;
    if (capture_options.enabled()) {
      auto log = capture::CaptureLog::Open(capture_options, pool->Now());
      if (!log.ok()) return log.status();
      capture_log = std::move(log).value();
      Log("capturing routed requests to " + capture_options.path);
    }

    grpc = std::make_unique<rpc::ExtProcServer>(
        pool->core(), &stats, [p = pool.get()] { return p->Now(); }, [this] { return settings.load(); });
    rpc::ExtProcServerOptions go;
    go.host = options.host;
    go.port = options.grpc_port;
    go.health_port = options.health_port;
    go.stream_timeout_s = timeout_s;
    go.max_message_bytes = static_cast<std::size_t>(max_body) + (1u << 20);
    go.want_token_ids = [p = pool.get()] { return p->core().kv_events_active(); };
    go.capture = capture_log.get();
    go.tokenize = [this](extproc::TokenInput in, std::function<void(std::vector<uint32_t>)> done) {
      Tokenize(std::move(in), std::move(done));
    };
    if (flow_on) {
      // Flow admission is this front end's call into the gate, as in serve; the transport
      // holds streams in it.
      flow_gate = std::make_unique<flow::FlowGate>(flow_options, pool->core(),
                                                   [p = pool.get()] { return p->Now(); });
      go.flow_gate = flow_gate.get();
    }
    go.handshake_timeout_s = options.tls.handshake_timeout_s;
    if (options.tls.secure_serving) {
      if (Status st = SetUpTls(go.tls); !st.ok()) return st;
    }
    if (Status st = grpc->Start(go); !st.ok()) return st;
    if (cert_timer) cert_timer->Start();
    if (flow_on) flow_server.store(grpc.get(), std::memory_order_release);

    http::ServerOptions so;
    so.host = options.host;
    so.port = options.metrics_port;
    so.error_body = api::ErrorBodyFor;
    so.log = [this](std::string_view l) { Log(l); };
    metrics_server = std::make_unique<http::Server>(
        io->contexts(), so, [this](const std::shared_ptr<http::Exchange>& ex) { HandleHttp(ex); });
    if (Status st = metrics_server->Listen(); !st.ok()) {
      return Status::Unavailable("metrics: " + st.message());
    }
    if (options.handle_signals) {
      signals = std::make_unique<asio::signal_set>(io->context(0), SIGHUP, SIGINT, SIGTERM);
      WaitSignal();
    }
    return Status::Ok();
  }

  // The ext_proc port's TLS: the pair (given or made), and with reload the private copy
  // gRPC watches and the poll of --cert-path.
  Status SetUpTls(rpc::ExtProcTls& t) {
    const EppTlsOptions& o = options.tls;
    t.enabled = true;
    tls::KeyPair pair;
    if (o.cert_path.empty()) {
      Result<tls::KeyPair> made = tls::SelfSigned("kvroute-epp", SelfSignedSan());
      if (!made.ok()) return Status::Internal("tls: self-signed certificate: " + made.status().message());
      pair = std::move(made).value();
    } else {
      Result<tls::KeyPair> read = pool::ReadKeyPair(pool::RealFileSystem(), pool::CertFileIn(o.cert_path), pool::KeyFileIn(o.cert_path));
      if (!read.ok()) return Status::InvalidArgument("--cert-path: " + read.status().message());
      pair = std::move(read).value();
    }
    auto log = [this](std::string_view line) { Log(std::string(line)); };
    if (o.cert_path.empty() || !o.enable_cert_reload) {
      served = std::make_unique<certs::ServedCertificate>(pair, std::nullopt, pool::RealFileSystem(),
                                                          nullptr, log, o.cert_path);
      t.cert_pem = std::move(pair.cert_pem);
      t.key_pem = std::move(pair.key_pem);
      return Status::Ok();
    }
    std::error_code ec;
    std::string tmpl = (std::filesystem::temp_directory_path(ec) / "kvroute-epp-tls-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return Status::Unavailable("tls: cannot make a private directory " + tmpl + ": " + std::strerror(errno));
    }
    tls_dir = tmpl;
    t.watched_file = tls_dir + "/serving.pem";
    t.refresh_s = 1;
    if (Status st = WriteAtomically(t.watched_file, Bundle(pair)); !st.ok()) return Status::Unavailable("tls: " + st.message());
    served = std::make_unique<certs::ServedCertificate>(
        pair, pool::CertWatch::InDirectory(o.cert_path, pair), pool::RealFileSystem(),
        [this](const tls::KeyPair& p) { return WriteAtomically(tls_dir + "/serving.pem", Bundle(p)); },
        log, o.cert_path);
    const auto every = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(std::max(0.01, o.reload_interval_s)));
    cert_timer = std::make_unique<pool::PollTimer>(io->context(0), every, [this] { served->Poll(); });
    return Status::Ok();
  }

  static std::string Bundle(const tls::KeyPair& p) {
    std::string out = p.cert_pem;
    if (!out.empty() && out.back() != '\n') out += '\n';
    return out + p.key_pem;
  }

  void AppendTlsMetrics(std::string& out) {
    if (options.tls.secure_serving && served) served->AppendMetrics(out);
  }


  // On the io thread: the prompt's ids from a ready replica's POST /tokenize (or
  // pool.kv_events.tokenizer); empty ids on any failure (the pick is then approximate).
  void Tokenize(extproc::TokenInput in, std::function<void(std::vector<uint32_t>)> done) {
    asio::post(io->context(0), [this, in = std::move(in), done = std::move(done)]() mutable {
      tokenize::TokenizeInput ti;  // views of `in`, valid through the call
      ti.endpoint = in.endpoint;
      ti.model = in.model;
      ti.prompt = in.prompt;
      ti.body = in.body;
      ti.add_special_tokens = in.add_special_tokens;
      auto table = pool->core().table();
      // A replica that is not down, from published health (no scheduler lock).
      if (tokenizer->options().default_host.empty()) {
        if (const routing::Endpoint* ep = table->Find(pool->core().AnyUp(pool->Now()))) {
          ti.target_host = ep->spec.host;
          ti.target_port = ep->spec.port;
        }
      }
      tokenizer->Tokenize(ti, [done = std::move(done)](Result<tokenize::TokenIds> ids) {
        done(ids.ok() ? std::move(ids).value() : std::vector<uint32_t>());
      });
    });
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

  void HandleHttp(const std::shared_ptr<http::Exchange>& ex) {
    const http::Request& req = ex->request();
    std::string_view target(req.target().data(), req.target().size());
    std::string_view path = target.substr(0, target.find('?'));
    const bool get = req.method() == bhttp::verb::get || req.method() == bhttp::verb::head;
    if (path == "/metrics" || path == "/healthz" || path == "/readyz") {
      if (!get) {
        ex->Respond(405, api::ErrorBody(api::MakeError(405, "Method not allowed.")));
        return;
      }
    }
    if (path == "/metrics") {
      ex->Respond(200, MetricsText(), "text/plain; version=0.0.4; charset=utf-8");
    } else if (path == "/healthz") {
      ex->Respond(200, "ok\n", "text/plain");
    } else if (path == "/readyz") {
      const bool ready = Ready();
      std::string why;
      if (!ready) {
        why = pool ? pool->DiscoveryStatus() : std::string();
        why = (why.empty() ? std::string("no endpoint has fresh metrics") : why) + "\n";
      }
      ex->Respond(ready ? 200 : 503, ready ? std::string("ready\n") : why, "text/plain");
    } else {
      ex->Respond(404, api::ErrorBody(api::MakeError(404, "Not found: " + std::string(path))));
    }
  }

  std::string MetricsText() {
    std::string out;
    out.reserve(16384);
    if (!pool) return out;
    const double now = pool->Now();
    pool->core().AppendMetrics(out, now);
    pool->AppendMetrics(out);  // discovery series (pool.endpoints_file), when configured
    std::string name;
    {
      std::lock_guard<std::mutex> lock(settings_mu);
      name = pool_label;
    }
    stats.AppendMetrics(out, name, pool->core().Gauges(now));
    if (grpc) AppendServerMetrics(out, grpc->stats());
    AppendTlsMetrics(out);
    if (flow_gate) flow::AppendFlowMetrics(out, flow_gate->stats());
    if (tokenizer && pool->core().kv_events_active()) {
      tokenize::AppendTokenizerMetrics(out, tokenizer->stats().Read());
    }
    if (capture_log) capture_log->AppendMetrics(out);
    return out;
  }

  bool Ready() { return pool && pool->core().Ready(pool->Now()); }

  void Stop() {
    if (stopped || !io) return;
    stopped = true;
    flow_server.store(nullptr, std::memory_order_release);
    if (cert_timer) cert_timer->Stop();
    if (grpc) grpc->Stop();
    if (!tls_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(tls_dir, ec);
    }
    if (metrics_server) metrics_server->StopAccepting();
    http::CancelSignalWait(*io, signals.get());
    if (pool) pool->Stop();
    io->Stop();
  }

  void RequestShutdown() {
    std::lock_guard<std::mutex> lock(shutdown_mu);
    shutdown_requested = true;
    shutdown_cv.notify_all();
  }

  EppOptions options;
  config::RouterConfig initial;
  extproc::EppStats stats;
  Published<extproc::ExchangeSettings> settings;
  std::mutex settings_mu;                 // serialises the writers of `settings`
  pool::Priorities configured_objectives;  // epp.objectives of the running config; settings_mu
  std::string pool_label{kPoolName};         // inference_pool_* name label; settings_mu
  // Declared first among the owners of sockets and timers: destroyed last.
  std::unique_ptr<http::IoPool> io;
  std::unique_ptr<pool::Pool> pool;
  // Precise prefix routing's tokenizer and its connections (io thread).
  std::unique_ptr<http::UpstreamClient> tokenize_client;
  std::unique_ptr<tokenize::HttpTokenizer> tokenizer;
  // Flow control (flow.enabled at start): over pool's core; outlives grpc, which holds
  // streams in it.
  std::unique_ptr<flow::FlowGate> flow_gate;
  // capture: (read at start; null: off). Outlives grpc, whose exchanges hand it lines.
  std::unique_ptr<capture::CaptureLog> capture_log;
  std::unique_ptr<rpc::ExtProcServer> grpc;
  bool flow_on = false;  // flow.enabled at start (a reload cannot change it)
  // grpc once started with flow control: what the scrape listener pumps (io thread).
  std::atomic<rpc::ExtProcServer*> flow_server{nullptr};
  std::unique_ptr<http::Server> metrics_server;
  std::unique_ptr<asio::signal_set> signals;
  // TLS: the private directory gRPC watches (reload only), what is served now and the
  // poll of --cert-path that keeps it current.
  std::string tls_dir;
  std::unique_ptr<certs::ServedCertificate> served;
  std::unique_ptr<pool::PollTimer> cert_timer;
  bool stopped = false;
  std::mutex shutdown_mu;
  std::condition_variable shutdown_cv;
  bool shutdown_requested = false;
};

Epp::Epp(config::RouterConfig config, EppOptions options)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(options))) {}
Epp::~Epp() { Stop(); }
Status Epp::Start() { return impl_->Start(); }
void Epp::Stop() { impl_->Stop(); }
std::shared_ptr<const extproc::ExchangeSettings> Epp::settings() const { return impl_->settings.load(); }
uint16_t Epp::grpc_port() const { return impl_->grpc ? impl_->grpc->port() : 0; }
uint16_t Epp::health_port() const { return impl_->grpc ? impl_->grpc->health_port() : 0; }
uint16_t Epp::metrics_port() const { return impl_->metrics_server ? impl_->metrics_server->port() : 0; }
std::string Epp::serving_cert_pem() const {
  return impl_->served ? impl_->served->cert_pem() : std::string();
}
Status Epp::Reload() { return impl_->Reload(); }
Status Epp::Apply(config::RouterConfig config) { return impl_->Apply(std::move(config)); }
std::string Epp::MetricsText() { return impl_->MetricsText(); }
bool Epp::Ready() { return impl_->Ready(); }
routing::RoutingCore& Epp::core() { return impl_->pool->core(); }
const extproc::EppStats& Epp::stats() const { return impl_->stats; }
void Epp::WaitForShutdown() {
  std::unique_lock<std::mutex> lock(impl_->shutdown_mu);
  impl_->shutdown_cv.wait(lock, [this] { return impl_->shutdown_requested; });
}
void Epp::RequestShutdown() { impl_->RequestShutdown(); }

}  // namespace kvroute::epp
