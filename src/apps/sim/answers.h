// The bodies `kvroute sim` answers on /v1/embeddings and /v1/responses, in vLLM's shapes
// (OpenAI's Embeddings and Responses objects). Pure functions of what the engine computed:
// the replica (replica.cc) costs every request in its engine and calls these to write the
// answer. Deterministic: the same input gives the same vector and the same text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::sim::answers {

// Vector length of the simulated embedding model (what e5-small and bge-small return).
// A request's `dimensions` may ask for fewer: the vector is cut and normalised again, as
// vLLM does for matryoshka models; more is a 400.
inline constexpr std::size_t kEmbeddingDims = 384;

// One input's embedding: `dims` floats drawn from a hash of its tokens (position by
// position), L2-normalised. Different inputs give different vectors; the same input the
// same one, on every replica.
void EmbeddingVector(std::span<const uint32_t> tokens, std::size_t dims, std::vector<float>& out);

// Standard base64 with padding.
std::string Base64(std::string_view bytes);

// {"id","object":"list","created","model","data":[{"index","object":"embedding",
// "embedding"}...],"usage":{"prompt_tokens","total_tokens","completion_tokens":0,
// "prompt_tokens_details":null}}. With `base64`, each embedding is the base64 of its
// little-endian float32 values (what OpenAI's SDKs request by default); else an array of
// numbers.
std::string EmbeddingsBody(std::string_view id, int64_t created, std::string_view model_json,
                           std::span<const std::vector<uint32_t>> inputs, std::size_t dims,
                           bool base64, int64_t prompt_tokens);

// One Responses answer: a single assistant message of output_text.
struct Response {
  std::string id;      // "resp_..."
  std::string msg_id;  // "msg_..."
  int64_t created = 0;
  std::string_view model_json;  // the model name as a JSON string
  std::string_view text;        // generated so far (all of it when finished)
  int64_t max_output_tokens = -1;  // -1: not set
  int64_t input_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t output_tokens = 0;
  // "stop", "length" (incomplete: max_output_tokens), "abort"; empty while generating.
  std::string_view finish_reason;
};

// The response object: status in_progress (no finish reason yet), completed, or
// incomplete (incomplete_details.reason max_output_tokens) with its usage; output holds the
// message (empty while in progress and `with_output` false).
std::string ResponseObject(const Response& r, bool with_output);

// A streamed answer as server-sent events ("event: <type>\ndata: {...}\n\n"), each with
// its sequence_number (`seq`, advanced by every event):
//   Start:  response.created, response.in_progress, response.output_item.added,
//           response.content_part.added
//   Delta:  response.output_text.delta
//   End:    response.output_text.done, response.content_part.done,
//           response.output_item.done, then response.completed (or response.incomplete)
void AppendResponseStart(std::string& out, const Response& r, int64_t& seq);
void AppendResponseDelta(std::string& out, const Response& r, std::string_view delta, int64_t& seq);
void AppendResponseEnd(std::string& out, const Response& r, int64_t& seq);

}  // namespace kvroute::sim::answers
