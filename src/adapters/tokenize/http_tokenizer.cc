#include "adapters/tokenize/http_tokenizer.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <simdjson.h>

#include <utility>

#include "core/api/tokenize.h"

namespace kvroute::tokenize {

namespace {

using Clock = std::chrono::steady_clock;

// One call in flight: owns the request body (the client does not copy it), the answer
// read so far, the deadline timer and the caller's callback.
struct Call {
  std::shared_ptr<TokenizerStats> stats;
  TokenizeCallback done;
  Clock::time_point start;
  std::string target;  // "host:port", for messages
  std::string body;
  std::string answer;
  std::size_t max_bytes = 0;
  int status = 0;
  bool too_large = false;
  bool timed_out = false;
  bool finished = false;
  http::UpstreamCall handle;
  std::unique_ptr<boost::asio::steady_timer> deadline;
};

void Finish(Call& call, Result<TokenIds> result, std::optional<TokenizeFailure> failure) {
  if (call.finished) return;
  call.finished = true;
  if (call.deadline) call.deadline->cancel();
  call.stats->Record(std::chrono::duration<double>(Clock::now() - call.start).count(), failure);
  TokenizeCallback done = std::move(call.done);
  done(std::move(result));
}

// The message of an OpenAI-shaped error body, or the start of the body as it is.
std::string ErrorMessageOf(std::string_view body) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  std::string_view message;
  if (!parser.parse(body.data(), body.size()).get(root) &&
      !root["error"]["message"].get_string().get(message)) {
    return std::string(message);
  }
  constexpr std::size_t kMax = 200;
  std::string out(body.substr(0, kMax));
  if (body.size() > kMax) out += "...";
  return out;
}

StatusCode CodeForHttpStatus(int status) {
  if (status == 400 || status == 422) return StatusCode::kInvalidArgument;
  if (status == 404) return StatusCode::kNotFound;
  if (status == 413) return StatusCode::kResourceExhausted;
  return StatusCode::kUnavailable;
}

void OnDone(Call& call, const http::UpstreamResult& r, std::chrono::milliseconds timeout) {
  const std::string& t = call.target;
  if (call.too_large) {
    return Finish(call,
                  Status::ResourceExhausted("tokenize answer from " + t + " is over " +
                                            std::to_string(call.max_bytes) + " bytes"),
                  TokenizeFailure::kTooLarge);
  }
  using E = http::UpstreamError;
  if (call.timed_out || r.error == E::kConnectTimeout || r.error == E::kFirstByteTimeout ||
      r.error == E::kIdleTimeout) {
    return Finish(call,
                  Status::DeadlineExceeded("no tokenize answer from " + t + " within " +
                                           std::to_string(timeout.count()) + " ms"),
                  TokenizeFailure::kTimeout);
  }
  if (http::IsConnectError(r.error)) {
    return Finish(call,
                  Status::Unavailable("tokenize: cannot connect to " + t + " (" +
                                      std::string(http::UpstreamErrorName(r.error)) + ")"),
                  TokenizeFailure::kConnect);
  }
  if (!r.ok()) {
    std::string m = "tokenize: " + t + ": " + std::string(http::UpstreamErrorName(r.error));
    if (!r.message.empty()) m += ": " + r.message;
    return Finish(call, Status::Unavailable(std::move(m)), TokenizeFailure::kTransport);
  }
  if (call.status != 200) {
    return Finish(call,
                  Status(CodeForHttpStatus(call.status),
                         "tokenize: " + t + " answered " + std::to_string(call.status) + ": " +
                             ErrorMessageOf(call.answer)),
                  TokenizeFailure::kStatus);
  }
  // Reserved with padding (below): parsed in place, without copying the answer.
  const bool padded = call.answer.capacity() >= call.answer.size() + api::kJsonPadding;
  Result<api::TokenizeAnswer> answer = api::ParseTokenizeAnswer(call.answer, padded);
  if (!answer.ok()) {
    return Finish(call, Status::Internal(t + ": " + answer.status().message()),
                  TokenizeFailure::kBadAnswer);
  }
  Finish(call, std::move(answer->tokens), std::nullopt);
}

}  // namespace

HttpTokenizer::HttpTokenizer(boost::asio::io_context& ctx, http::UpstreamClient& client,
                             HttpTokenizerOptions options)
    : ctx_(ctx),
      client_(client),
      options_(std::move(options)),
      stats_(std::make_shared<TokenizerStats>()) {}

void HttpTokenizer::Tokenize(const TokenizeInput& input, TokenizeCallback done) {
  auto call = std::make_shared<Call>();
  call->stats = stats_;
  call->done = std::move(done);
  call->start = Clock::now();
  std::string_view host = input.target_host;
  uint16_t port = input.target_port;
  const bool tls = !host.empty() && input.target_tls;
  if (host.empty()) {
    host = options_.default_host;
    port = options_.default_port;
  }
  call->target = std::string(host) + ":" + std::to_string(port);
  // Errors found before any I/O are reported later too: never inside Tokenize.
  auto fail_later = [this, call](Status s, TokenizeFailure f) {
    boost::asio::post(ctx_, [call, s = std::move(s), f]() mutable { Finish(*call, std::move(s), f); });
  };
  if (host.empty() || port == 0) {
    return fail_later(Status::Unavailable("tokenize: no target (no replica given, no default)"),
                      TokenizeFailure::kConnect);
  }
  api::TokenizeSource source;
  source.endpoint = input.endpoint;
  source.model = input.model;
  source.prompt = input.prompt;
  source.body = input.body;
  source.add_special_tokens = input.add_special_tokens;
  Result<std::string> body = api::BuildTokenizeBody(source);
  if (!body.ok()) {
    return fail_later(Status::InvalidArgument("tokenize: " + body.status().message()),
                      TokenizeFailure::kInput);
  }
  call->body = std::move(*body);

  const std::chrono::milliseconds timeout = options_.timeout;
  const std::size_t max_bytes = options_.max_response_bytes;
  call->max_bytes = max_bytes;
  call->deadline = std::make_unique<boost::asio::steady_timer>(ctx_, timeout);
  call->deadline->async_wait([weak = std::weak_ptr<Call>(call)](boost::system::error_code ec) {
    auto c = weak.lock();
    if (ec || !c || c->finished) return;
    c->timed_out = true;
    c->handle.Cancel();  // on_done(kCancelled) runs now and reports the timeout
  });

  http::UpstreamRequest req;
  req.method = boost::beast::http::verb::post;
  req.tls = tls;
  req.target = options_.path;
  req.body = call->body;
  req.connect_timeout = timeout;
  req.first_byte_timeout = timeout;
  req.idle_timeout = timeout;
  http::UpstreamCallbacks cb;
  Call* c = call.get();  // kept alive by cb.owner until on_done has run
  cb.owner = call;
  cb.on_head = [c, max_bytes](const http::ResponseHead& head) {
    c->status = head.status;
    if (head.content_length && *head.content_length > max_bytes) {
      c->too_large = true;
      c->handle.Cancel();
      return;
    }
    if (head.content_length) {
      c->answer.reserve(static_cast<std::size_t>(*head.content_length) + api::kJsonPadding);
    }
  };
  cb.on_data = [c, max_bytes](std::string_view piece) {
    if (c->answer.size() + piece.size() > max_bytes) {
      c->too_large = true;
      c->handle.Cancel();
      return;
    }
    c->answer.append(piece);
  };
  cb.on_done = [c, timeout](http::UpstreamResult&& r) { OnDone(*c, r, timeout); };
  call->handle = client_.Start(host, port, req, std::move(cb));
}

}  // namespace kvroute::tokenize
