// OpenAI-compatible request parsing and error bodies, shared by the simulator (which
// serves the API) and the router (which reads just enough of it to pick an endpoint).
// Pure logic: bytes in, values out. No exceptions escape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <string_view>

namespace kvroute::api {

// The request bodies kvroute parses: generation (completions, chat, responses) and
// embeddings. Every other path a router forwards is read with ScanRoutingFields.
// kOther: any other path a router forwards as it came (read with ScanRoutingFields; never
// passed to ParseRequest).
enum class Endpoint { kCompletions, kChatCompletions, kEmbeddings, kResponses, kOther };

// The path vLLM serves `e` on ("/v1/completions", ...; "" for kOther).
std::string_view EndpointPath(Endpoint e);
// Whether prefill/decode disaggregation may split a request of kind `e`: completions and
// chat, whose two legs kvroute knows how to build (core/api/pd_legs.h).
inline bool Disaggregable(Endpoint e) {
  return e == Endpoint::kCompletions || e == Endpoint::kChatCompletions;
}

// vLLM's P/D extra (REFERENCE.md section 20): the `kv_transfer_params` object a P/D proxy
// puts in each leg's body, and prefill's answer carries at top level. Fields absent or
// null are unset; fields kvroute does not know are ignored (they grow by release) but kept
// in `raw`.
struct KvTransferParams {
  bool do_remote_decode = false;   // this request is the prefill leg
  bool do_remote_prefill = false;  // this request is the decode leg
  std::optional<std::string> remote_engine_id;
  std::optional<std::vector<int64_t>> remote_block_ids;  // non-negative integers
  std::optional<std::string> remote_request_id;
  std::optional<std::string> remote_host;
  std::optional<int64_t> remote_port;
  std::optional<int64_t> tp_size;
  std::optional<int64_t> remote_prefill_cached_tokens;  // newer vLLM, non-negative
  // The whole object as JSON, every field included, minified (same keys, same order,
  // same values; whitespace dropped), so a proxy can pass it on as it came.
  std::string raw;
};

// What kvroute needs from a request body. Strings are owned copies: a request is
// parsed once and the result outlives the body buffer.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // The prompt as text: `prompt` for completions, or `messages` rendered through
  // RenderChat for chat. The simulator tokenizes it; the router hashes it.
  std::string prompt_text;
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage
  std::optional<int64_t> max_tokens;  // max_tokens, or chat's max_completion_tokens
  std::string cache_salt;           // vLLM extra; empty when absent
  int64_t priority = 0;             // vLLM extra; lower is more important
  bool ignore_eos = false;
  // vLLM extra: whether the tokenizer adds special tokens (BOS); unset means the
  // endpoint's default (completions true, chat false). kvroute's engine has none.
  std::optional<bool> add_special_tokens;
  // Embeddings: each input, as text (`input` a string or an array of strings) or as token
  // ids (an array of integers, or an array of such arrays); prompt_text joins the texts
  // with "\n" (what the router hashes). encoding_format "base64" (else "float"), and
  // `dimensions` when given (> 0).
  std::vector<std::string> inputs;
  std::vector<std::vector<uint32_t>> input_token_ids;
  bool base64 = false;
  std::optional<int64_t> dimensions;
  // vLLM extra: kv_transfer_params (an object); nullopt when absent or null.
  std::optional<KvTransferParams> kv_transfer_params;
  // The prompt's token ids from the engines' tokenizer, when a front end tokenized it for
  // precise prefix routing (never set by parsing).
  std::vector<uint32_t> token_ids;
  // The request's latency objectives in seconds from its headers (ParseSloHeaders); 0 when
  // it stated none (never set by body parsing).
  double slo_ttft_s = 0.0;
  double slo_tpot_s = 0.0;
  // When the front end received it, on its clock (seconds), for the capture; set only
  // while capturing (never by parsing).
  double received_s = 0.0;
};

// Request headers that carry latency objectives, in milliseconds (llm-d Router's names;
// the x-slo-* ones are their older spelling). The router consumes them: they are not
// forwarded to the engines.
inline constexpr std::string_view kSloTtftHeader = "x-llm-d-slo-ttft-ms";
inline constexpr std::string_view kSloTpotHeader = "x-llm-d-slo-tpot-ms";
inline constexpr std::string_view kSloTtftHeaderOld = "x-slo-ttft-ms";
inline constexpr std::string_view kSloTpotHeaderOld = "x-slo-tpot-ms";

// The flow a request belongs to for flow control's fairness (llm-d Router's name, then the
// Gateway API Inference Extension's older one), when the configuration names no flow header.
inline constexpr std::string_view kFairnessHeader = "x-llm-d-inference-fairness-id";
inline constexpr std::string_view kFairnessHeaderOld = "x-gateway-inference-fairness-id";
// Written on a refusal, saying why (llm-d Router's header and values): the pool saturated
// (a sheddable request, a full queue), no endpoint to send to, the wait in the queue over,
// the client gone while its request waited in the queue, the router stopping.
inline constexpr std::string_view kDroppedReasonHeader = "x-llm-d-request-dropped-reason";
inline constexpr std::string_view kDroppedSaturated = "rejected-saturated";
inline constexpr std::string_view kDroppedNoEndpoints = "rejected-no-endpoints";
inline constexpr std::string_view kDroppedTtlExpired = "rejected-ttl-expired";
inline constexpr std::string_view kDroppedContextCancelled = "rejected-context-cancelled";
inline constexpr std::string_view kDroppedShuttingDown = "rejected-shutting-down";
// The model a request is sent as, replacing its body's "model" (llm-d Router's header);
// consumed: not forwarded.
inline constexpr std::string_view kModelRewriteHeader = "x-llm-d-model-name-rewrite";

// An error in the shape vLLM and OpenAI use:
// {"error":{"message":...,"type":...,"param":...,"code":<status>}}.
struct ApiError {
  int status = 400;          // HTTP status, also the body's "code"
  std::string type;          // "BadRequestError", "NotFoundError", ...
  std::string message;
  std::string param;         // empty renders as null
};

// The error type name for an HTTP status: 400 BadRequestError, 404 NotFoundError,
// 413 RequestEntityTooLarge... (see openai.cc for the table).
std::string_view ErrorTypeForStatus(int status);

// Makes an ApiError with the type that fits `status`.
ApiError MakeError(int status, std::string message, std::string param = {});

// Serialises `e` as the JSON error body (no trailing newline).
std::string ErrorBody(const ApiError& e);
// ErrorBody(MakeError(status, message)): the body an HTTP server of kvroute's answers its
// own errors with (http::ServerOptions::error_body).
std::string ErrorBodyFor(int status, std::string_view message);

// Reads the objectives from header values (empty: absent; the current name wins over the
// older one) into `out` (seconds). A value that is not a finite positive number of
// milliseconds is a 400 naming the header (the body ErrorBody makes).
std::optional<ApiError> ParseSloHeaders(std::string_view ttft_ms, std::string_view ttft_ms_old,
                                        std::string_view tpot_ms, std::string_view tpot_ms_old,
                                        ParsedRequest* out);

// Result of parsing: either a request or an error (status 400 for malformed JSON,
// missing or wrong-typed fields). Never throws.
struct ParseResult {
  std::optional<ParsedRequest> request;
  ApiError error;
  bool ok() const { return request.has_value(); }
};

// Parses a POST body for `endpoint`. `body` need not be padded; the function copies
// it into simdjson's padded buffer only when it must.
//
// Accepted fields (others are ignored; `null` counts as absent for optional fields):
//   model (required string); completions: prompt (string, or an array of exactly one
//   string; token-id arrays and batches are rejected); chat: messages (non-empty array of
//   {role: string, content: string | null | [{type:"text", text}...]}; text parts are
//   joined with "\n"), rendered with RenderChat; stream (bool);
//   stream_options.include_usage (bool); max_tokens and, for chat, max_completion_tokens
//   (non-negative integers; max_completion_tokens wins when both are set); cache_salt
//   (string); priority (integer); ignore_eos (bool); add_special_tokens (bool);
//   kv_transfer_params (an object: do_remote_decode and do_remote_prefill booleans,
//   remote_engine_id, remote_request_id and remote_host strings, remote_block_ids an array
//   of non-negative integers, remote_port, tp_size and remote_prefill_cached_tokens
//   non-negative integers; any of them null or absent; other keys ignored).
// Errors are status 400 BadRequestError; `param` names the offending field, with a
// path for nested ones ("messages[1].content", "stream_options.include_usage",
// "kv_transfer_params.remote_block_ids[2]"), and is
// empty for malformed JSON or a non-object body.
// Thread: any; each thread reuses its own simdjson parser (thread_local), whose buffers
// grow to the largest body that thread has parsed.
ParseResult ParseRequest(Endpoint endpoint, std::string_view body);

// Responses (`/v1/responses`): `input` is a string (one user message) or an array of
// message items ({role, content} with an optional "type": "message"; content a string or
// parts of type input_text / output_text / text); other item kinds (tool calls and their
// outputs, reasoning) are skipped. `instructions` becomes a leading system message, and
// the whole renders through RenderChat as a chat request would. max_output_tokens is
// max_tokens; stream as chat.
//
// Embeddings (`/v1/embeddings`): model and input (required; see ParsedRequest::inputs),
// encoding_format ("float" or "base64"), dimensions (a positive integer), priority,
// cache_salt; an empty input array or an empty token array is a 400.

// What a router needs to pick for a request on a path whose body it does not otherwise
// parse (rerank, score, pooling, classify, tokenize, audio...): the model, and text to
// hash for prefix affinity (the first of `prompt`, `input`, `query`, `text_1`, `text`
// that is a string, or an array whose leading strings are joined with "\n"; chat
// `messages` rendered as RenderChat does). Never fails: a body that is not a JSON object
// (multipart audio, garbage) gives `json` false and empty fields; the engine judges it.
struct RoutingFields {
  bool json = false;
  std::string model;
  std::string prompt_text;
};
RoutingFields ScanRoutingFields(std::string_view body);

// Bytes that must be readable (any value) after the end of a body passed to
// ParseRequestPadded.
inline constexpr std::size_t kJsonPadding = 64;

// As ParseRequest, but `body.data()` must be followed by at least kJsonPadding readable
// bytes (e.g. a receive buffer with spare capacity): skips the copy.
ParseResult ParseRequestPadded(Endpoint endpoint, std::string_view body);

// One chat message as RenderChat sees it (views into the caller's storage).
struct ChatMessage {
  std::string_view role;
  std::string_view content;
};

// The chat template kvroute uses everywhere a chat request must become one text (the
// simulator tokenizes it; the router hashes it, so both must agree):
//   for each message: "<|" + role + "|>\n" + content + "\n"
//   then the generation prompt "<|assistant|>\n".
// AppendChatMessage appends one message's part, AppendChatGenerationPrompt the tail;
// RenderChat does the whole thing into a fresh string.
void AppendChatMessage(std::string& out, std::string_view role, std::string_view content);
void AppendChatGenerationPrompt(std::string& out);
std::string RenderChat(std::span<const ChatMessage> messages);

// Appends `s` to `out` as a JSON string literal (quotes and escapes included).
void AppendJsonString(std::string& out, std::string_view s);

}  // namespace kvroute::api
