#include "apps/sidecar/sidecar.h"

#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>

#include <array>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "core/api/openai.h"
#include "core/api/pd_legs.h"
#include "core/routing/lifecycle.h"
#include "core/metrics/prom_writer.h"
#include "adapters/http/client.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/relay.h"
#include "adapters/http/server.h"
#include "apps/pd/pd_counters.h"
#include "apps/pd/request_id.h"
#include "core/common/enum_names.h"

namespace kvroute::sidecar {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using pd::PdFallback;
using pd::PdOutcome;

namespace {

constexpr std::string_view kPrefillerHeader = "x-prefiller-host-port";
// Larger answers are not buffered: a prefill answer (one token) or an error body never
// comes near it.
constexpr std::size_t kMaxBuffered = 4u << 20;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) { return boost::beast::iequals(a, b); }

// Parses an address literal into `c` (bits set to the full length). False if not one.
bool ParseAddress(std::string_view text, Cidr& c) {
  // Digits, hex letters, dots and colons only: the system parser stops at a NUL and would
  // take "10.0.0.2\0anything" for 10.0.0.2 (a fuzz finding); no zone ids.
  if (text.empty() || text.size() > 45) return false;
  for (char ch : text) {
    const bool ok = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F') ||
                    ch == '.' || ch == ':';
    if (!ok) return false;
  }
  boost::system::error_code ec;
  asio::ip::address a = asio::ip::make_address(std::string(text), ec);
  if (ec) return false;
  if (a.is_v4()) {
    auto b = a.to_v4().to_bytes();
    std::copy(b.begin(), b.end(), c.bytes.begin());
    c.v4 = true;
    c.bits = 32;
  } else {
    auto b = a.to_v6().to_bytes();
    std::copy(b.begin(), b.end(), c.bytes.begin());
    c.v4 = false;
    c.bits = 128;
  }
  return true;
}

bool Contains(const Cidr& range, const Cidr& addr) {
  if (range.v4 != addr.v4) return false;
  int bits = range.bits;
  for (std::size_t i = 0; bits > 0; ++i, bits -= 8) {
    const uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
    if ((range.bytes[i] & mask) != (addr.bytes[i] & mask)) return false;
  }
  return true;
}

std::string ErrorJson(int status, std::string message) {
  return api::ErrorBody(api::MakeError(status, std::move(message)));
}

// Hop-by-hop fields (RFC 9110 section 7.6.1) and those the HTTP layers write themselves.
bool IsHopOrFraming(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
      "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length", "content-type"};
  for (std::string_view n : kNames) {
    if (EqualsIgnoreCase(name, n)) return true;
  }
  return false;
}

// True when the Connection field of `fields` lists `name`.
template <typename FieldsT>
bool NamedByConnection(const FieldsT& fields, std::string_view name) {
  for (auto it = fields.find(bhttp::field::connection); it != fields.end() && it->name() == bhttp::field::connection;
       ++it) {
    std::string_view v(it->value().data(), it->value().size());
    while (!v.empty()) {
      std::size_t comma = v.find(',');
      if (EqualsIgnoreCase(Trim(v.substr(0, comma)), name)) return true;
      if (comma == std::string_view::npos) break;
      v.remove_prefix(comma + 1);
    }
  }
  return false;
}

// The end-to-end fields of `fields`, without `skip` (lower case).
template <typename FieldsT>
void EndToEnd(const FieldsT& fields, std::string_view skip, std::vector<std::pair<std::string, std::string>>& out) {
  for (const auto& f : fields) {
    std::string_view name(f.name_string().data(), f.name_string().size());
    if (IsHopOrFraming(name) || EqualsIgnoreCase(name, skip) || NamedByConnection(fields, name)) continue;
    out.emplace_back(std::string(name), std::string(f.value()));
  }
}

}  // namespace

std::optional<std::vector<Cidr>> ParseCidrList(std::string_view text, std::string* error) {
  std::vector<Cidr> out;
  while (true) {
    std::size_t comma = text.find(',');
    std::string_view entry = Trim(text.substr(0, comma));
    if (!entry.empty()) {
      std::size_t slash = entry.find('/');
      Cidr c;
      if (!ParseAddress(entry.substr(0, slash), c)) {
        if (error) *error = "'" + std::string(entry) + "' is not an IP address or range";
        return std::nullopt;
      }
      if (slash != std::string_view::npos) {
        std::string_view len = entry.substr(slash + 1);
        int bits = -1;
        auto [p, ec] = std::from_chars(len.data(), len.data() + len.size(), bits);
        if (ec != std::errc() || p != len.data() + len.size() || bits < 0 || bits > c.bits) {
          if (error) *error = "'" + std::string(entry) + "': prefix length must be 0-" + std::to_string(c.bits);
          return std::nullopt;
        }
        c.bits = bits;
      }
      out.push_back(c);
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

std::string_view PrefillerRefusalName(PrefillerRefusal r) {
  static constexpr std::array<std::string_view, kPrefillerRefusals> kNames = {"", "invalid",
                                                                              "not_allowed"};
  return NameAt(kNames, r, "");
}

PrefillerRefusal ParsePrefiller(std::string_view value, const std::vector<Cidr>& allow, Prefiller* out) {
  std::string_view v = Trim(value.substr(0, value.find(',')));
  std::string_view host, port;
  if (!v.empty() && v.front() == '[') {
    std::size_t close = v.find(']');
    if (close == std::string_view::npos || close + 1 >= v.size() || v[close + 1] != ':') {
      return PrefillerRefusal::kInvalid;
    }
    host = v.substr(1, close - 1);
    port = v.substr(close + 2);
  } else {
    std::size_t colon = v.rfind(':');
    if (colon == std::string_view::npos || v.find(':') != colon) return PrefillerRefusal::kInvalid;
    host = v.substr(0, colon);
    port = v.substr(colon + 1);
  }
  unsigned p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p == 0 || p > 65535) {
    return PrefillerRefusal::kInvalid;
  }
  Cidr addr;
  if (host.empty() || !ParseAddress(host, addr)) return PrefillerRefusal::kInvalid;
  if (!allow.empty()) {
    bool ok = false;
    for (const Cidr& range : allow) ok = ok || Contains(range, addr);
    if (!ok) return PrefillerRefusal::kNotAllowed;
  }
  out->host = std::string(host);
  out->port = static_cast<uint16_t>(p);
  return PrefillerRefusal::kNone;
}

// ---- the server ----

enum class Mode : uint8_t { kPd, kLocal, kPassthrough };
inline constexpr std::size_t kModes = 3;
inline constexpr std::string_view kModeNames[kModes] = {"pd", "local", "passthrough"};

// What a request in flight reads and counts: options and counters, no lock.
struct Shared {
  SidecarOptions options;
  pd::PdCounters pd;
  std::atomic<uint64_t> requests[kModes]{};
  std::atomic<uint64_t> refused[kPrefillerRefusals]{};
};

struct Sidecar::Impl : Shared {
  explicit Impl(SidecarOptions o) { options = std::move(o); }

  void Handle(std::shared_ptr<http::Exchange> ex);
  void Log(std::string_view line) {
    if (options.log) std::fprintf(stderr, "kvroute sidecar: %.*s\n", static_cast<int>(line.size()), line.data());
  }
  std::string MetricsText() const;

  std::unique_ptr<http::IoPool> io;
  std::vector<std::unique_ptr<http::UpstreamClient>> clients;  // one per worker
  std::unique_ptr<http::Server> server;
  std::unique_ptr<asio::signal_set> signals;
  bool stopped = false;
  std::mutex mu;
  std::condition_variable cv;
  bool shutdown = false;
};

namespace {

// One client request: an optional prefill leg to the named pod, then the request to the
// local engine, whose answer is relayed. Lives as long as its upstream call or its
// exchange needs it; runs on the exchange's worker.
struct Call : std::enable_shared_from_this<Call> {
  Shared* sc = nullptr;
  std::shared_ptr<http::Exchange> ex;
  http::UpstreamClient* client = nullptr;
  http::UpstreamCall call;
  std::vector<std::pair<std::string, std::string>> headers;  // forwarded to both legs
  std::string content_type;                                  // the client's
  // P/D: the prefill pod, its leg's body and answer, and what the decode leg sends.
  bool pd = false;
  Prefiller prefiller;
  std::string prefill_body;
  int prefill_status = 0;
  bool prefill_too_big = false;
  std::string prefill_answer;
  int prefill_retries = 0;
  bool remote = false;  // the engine's leg carries prefill's kv_transfer_params
  std::string decode_body;
  int64_t prefill_cached = -1;
  bool decode_retried = false;
  // The engine's answer.
  int status = 0;
  bool streaming = false;
  bool buffer_error = false;  // a 5xx of a remote decode leg: held, maybe sent again
  bool first_byte = false;
  std::string content_type_out;
  http::Fields head_fields;
  std::string buffered;
  bool too_big = false;

  ~Call() {
    if (ex) ex->OnClientGone({});
  }

  const SidecarOptions& opt() const { return sc->options; }
  http::UpstreamRequest Request(std::string_view body) const {
    http::UpstreamRequest r;
    r.method = ex->request().method();
    r.target = std::string_view(ex->request().target().data(), ex->request().target().size());
    r.body = body;
    r.content_type = content_type.empty() ? std::string_view("application/json") : std::string_view(content_type);
    r.headers = &headers;
    r.connect_timeout = opt().connect_timeout;
    r.first_byte_timeout = opt().first_byte_timeout;
    r.idle_timeout = opt().idle_timeout;
    return r;
  }

  // ---- prefill leg ----

  void SendPrefill() {
    prefill_status = 0;
    prefill_too_big = false;
    prefill_answer.clear();
    http::UpstreamCallbacks cb;
    cb.on_head = [this](const http::ResponseHead& h) { prefill_status = h.status; };
    cb.on_data = [this](std::string_view d) {
      if (prefill_answer.size() + d.size() > kMaxBuffered) {
        prefill_too_big = true;
      } else {
        prefill_answer.append(d);
      }
    };
    cb.on_done = [this](http::UpstreamResult&& r) { OnPrefillDone(std::move(r)); };
    cb.owner = shared_from_this();
    call = client->Start(prefiller.host, prefiller.port, Request(prefill_body), std::move(cb));
  }

  void OnPrefillDone(http::UpstreamResult&& r) {
    call = {};
    if (r.error == http::UpstreamError::kCancelled) return sc->pd.Count(PdOutcome::kCancelled, false);
    if (r.ok() && prefill_status >= 200 && prefill_status < 300 && !prefill_too_big) {
      api::PrefillAnswer a = api::ReadPrefillAnswer(prefill_answer);
      std::optional<std::string> body;
      if (!a.kv_raw.empty()) body = api::BuildDecodeBody(ex->request().body(), a.kv_raw);
      if (body) {
        sc->pd.Count(PdOutcome::kOk, false);
        remote = true;
        decode_body = std::move(*body);
        prefill_cached = a.cached_tokens;
      } else {
        sc->pd.Count(PdOutcome::kNoParams, false);
        sc->pd.Count(PdFallback::kLocalPrefill);
      }
      prefill_answer = {};
      return SendEngine();
    }
    sc->pd.Count(PdOutcome::kError, false);
    routing::SidecarPrefillFailure f;
    f.transport_failed = !r.ok();
    f.status = prefill_status;
    f.retries_so_far = prefill_retries;
    f.max_retries = opt().prefill_max_retries;
    f.client_gone = ex->client_gone();
    if (routing::DecideSidecarPrefill(f) == routing::SidecarPrefillDecision::kRetrySame) {
      ++prefill_retries;
      sc->pd.Count(PdFallback::kPrefillRetry);
      return SendPrefill();
    }
    sc->pd.Count(PdFallback::kLocalPrefill);
    prefill_answer = {};
    SendEngine();
  }

  // ---- the local engine ----

  void SendEngine() {
    status = 0;
    streaming = buffer_error = first_byte = too_big = false;
    buffered.clear();
    head_fields.clear();
    http::UpstreamCallbacks cb;
    cb.on_head = [this](const http::ResponseHead& h) { OnHead(h); };
    cb.on_data = [this](std::string_view d) { OnData(d); };
    cb.on_done = [this](http::UpstreamResult&& r) { OnDone(std::move(r)); };
    cb.owner = shared_from_this();
    std::string_view body = remote ? std::string_view(decode_body) : std::string_view(ex->request().body());
    call = client->Start(opt().engine_host, opt().engine_port, Request(body), std::move(cb));
  }

  bool Rewrites() const { return remote && prefill_cached >= 0; }

  void OnHead(const http::ResponseHead& h) {
    status = h.status;
    content_type_out.assign(h.content_type);
    if (h.fields) {
      std::vector<std::pair<std::string, std::string>> f;
      EndToEnd(*h.fields, {}, f);
      head_fields = std::move(f);
    }
    if (remote && status >= 500) {
      buffer_error = true;  // nothing reaches the client until it is known whether a retry answers
      return;
    }
    const bool sse = content_type_out.rfind("text/event-stream", 0) == 0;
    streaming = sse || !h.content_length || *h.content_length > kMaxBuffered;
    if (streaming) ex->BeginStream(status, content_type_out, head_fields);
  }

  void OnData(std::string_view d) {
    first_byte = true;
    if (!streaming) {
      if (buffered.size() + d.size() > kMaxBuffered) {
        too_big = true;
      } else {
        buffered.append(d);
      }
      return;
    }
    std::string chunk(d);
    if (Rewrites()) api::RewriteCachedTokens(chunk, prefill_cached);
    http::RelayChunk(*ex, call, std::move(chunk), *this);
  }

  void CountDecode(PdOutcome o) {
    if (pd && remote) sc->pd.Count(o, true);
  }

  void OnDone(http::UpstreamResult&& r) {
    call = {};
    if (r.error == http::UpstreamError::kCancelled) return CountDecode(PdOutcome::kCancelled);
    // A remote decode leg that failed before the client saw a byte (a 5xx held back, or a
    // transport failure before the head): once more as an ordinary request.
    const bool failed_early = (r.ok() && buffer_error) || (!r.ok() && !r.head_received);
    if (remote && failed_early && !decode_retried && !ex->client_gone()) {
      CountDecode(PdOutcome::kError);
      sc->pd.Count(PdFallback::kDecodeRetry);
      decode_retried = true;
      remote = false;
      return SendEngine();
    }
    CountDecode(r.ok() && !buffer_error ? PdOutcome::kOk : PdOutcome::kError);
    if (r.ok()) {
      if (streaming) {
        ex->EndStream();
      } else if (too_big) {
        ex->Respond(502, ErrorJson(502, "the engine's answer exceeded the sidecar's buffer"));
      } else {
        if (Rewrites() && status == 200) api::RewriteCachedTokens(buffered, prefill_cached);
        ex->Respond(status, std::move(buffered), content_type_out, head_fields);
      }
      return;
    }
    const bool timeout = r.error == http::UpstreamError::kFirstByteTimeout ||
                         r.error == http::UpstreamError::kIdleTimeout;
    const int code = timeout ? 504 : 502;
    std::string message = std::string("engine ") + (timeout ? "timed out: " : "failed: ") +
                          std::string(http::UpstreamErrorName(r.error));
    if (streaming) {
      // The client has a 200 and part of the stream: end it with an SSE error frame.
      std::string frame = "\n\ndata: " + ErrorJson(code, std::move(message)) + "\n\ndata: [DONE]\n\n";
      ex->SendChunk(std::move(frame));
      ex->EndStream();
      return;
    }
    ex->Respond(code, ErrorJson(code, std::move(message)));
  }
};

}  // namespace

std::string Sidecar::Impl::MetricsText() const {
  std::string out;
  auto load = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  std::array<metrics::LabeledValue, kModes> by_path;
  for (std::size_t i = 0; i < kModes; ++i) by_path[i] = {kModeNames[i], load(requests[i])};
  metrics::AppendCounterFamily(out, "kvroute_sidecar_requests_total",
                               "Requests the sidecar took, by path: pd (named a prefill pod: two "
                               "legs), local (generation the local engine served alone), "
                               "passthrough (any other path or method, sent to the engine "
                               "unchanged).",
                               "path", by_path);
  std::array<metrics::LabeledValue, kPrefillerRefusals - 1> by_reason;  // kNone is no refusal
  for (std::size_t i = 1; i < kPrefillerRefusals; ++i) {
    by_reason[i - 1] = {PrefillerRefusalName(static_cast<PrefillerRefusal>(i)), load(refused[i])};
  }
  metrics::AppendCounterFamily(out, "kvroute_sidecar_prefiller_refused_total",
                               "x-prefiller-host-port values not followed, by reason: invalid "
                               "(not an IP address and port), not_allowed (outside "
                               "--prefiller-allow); the local engine prefilled those requests.",
                               "reason", by_reason);
  pd::AppendPdMetrics(out, pd);
  return out;
}

void Sidecar::Impl::Handle(std::shared_ptr<http::Exchange> ex) {
  const http::Request& req = ex->request();
  std::string_view target(req.target().data(), req.target().size());
  std::string_view path = target.substr(0, target.find('?'));
  const bhttp::verb method = req.method();
  if (path == "/sidecar/metrics" || path == "/sidecar/healthz") {
    if (method != bhttp::verb::get) {
      ex->Respond(405, ErrorJson(405, "Method not allowed."));
      return;
    }
    if (path == "/sidecar/healthz") {
      ex->Respond(200, "ok\n", "text/plain");
    } else {
      ex->Respond(200, MetricsText(), "text/plain; version=0.0.4; charset=utf-8");
    }
    return;
  }
  if (method == bhttp::verb::head || method == bhttp::verb::connect || method == bhttp::verb::unknown) {
    ex->Respond(405, ErrorJson(405, "Method not allowed."));
    return;
  }
  auto c = std::make_shared<Call>();
  c->sc = this;
  c->client = clients[ex->worker()].get();
  EndToEnd(req, kPrefillerHeader, c->headers);
  if (auto it = req.find(bhttp::field::content_type); it != req.end()) c->content_type = std::string(it->value());
  const bool generation =
      method == bhttp::verb::post && (path == "/v1/completions" || path == "/v1/chat/completions");
  Mode mode = generation ? Mode::kLocal : Mode::kPassthrough;
  if (auto it = req.find(boost::beast::string_view(kPrefillerHeader.data(), kPrefillerHeader.size()));
      generation && it != req.end()) {
    PrefillerRefusal why = ParsePrefiller(std::string_view(it->value().data(), it->value().size()),
                                          options.prefiller_allow, &c->prefiller);
    std::optional<std::string> body;
    if (why == PrefillerRefusal::kNone) body = api::BuildPrefillBody(req.body());
    if (why != PrefillerRefusal::kNone) {
      refused[static_cast<std::size_t>(why)].fetch_add(1, std::memory_order_relaxed);
    } else if (body) {  // not a JSON object: the engine answers it (400) alone
      mode = Mode::kPd;
      c->pd = true;
      c->prefill_body = std::move(*body);
    }
  }
  requests[static_cast<std::size_t>(mode)].fetch_add(1, std::memory_order_relaxed);
  c->ex = std::move(ex);
  Call* raw = c.get();
  c->ex->OnClientGone([raw] { raw->call.Cancel(); });
  if (!c->pd) return c->SendEngine();
  bool has_id = false;
  for (const auto& [name, value] : c->headers) has_id = has_id || EqualsIgnoreCase(name, "x-request-id");
  if (!has_id) c->headers.emplace_back("x-request-id", pd::NewRequestId());
  c->SendPrefill();
}

Sidecar::Sidecar(SidecarOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Sidecar::~Sidecar() { Stop(); }

Status Sidecar::Start() {
  Impl& s = *impl_;
  const int threads = s.options.threads > 0 ? s.options.threads
                                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  s.io = std::make_unique<http::IoPool>(threads);
  for (int i = 0; i < threads; ++i) s.clients.push_back(std::make_unique<http::UpstreamClient>(s.io->context(i)));
  http::ServerOptions so;
  so.host = s.options.listen_host;
  so.port = s.options.listen_port;
  so.max_body_bytes = s.options.max_body_bytes;
  so.max_header_bytes = s.options.max_header_bytes;
  so.read_timeout = s.options.request_read_timeout;
  so.error_body = [](int status, std::string_view message) { return ErrorJson(status, std::string(message)); };
  so.log = [&s](std::string_view line) { s.Log(line); };
  s.server = std::make_unique<http::Server>(s.io->contexts(), so,
                                            [&s](std::shared_ptr<http::Exchange> ex) { s.Handle(std::move(ex)); });
  s.io->Start();
  if (Status st = s.server->Listen(); !st.ok()) return st;
  if (s.options.handle_signals) {
    s.signals = std::make_unique<asio::signal_set>(s.io->context(0), SIGINT, SIGTERM);
    s.signals->async_wait([&s](boost::system::error_code ec, int) {
      if (ec) return;
      std::lock_guard<std::mutex> lock(s.mu);
      s.shutdown = true;
      s.cv.notify_all();
    });
  }
  return Status::Ok();
}

void Sidecar::Stop() {
  Impl& s = *impl_;
  if (s.stopped || !s.io) return;
  s.stopped = true;
  if (s.server) s.server->StopAccepting();
  http::CancelSignalWait(*s.io, s.signals.get());
  s.io->Stop();
}

uint16_t Sidecar::port() const { return impl_->server ? impl_->server->port() : 0; }

void Sidecar::WaitForShutdown() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->shutdown; });
}

}  // namespace kvroute::sidecar
