// The router's tokenizer: a request's prompt token ids, as the engine that serves it will
// see them, for precise prefix routing (matching the ids of vLLM's KV-cache events).
//
// One asynchronous interface, so a local tokenizer (a vocabulary in-process) can follow the
// first implementation, HttpTokenizer (http_tokenizer.h), which asks a replica's vLLM
// POST /tokenize. Tokenize never blocks its caller's thread: the answer comes through a
// callback on the implementation's event loop, never before Tokenize returns.
//
// Stats: every implementation counts calls, failures by kind and latency in a
// TokenizerStats (atomics: read from any thread, e.g. /metrics).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/api/openai.h"
#include "core/common/status.h"

namespace kvroute::tokenize {

using TokenIds = std::vector<uint32_t>;

// What to tokenize: one client request, as the router holds it after api::ParseRequest.
// Views: they need to stay valid only during the Tokenize call.
struct TokenizeInput {
  api::Endpoint endpoint = api::Endpoint::kCompletions;
  std::string_view model;
  // Completions: the prompt text (ParsedRequest::prompt_text).
  std::string_view prompt;
  // Chat: the client's original body (its messages and chat-template fields are used as
  // sent). Unused for completions.
  std::string_view body;
  // ParsedRequest::add_special_tokens.
  std::optional<bool> add_special_tokens;
  // Who tokenizes, for implementations that ask a server: host and port of a ready
  // replica of the request's model, chosen by the caller. Empty host: the implementation's
  // configured default (if any). Ignored by local implementations.
  std::string_view target_host;
  uint16_t target_port = 0;
  bool target_tls = false;  // the replica's address is https://
};

// The ids, or why there are none: InvalidArgument (the input cannot be tokenized, or the
// server said 400), NotFound (the server does not serve the model), DeadlineExceeded
// (timeout), Unavailable (no target, connection refused or lost, a 5xx), ResourceExhausted
// (an answer over the size bound), Internal (an answer that is not a tokenize answer).
using TokenizeCallback = std::function<void(Result<TokenIds>)>;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Starts tokenizing `input`; `done` runs exactly once, on the implementation's event
  // loop thread, after Tokenize has returned. Thread: the implementation's event loop.
  virtual void Tokenize(const TokenizeInput& input, TokenizeCallback done) = 0;
};

// Why a call failed, for the failure counters (metric label values in brackets).
enum class TokenizeFailure : uint8_t {
  kInput,      // the request could not be turned into a tokenize call ("input")
  kConnect,    // no target, or connecting failed ("connect")
  kTimeout,    // the deadline passed ("timeout")
  kStatus,     // the server answered with a non-200 status ("status")
  kTooLarge,   // the answer was over the size bound ("too_large")
  kBadAnswer,  // the answer is not a tokenize answer ("bad_answer")
  kTransport,  // the connection broke mid-answer, or another transport error ("transport")
};
inline constexpr std::size_t kNumTokenizeFailures = 7;
std::string_view TokenizeFailureName(TokenizeFailure f);

// Counters and a latency histogram (seconds, Prometheus-style cumulative buckets when
// read). Written by one thread (the tokenizer's loop), read by any.
class TokenizerStats {
 public:
  // Upper bounds in seconds (le), loopback microseconds to remote tens of milliseconds.
  static constexpr std::array<double, 14> kBuckets = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5};

  // One finished call: its latency and, when it failed, why.
  void Record(double seconds, std::optional<TokenizeFailure> failure);

  struct Snapshot {
    uint64_t calls = 0;
    uint64_t failures = 0;
    std::array<uint64_t, kNumTokenizeFailures> failures_by_kind{};
    // Per-bucket counts (not cumulative); the last is above every bound.
    std::array<uint64_t, kBuckets.size() + 1> buckets{};
    double latency_sum_s = 0.0;
  };
  Snapshot Read() const;

 private:
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> failures_{0};
  std::array<std::atomic<uint64_t>, kNumTokenizeFailures> failures_by_kind_{};
  std::array<std::atomic<uint64_t>, kBuckets.size() + 1> buckets_{};
  std::atomic<uint64_t> latency_sum_ns_{0};
};

}  // namespace kvroute::tokenize
