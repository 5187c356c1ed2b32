// A Tokenizer that asks a vLLM server: POST /tokenize (REFERENCE.md section 21) to the
// target given per call (a ready replica of the request's model, chosen by the caller) or
// to a fixed configured one. Completions use the completion form {"model","prompt",
// "add_special_tokens":true}; chat requests the chat form with the client's `messages` and
// chat-template fields forwarded byte for byte and "add_special_tokens":false (vLLM's
// serving defaults; a client's own add_special_tokens is forwarded instead), so the ids
// are the ones that replica's engine uses for the request (api::BuildTokenizeBody).
//
// Each call has one deadline (`timeout`, from Tokenize to the whole answer read) and a
// bound on the answer's size; a non-200 answer, a body that is not JSON or not a tokenize
// answer is an error with a message naming the target (never a crash). Connections: the
// requests go through the http::UpstreamClient given, normally the worker's own client
// that also forwards requests, so keep-alive connections to a replica are reused.
//
// Threads: one event loop. Construct, call Tokenize and destroy on the thread running
// `ctx`; callbacks run there. Calls still in flight when the tokenizer is destroyed
// complete normally (they own what they use), provided `ctx` and `client` live on.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "adapters/http/client.h"
#include "adapters/tokenize/tokenizer.h"

namespace kvroute::tokenize {

struct HttpTokenizerOptions {
  // The whole call: connecting, sending, and reading the entire answer.
  std::chrono::milliseconds timeout{2000};
  // Answers larger than this fail (ResourceExhausted). 8 MiB holds ~1M ids.
  std::size_t max_response_bytes = 8u << 20;
  // The target when a call names none (empty: such calls fail with Unavailable).
  std::string default_host;
  uint16_t default_port = 0;
  std::string path = "/tokenize";
};

class HttpTokenizer final : public Tokenizer {
 public:
  // `client` must belong to `ctx`; both must outlive every call.
  HttpTokenizer(boost::asio::io_context& ctx, http::UpstreamClient& client,
                HttpTokenizerOptions options = {});

  void Tokenize(const TokenizeInput& input, TokenizeCallback done) override;

  const HttpTokenizerOptions& options() const { return options_; }
  // Counters of every call this tokenizer made. Thread: any.
  const TokenizerStats& stats() const { return *stats_; }

 private:
  boost::asio::io_context& ctx_;
  http::UpstreamClient& client_;
  HttpTokenizerOptions options_;
  std::shared_ptr<TokenizerStats> stats_;  // shared with calls in flight
};

}  // namespace kvroute::tokenize
