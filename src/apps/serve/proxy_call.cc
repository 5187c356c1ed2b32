// One proxied request (ProxyCall): tries the ranked endpoints in order, relays the
// response as it arrives (streamed, or buffered up to kMaxBufferedResponse), retries
// what the core allows, sends the prefill leg of a disaggregated pick first; and
// Router::Impl::StartPicked, which starts one for a picked request.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "adapters/http/client.h"
#include "adapters/http/relay.h"
#include "adapters/http/server.h"
#include "apps/pd/pd_counters.h"
#include "apps/pd/request_id.h"
#include "apps/serve/router_internal.h"
#include "core/api/json_scan.h"
#include "core/api/openai.h"
#include "core/api/pd_legs.h"
#include "core/capture/capture.h"
#include "core/routing/routing_core.h"

namespace kvroute::router {

namespace bhttp = boost::beast::http;
using api::BuildDecodeBody;
using api::BuildPrefillBody;
using api::PrefillAnswer;
using api::ReadPrefillAnswer;
using api::RewriteCachedTokens;
using detail::CollectForwardHeaders;
using detail::CollectResponseHeaders;
using detail::ErrorJson;
using detail::FrontSettings;
using detail::HeaderValue;
using detail::kAttemptsHeader;
using detail::kEndpointHeader;
using detail::kMaxBufferedResponse;
using detail::kPrefillHeader;
using detail::RespondNoEndpoint;
using pd::PdFallback;
using pd::PdOutcome;

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
  // capture: this request's line, filled as it goes; null when it is not captured.
  std::unique_ptr<capture::Entry> capture;
  api::ResponseTail capture_tail;  // a captured stream's last bytes (its usage)
  api::Usage capture_usage;        // a captured buffered answer's usage

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
    if (capture) capture_tail.Clear();
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
      if (capture) capture->ttft_s = router->Now() - capture->arrival_s;
    }
    if (streaming) {
      if (capture) capture_tail.Feed(d);
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
        if (capture) capture_usage = api::FindUsage(buffered);
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
    if (capture) SubmitCapture(code);
    router->PumpFlow(endpoint_id());  // its slot is free: a waiting request may go
  }

  void SubmitCapture(int code) {
    capture::Entry& e = *capture;
    const api::Usage u = streaming ? api::FindUsage(capture_tail.view()) : capture_usage;
    e.status = code;
    e.endpoint = endpoint().spec.name;
    e.prompt_tokens = u.prompt_tokens;
    e.cached_tokens = u.cached_tokens;
    e.output_tokens = u.completion_tokens >= 0              ? u.completion_tokens
                      : streaming && chunks.chunks() > 0 ? chunks.chunks()
                                                          : -1;
    router->capture_log->Submit(std::move(e));
    capture.reset();
  }
};

}  // namespace

// Forwards a picked request (at arrival, or a waiting one at dispatch time) on its
// connection's thread.
void Router::Impl::StartPicked(std::shared_ptr<http::Exchange> ex,
                               std::shared_ptr<const FrontSettings> fs, routing::PickResult pick,
                               api::ParsedRequest* parsed) {
  if (pick.ok() && pick.disaggregated() && (!parsed || ex->client_gone())) {
    core().OnPrefillDone(pick.prefill, pick.prefill_tokens, pick.handle);  // no leg will be sent
    pick.pd = routing::PdDecision::kNoPrefill;
  }
  // capture: a line for every routed request the sample takes, answered or not.
  std::unique_ptr<capture::Entry> entry;
  if (capture_log && parsed && capture_log->Sample()) {
    std::string_view session;
    if (fs->sessions) session = HeaderValue(ex->request(), fs->session_header);
    const std::string_view target(ex->request().target().data(), ex->request().target().size());
    entry = std::make_unique<capture::Entry>(
        capture::StartEntry(*capture_log, *parsed, detail::Path(target), session, parsed->received_s));
  }
  if (!pick.ok()) {
    core().OnFinished(pick.handle, routing::RoutingCore::kNoEndpoint, 503, Now());
    RespondNoEndpoint(*ex, "No usable endpoint: " + pick.status.message() + ".");
    if (entry) {
      entry->status = 503;
      capture_log->Submit(std::move(*entry));
    }
    return;
  }
  if (ex->client_gone()) {  // left between a flow dispatch and this
    core().OnFinished(pick.handle, pick.ranked[0], 499, Now());
    PumpFlow(pick.ranked[0]);
    if (entry) {
      entry->status = 499;
      capture_log->Submit(std::move(*entry));
    }
    return;
  }
  auto pc = std::make_shared<ProxyCall>();
  pc->capture = std::move(entry);
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

}  // namespace kvroute::router
