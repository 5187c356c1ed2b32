// Shared by the replica_*.cc files and nothing else: a request's state from arrival to
// its final byte (Replica::Live) and the helpers several of those files use.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "adapters/http/server.h"
#include "apps/sim/replica.h"
#include "core/api/openai.h"
#include "core/engine/engine.h"

namespace kvroute::sim {
namespace detail {

// The system clock's Unix seconds (the `created` of answers).
int64_t UnixNow();
// Appends the low `width` hex digits of `v` (lowercase, zero-padded).
void AppendHex(std::string& out, uint64_t v, int width);
// Answers `status` with an OpenAI-shaped error body; returns what Respond returns.
bool RespondApiError(http::Exchange& ex, int status, std::string message,
                     std::string param = {});
// `seconds` of wall time (negative as 0), rounded up to the steady clock's tick.
std::chrono::steady_clock::duration WallDuration(double seconds);

}  // namespace detail

// One request from HTTP arrival to its final byte. Lives in live_ (keyed by engine id)
// from arrival; the engine knows it only after Admit.
struct Replica::Live {
  uint64_t id = 0;
  std::shared_ptr<http::Exchange> ex;
  api::ParsedRequest req;
  engine::EngineRequest engine_req;
  std::string response_id;
  int64_t created = 0;
  bool chat = false;  // chat completions, or a Responses request (rendered as chat)
  api::Endpoint kind = api::Endpoint::kCompletions;
  std::vector<std::vector<uint32_t>> embed_inputs;  // embeddings: each input's tokens
  std::size_t embed_dims = 0;
  std::string msg_id;        // responses: the output message's id
  int64_t seq = 0;           // responses: the stream's next sequence_number
  bool admitted = false;
  bool sent_role = false;
  std::string text;  // non-streaming: generated text so far
  std::string model_json;  // the model answers name, a JSON string (adapter requests)
  int chunks_sent = 0;  // streaming: HTTP chunks sent (stall and reset count them)
  bool pd_prefill = false;       // P/D prefill leg: hold the blocks, answer kv_transfer_params
  bool pd_pull_pending = false;  // P/D decode leg whose pull is not settled yet
  Clock::time_point arrival;
  Clock::time_point last_token;
  std::unique_ptr<boost::asio::steady_timer> delay;  // network latency before admission
};

}  // namespace kvroute::sim
