#include "apps/epp/extproc/exchange.h"

#include "core/api/json_scan.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>

#include "core/api/openai.h"
#include "core/api/pd_legs.h"
#include "core/sched/types.h"

namespace kvroute::extproc {

namespace core_pb = ::envoy::config::core::v3;
namespace mode_pb = ::envoy::extensions::filters::http::ext_proc::v3;

namespace {

// Enough of a response body's end to hold its final usage object.

BodyMode FromProto(mode_pb::ProcessingMode::BodySendMode m) {
  switch (m) {
    case mode_pb::ProcessingMode::STREAMED: return BodyMode::kStreamed;
    case mode_pb::ProcessingMode::BUFFERED: return BodyMode::kBuffered;
    case mode_pb::ProcessingMode::BUFFERED_PARTIAL: return BodyMode::kBufferedPartial;
    case mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED: return BodyMode::kFullDuplexStreamed;
    default: return BodyMode::kNone;
  }
}

bool Is(std::string_view key, std::string_view want) {
  if (key.size() != want.size()) return false;
  for (std::size_t i = 0; i < key.size(); ++i) {
    char c = key[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != want[i]) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// filter_metadata["envoy.lb"].fields[key], or nullptr.
const google::protobuf::Value* LbField(const pb::ProcessingRequest& r, std::string_view key,
                                       std::string_view ns_name = kLbNamespace) {
  if (!r.has_metadata_context()) return nullptr;
  const auto& fm = r.metadata_context().filter_metadata();
  auto ns = fm.find(std::string(ns_name));
  if (ns == fm.end()) return nullptr;
  auto it = ns->second.fields().find(std::string(key));
  return it == ns->second.fields().end() ? nullptr : &it->second;
}

// The top-level "model" of a JSON body, for paths kvroute does not parse further.
std::string ModelField(std::string_view body) {
  thread_local simdjson::ondemand::parser parser;
  simdjson::padded_string padded(body);
  simdjson::ondemand::document doc;
  if (parser.iterate(padded).get(doc) != simdjson::SUCCESS) return {};
  simdjson::ondemand::object obj;
  if (doc.get_object().get(obj) != simdjson::SUCCESS) return {};
  std::string_view model;
  if (obj.find_field_unordered("model").get_string().get(model) != simdjson::SUCCESS) return {};
  return std::string(model);
}

core_pb::HeaderValueOption* SetHeader(pb::HeaderMutation* m, std::string_view key,
                                      std::string_view value) {
  core_pb::HeaderValueOption* o = m->add_set_headers();
  o->mutable_header()->set_key(std::string(key));
  o->mutable_header()->set_raw_value(std::string(value));
  o->set_append_action(core_pb::HeaderValueOption::OVERWRITE_IF_EXISTS_OR_ADD);
  return o;
}

// Sets `response` (a request's or a response's BodyResponse) to stream `body` back to
// Envoy, as a full-duplex streamed answer does.
void StreamBody(pb::BodyResponse* response, std::string_view body, bool end_of_stream) {
  auto* sr = response->mutable_response()->mutable_body_mutation()->mutable_streamed_response();
  sr->set_body(body.data(), body.size());
  sr->set_end_of_stream(end_of_stream);
}

// The answer, in `response` (already set), to body chunk `b` passed through unchanged: in
// full-duplex streamed mode the chunk goes back as it came; otherwise nothing is said.
void PassBody(BodyMode mode, const pb::HttpBody& b, pb::BodyResponse* response) {
  if (mode == BodyMode::kFullDuplexStreamed) StreamBody(response, b.body(), b.end_of_stream());
}

void SetDestinationMetadata(pb::ProcessingResponse& r, const std::string& destination) {
  auto& lb = (*r.mutable_dynamic_metadata()->mutable_fields())[std::string(kLbNamespace)];
  (*lb.mutable_struct_value()->mutable_fields())[std::string(kDestinationHeader)].set_string_value(
      destination);
}

}  // namespace

std::string_view HeaderValueOf(const core_pb::HeaderValue& h) {
  return h.raw_value().empty() ? std::string_view(h.value()) : std::string_view(h.raw_value());
}

Exchange::Exchange(ExchangeEnv env, std::shared_ptr<const ExchangeSettings> settings)
    : env_(std::move(env)), settings_(std::move(settings)), mode_(settings_->body_mode) {}

Exchange::~Exchange() { Close(now_s_, true); }

void Exchange::Emit(pb::ProcessingResponse&& r, std::vector<pb::ProcessingResponse>& out) {
  if (observability_) return;
  out.push_back(std::move(r));
}

void Exchange::OnRequest(const pb::ProcessingRequest& request, double now_s,
                         std::vector<pb::ProcessingResponse>& out) {
  now_s_ = now_s;
  if (immediate_sent_ || closed_) return;
  if (request.observability_mode()) observability_ = true;
  if (phase_ == Phase::kHeld) return;  // Envoy waits for the held answer; nothing to add
  if (request.has_protocol_config() && !protocol_seen_) {
    protocol_seen_ = true;
    mode_ = FromProto(request.protocol_config().request_body_mode());
    response_mode_ = FromProto(request.protocol_config().response_body_mode());
    response_body_sent_ = response_mode_ != BodyMode::kNone;
  }
  if (phase_ == Phase::kHeaders || phase_ == Phase::kBody) ReadSubset(request);
  if (const google::protobuf::Value* served = LbField(request, kServedKey);
      served != nullptr && served->has_string_value() && phase_ == Phase::kPicked &&
      pick_.handle != sched::kNoHandle && !finished_) {
    std::string_view addr = Trim(served->string_value());
    for (uint32_t k = 0; k < pick_.table->by_id.size(); ++k) {
      const routing::Endpoint* ep = pick_.table->Find(k);
      if (ep != nullptr && ep->spec.address == addr && k != served_) {
        served_ = k;
        env_.core->OnDispatched(pick_.handle, k, now_s_);
      }
    }
  }
  switch (request.request_case()) {
    case pb::ProcessingRequest::kRequestHeaders:
      return OnRequestHeaders(request.request_headers(), out);
    case pb::ProcessingRequest::kRequestBody:
      return OnRequestBody(request.request_body(), out);
    case pb::ProcessingRequest::kRequestTrailers:
      return OnRequestTrailers(out);
    case pb::ProcessingRequest::kResponseHeaders:
      return OnResponseHeaders(request.response_headers(), out);
    case pb::ProcessingRequest::kResponseBody:
      return OnResponseBody(request.response_body(), out);
    case pb::ProcessingRequest::kResponseTrailers: {
      if (phase_ == Phase::kPicked && !finished_) FinishRequest(status_ != 0 ? status_ : 200);
      pb::ProcessingResponse r;
      r.mutable_response_trailers();
      return Emit(std::move(r), out);
    }
    default:
      return;  // no request in the oneof (or one from a newer Envoy): nothing to answer
  }
}

void Exchange::ReadSubset(const pb::ProcessingRequest& request) {
  // The hint's namespace: "envoy.lb" (the protocol proposal as first written) or
  // "envoy.lb.subset_hint" (the current Gateway API Inference Extension spec); either.
  const google::protobuf::Value* v = LbField(request, kSubsetKey);
  if (v == nullptr) v = LbField(request, kSubsetKey, kSubsetHintNamespace);
  if (v == nullptr) return;
  subset_seen_ = true;
  subset_.clear();
  auto add = [&](std::string_view list) {
    // A string may itself hold several comma-separated addresses.
    while (!list.empty()) {
      std::size_t comma = list.find(',');
      std::string_view item = Trim(list.substr(0, comma));
      if (!item.empty()) subset_.emplace_back(item);
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
  };
  if (v->has_list_value()) {
    for (const google::protobuf::Value& item : v->list_value().values()) {
      if (item.has_string_value()) add(item.string_value());
    }
  } else if (v->has_string_value()) {
    add(v->string_value());
  }
}

void Exchange::OnRequestHeaders(const pb::HttpHeaders& h, std::vector<pb::ProcessingResponse>& out) {
  if (started_s_ < 0) started_s_ = now_s_;
  if (phase_ != Phase::kHeaders) {
    pb::ProcessingResponse r;
    r.mutable_request_headers();
    return Emit(std::move(r), out);
  }
  for (const core_pb::HeaderValue& hv : h.headers().headers()) {
    std::string_view key = hv.key();
    if (Is(key, ":path")) {
      path_ = HeaderValueOf(hv);
    } else if (Is(key, "content-type")) {
      content_type_ = HeaderValueOf(hv);
    } else if (Is(key, "x-request-id")) {
      request_id_ = HeaderValueOf(hv);
    } else if (Is(key, "x-gateway-inference-objective") || Is(key, "x-llm-d-inference-objective")) {
      objective_ = Trim(HeaderValueOf(hv));
    } else if (Is(key, "x-gateway-model-name")) {
      model_header_ = Trim(HeaderValueOf(hv));
    } else if (Is(key, api::kSloTtftHeader)) {
      slo_headers_[0] = Trim(HeaderValueOf(hv));
    } else if (Is(key, api::kSloTtftHeaderOld)) {
      slo_headers_[1] = Trim(HeaderValueOf(hv));
    } else if (Is(key, api::kSloTpotHeader)) {
      slo_headers_[2] = Trim(HeaderValueOf(hv));
    } else if (Is(key, api::kSloTpotHeaderOld)) {
      slo_headers_[3] = Trim(HeaderValueOf(hv));
    } else if (Is(key, kPrefillerHeader)) {
      client_prefiller_ = true;
    } else if (Is(key, api::kFairnessHeader) || (Is(key, api::kFairnessHeaderOld) && fairness_.empty())) {
      fairness_ = Trim(HeaderValueOf(hv));
    } else if (Is(key, api::kModelRewriteHeader)) {
      rewrite_ = Trim(HeaderValueOf(hv));
    }
    if (!settings_->flow_header.empty() && Is(key, settings_->flow_header)) {
      flow_value_ = Trim(HeaderValueOf(hv));
    }
    if (settings_->sessions) {
      if (Is(key, settings_->session_header)) {
        session_id_ = Trim(HeaderValueOf(hv));
      } else if (Is(key, settings_->token_header)) {
        session_token_ = Trim(HeaderValueOf(hv));
      }
    }
  }
  if (h.end_of_stream() || mode_ == BodyMode::kNone) {
    phase_ = Phase::kBody;  // PickAndAnswer moves on from here
    return PickAndAnswer(false, false, out);
  }
  phase_ = Phase::kBody;
  if (mode_ != BodyMode::kFullDuplexStreamed) {
    // Envoy holds the body until the headers are answered.
    pb::ProcessingResponse r;
    r.mutable_request_headers();
    Emit(std::move(r), out);
  }
}

void Exchange::OnRequestBody(const pb::HttpBody& b, std::vector<pb::ProcessingResponse>& out) {
  if (phase_ == Phase::kHeaders) phase_ = Phase::kBody;  // no headers seen: none to read
  if (phase_ != Phase::kBody) {
    // Body after the pick (or after the request finished): pass it through unchanged.
    pb::ProcessingResponse r;
    PassBody(mode_, b, r.mutable_request_body());
    return Emit(std::move(r), out);
  }
  const std::string& chunk = b.body();
  if (body_.size() + chunk.size() > settings_->max_body_bytes) {
    return Fail(413, "Request body exceeds the limit of " +
                         std::to_string(settings_->max_body_bytes) + " bytes.", out);
  }
  const std::size_t need = body_.size() + chunk.size() + api::kJsonPadding;
  if (body_.capacity() < need) body_.reserve(std::max(need, body_.capacity() * 2));
  body_.append(chunk);
  if (b.end_of_stream()) return PickAndAnswer(true, false, out);
  if (mode_ == BodyMode::kStreamed) {
    pb::ProcessingResponse r;
    r.mutable_request_body();
    Emit(std::move(r), out);
  }
}

void Exchange::OnRequestTrailers(std::vector<pb::ProcessingResponse>& out) {
  if (phase_ == Phase::kHeaders || phase_ == Phase::kBody) {
    phase_ = Phase::kBody;
    PickAndAnswer(true, true, out);
    if (immediate_sent_ || phase_ == Phase::kHeld) return;  // Resume emits it when held
  }
  pb::ProcessingResponse r;
  r.mutable_request_trailers();
  Emit(std::move(r), out);
}

void Exchange::PickAndAnswer(bool with_body, bool trailers, std::vector<pb::ProcessingResponse>& out) {
  std::string_view path = path_;
  path = path.substr(0, path.find('?'));
  const bool completions = path == "/v1/completions";
  const bool chat = path == "/v1/chat/completions";
  const bool has_body = with_body && !body_.empty();

  sr_ = sched::SchedRequest();
  if (has_body && (completions || chat)) {
    const api::Endpoint kind = completions ? api::Endpoint::kCompletions : api::Endpoint::kChatCompletions;
    parsed_ = body_.capacity() >= body_.size() + api::kJsonPadding ? api::ParseRequestPadded(kind, body_)
                                                                   : api::ParseRequest(kind, body_);
    if (!parsed_.ok()) {
      model_ = model_header_;
      ResolvePriority();
      if (env_.stats) env_.stats->OnRequest(StatsLabels());
      return FailParsed(parsed_.error.status, api::ErrorBody(parsed_.error), out);
    }
    model_ = parsed_.request->model;
    if (auto e = api::ParseSloHeaders(slo_headers_[0], slo_headers_[1], slo_headers_[2],
                                      slo_headers_[3], &*parsed_.request)) {
      return FailParsed(e->status, api::ErrorBody(*e), out);
    }
    // What the headers leave unstated, the named objective gives (then scheduling.slo).
    if (!objective_.empty()) {
      if (auto it = settings_->objective_slos.find(objective_);
          it != settings_->objective_slos.end()) {
        if (parsed_.request->slo_ttft_s <= 0) parsed_.request->slo_ttft_s = it->second.first;
        if (parsed_.request->slo_tpot_s <= 0) parsed_.request->slo_tpot_s = it->second.second;
      }
    }
    sr_ = sched::FromParsed(*parsed_.request);
    // The request is scheduled as the model it is sent as.
    if (!rewrite_.empty()) sr_.model = rewrite_;
    kind_ = kind;
    awaiting_tokens_ = env_.want_token_ids && env_.want_token_ids();
  } else {
    model_ = model_header_;
    if (model_.empty() && has_body) model_ = ModelField(body_);
    sr_.model = rewrite_.empty() ? std::string_view(model_) : std::string_view(rewrite_);
  }
  sr_.priority = 0;  // vLLM's own priority is the engine's business, not the picker's
  ResolvePriority();
  if (env_.stats) env_.stats->OnRequest(StatsLabels());
  if (settings_->defer_pick || awaiting_tokens_) {
    // The caller (tokenizing, flow control) decides when; body_ and parsed_ stay as they are.
    held_with_body_ = with_body;
    held_trailers_ = trailers;
    phase_ = Phase::kHeld;
    return;
  }
  PickUnlessShed(with_body, trailers, out);
}

void Exchange::ResolvePriority() {
  priority_ = 0;
  if (!objective_.empty()) {
    auto it = settings_->objectives.find(objective_);
    if (it != settings_->objectives.end()) priority_ = it->second;
  }
}

void Exchange::PickUnlessShed(bool with_body, bool trailers, std::vector<pb::ProcessingResponse>& out) {
  if (priority_ < 0 && env_.core->Load(now_s_).saturated_pool()) {
    return Fail(429, "The pool is saturated and objective '" + objective_ +
                         "' is sheddable (priority " + std::to_string(priority_) + ").", out);
  }
  PickNow(with_body, trailers, out);
}

TokenInput Exchange::token_input() const {
  TokenInput in;
  if (!parsed_.ok() || !parsed_.request) return in;
  in.endpoint = kind_;
  in.model = parsed_.request->model;
  in.prompt = parsed_.request->prompt_text;
  if (kind_ == api::Endpoint::kChatCompletions) in.body = body_;
  in.add_special_tokens = parsed_.request->add_special_tokens;
  return in;
}

void Exchange::OnTokenIds(std::vector<uint32_t> ids, double now_s, std::vector<pb::ProcessingResponse>& out) {
  if (phase_ != Phase::kHeld || closed_ || !awaiting_tokens_) return;
  now_s_ = now_s;
  awaiting_tokens_ = false;
  token_ids_ = std::move(ids);
  sr_.token_ids = token_ids_;
  if (settings_->defer_pick) return;  // held on, for flow control
  phase_ = Phase::kBody;
  PickUnlessShed(held_with_body_, held_trailers_, out);
  AnswerHeldTrailers(out);
}

void Exchange::AnswerHeldTrailers(std::vector<pb::ProcessingResponse>& out) {
  if (!held_trailers_ || immediate_sent_) return;
  // What OnRequestTrailers emits after the pick.
  pb::ProcessingResponse r;
  r.mutable_request_trailers();
  Emit(std::move(r), out);
}

void Exchange::Resume(double now_s, std::vector<pb::ProcessingResponse>& out, double queued_s) {
  if (phase_ != Phase::kHeld || closed_ || awaiting_tokens_) return;
  now_s_ = now_s;
  sr_.queued_s = queued_s;
  phase_ = Phase::kBody;
  PickNow(held_with_body_, held_trailers_, out);
  AnswerHeldTrailers(out);
}

void Exchange::Refuse(int status, std::string message, std::string_view retry_after, std::string_view dropped,
                      double now_s, std::vector<pb::ProcessingResponse>& out) {
  if (phase_ != Phase::kHeld || closed_) return;
  now_s_ = now_s;
  awaiting_tokens_ = false;
  FailParsed(status, api::ErrorBody(api::MakeError(status, std::move(message))), out, retry_after, dropped);
}

void Exchange::PickNow(bool with_body, bool trailers, std::vector<pb::ProcessingResponse>& out) {
  const double t0 = env_.timer ? env_.timer() : 0.0;
  std::vector<uint32_t> only;
  if (subset_seen_) {
    auto table = env_.core->table();
    for (const std::string& addr : subset_) {
      for (const auto& ep : table->by_id) {
        if (ep && ep->spec.address == addr) only.push_back(ep->id);
      }
    }
    if (only.empty()) {
      if (env_.stats) env_.stats->OnPickOutcome(false);
      return Fail(503, "No usable endpoint: none of the gateway's subset hint is in the pool.", out);
    }
  }
  if (env_.capture && !capture_ && parsed_.ok() && parsed_.request && env_.capture->Sample()) {
    std::string_view path = path_;
    capture_ = std::make_unique<capture::Entry>(capture::StartEntry(
        *env_.capture, *parsed_.request, path.substr(0, path.find('?')), session_id_, started_s_));
  }
  routing::PickRequest pr;
  pr.request = sr_;
  pr.dispatch_first = true;
  pr.only = only;
  pr.session_id = session_id_;
  pr.session_token = session_token_;
  pick_ = env_.core->Pick(pr, now_s_);
  if (env_.timer && env_.stats) env_.stats->OnPickDuration(env_.timer() - t0);
  if (!pick_.ok() || pick_.n_ranked == 0) {
    if (env_.stats) env_.stats->OnPickOutcome(false);
    return Fail(503, "No usable endpoint: " + pick_.status.message() + ".", out);
  }
  served_ = pick_.ranked[0];
  picked_s_ = now_s_;
  if (env_.stats) {
    env_.stats->OnPickOutcome(true);
    env_.stats->OnPicked(StatsLabels());
    stats_running_ = true;
  }
  if (!pick_.dispatched) env_.core->OnDispatched(pick_.handle, served_, now_s_);
  const std::size_t n = std::min(pick_.n_ranked, 1 + settings_->fallbacks);
  destination_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) destination_ += ',';
    destination_ += pick_.endpoint(i).spec.address;
  }
  phase_ = Phase::kPicked;

  pb::ProcessingResponse r;
  SetDestinationMetadata(r, destination_);
  const bool in_body = with_body && mode_ != BodyMode::kFullDuplexStreamed && mode_ != BodyMode::kNone;
  pb::CommonResponse* common = in_body ? r.mutable_request_body()->mutable_response()
                                       : r.mutable_request_headers()->mutable_response();
  common->set_clear_route_cache(true);
  SetHeader(common->mutable_header_mutation(), kDestinationHeader, destination_);
  if (pick_.disaggregated()) {
    SetHeader(common->mutable_header_mutation(), kPrefillerHeader,
              pick_.prefill_endpoint().spec.address);
    prefill_open_ = true;
  } else if (client_prefiller_) {
    common->mutable_header_mutation()->add_remove_headers(std::string(kPrefillerHeader));
  }
  // The latency objectives are the router's: not forwarded to the engine.
  static constexpr std::string_view kSloNames[] = {api::kSloTtftHeader, api::kSloTtftHeaderOld,
                                                   api::kSloTpotHeader, api::kSloTpotHeaderOld};
  for (size_t i = 0; i < slo_headers_.size(); ++i) {
    if (!slo_headers_[i].empty()) {
      common->mutable_header_mutation()->add_remove_headers(std::string(kSloNames[i]));
    }
  }
  if (!rewrite_.empty()) {
    common->mutable_header_mutation()->add_remove_headers(std::string(api::kModelRewriteHeader));
    // The body as sent upstream names the rewritten model: replaced here when this answer
    // can still change it (buffered modes answer the whole body; full duplex re-emits it
    // below). A streamed body's earlier chunks are gone, and a body that is no JSON object
    // is left as it is (the engine refuses it).
    if (with_body && !trailers && !body_.empty() &&
        (mode_ == BodyMode::kBuffered || mode_ == BodyMode::kBufferedPartial ||
         mode_ == BodyMode::kFullDuplexStreamed)) {
      if (std::optional<std::string> b = api::ReplaceModel(body_, rewrite_)) {
        body_ = std::move(*b);
        if (mode_ != BodyMode::kFullDuplexStreamed) {
          common->mutable_body_mutation()->set_body(body_);
          SetHeader(common->mutable_header_mutation(), "Content-Length", std::to_string(body_.size()));
        }
      }
    }
  }
  if (in_body && trailers) {
    // The body's last chunk is already answered: the pick rides on the trailers response
    // (dynamic metadata only; Envoy has forwarded the headers by now).
    pb::ProcessingResponse t;
    SetDestinationMetadata(t, destination_);
    t.mutable_request_trailers();
    Emit(std::move(t), out);
    body_ = std::string();
    return;
  }
  const bool reemit = with_body && mode_ == BodyMode::kFullDuplexStreamed;
  if (reemit) SetHeader(common->mutable_header_mutation(), "Content-Length", std::to_string(body_.size()));
  Emit(std::move(r), out);
  if (reemit) {
    std::size_t at = 0;
    do {
      const std::size_t len = std::min(kMaxStreamedChunk, body_.size() - at);
      pb::ProcessingResponse c;
      StreamBody(c.mutable_request_body(), std::string_view(body_).substr(at, len),
                 at + len == body_.size() && !trailers);
      at += len;
      Emit(std::move(c), out);
    } while (at < body_.size());
  }
  body_ = std::string();  // the prompt is not kept for the response path
}

void Exchange::ReleasePrefill() {
  if (!prefill_open_) return;
  prefill_open_ = false;
  // The sidecar runs the leg: when it answered is not seen here, so nothing is learned.
  env_.core->OnPrefillDone(pick_.prefill, pick_.prefill_tokens, pick_.handle);
}

void Exchange::OnResponseHeaders(const pb::HttpHeaders& h, std::vector<pb::ProcessingResponse>& out) {
  ReleasePrefill();
  if (phase_ == Phase::kPicked && !finished_) {
    response_seen_ = true;
    for (const core_pb::HeaderValue& hv : h.headers().headers()) {
      std::string_view key = hv.key();
      if (Is(key, ":status")) {
        std::string_view v = HeaderValueOf(hv);
        int code = 0;
        auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), code);
        if (ec == std::errc() && code >= 100 && code <= 999) status_ = code;
      } else if (Is(key, kServedKey)) {
        std::string_view addr = Trim(HeaderValueOf(hv));
        for (const auto& ep : pick_.table->by_id) {
          if (ep && ep->spec.address == addr && ep->id != served_) {
            served_ = ep->id;
            env_.core->OnDispatched(pick_.handle, served_, now_s_);
          }
        }
      }
    }
    if (!response_body_sent_ || h.end_of_stream()) {
      first_token_ = true;
      env_.core->OnFirstToken(pick_.handle, now_s_);
    }
    if (h.end_of_stream()) FinishRequest(status_ != 0 ? status_ : 200);
  }
  pb::ProcessingResponse r;
  r.mutable_response_headers();
  if (settings_->sessions && phase_ == Phase::kPicked && pick_.table) {
    // The session token of the endpoint that served the request, for the client to send
    // back (the table the pick holds names every endpoint it could have gone to).
    if (const routing::Endpoint* ep = pick_.table->Find(served_)) {
      SetHeader(r.mutable_response_headers()->mutable_response()->mutable_header_mutation(),
                settings_->token_header, routing::SessionToken(*ep));
    }
  }
  Emit(std::move(r), out);
}

void Exchange::OnResponseBody(const pb::HttpBody& b, std::vector<pb::ProcessingResponse>& out) {
  if (phase_ == Phase::kPicked && !finished_) {
    response_seen_ = true;
    if (!first_token_ && !b.body().empty()) {
      first_token_ = true;
      first_byte_s_ = now_s_;
      env_.core->OnFirstToken(pick_.handle, now_s_);
    }
    std::string_view chunk = b.body();
    chunks_.Feed(chunk);
    response_tail_.Feed(chunk);
    if (b.end_of_stream()) {
      const api::Usage u = api::FindUsage(response_tail_.view());
      if (env_.stats) env_.stats->OnUsage(StatsLabels(), u.prompt_tokens, u.completion_tokens);
      usage_input_ = u.prompt_tokens;
      usage_output_ = u.completion_tokens;
      usage_cached_ = u.cached_tokens;
      if (pick_.predicted_cached_tokens >= 0 && (status_ == 0 || status_ == 200) &&
          pick_.n_ranked > 0 && served_ == pick_.ranked[0]) {
        env_.core->OnRouteReceipt(served_, pick_.predicted_cached_tokens, u.cached_tokens);
      }
      FinishRequest(status_ != 0 ? status_ : 200, chunks_.chunks() > 0 ? chunks_.chunks() : -1);
    }
  }
  pb::ProcessingResponse r;
  PassBody(response_mode_, b, r.mutable_response_body());
  Emit(std::move(r), out);
}

void Exchange::Fail(int status, std::string message, std::vector<pb::ProcessingResponse>& out) {
  // The picker's own refusals: a sheddable request while saturated (429), no endpoint (503).
  const std::string_view dropped = status == 429   ? api::kDroppedSaturated
                                   : status == 503 ? api::kDroppedNoEndpoints
                                                   : std::string_view();
  FailParsed(status, api::ErrorBody(api::MakeError(status, std::move(message))), out, {}, dropped);
}

void Exchange::FailParsed(int status, std::string body, std::vector<pb::ProcessingResponse>& out,
                          std::string_view retry_after, std::string_view dropped) {
  if (env_.stats) env_.stats->OnError(StatsLabels(), status);
  served_ = routing::RoutingCore::kNoEndpoint;
  FinishRequest(status);
  immediate_sent_ = true;
  phase_ = Phase::kDone;
  body_ = std::string();
  pb::ProcessingResponse r;
  pb::ImmediateResponse* ir = r.mutable_immediate_response();
  ir->mutable_status()->set_code(static_cast<::envoy::type::v3::StatusCode>(status));
  SetHeader(ir->mutable_headers(), "content-type", "application/json");
  if (!retry_after.empty()) SetHeader(ir->mutable_headers(), "retry-after", retry_after);
  if (!dropped.empty()) SetHeader(ir->mutable_headers(), api::kDroppedReasonHeader, dropped);
  ir->set_body(std::move(body));
  ir->set_details("kvroute_epp_" + std::to_string(status));
  // Observability mode expects no answers, but an error still ends the exchange.
  out.push_back(std::move(r));
}

void Exchange::FinishRequest(int code, int64_t generated_tokens) {
  ReleasePrefill();
  if (finished_) return;
  finished_ = true;
  if (stats_running_ && env_.stats) {
    stats_running_ = false;
    EppStats::Done d;
    d.duration_s = now_s_ - started_s_;
    if (first_byte_s_ >= 0) {
      d.ttft_s = first_byte_s_ - picked_s_;
      d.end_after_first_s = now_s_ - first_byte_s_;
    }
    d.input_tokens = usage_input_;
    d.output_tokens = usage_output_ >= 0 ? usage_output_ : generated_tokens;
    d.cached_tokens = usage_cached_;
    env_.stats->OnDone(StatsLabels(), d);
  }
  env_.core->OnFinished(pick_.handle, pick_.handle == sched::kNoHandle ? routing::RoutingCore::kNoEndpoint
                                                                       : served_,
                        code, now_s_, generated_tokens);
  pick_.handle = sched::kNoHandle;
  if (capture_) SubmitCapture(code, generated_tokens);
}

void Exchange::SubmitCapture(int code, int64_t generated_tokens) {
  capture::Entry& e = *capture_;
  e.status = code;
  if (pick_.table && served_ != routing::RoutingCore::kNoEndpoint) {
    if (const routing::Endpoint* ep = pick_.table->Find(served_)) e.endpoint = ep->spec.name;
  }
  if (first_byte_s_ >= 0) e.ttft_s = first_byte_s_ - started_s_;
  e.prompt_tokens = usage_input_;
  e.cached_tokens = usage_cached_;
  e.output_tokens = usage_output_ >= 0 ? usage_output_ : generated_tokens;
  env_.capture->Submit(std::move(e));
  capture_.reset();
}

void Exchange::Close(double now_s, bool cancelled) {
  if (closed_) return;
  closed_ = true;
  now_s_ = now_s;
  ReleasePrefill();
  if (finished_) return;
  if (phase_ == Phase::kPicked && !cancelled) {
    FinishRequest(status_ != 0 ? status_ : 200);
  } else {
    if (phase_ != Phase::kPicked) served_ = routing::RoutingCore::kNoEndpoint;
    FinishRequest(499);
  }
}

}  // namespace kvroute::extproc
