// Every request's way in (Router::Impl::Handle: API key, method and path), the router's
// own answers (/healthz, /readyz, /metrics), and the way to a pick: the OpenAI endpoints
// parsed (latency-objective headers, model rewrite, tokenizing for precise prefix
// routing), vLLM's other paths forwarded as they came, then Route (flow control, pick).
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "adapters/http/server.h"
#include "adapters/pool/pool.h"
#include "adapters/tokenize/http_tokenizer.h"
#include "apps/serve/api_key_auth.h"
#include "apps/serve/router_internal.h"
#include "core/api/openai.h"
#include "core/api/pd_legs.h"
#include "core/flow/flow_gate.h"
#include "core/routing/routing_core.h"

namespace kvroute::router {

namespace bhttp = boost::beast::http;
using detail::ErrorJson;
using detail::FrontSettings;
using detail::HeaderValue;
using detail::kRoutingHeader;
using detail::kUnauthorizedBody;
using detail::NeedsKey;
using detail::ObjectiveOf;
using detail::Path;

namespace {

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

}  // namespace

bool Router::Impl::Authorized(http::Exchange& ex, std::string_view path) {
  if (!auth || !NeedsKey(path, ex.request().method())) return true;
  if (auth->Check(HeaderValue(ex.request(), "authorization"), ex.worker()) == AuthVerdict::kAccepted) {
    return true;
  }
  ex.Respond(401, std::string(kUnauthorizedBody), "application/json", {{"www-authenticate", "Bearer"}});
  return false;
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
  if (capture_log) parsed.request->received_s = Now();
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

void Router::Impl::Forward(std::shared_ptr<http::Exchange> ex) {
  auto fs = settings.load();
  api::RoutingFields f = api::ScanRoutingFields(ex->request().body());
  api::ParsedRequest p;
  p.endpoint = api::Endpoint::kOther;
  p.model = std::move(f.model);
  p.prompt_text = std::move(f.prompt_text);
  p.stream = false;  // nothing for the latency model to learn from
  if (capture_log) p.received_s = Now();
  Route(std::move(ex), std::move(fs), p);
}

}  // namespace kvroute::router
