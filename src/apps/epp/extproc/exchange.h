// One Envoy ext_proc stream of the endpoint picker (`kvroute epp`), as pure logic:
// ProcessingRequest messages in, ProcessingResponse messages out, the routing core's
// Pick / OnDispatched / OnFirstToken / OnFinished in between. No sockets, no clock: the
// gRPC adapter (src/apps/epp/grpc/) reads the clock and passes `now_s` in.
//
// What a stream sees and answers (the reference picker's behaviour, REFERENCE.md 11):
//
//   request_headers, end_of_stream     pick at once on the model alone (header
//                                      x-gateway-model-name): request_headers response
//                                      with the pick
//   request_headers (a body follows)   FULL_DUPLEX_STREAMED: nothing yet. STREAMED,
//                                      BUFFERED, BUFFERED_PARTIAL: an empty (CONTINUE)
//                                      request_headers response. NONE: pick on the model
//                                      alone, as with end_of_stream
//   request_body chunks                gathered (over limits.max_body_bytes: 413).
//                                      STREAMED: each chunk before the last answered with
//                                      an empty request_body response
//   request_body, end_of_stream        the body is parsed (api::ParseRequest for
//   (or request_trailers)              /v1/completions and /v1/chat/completions, 400 when
//                                      it is malformed; other paths use the body's "model"
//                                      when it has one) and the pick made. Then
//     FULL_DUPLEX_STREAMED   a request_headers response carrying the pick and
//                            Content-Length, then the body re-emitted as request_body
//                            responses with streamed_response chunks of at most
//                            kMaxStreamedChunk bytes, end_of_stream on the last
//     BUFFERED / STREAMED    a request_body response carrying the pick (the header
//                            mutation in its CommonResponse; the body is not replaced)
//
//   "carrying the pick": CommonResponse.clear_route_cache = true, header_mutation sets
//   x-gateway-destination-endpoint (raw_value; OVERWRITE_IF_EXISTS_OR_ADD) to the
//   winner's "host:port" then up to `fallbacks` next-ranked ones, comma-separated; the
//   same ProcessingResponse has dynamic_metadata
//   {"envoy.lb": {"x-gateway-destination-endpoint": <the same value>}}.
//   Prefill/decode (issue 25): when the pick is a pair, the destination is the decode
//   endpoint and header_mutation also sets x-prefiller-host-port: <prefill host:port> (the
//   llm-d contract: the decode pod's sidecar runs the prefill leg there first); otherwise
//   a client-sent x-prefiller-host-port is removed, so no client chooses a prefill host
//   (when the pick is a pair, the router's value overwrites it).
//   The prefill's charge (RoutingCore::OnPrefillDone) ends at the response headers (the
//   sidecar answers after its prefill leg), or when the exchange ends without them.
//
//   response_headers      the served endpoint is read (header, or envoy.lb metadata
//                         x-gateway-destination-endpoint-served; when it is another
//                         endpoint the in-flight accounting moves there) and :status
//                         kept; first token here unless Envoy said (protocol_config) it
//                         sends the response body; answered with an empty
//                         response_headers response; end_of_stream: finished
//   response_body         first token at the first non-empty chunk; usage read from the
//                         last chunk's (or the JSON body's) "usage"; FULL_DUPLEX_STREAMED
//                         response mode: each chunk echoed as a streamed_response, else an
//                         empty response_body response; end_of_stream: finished
//   *_trailers            an empty trailers response (response trailers: finished)
//
// Sessions (ExchangeSettings::sessions): the request's session id and token headers go to
// the pick (PickRequest::session_id, session_token); the response_headers response of a
// picked request sets the token header (OVERWRITE_IF_EXISTS_OR_ADD) to the session token
// of the endpoint that served it (RoutingCore's SessionToken: base64 of its address), so
// the client can send it back.
//
// The body mode is protocol_config.request_body_mode when Envoy sends it (first message),
// else ExchangeSettings::body_mode. The subset hint
// (metadata_context.filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-subset"],
// a list of "host:port", on any request-path message before the pick) restricts the
// pick to those endpoints; none of them in the pool: 503.
//
// Errors end the stream with one ImmediateResponse: status, content-type
// application/json and an OpenAI-shaped body (api::ErrorBody): 400 bad body, 413 body
// over the limit, 503 no usable endpoint, 429 for a sheddable request (its objective's
// priority below 0, from ExchangeSettings::objectives; unknown objectives are priority
// 0) while the pool is saturated (RoutingCore::PoolLoad::saturated_pool).
//
// Deferred pick (ExchangeSettings::defer_pick, `kvroute epp` with flow control on): at
// the point where the exchange would pick (and after the body parsed, so 400 and 413 are
// still answered at once) it picks nothing and emits nothing; held() turns true and the
// caller decides, with priority() and held_bytes(), when the pick happens: Resume(now)
// picks with the core's state of that moment and emits exactly what the exchange would
// have emitted then (the sheddable 429 is the caller's business in this mode); Refuse()
// ends the stream with an ImmediateResponse instead (429 with Retry-After, 503). While
// held, request messages get no answer (Envoy waits for the held one); Close finishes the
// request as 499 without an endpoint.
//
// Precise prefix routing (ExchangeEnv::want_token_ids true at the pick, i.e. the core has
// KV-cache events configured): a parsed /v1/completions or /v1/chat/completions body is
// held for its prompt's token ids before the pick: awaiting_token_ids() and held() turn
// true; the caller tokenizes (token_input()) off the stream's thread and calls
// OnTokenIds with the ids (empty: tokenizing failed, the pick is approximate). Then the
// exchange continues as it would have at the pick: with defer_pick it stays held for
// flow control, else it picks (the sheddable 429 included) and emits the answers.
// Route receipts: a response of a pick with a prediction
// (PickResult::predicted_cached_tokens >= 0) whose body Envoy sends ends with
// RoutingCore::OnRouteReceipt(served endpoint, prediction, the body's
// usage.prompt_tokens_details.cached_tokens or -1) when its status is 200.
//
// In observability_mode Envoy expects no answers: the exchange still picks and accounts
// but emits nothing.
//
// Accounting: a successful pick holds a core handle; it gets OnFinished exactly once, at
// the response's end, at an error, or at Close (stream ended or cancelled), whichever
// comes first. Requests answered without an endpoint are counted with kNoEndpoint.
//
// Threads: one Exchange is used by one stream, its calls serialised by the caller; the
// core and the stats may be shared by every stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "core/api/json_scan.h"
#include "core/api/openai.h"
#include "apps/epp/extproc/epp_stats.h"
#include "core/capture/capture.h"
#include "core/routing/routing_core.h"
#include "core/sched/types.h"
#include "envoy/service/ext_proc/v3/external_processor.pb.h"

namespace kvroute::extproc {

namespace pb = ::envoy::service::ext_proc::v3;

inline constexpr std::size_t kMaxStreamedChunk = 62000;
inline constexpr std::string_view kDestinationHeader = "x-gateway-destination-endpoint";
inline constexpr std::string_view kPrefillerHeader = "x-prefiller-host-port";
inline constexpr std::string_view kSubsetKey = "x-gateway-destination-endpoint-subset";
inline constexpr std::string_view kServedKey = "x-gateway-destination-endpoint-served";
inline constexpr std::string_view kLbNamespace = "envoy.lb";
// Where the current GIE spec puts the subset hint (read as well as kLbNamespace).
inline constexpr std::string_view kSubsetHintNamespace = "envoy.lb.subset_hint";

enum class BodyMode { kNone, kStreamed, kBuffered, kBufferedPartial, kFullDuplexStreamed };

// What every stream of one configuration shares; replaced whole on reload.
struct ExchangeSettings {
  BodyMode body_mode = BodyMode::kFullDuplexStreamed;  // when Envoy sends no protocol_config
  std::size_t fallbacks = 2;                           // after the winner, in the header
  uint64_t max_body_bytes = 16ull << 20;
  std::map<std::string, int64_t, std::less<>> objectives;  // objective name -> priority
  // An objective's latency objectives in seconds (TTFT, TPOT; 0: none), for a request that
  // names it and states none in its SLO headers (epp.objectives NAME: {slo: ...}).
  std::map<std::string, std::pair<double, double>, std::less<>> objective_slos;
  // Hold the pick for the caller (flow control) instead of picking at once; see above.
  bool defer_pick = false;
  // The request header naming its flow (flow.flow_header, lower case); empty: the
  // fairness id, else the objective. Read into flow_key().
  std::string flow_header;
  // Session affinity (sessions:, lower case): the request headers naming the session and
  // carrying its token, passed to the pick; the token is written on the response headers.
  // Off: neither is read or written.
  bool sessions = true;
  std::string session_header = "x-session-id";
  std::string token_header = "x-session-token";
};

// Where the exchange's calls go. `core` is required; `stats` may be null; `timer` (a
// monotonic clock in seconds), when set, times each pick for the e2e histogram.
struct ExchangeEnv {
  routing::RoutingCore* core = nullptr;
  EppStats* stats = nullptr;
  std::function<double()> timer;
  // Asked once per request at the pick: hold the pick for the prompt's token ids (see
  // above). Unset: never.
  std::function<bool()> want_token_ids;
  // capture: a parsed request the sample takes is handed here when it ends. Null: off.
  capture::Sink* capture = nullptr;
};

// What to tokenize, owned (the exchange's own strings may go with its stream).
struct TokenInput {
  api::Endpoint endpoint = api::Endpoint::kCompletions;
  std::string model;
  std::string prompt;  // completions: the prompt text
  std::string body;    // chat: the client's body
  std::optional<bool> add_special_tokens;
};

class Exchange {
 public:
  Exchange(ExchangeEnv env, std::shared_ptr<const ExchangeSettings> settings);
  // Calls Close(last time seen, cancelled) if the caller did not.
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  // Feeds one message; appends the responses it calls for to `out` (zero or more, in
  // order). After an ImmediateResponse (done() true) further messages are ignored.
  void OnRequest(const pb::ProcessingRequest& request, double now_s,
                 std::vector<pb::ProcessingResponse>& out);

  // The stream ended (Envoy half-closed, the RPC was cancelled or timed out). Finishes
  // the request if it is still open: code 499 when `cancelled` or before the pick, else
  // the response's status (200 when Envoy sent no response headers).
  // Idempotent.
  void Close(double now_s, bool cancelled);

  // An ImmediateResponse was emitted: the caller should end the stream after sending it.
  bool done() const { return immediate_sent_; }
  // The core handle is released (finished, failed or closed).
  bool finished() const { return finished_; }
  // The pick's header value ("" before a pick).
  const std::string& destination() const { return destination_; }
  // The effective request body mode (after protocol_config).
  BodyMode body_mode() const { return mode_; }

  // Deferred pick (settings.defer_pick). True from the moment the exchange would have
  // picked until Resume, Refuse or Close.
  bool held() const { return phase_ == Phase::kHeld && !closed_; }
  // Held for token ids (precise prefix routing): token_input() says what to tokenize.
  bool awaiting_token_ids() const { return awaiting_tokens_ && held(); }
  TokenInput token_input() const;
  // The prompt's token ids (empty: none, pick approximately). Continues the held request:
  // stays held for flow control with defer_pick, else picks and appends the answers.
  void OnTokenIds(std::vector<uint32_t> ids, double now_s, std::vector<pb::ProcessingResponse>& out);
  // The request as the pick will see it (model, prompt, ...); valid while held().
  const sched::SchedRequest& held_request() const { return sr_; }
  // The endpoint the request went to (the pick's winner, or the one Envoy reported it
  // served); RoutingCore::kNoEndpoint before a pick or when it never went anywhere.
  uint32_t served_endpoint() const { return served_; }
  // The request's priority: its objective's (ExchangeSettings::objectives; unknown or no
  // objective: 0). Meaningful once held() (or picked).
  int64_t priority() const { return priority_; }
  // The request body's size while held.
  uint64_t held_bytes() const { return body_.size(); }
  // The objective header's value ("" when none).
  const std::string& objective() const { return objective_; }
  // The flow: the configured flow header's value, else the fairness id (llm-d's header, then
  // the older one), else the objective.
  const std::string& flow_key() const {
    return !flow_value_.empty() ? flow_value_ : !fairness_.empty() ? fairness_ : objective_;
  }
  // Picks now and appends the answers the pick calls for (the pick, or a 503
  // ImmediateResponse). Nothing happens unless held(). `queued_s`: how long it waited in
  // the flow queue (counted against its TTFT objective).
  void Resume(double now_s, std::vector<pb::ProcessingResponse>& out, double queued_s = 0.0);
  // Ends the held request with an ImmediateResponse `status` (OpenAI-shaped body with
  // `message`), with a retry-after header when `retry_after` is not empty and
  // x-llm-d-request-dropped-reason `dropped` (api::kDropped*); finished as `status`
  // without an endpoint. Nothing happens unless held().
  void Refuse(int status, std::string message, std::string_view retry_after, std::string_view dropped,
              double now_s, std::vector<pb::ProcessingResponse>& out);

 private:
  enum class Phase { kHeaders, kBody, kHeld, kPicked, kDone };

  void OnRequestHeaders(const pb::HttpHeaders& h, std::vector<pb::ProcessingResponse>& out);
  void OnRequestBody(const pb::HttpBody& b, std::vector<pb::ProcessingResponse>& out);
  void OnRequestTrailers(std::vector<pb::ProcessingResponse>& out);
  void OnResponseHeaders(const pb::HttpHeaders& h, std::vector<pb::ProcessingResponse>& out);
  void OnResponseBody(const pb::HttpBody& b, std::vector<pb::ProcessingResponse>& out);
  // Parses the body, picks and emits the pick in the shape of the mode. `trailers`: the
  // body ended with trailers (its last streamed chunk is not end_of_stream).
  void PickAndAnswer(bool with_body, bool trailers, std::vector<pb::ProcessingResponse>& out);
  // The pick itself, from sr_ (PickAndAnswer, or Resume after a deferral).
  void PickNow(bool with_body, bool trailers, std::vector<pb::ProcessingResponse>& out);
  // After a held request's pick: the trailers response it owes when its trailers came
  // while it was held (none once an immediate response went).
  void AnswerHeldTrailers(std::vector<pb::ProcessingResponse>& out);
  // The sheddable 429 while the pool is saturated, else PickNow.
  void PickUnlessShed(bool with_body, bool trailers, std::vector<pb::ProcessingResponse>& out);
  // priority_ from the objective header (ExchangeSettings::objectives; else 0).
  void ResolvePriority();
  // Emits the ImmediateResponse and finishes the request (kNoEndpoint).
  void Fail(int status, std::string message, std::vector<pb::ProcessingResponse>& out);
  void FailParsed(int status, std::string body, std::vector<pb::ProcessingResponse>& out,
                  std::string_view retry_after = {}, std::string_view dropped = {});
  void ReadSubset(const pb::ProcessingRequest& request);
  // generated_tokens: the streamed answer's chunk count when it ended whole (-1: none).
  void FinishRequest(int code, int64_t generated_tokens = -1);
  // capture: hands the request's line, its outcome filled in, to env_.capture.
  void SubmitCapture(int code, int64_t generated_tokens);
  void Emit(pb::ProcessingResponse&& r, std::vector<pb::ProcessingResponse>& out);

  ExchangeEnv env_;
  std::shared_ptr<const ExchangeSettings> settings_;
  double now_s_ = 0.0;
  Phase phase_ = Phase::kHeaders;
  BodyMode mode_;
  bool protocol_seen_ = false;
  bool response_body_sent_ = false;  // protocol_config says Envoy sends response bodies
  BodyMode response_mode_ = BodyMode::kNone;
  bool observability_ = false;
  bool immediate_sent_ = false;
  bool finished_ = false;
  bool closed_ = false;

  // Request headers.
  std::string path_;
  std::string model_header_;
  std::string objective_;
  // Latency objective headers as sent (api::kSlo*Header, current and older names), in
  // that order; the router consumes them and removes them from the forwarded request.
  std::array<std::string, 4> slo_headers_;
  std::string flow_value_;
  std::string session_id_, session_token_;  // the session headers (sessions on)
  std::string fairness_;  // x-llm-d-inference-fairness-id (or the older header)
  std::string rewrite_;   // x-llm-d-model-name-rewrite (consumed: not forwarded)
  std::string request_id_;
  std::string content_type_;
  std::string body_;
  // Subset hint: the addresses as sent; seen at all.
  bool subset_seen_ = false;
  std::vector<std::string> subset_;

  // What the pick is made on: the parsed body (sr_ views its strings, and body_'s).
  api::ParseResult parsed_;
  sched::SchedRequest sr_;
  int64_t priority_ = 0;
  // A deferred pick: how PickAndAnswer was called.
  bool held_with_body_ = false;
  bool held_trailers_ = false;
  // Precise prefix routing: held for the ids; the ids (sr_.token_ids views them).
  bool awaiting_tokens_ = false;
  api::Endpoint kind_ = api::Endpoint::kCompletions;
  std::vector<uint32_t> token_ids_;

  // The pick.
  routing::PickResult pick_;
  std::string model_;  // the model the client asked for (metrics)
  // The llm_d_epp_request_* labels: model_, the model sent upstream (rewrite_ or model_),
  // the fairness id (the configured flow header's value, else llm-d's header or its older
  // one; none: EppStats' "default-flow"; the objective is not one) and priority_.
  EppStats::RequestLabels StatsLabels() const {
    return {model_, rewrite_.empty() ? std::string_view(model_) : std::string_view(rewrite_),
            !flow_value_.empty() ? std::string_view(flow_value_) : std::string_view(fairness_), priority_};
  }
  std::string destination_;
  uint32_t served_ = routing::RoutingCore::kNoEndpoint;

  // Response path.
  int status_ = 0;
  bool response_seen_ = false;
  bool prefill_open_ = false;
  bool client_prefiller_ = false;  // the request came with an x-prefiller-host-port
  // prefill_open_: a pair was picked and its prefill charge not yet released.
  void ReleasePrefill();
  bool first_token_ = false;
  // For the llm_d_epp_request_* series: when the headers came, the pick, the first response
  // body byte (-1: not yet), the usage the response reported, and whether the stats count
  // this request as running.
  double started_s_ = -1.0, picked_s_ = -1.0, first_byte_s_ = -1.0;
  int64_t usage_input_ = -1, usage_output_ = -1, usage_cached_ = -1;
  bool stats_running_ = false;
  api::ResponseTail response_tail_;  // the response body's last bytes (usage)
  std::unique_ptr<capture::Entry> capture_;  // this request's capture line; null: none
  api::ChoiceChunkCounter chunks_;  // streamed chunks with a choice (TPOT's token count)
};

using api::FindUsage;  // core/api/json_scan.h
using api::Usage;

// A header's value: raw_value when set (newer Envoy), else value.
std::string_view HeaderValueOf(const ::envoy::config::core::v3::HeaderValue& h);

}  // namespace kvroute::extproc
