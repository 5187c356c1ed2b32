// HttpTokenizer over loopback: against a real simulated replica (both request forms; the
// ids are the engine's, checked against usage and the engine's prefix cache), and against
// stub servers for every failure (refused, hung, slow, 404/500, not JSON, wrong shape, too
// large), with the stats each call leaves behind.
#include "adapters/tokenize/http_tokenizer.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <boost/asio/post.hpp>
#include <future>
#include <string>
#include <vector>

#include "core/api/openai.h"
#include "core/engine/tokenizer.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/stub_server.h"

namespace kvroute::tokenize {
namespace {

using namespace std::chrono_literals;
using test_support::kLoopbackHost;
using test_support::kTestModel;
using test_support::LoopbackServer;

// A worker as the router has one: an event loop with its upstream client, and a
// tokenizer on it. Every call goes through the loop; the test thread waits (bounded).
class Worker {
 public:
  explicit Worker(HttpTokenizerOptions options = {}) : pool_(1) {
    pool_.Start();
    OnLoop([&] {
      client_ = std::make_unique<http::UpstreamClient>(pool_.context(0));
      tokenizer_ = std::make_unique<HttpTokenizer>(pool_.context(0), *client_, options);
    });
  }
  ~Worker() {
    OnLoop([&] {
      tokenizer_.reset();
      client_.reset();
    });
    pool_.Stop();
  }

  // Tokenize on the loop; the result, or DeadlineExceeded if no callback came in 10 s.
  Result<TokenIds> Run(TokenizeInput input) {
    auto done = std::make_shared<std::promise<Result<TokenIds>>>();
    auto fut = done->get_future();
    bool returned = false;
    bool early = false;
    boost::asio::post(pool_.context(0), [&, input, done] {
      tokenizer_->Tokenize(input, [&, done](Result<TokenIds> r) {
        early = !returned;
        done->set_value(std::move(r));
      });
      returned = true;
    });
    if (fut.wait_for(10s) != std::future_status::ready) {
      ADD_FAILURE() << "no callback";
      return Status::DeadlineExceeded("test: no callback");
    }
    EXPECT_FALSE(early) << "the callback ran inside Tokenize";
    return fut.get();
  }

  const TokenizerStats& stats() { return tokenizer_->stats(); }
  http::ClientStats client_stats() {
    http::ClientStats s;
    OnLoop([&] { s = client_->stats(); });
    return s;
  }

 private:
  void OnLoop(std::function<void()> fn) {
    std::promise<void> ran;
    boost::asio::post(pool_.context(0), [&] {
      fn();
      ran.set_value();
    });
    ran.get_future().wait();
  }

  http::IoPool pool_;
  std::unique_ptr<http::UpstreamClient> client_;
  std::unique_ptr<HttpTokenizer> tokenizer_;
};

TokenizeInput Completion(std::string_view prompt, uint16_t port) {
  TokenizeInput in;
  in.endpoint = api::Endpoint::kCompletions;
  in.model = kTestModel;
  in.prompt = prompt;
  in.target_host = kLoopbackHost;
  in.target_port = port;
  return in;
}

std::string Text(std::size_t bytes, std::string_view seed) {
  std::string p;
  for (int i = 0; p.size() < bytes; ++i) p += std::string(seed) + std::to_string(i) + ", ";
  p.resize(bytes);
  return p;
}

class SimReplicaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fleet_ = std::make_unique<sim::Fleet>(
        std::vector<sim::ReplicaConfig>{test_support::SimReplica()}, 1);
    ASSERT_TRUE(fleet_->Start().ok());
  }
  uint16_t port() const { return fleet_->port(0); }

  // usage.prompt_tokens of a generation request.
  int64_t PromptTokens(std::string_view path, std::string_view body) {
    std::optional<http::ClientResponse> r = http::Fetch(kLoopbackHost, port(), "POST", path, body);
    if (!r || r->status != 200) {
      ADD_FAILURE() << (r ? r->body : "no answer");
      return -1;
    }
    simdjson::dom::parser p;
    return int64_t(p.parse(r->body)["usage"]["prompt_tokens"]);
  }

  std::unique_ptr<sim::Fleet> fleet_;
};

TEST_F(SimReplicaTest, CompletionIdsAreTheEnginesIds) {
  Worker w;
  const std::string prompt = Text(4000, "completion");
  Result<TokenIds> ids = w.Run(Completion(prompt, port()));
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  ASSERT_EQ(ids->size(), 1000u);
  EXPECT_EQ(*ids, engine::Tokenize(prompt));
  ASSERT_EQ(fleet_->PeekCachedTokens(0, *ids), 0);
  EXPECT_EQ(PromptTokens("/v1/completions", test_support::CompletionBody(prompt, 1)), 1000);
  EXPECT_EQ(fleet_->PeekCachedTokens(0, *ids), 992) << "the engine cached exactly these ids";
}

TEST_F(SimReplicaTest, ChatIdsAreTheEnginesIds) {
  Worker w;
  // Written as a client would, with spacing and an escape; the template fields go along.
  std::string body = R"({ "model": "test/model", "max_tokens": 1, "messages": [)"
                     R"( {"role": "system", "content": ")" + Text(1500, "sys") +
                     R"("}, {"role": "user", "content": "caf\u00e9?"} ], "add_generation_prompt": true })";
  api::ParseResult parsed = api::ParseRequest(api::Endpoint::kChatCompletions, body);
  ASSERT_TRUE(parsed.ok());
  TokenizeInput in;
  in.endpoint = api::Endpoint::kChatCompletions;
  in.model = parsed.request->model;
  in.body = body;
  in.target_host = kLoopbackHost;
  in.target_port = port();
  Result<TokenIds> ids = w.Run(in);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, engine::Tokenize(parsed.request->prompt_text));
  ASSERT_EQ(fleet_->PeekCachedTokens(0, *ids), 0);
  EXPECT_EQ(PromptTokens("/v1/chat/completions", body), static_cast<int64_t>(ids->size()));
  EXPECT_EQ(fleet_->PeekCachedTokens(0, *ids), static_cast<int>((ids->size() - 1) / 16 * 16));
}

TEST_F(SimReplicaTest, ConnectionsAreReusedAndCallsCounted) {
  Worker w;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(w.Run(Completion(Text(100 + i, "x"), port())).ok());
  }
  const http::ClientStats cs = w.client_stats();
  EXPECT_EQ(cs.requests, 5u);
  EXPECT_EQ(cs.connections_opened, 1u);
  EXPECT_EQ(cs.connections_reused, 4u);
  const TokenizerStats::Snapshot s = w.stats().Read();
  EXPECT_EQ(s.calls, 5u);
  EXPECT_EQ(s.failures, 0u);
  uint64_t in_buckets = 0;
  for (uint64_t b : s.buckets) in_buckets += b;
  EXPECT_EQ(in_buckets, 5u);
  EXPECT_GT(s.latency_sum_s, 0.0);
}

TEST_F(SimReplicaTest, WrongModelIsNotFoundWithTheServersMessage) {
  Worker w;
  TokenizeInput in = Completion("hello", port());
  in.model = "other/model";
  Result<TokenIds> r = w.Run(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "tokenize: 127.0.0.1:" + std::to_string(port()) +
                                      " answered 404: The model `other/model` does not exist.");
  EXPECT_EQ(w.stats().Read().failures_by_kind[static_cast<int>(TokenizeFailure::kStatus)], 1u);
}

TEST(HttpTokenizerTest, DefaultTargetIsUsedWhenTheCallNamesNone) {
  LoopbackServer server([](std::shared_ptr<http::Exchange> ex) {
    EXPECT_EQ(ex->request().target(), "/v1/tokenize");
    EXPECT_EQ(ex->request().body(), R"({"model":"test/model","prompt":"hi","add_special_tokens":true})");
    ex->Respond(200, R"({"count":2,"max_model_len":10,"tokens":[128000,6151],"token_strs":null})");
  });
  ASSERT_TRUE(server.listen_status().ok());
  HttpTokenizerOptions o;
  o.default_host = kLoopbackHost;
  o.default_port = server.port();
  o.path = "/v1/tokenize";
  Worker w(o);
  TokenizeInput in = Completion("hi", 0);
  in.target_host = {};
  Result<TokenIds> r = w.Run(in);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (TokenIds{128000, 6151}));
}

TEST(HttpTokenizerTest, NoTargetAndBadInputFailWithoutIo) {
  Worker w;
  TokenizeInput in = Completion("hi", 0);
  in.target_host = {};
  Result<TokenIds> r = w.Run(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), "tokenize: no target (no replica given, no default)");

  in = Completion("", 1);
  in.endpoint = api::Endpoint::kChatCompletions;
  in.body = R"({"model":"m"})";
  r = w.Run(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "tokenize: chat request has no 'messages'");
  const TokenizerStats::Snapshot s = w.stats().Read();
  EXPECT_EQ(s.calls, 2u);
  EXPECT_EQ(s.failures_by_kind[static_cast<int>(TokenizeFailure::kConnect)], 1u);
  EXPECT_EQ(s.failures_by_kind[static_cast<int>(TokenizeFailure::kInput)], 1u);
}

TEST(HttpTokenizerTest, RefusedConnectionIsUnavailable) {
  Worker w;
  const uint16_t closed = test_support::ClosedPort();
  Result<TokenIds> r = w.Run(Completion("hi", closed));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(),
            "tokenize: cannot connect to 127.0.0.1:" + std::to_string(closed) +
                " (connect_refused)");
}

TEST(HttpTokenizerTest, AServerThatNeverAnswersTimesOut) {
  test_support::SilentListener silent;
  HttpTokenizerOptions o;
  o.timeout = 150ms;
  Worker w(o);
  const auto start = std::chrono::steady_clock::now();
  Result<TokenIds> r = w.Run(Completion("hi", silent.port()));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.status().message(),
            "no tokenize answer from 127.0.0.1:" + std::to_string(silent.port()) + " within 150 ms");
  EXPECT_GE(took, 150ms);
  EXPECT_LT(took, 3s);
  EXPECT_EQ(w.stats().Read().failures_by_kind[static_cast<int>(TokenizeFailure::kTimeout)], 1u);
}

TEST(HttpTokenizerTest, ADripFedAnswerHitsTheWholeCallDeadline) {
  // Headers at once, then a body byte every 40 ms: each gap is under the timeout, the whole
  // answer is not.
  LoopbackServer server([](std::shared_ptr<http::Exchange> ex) {
    ex->BeginStream(200, "application/json");
    auto timer = std::make_shared<boost::asio::steady_timer>(ex->executor());
    auto tick = std::make_shared<std::function<void()>>();
    *tick = [ex, timer, tick] {
      if (!ex->SendChunk(" ")) return;
      timer->expires_after(40ms);
      timer->async_wait([tick](boost::system::error_code ec) {
        if (!ec) (*tick)();
      });
    };
    (*tick)();
  });
  ASSERT_TRUE(server.listen_status().ok());
  HttpTokenizerOptions o;
  o.timeout = 300ms;
  Worker w(o);
  Result<TokenIds> r = w.Run(Completion("hi", server.port()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
}

struct CannedAnswer {
  int status;
  std::string body;
  StatusCode code;
  std::string message;  // after "tokenize: 127.0.0.1:PORT" or "127.0.0.1:PORT: "
  TokenizeFailure failure;
};

TEST(HttpTokenizerTest, BadAnswersAreErrorsNotCrashes) {
  const std::vector<CannedAnswer> cases = {
      {500, R"({"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}})",
       StatusCode::kUnavailable, " answered 500: boom", TokenizeFailure::kStatus},
      {400, R"({"error":{"message":"'prompt' must be a string","type":"BadRequestError","param":"prompt","code":400}})",
       StatusCode::kInvalidArgument, " answered 400: 'prompt' must be a string",
       TokenizeFailure::kStatus},
      {502, "<html>bad gateway</html>", StatusCode::kUnavailable,
       " answered 502: <html>bad gateway</html>", TokenizeFailure::kStatus},
      {200, "<html>hello</html>", StatusCode::kInternal,
       ": tokenize answer is not JSON: ", TokenizeFailure::kBadAnswer},
      {200, R"({"count":1})", StatusCode::kInternal,
       ": tokenize answer has no 'tokens' array", TokenizeFailure::kBadAnswer},
      {200, R"({"count":2,"tokens":[1,"x"]})", StatusCode::kInternal,
       ": tokenize answer: tokens[1] is not a token id", TokenizeFailure::kBadAnswer},
      {200, R"({"count":3,"tokens":[1,2]})", StatusCode::kInternal,
       ": tokenize answer: count 3 but 2 tokens", TokenizeFailure::kBadAnswer},
      {200, "", StatusCode::kInternal, ": tokenize answer is not JSON: ",
       TokenizeFailure::kBadAnswer},
  };
  std::size_t next = 0;
  LoopbackServer server([&](std::shared_ptr<http::Exchange> ex) {
    const CannedAnswer& c = cases[next++];
    ex->Respond(c.status, c.body);
  });
  ASSERT_TRUE(server.listen_status().ok());
  Worker w;
  const std::string target = "127.0.0.1:" + std::to_string(server.port());
  for (const CannedAnswer& c : cases) {
    Result<TokenIds> r = w.Run(Completion("hi", server.port()));
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), c.code) << c.body;
    const std::string prefix = c.failure == TokenizeFailure::kStatus ? "tokenize: " + target
                                                                     : target;
    EXPECT_EQ(r.status().message().substr(0, prefix.size() + c.message.size()), prefix + c.message)
        << r.status().message();
  }
  const TokenizerStats::Snapshot s = w.stats().Read();
  EXPECT_EQ(s.calls, cases.size());
  EXPECT_EQ(s.failures, cases.size());
  EXPECT_EQ(s.failures_by_kind[static_cast<int>(TokenizeFailure::kStatus)], 3u);
  EXPECT_EQ(s.failures_by_kind[static_cast<int>(TokenizeFailure::kBadAnswer)], 5u);
}

TEST(HttpTokenizerTest, AnswersOverTheBoundAreRefused) {
  std::string big = R"({"tokens":[)";
  for (int i = 0; i < 5000; ++i) big += (i ? ",1" : "1");
  big += "]}";
  bool stream = false;
  LoopbackServer server([&](std::shared_ptr<http::Exchange> ex) {
    if (!stream) {
      ex->Respond(200, big);  // Content-Length says it at once
      return;
    }
    ex->BeginStream(200, "application/json");  // chunked: found while reading
    ex->SendChunk(big.substr(0, 6000));
    ex->SendChunk(big.substr(6000));
    ex->EndStream();
  });
  ASSERT_TRUE(server.listen_status().ok());
  HttpTokenizerOptions o;
  o.max_response_bytes = 8192;
  Worker w(o);
  for (bool chunked : {false, true}) {
    stream = chunked;
    Result<TokenIds> r = w.Run(Completion("hi", server.port()));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(r.status().message(), "tokenize answer from 127.0.0.1:" +
                                        std::to_string(server.port()) + " is over 8192 bytes");
  }
  o.max_response_bytes = big.size();
  Worker roomy(o);
  Result<TokenIds> r = roomy.Run(Completion("hi", server.port()));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 5000u);
}

TEST(HttpTokenizerTest, AResetMidAnswerIsATransportError) {
  test_support::StubUpstream stub(test_support::StubUpstream::Mode::kDieMidStream);
  Worker w;
  Result<TokenIds> r = w.Run(Completion("hi", stub.port()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  const std::string prefix = "tokenize: " + stub.address() + ": reset";
  EXPECT_EQ(r.status().message().substr(0, prefix.size()), prefix) << r.status().message();
  EXPECT_EQ(w.stats().Read().failures_by_kind[static_cast<int>(TokenizeFailure::kTransport)], 1u);
}

TEST(TokenizerStatsTest, BucketsAreUpperBoundsInclusive) {
  TokenizerStats s;
  s.Record(0.0001, std::nullopt);   // le 0.0001
  s.Record(0.0003, std::nullopt);   // le 0.0005
  s.Record(7.0, TokenizeFailure::kTimeout);  // above every bound
  const TokenizerStats::Snapshot r = s.Read();
  EXPECT_EQ(r.calls, 3u);
  EXPECT_EQ(r.failures, 1u);
  EXPECT_EQ(r.buckets[0], 1u);
  EXPECT_EQ(r.buckets[2], 1u);
  EXPECT_EQ(r.buckets.back(), 1u);
  EXPECT_NEAR(r.latency_sum_s, 7.0004, 1e-9);
  EXPECT_EQ(TokenizeFailureName(TokenizeFailure::kTooLarge), "too_large");
}

}  // namespace
}  // namespace kvroute::tokenize
