// The ext_proc exchange as pure logic: ProcessingRequest messages in, ProcessingResponse
// messages out, over a real RoutingCore fed scrapes in virtual time. No sockets.
#include "apps/epp/extproc/exchange.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <set>
#include <string>
#include <vector>

#include "core/api/openai.h"
#include "core/metrics/prom_parser.h"
#include "support/openai_body.h"

namespace kvroute::extproc {
namespace {

namespace core_pb = ::envoy::config::core::v3;
namespace mode_pb = ::envoy::extensions::filters::http::ext_proc::v3;
using Responses = std::vector<pb::ProcessingResponse>;

constexpr const char* kModel = "test/model";

routing::ScrapeResult Idle(double at, double waiting = 0, double kv = 0.1) {
  routing::ScrapeResult r;
  r.ok = true;
  r.sent_at_s = at;
  r.metrics.running = 0;
  r.metrics.waiting = waiting;
  r.metrics.kv_usage = kv;
  r.metrics.engines = 1;
  r.metrics.present = metrics::EngineMetrics::kRunning | metrics::EngineMetrics::kWaiting |
                      metrics::EngineMetrics::kKvUsage;
  return r;
}

std::string Completion(std::string_view prompt) {
  return kvroute::test_support::CompletionBody(prompt, 8);
}

std::string LongPrompt(std::size_t n, char salt) {
  std::string p = "system prompt shared by every request of this test, then: ";
  p += salt;
  while (p.size() < n) p += static_cast<char>('a' + (p.size() * 7 + salt) % 26);
  return p;
}

void AddHeader(pb::HttpHeaders* h, std::string key, std::string value, bool raw = true) {
  core_pb::HeaderValue* v = h->mutable_headers()->add_headers();
  v->set_key(std::move(key));
  if (raw) {
    v->set_raw_value(std::move(value));
  } else {
    v->set_value(std::move(value));
  }
}

pb::ProcessingRequest Headers(std::string path, bool eos = false,
                              std::vector<std::pair<std::string, std::string>> extra = {}) {
  pb::ProcessingRequest r;
  pb::HttpHeaders* h = r.mutable_request_headers();
  AddHeader(h, ":method", "POST");
  AddHeader(h, ":path", std::move(path));
  AddHeader(h, "content-type", "application/json");
  AddHeader(h, "x-request-id", "req-1");
  for (auto& [k, v] : extra) AddHeader(h, k, v);
  h->set_end_of_stream(eos);
  return r;
}

pb::ProcessingRequest Body(std::string bytes, bool eos) {
  pb::ProcessingRequest r;
  r.mutable_request_body()->set_body(std::move(bytes));
  r.mutable_request_body()->set_end_of_stream(eos);
  return r;
}

void SetProtocol(pb::ProcessingRequest& r, mode_pb::ProcessingMode::BodySendMode request_mode,
                 mode_pb::ProcessingMode::BodySendMode response_mode = mode_pb::ProcessingMode::NONE) {
  r.mutable_protocol_config()->set_request_body_mode(request_mode);
  r.mutable_protocol_config()->set_response_body_mode(response_mode);
}

void SetSubset(pb::ProcessingRequest& r, std::vector<std::string> addrs,
               const std::string& ns = "envoy.lb") {
  auto& lb = (*r.mutable_metadata_context()->mutable_filter_metadata())[ns];
  auto* list = (*lb.mutable_fields())[std::string(kSubsetKey)].mutable_list_value();
  for (auto& a : addrs) list->add_values()->set_string_value(a);
}

std::string HeaderSet(const pb::CommonResponse& c, std::string_view key) {
  for (const auto& o : c.header_mutation().set_headers()) {
    if (o.header().key() == key) {
      EXPECT_EQ(o.append_action(), core_pb::HeaderValueOption::OVERWRITE_IF_EXISTS_OR_ADD);
      return o.header().raw_value();
    }
  }
  return "<unset>";
}

std::string LbValue(const pb::ProcessingResponse& r) {
  auto ns = r.dynamic_metadata().fields().find("envoy.lb");
  if (ns == r.dynamic_metadata().fields().end()) return "<none>";
  auto it = ns->second.struct_value().fields().find(std::string(kDestinationHeader));
  if (it == ns->second.struct_value().fields().end()) return "<none>";
  return it->second.string_value();
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    std::size_t comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

class ExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<routing::EndpointSpec> eps;
    for (int i = 0; i < 4; ++i) {
      routing::EndpointSpec e;
      e.host = "10.0.0." + std::to_string(i + 1);
      e.port = 8000;
      e.address = e.host + ":8000";
      e.name = "r" + std::to_string(i);
      eps.push_back(e);
      addresses_.insert(e.address);
    }
    routing::CoreOptions o;
    o.scheduling.policy = "kvroute";
    ASSERT_TRUE(core_.Configure(o, eps, 0.0).ok());
    ScrapeAll(Idle(now_));
    settings_ = std::make_shared<ExchangeSettings>();
  }

  void ScrapeAll(const routing::ScrapeResult& r) {
    for (const auto& ep : core_.table()->by_id) core_.OnScrape(ep->id, r, now_);
  }

  std::unique_ptr<Exchange> New() {
    ExchangeEnv env;
    env.core = &core_;
    env.stats = &stats_;
    env.timer = [this] { return now_; };
    return std::make_unique<Exchange>(env, settings_);
  }

  Responses Feed(Exchange& ex, const pb::ProcessingRequest& r) {
    Responses out;
    ex.OnRequest(r, now_, out);
    return out;
  }

  double Inflight() {
    std::string text;
    core_.AppendMetrics(text, now_);
    double sum = 0;
    for (const auto& s : metrics::ParseAllSamples(text)) {
      if (s.name == "kvroute_endpoint_inflight") sum += s.value;
    }
    return sum;
  }

  double Requests(std::string_view code) {
    std::string text;
    core_.AppendMetrics(text, now_);
    double sum = 0;
    for (const auto& s : metrics::ParseAllSamples(text)) {
      if (s.name != "kvroute_requests_total") continue;
      for (const auto& [k, v] : s.labels) {
        if (k == "code" && v == code) sum += s.value;
      }
    }
    return sum;
  }

  // Checks that `r` carries the pick in `c` and returns the header value.
  std::string CheckPick(const pb::ProcessingResponse& r, const pb::CommonResponse& c,
                        std::size_t want_count) {
    EXPECT_TRUE(c.clear_route_cache());
    const std::string dest = HeaderSet(c, kDestinationHeader);
    EXPECT_EQ(LbValue(r), dest);
    auto parts = Split(dest);
    EXPECT_EQ(parts.size(), want_count) << dest;
    std::set<std::string> distinct(parts.begin(), parts.end());
    EXPECT_EQ(distinct.size(), parts.size()) << dest;
    for (const auto& p : parts) EXPECT_TRUE(addresses_.count(p)) << p;
    return dest;
  }

  // An immediate JSON error; `dropped`: its x-llm-d-request-dropped-reason ("" none).
  void ExpectImmediate(const Responses& out, int status, std::string_view dropped = "") {
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out[0].has_immediate_response());
    const pb::ImmediateResponse& ir = out[0].immediate_response();
    EXPECT_EQ(static_cast<int>(ir.status().code()), status);
    ASSERT_EQ(ir.headers().set_headers_size(), dropped.empty() ? 1 : 2);
    EXPECT_EQ(ir.headers().set_headers(0).header().key(), "content-type");
    EXPECT_EQ(ir.headers().set_headers(0).header().raw_value(), "application/json");
    if (!dropped.empty()) {
      EXPECT_EQ(ir.headers().set_headers(1).header().key(), "x-llm-d-request-dropped-reason");
      EXPECT_EQ(ir.headers().set_headers(1).header().raw_value(), dropped);
    }
    EXPECT_NE(ir.body().find("\"error\":{"), std::string::npos) << ir.body();
    EXPECT_NE(ir.body().find("\"code\":" + std::to_string(status)), std::string::npos) << ir.body();
  }

  routing::RoutingCore core_;
  EppStats stats_;
  std::shared_ptr<ExchangeSettings> settings_;
  std::set<std::string> addresses_;
  double now_ = 1.0;
};

TEST_F(ExchangeTest, FullDuplexAnswersNothingUntilEndOfBodyThenPickAndReemitsBody) {
  auto ex = New();
  const std::string body = Completion(LongPrompt(1000, 'x'));
  EXPECT_TRUE(Feed(*ex, Headers("/v1/completions")).empty());
  EXPECT_TRUE(Feed(*ex, Body(body.substr(0, 300), false)).empty());
  Responses out = Feed(*ex, Body(body.substr(300), true));
  ASSERT_EQ(out.size(), 2u);
  ASSERT_TRUE(out[0].has_request_headers());
  const std::string dest = CheckPick(out[0], out[0].request_headers().response(), 3);
  EXPECT_EQ(HeaderSet(out[0].request_headers().response(), "Content-Length"), std::to_string(body.size()));
  EXPECT_EQ(ex->destination(), dest);
  ASSERT_TRUE(out[1].has_request_body());
  const auto& sr = out[1].request_body().response().body_mutation().streamed_response();
  EXPECT_EQ(sr.body(), body);
  EXPECT_TRUE(sr.end_of_stream());
  EXPECT_FALSE(out[1].has_dynamic_metadata());
  EXPECT_EQ(Inflight(), 1.0);
  ex->Close(now_, false);
  EXPECT_EQ(Inflight(), 0.0);
  EXPECT_EQ(Requests("200"), 1.0);
}

TEST_F(ExchangeTest, FullDuplexReemitsALargeBodyInChunksOfAtMost62000Bytes) {
  auto ex = New();
  const std::string body = Completion(LongPrompt(220 * 1024, 'y'));
  Feed(*ex, Headers("/v1/completions"));
  Responses out;
  for (std::size_t at = 0; at < body.size(); at += 16384) {
    out = Feed(*ex, Body(body.substr(at, 16384), at + 16384 >= body.size()));
  }
  const std::size_t chunks = (body.size() + kMaxStreamedChunk - 1) / kMaxStreamedChunk;
  ASSERT_EQ(out.size(), 1 + chunks);
  CheckPick(out[0], out[0].request_headers().response(), 3);
  std::string joined;
  for (std::size_t i = 1; i < out.size(); ++i) {
    const auto& sr = out[i].request_body().response().body_mutation().streamed_response();
    EXPECT_LE(sr.body().size(), kMaxStreamedChunk);
    if (i + 1 < out.size()) {
      EXPECT_EQ(sr.body().size(), kMaxStreamedChunk);
    }
    EXPECT_EQ(sr.end_of_stream(), i + 1 == out.size());
    joined += sr.body();
  }
  EXPECT_EQ(joined, body);
}

TEST_F(ExchangeTest, BufferedAnswersHeadersAtOnceAndPutsThePickInTheBodyResponse) {
  settings_->body_mode = BodyMode::kBuffered;
  auto ex = New();
  Responses out = Feed(*ex, Headers("/v1/completions"));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_request_headers());
  EXPECT_FALSE(out[0].request_headers().has_response());
  EXPECT_FALSE(out[0].has_dynamic_metadata());
  out = Feed(*ex, Body(Completion("hello"), true));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_request_body());
  const pb::CommonResponse& c = out[0].request_body().response();
  CheckPick(out[0], c, 3);
  EXPECT_EQ(HeaderSet(c, "Content-Length"), "<unset>");
  EXPECT_FALSE(c.has_body_mutation());
  EXPECT_EQ(c.status(), pb::CommonResponse::CONTINUE);
}

TEST_F(ExchangeTest, StreamedAnswersEveryChunkAndPicksOnTheLast) {
  settings_->body_mode = BodyMode::kStreamed;
  auto ex = New();
  const std::string body = Completion(LongPrompt(5000, 's'));
  ASSERT_EQ(Feed(*ex, Headers("/v1/completions")).size(), 1u);
  for (int i = 0; i < 3; ++i) {
    Responses out = Feed(*ex, Body(body.substr(i * 1000, 1000), false));
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out[0].has_request_body());
    EXPECT_FALSE(out[0].request_body().has_response());
  }
  Responses out = Feed(*ex, Body(body.substr(3000), true));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_request_body());
  CheckPick(out[0], out[0].request_body().response(), 3);
}

TEST_F(ExchangeTest, ProtocolConfigOverridesTheConfiguredMode) {
  settings_->body_mode = BodyMode::kFullDuplexStreamed;
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  SetProtocol(h, mode_pb::ProcessingMode::BUFFERED);
  ASSERT_EQ(Feed(*ex, h).size(), 1u);  // BUFFERED: headers answered at once
  EXPECT_EQ(ex->body_mode(), BodyMode::kBuffered);
  Responses out = Feed(*ex, Body(Completion("hi"), true));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].has_request_body());

  settings_->body_mode = BodyMode::kBuffered;
  auto ex2 = New();
  pb::ProcessingRequest h2 = Headers("/v1/completions");
  SetProtocol(h2, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED);
  EXPECT_TRUE(Feed(*ex2, h2).empty());
  out = Feed(*ex2, Body(Completion("hi"), true));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].has_request_headers());
}

TEST_F(ExchangeTest, HeadersWithEndOfStreamPickAtOnceOnTheModel) {
  auto ex = New();
  Responses out = Feed(*ex, Headers("/v1/models", true, {{"x-gateway-model-name", kModel}}));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_request_headers());
  CheckPick(out[0], out[0].request_headers().response(), 3);
  EXPECT_EQ(HeaderSet(out[0].request_headers().response(), "Content-Length"), "<unset>");
}

TEST_F(ExchangeTest, HeaderValuesAreReadFromValueWhenRawValueIsEmpty) {
  auto ex = New();
  pb::ProcessingRequest r;
  AddHeader(r.mutable_request_headers(), ":path", "/v1/completions", /*raw=*/false);
  Feed(*ex, r);
  // A malformed body on /v1/completions is a 400: the path was read from `value`.
  ExpectImmediate(Feed(*ex, Body("{not json", true)), 400);
}

TEST_F(ExchangeTest, FallbackCountIsConfigurable) {
  settings_->fallbacks = 0;
  auto ex = New();
  Feed(*ex, Headers("/v1/completions"));
  Responses out = Feed(*ex, Body(Completion("one"), true));
  CheckPick(out[0], out[0].request_headers().response(), 1);
  settings_->fallbacks = 7;
  auto ex2 = New();
  Feed(*ex2, Headers("/v1/completions"));
  out = Feed(*ex2, Body(Completion("all"), true));
  CheckPick(out[0], out[0].request_headers().response(), 4);  // the pool has 4
}

TEST_F(ExchangeTest, ChatAndOtherPathsArePicked) {
  auto ex = New();
  Feed(*ex, Headers("/v1/chat/completions"));
  Responses out = Feed(*ex, Body(std::string("{\"model\":\"") + kModel +
                                     "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                                 true));
  ASSERT_EQ(out.size(), 2u);
  CheckPick(out[0], out[0].request_headers().response(), 3);
  // Not an OpenAI generation body: routed on the model alone, never a 400.
  auto ex2 = New();
  Feed(*ex2, Headers("/v1/embeddings"));
  out = Feed(*ex2, Body("{\"model\":\"m\",\"input\":[1,2,3]}", true));
  ASSERT_EQ(out.size(), 2u);
  CheckPick(out[0], out[0].request_headers().response(), 3);
  auto ex3 = New();
  Feed(*ex3, Headers("/v1/responses"));
  out = Feed(*ex3, Body("not even json", true));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].request_body().response().body_mutation().streamed_response().body(), "not even json");
}

TEST_F(ExchangeTest, SamePrefixGoesToTheSameEndpoint) {
  const std::string prompt = LongPrompt(8000, 'p');
  std::string first;
  for (int i = 0; i < 5; ++i) {
    auto ex = New();
    Feed(*ex, Headers("/v1/completions"));
    Responses out = Feed(*ex, Body(Completion(prompt + " question " + std::to_string(i)), true));
    ASSERT_EQ(out.size(), 2u);
    std::string winner = Split(ex->destination())[0];
    if (i == 0) first = winner;
    EXPECT_EQ(winner, first) << i;
    ex->Close(now_, false);
    now_ += 0.01;
  }
}

TEST_F(ExchangeTest, MalformedBodyIs400WithAnOpenAIBody) {
  auto ex = New();
  Feed(*ex, Headers("/v1/completions"));
  Responses out = Feed(*ex, Body("{\"model\": 12", true));
  ExpectImmediate(out, 400);
  EXPECT_TRUE(ex->done());
  EXPECT_TRUE(ex->finished());
  // Anything after the immediate response is ignored.
  EXPECT_TRUE(Feed(*ex, Body("more", true)).empty());
  EXPECT_EQ(Inflight(), 0.0);
  EXPECT_EQ(Requests("400"), 1.0);
  // A wrong-typed field is a 400 naming the field, as serve answers.
  auto ex2 = New();
  Feed(*ex2, Headers("/v1/completions"));
  out = Feed(*ex2, Body("{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":\"many\"}", true));
  ExpectImmediate(out, 400);
  EXPECT_NE(out[0].immediate_response().body().find("max_tokens"), std::string::npos);
}

TEST_F(ExchangeTest, BodyOverTheLimitIs413) {
  settings_->max_body_bytes = 1000;
  auto ex = New();
  Feed(*ex, Headers("/v1/completions"));
  EXPECT_TRUE(Feed(*ex, Body(std::string(600, ' '), false)).empty());
  ExpectImmediate(Feed(*ex, Body(std::string(600, ' '), false)), 413);
  EXPECT_EQ(Requests("413"), 1.0);
}

TEST_F(ExchangeTest, NoUsableEndpointIs503) {
  routing::ScrapeResult down;
  down.ok = false;
  down.connect_failed = true;
  down.sent_at_s = now_;
  ScrapeAll(down);
  auto ex = New();
  Feed(*ex, Headers("/v1/completions"));
  ExpectImmediate(Feed(*ex, Body(Completion("x"), true)), 503, "rejected-no-endpoints");
  EXPECT_EQ(Inflight(), 0.0);
  EXPECT_EQ(Requests("503"), 1.0);
}

TEST_F(ExchangeTest, SheddableRequestsGet429WhenThePoolIsSaturated) {
  settings_->objectives = {{"batch", -1}, {"critical", 10}};
  now_ += 0.01;  // a scrape must be newer than the last one to count
  ScrapeAll(Idle(now_, /*waiting=*/20));
  auto ex = New();
  Feed(*ex, Headers("/v1/completions", false, {{"x-gateway-inference-objective", "batch"}}));
  ExpectImmediate(Feed(*ex, Body(Completion("x"), true)), 429, "rejected-saturated");
  // The other objective header name, the same table.
  auto ex2 = New();
  Feed(*ex2, Headers("/v1/completions", false, {{"x-llm-d-inference-objective", "batch"}}));
  ExpectImmediate(Feed(*ex2, Body(Completion("x"), true)), 429, "rejected-saturated");
  // Not sheddable: still routed.
  for (const char* objective : {"critical", "unknown"}) {
    auto ex3 = New();
    Feed(*ex3, Headers("/v1/completions", false, {{"x-gateway-inference-objective", objective}}));
    EXPECT_EQ(Feed(*ex3, Body(Completion("x"), true)).size(), 2u) << objective;
  }
  // Not saturated: the sheddable one is routed too.
  now_ += 0.01;
  ScrapeAll(Idle(now_));
  auto ex4 = New();
  Feed(*ex4, Headers("/v1/completions", false, {{"x-gateway-inference-objective", "batch"}}));
  EXPECT_EQ(Feed(*ex4, Body(Completion("x"), true)).size(), 2u);
}

TEST_F(ExchangeTest, SubsetHintRestrictsThePick) {
  for (int round = 0; round < 8; ++round) {
    auto ex = New();
    pb::ProcessingRequest h = Headers("/v1/completions");
    SetSubset(h, {"10.0.0.3:8000", "10.0.0.4:8000", "192.168.9.9:1"});
    Feed(*ex, h);
    Responses out = Feed(*ex, Body(Completion("subset " + std::to_string(round)), true));
    ASSERT_EQ(out.size(), 2u);
    const std::string dest = CheckPick(out[0], out[0].request_headers().response(), 2);
    for (const auto& p : Split(dest)) EXPECT_TRUE(p == "10.0.0.3:8000" || p == "10.0.0.4:8000") << p;
  }
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  SetSubset(h, {"192.168.9.9:1"});
  Feed(*ex, h);
  ExpectImmediate(Feed(*ex, Body(Completion("x"), true)), 503, "rejected-no-endpoints");
}

// The current GIE spec's namespace for the hint, envoy.lb.subset_hint, works the same.
TEST_F(ExchangeTest, SubsetHintUnderTheSubsetHintNamespace) {
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  SetSubset(h, {"10.0.0.2:8000"}, "envoy.lb.subset_hint");
  Feed(*ex, h);
  Responses out = Feed(*ex, Body(Completion("namespaced subset"), true));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(CheckPick(out[0], out[0].request_headers().response(), 1), "10.0.0.2:8000");
}

TEST_F(ExchangeTest, ACancelledOrAbandonedStreamLeavesNothingInFlight) {
  {
    auto ex = New();
    Feed(*ex, Headers("/v1/completions"));
    Feed(*ex, Body(Completion("x"), true));
    EXPECT_EQ(Inflight(), 1.0);
    ex->Close(now_, true);
    EXPECT_EQ(Inflight(), 0.0);
    ex->Close(now_, true);  // idempotent
  }
  EXPECT_EQ(Requests("499"), 1.0);
  {
    auto ex = New();  // destroyed without Close after the pick
    Feed(*ex, Headers("/v1/completions"));
    Feed(*ex, Body(Completion("y"), true));
  }
  EXPECT_EQ(Inflight(), 0.0);
  {
    auto ex = New();  // cancelled mid-body
    Feed(*ex, Headers("/v1/completions"));
    Feed(*ex, Body("{\"mo", false));
    ex->Close(now_, true);
  }
  EXPECT_EQ(Inflight(), 0.0);
  EXPECT_EQ(Requests("499"), 3.0);
}

TEST_F(ExchangeTest, ResponsePathReadsServedEndpointStatusAndUsage) {
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  SetProtocol(h, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED);
  Feed(*ex, h);
  Feed(*ex, Body(Completion("usage"), true));
  const std::string fallback = Split(ex->destination())[1];
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "200");
  AddHeader(rh.mutable_response_headers(), std::string(kServedKey), fallback);
  Responses out = Feed(*ex, rh);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].has_response_headers());
  pb::ProcessingRequest b1;
  b1.mutable_response_body()->set_body("data: {\"choices\":[{\"text\":\"a\"}]}\n\n");
  out = Feed(*ex, b1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].response_body().response().body_mutation().streamed_response().body(),
            b1.response_body().body());
  EXPECT_EQ(Inflight(), 1.0);
  pb::ProcessingRequest b2;
  b2.mutable_response_body()->set_body(
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}"
      "\n\ndata: [DONE]\n\n");
  b2.mutable_response_body()->set_end_of_stream(true);
  out = Feed(*ex, b2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].response_body().response().body_mutation().streamed_response().end_of_stream());
  EXPECT_TRUE(ex->finished());
  EXPECT_EQ(Inflight(), 0.0);
  // Counted under the endpoint that served.
  std::string served_name;
  for (const auto& ep : core_.table()->by_id) {
    if (ep->spec.address == fallback) served_name = ep->spec.name;
  }
  std::string text;
  core_.AppendMetrics(text, now_);
  double served_count = 0;
  for (const auto& s : metrics::ParseAllSamples(text)) {
    if (s.name != "kvroute_requests_total") continue;
    bool ep = false, ok = false;
    for (const auto& [k, v] : s.labels) {
      ep = ep || (k == "endpoint" && v == served_name);
      ok = ok || (k == "code" && v == "200");
    }
    if (ep && ok) served_count += s.value;
  }
  EXPECT_EQ(served_count, 1.0) << served_name;
  std::string epp;
  stats_.AppendMetrics(epp, "pool", core_.Gauges(now_));
  EXPECT_NE(epp.find("inference_objective_input_tokens_total{model_name=\"test/model\",target_model_name=\"test/model\"} 12"),
            std::string::npos) << epp;
  EXPECT_NE(epp.find("inference_objective_output_tokens_total{model_name=\"test/model\",target_model_name=\"test/model\"} 3"),
            std::string::npos);
}

// Prefill/decode (issue 25): with an endpoint labelled llm-d.ai/role=prefill, a long
// prompt is routed to a decode endpoint with x-prefiller-host-port naming the prefill one
// (the llm-d contract); a short prompt gets no such header, and one a client sent is
// removed. The prefill's queued tokens are released when the response headers arrive.
// Sessions: the id and token headers reach the pick; the response headers get the token
// of the endpoint that served (the one Envoy reports, a fallback here).
TEST_F(ExchangeTest, SessionHeadersReachThePickAndTheServedEndpointsTokenIsWritten) {
  auto pick = [&](const std::string& header, const std::string& value, const std::string& served) {
    auto ex = New();
    pb::ProcessingRequest h = Headers("/v1/completions");
    AddHeader(h.mutable_request_headers(), header, value);
    Feed(*ex, h);
    Feed(*ex, Body(Completion("session " + value), true));
    const std::string winner = Split(ex->destination())[0];
    pb::ProcessingRequest rh;
    AddHeader(rh.mutable_response_headers(), ":status", "200");
    if (!served.empty()) AddHeader(rh.mutable_response_headers(), std::string(kServedKey), served);
    Responses out = Feed(*ex, rh);
    EXPECT_EQ(out.size(), 1u);
    EXPECT_EQ(HeaderSet(out[0].response_headers().response(), "x-session-token"),
              routing::EncodeSessionToken(served.empty() ? winner : served));
    return winner;
  };
  const std::string first = pick("X-Session-Id", "s1", "");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(pick("x-session-id", "s1", ""), first);
  EXPECT_EQ(core_.session_picks(routing::SessionOutcome::kBound), 5u);
  EXPECT_EQ(pick("x-session-token", routing::EncodeSessionToken("10.0.0.3:8000"), ""), "10.0.0.3:8000");
  EXPECT_EQ(core_.session_picks(routing::SessionOutcome::kToken), 1u);
  // Served by another endpoint than the pick: that one's token.
  pick("x-session-id", "s2", "10.0.0.4:8000");
  // Off: nothing read, nothing written.
  auto off = std::make_shared<ExchangeSettings>();
  off->sessions = false;
  settings_ = off;
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  AddHeader(h.mutable_request_headers(), "x-session-id", "s1");
  Feed(*ex, h);
  Feed(*ex, Body(Completion("off"), true));
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "200");
  Responses out = Feed(*ex, rh);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].response_headers().has_response());
  EXPECT_EQ(core_.session_picks(routing::SessionOutcome::kBound), 5u);
}

TEST_F(ExchangeTest, APairPickSetsThePrefillerHeaderAndRoutesToDecode) {
  std::vector<routing::EndpointSpec> eps;
  for (const auto& ep : core_.table()->by_id) eps.push_back(ep->spec);
  eps[0].labels = {{"llm-d.ai/role", "decode"}};
  eps[1].labels = {{"llm-d.ai/role", "decode"}};
  eps[2].labels = {{"llm-d.ai/role", "prefill"}};  // 10.0.0.3:8000; r3 unlabelled
  routing::CoreOptions o;
  o.scheduling.policy = "kvroute";
  ASSERT_TRUE(core_.Configure(o, eps, now_).ok());
  ScrapeAll(Idle(now_));
  auto queued = [&] {
    std::string text;
    core_.AppendMetrics(text, now_);
    for (const auto& smp : metrics::ParseAllSamples(text)) {
      if (smp.name == "kvroute_pd_prefill_queued_tokens") return smp.value;
    }
    return -1.0;
  };
  auto run = [&](const std::string& prompt, bool client_header, Exchange& ex) {
    std::vector<std::pair<std::string, std::string>> extra;
    if (client_header) extra.emplace_back("x-prefiller-host-port", "203.0.113.9:8000");
    pb::ProcessingRequest h = Headers("/v1/completions", false, extra);
    SetProtocol(h, mode_pb::ProcessingMode::BUFFERED);
    Feed(ex, h);
    Responses out = Feed(ex, Body(Completion(prompt), true));
    EXPECT_EQ(out.size(), 1u);
    return out.empty() ? pb::CommonResponse() : out[0].request_body().response();
  };
  auto ex = New();
  const pb::CommonResponse c = run(LongPrompt(6000, 'p'), true, *ex);
  EXPECT_EQ(HeaderSet(c, kPrefillerHeader), "10.0.0.3:8000");
  const std::vector<std::string> dest = Split(HeaderSet(c, kDestinationHeader));
  for (const std::string& d : dest) EXPECT_NE(d, "10.0.0.3:8000");  // decode-capable only
  EXPECT_EQ(c.header_mutation().remove_headers_size(), 0);
  EXPECT_GT(queued(), 1000.0);
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "200");
  Feed(*ex, rh);
  EXPECT_EQ(queued(), 0.0);
  // Short: no pair; the client's header is removed, not forwarded.
  auto ex2 = New();
  const pb::CommonResponse s2 = run("hello", true, *ex2);
  EXPECT_EQ(HeaderSet(s2, kPrefillerHeader), "<unset>");
  ASSERT_EQ(s2.header_mutation().remove_headers_size(), 1);
  EXPECT_EQ(s2.header_mutation().remove_headers(0), "x-prefiller-host-port");
  EXPECT_NE(HeaderSet(s2, kDestinationHeader), "10.0.0.3:8000");
  // A pair whose stream ends before any response releases its charge too.
  auto ex3 = New();
  run(LongPrompt(6000, 'q'), false, *ex3);
  EXPECT_GT(queued(), 1000.0);
  ex3->Close(now_, true);
  EXPECT_EQ(queued(), 0.0);
}

// The streamed answer's chunks with a choice are its token count: with the first one's
// time they give the latency model a TPOT observation, here against the request's
// objective (20 ms a token asked, 50 ms a token served: one violation).
TEST_F(ExchangeTest, StreamedChoiceChunksGiveTheTpotObservation) {
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  SetProtocol(h, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED);
  AddHeader(h.mutable_request_headers(), "x-llm-d-slo-tpot-ms", "20");
  Feed(*ex, h);
  Feed(*ex, Body("{\"model\":\"test/model\",\"prompt\":\"tpot\",\"max_tokens\":3,\"stream\":true}", true));
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "200");
  Feed(*ex, rh);
  const std::string chunk = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
  pb::ProcessingRequest b1;
  b1.mutable_response_body()->set_body(chunk + chunk.substr(0, 20));  // a chunk and a half
  now_ += 0.01;
  Feed(*ex, b1);  // the first token
  pb::ProcessingRequest b2;
  b2.mutable_response_body()->set_body(chunk.substr(20) + chunk + "data: [DONE]\n\n");
  b2.mutable_response_body()->set_end_of_stream(true);
  now_ += 0.1;  // two more tokens in 100 ms
  Feed(*ex, b2);
  ASSERT_TRUE(ex->finished());
  const routing::LatencyStats st = core_.latency_stats();
  EXPECT_EQ(st.tpot_slo.observed, 1u);
  EXPECT_EQ(st.tpot_slo.violated, 1u);
}

// An objective's own TPOT objective (epp.objectives NAME: {slo: ...}) applies when the
// request names the objective and states none: the same stream as above, violated.
TEST_F(ExchangeTest, AnObjectivesSloAppliesWhereTheHeadersStateNone) {
  settings_->objective_slos["chat"] = {0.0, 0.02};
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  SetProtocol(h, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED);
  AddHeader(h.mutable_request_headers(), "x-llm-d-inference-objective", "chat");
  Feed(*ex, h);
  Feed(*ex, Body("{\"model\":\"test/model\",\"prompt\":\"obj\",\"max_tokens\":3,\"stream\":true}", true));
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "200");
  Feed(*ex, rh);
  const std::string chunk = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
  pb::ProcessingRequest b1;
  b1.mutable_response_body()->set_body(chunk);
  now_ += 0.01;
  Feed(*ex, b1);
  pb::ProcessingRequest b2;
  b2.mutable_response_body()->set_body(chunk + chunk + "data: [DONE]\n\n");
  b2.mutable_response_body()->set_end_of_stream(true);
  now_ += 0.1;
  Feed(*ex, b2);
  ASSERT_TRUE(ex->finished());
  const routing::LatencyStats st = core_.latency_stats();
  EXPECT_EQ(st.tpot_slo.observed, 1u);
  EXPECT_EQ(st.tpot_slo.violated, 1u);
  EXPECT_EQ(st.ttft_slo.observed, 0u);  // chat states no TTFT objective
}

TEST_F(ExchangeTest, ServedEndpointFromMetadataAndStreamedResponseBodies) {
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  SetProtocol(h, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, mode_pb::ProcessingMode::STREAMED);
  Feed(*ex, h);
  Feed(*ex, Body(Completion("meta"), true));
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "500");
  auto& lb = (*rh.mutable_metadata_context()->mutable_filter_metadata())["envoy.lb"];
  (*lb.mutable_fields())[std::string(kServedKey)].set_string_value(Split(ex->destination())[2]);
  Feed(*ex, rh);
  pb::ProcessingRequest b;
  b.mutable_response_body()->set_body("{\"error\":\"x\"}");
  b.mutable_response_body()->set_end_of_stream(true);
  Responses out = Feed(*ex, b);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_response_body());
  EXPECT_FALSE(out[0].response_body().has_response());  // STREAMED: an empty answer
  EXPECT_EQ(Requests("500"), 1.0);
  EXPECT_EQ(Inflight(), 0.0);
}

TEST_F(ExchangeTest, ResponseTrailersAndHeadersEndOfStreamFinish) {
  auto ex = New();
  Feed(*ex, Headers("/v1/completions"));
  Feed(*ex, Body(Completion("t"), true));
  pb::ProcessingRequest rt;
  rt.mutable_response_trailers();
  Responses out = Feed(*ex, rt);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].has_response_trailers());
  EXPECT_TRUE(ex->finished());

  auto ex2 = New();
  Feed(*ex2, Headers("/v1/completions"));
  Feed(*ex2, Body(Completion("u"), true));
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "204");
  rh.mutable_response_headers()->set_end_of_stream(true);
  Feed(*ex2, rh);
  EXPECT_TRUE(ex2->finished());
  EXPECT_EQ(Requests("204"), 1.0);
  EXPECT_EQ(Inflight(), 0.0);
}

TEST_F(ExchangeTest, RequestTrailersEndAFullDuplexBody) {
  auto ex = New();
  Feed(*ex, Headers("/v1/completions"));
  Feed(*ex, Body(Completion("trailers"), false));
  pb::ProcessingRequest t;
  t.mutable_request_trailers();
  Responses out = Feed(*ex, t);
  ASSERT_EQ(out.size(), 3u);
  CheckPick(out[0], out[0].request_headers().response(), 3);
  EXPECT_FALSE(out[1].request_body().response().body_mutation().streamed_response().end_of_stream());
  EXPECT_TRUE(out[2].has_request_trailers());
}

TEST_F(ExchangeTest, ObservabilityModeAnswersNothing) {
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  h.set_observability_mode(true);
  EXPECT_TRUE(Feed(*ex, h).empty());
  EXPECT_TRUE(Feed(*ex, Body(Completion("o"), true)).empty());
  EXPECT_FALSE(ex->destination().empty());
}

TEST_F(ExchangeTest, OutOfOrderMessagesGetAnswersOfTheirKind) {
  auto ex = New();
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "200");
  Responses out = Feed(*ex, rh);  // a response before any request: answered, ignored
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].has_response_headers());
  // A body without headers: gathered and picked like any other.
  out = Feed(*ex, Body(Completion("nohead"), true));
  ASSERT_EQ(out.size(), 2u);
  // A second request_headers after the pick: an empty answer.
  out = Feed(*ex, Headers("/v1/completions"));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].has_request_headers());
  EXPECT_FALSE(out[0].request_headers().has_response());
  pb::ProcessingRequest empty;
  EXPECT_TRUE(Feed(*ex, empty).empty());
}

TEST_F(ExchangeTest, StatsCountRequestsErrorsAndPickDurations) {
  for (int i = 0; i < 3; ++i) {
    auto ex = New();
    Feed(*ex, Headers("/v1/completions"));
    Feed(*ex, Body(Completion("s" + std::to_string(i)), true));
  }
  auto bad = New();
  Feed(*bad, Headers("/v1/completions", false, {{"x-gateway-model-name", "m2"}}));
  Feed(*bad, Body("[", true));
  EXPECT_EQ(stats_.requests(), 4u);
  EXPECT_EQ(stats_.picks_timed(), 3u);
  std::string text;
  stats_.AppendMetrics(text, "pool", core_.Gauges(now_));
  EXPECT_NE(text.find("inference_objective_request_total{model_name=\"test/model\",target_model_name=\"test/model\"} 3"),
            std::string::npos) << text;
  EXPECT_NE(text.find("inference_objective_request_error_total{model_name=\"m2\",target_model_name=\"m2\",error_code=\"400\"} 1"),
            std::string::npos) << text;
  EXPECT_NE(text.find("inference_pool_ready_pods{name=\"pool\"} 4"), std::string::npos);
  EXPECT_NE(text.find("inference_pool_average_kv_cache_utilization{name=\"pool\"}"), std::string::npos);
  EXPECT_NE(text.find("inference_pool_average_queue_size{name=\"pool\"}"), std::string::npos);
  EXPECT_NE(text.find("inference_extension_scheduler_e2e_duration_seconds_count 3"), std::string::npos);
}

// llm-d Router v1.0's names (REFERENCE.md 17) next to the older ones, with the same
// samples; the pool's spread over the ready endpoints.
TEST_F(ExchangeTest, LlmdNamesTwinTheOlderOnesAndThePoolSpreadIsExact) {
  for (const auto& ep : core_.table()->by_id) {
    routing::ScrapeResult r = Idle(now_, /*waiting=*/ep->id, /*kv=*/0.1 * (ep->id + 1));
    r.metrics.running = 2.0 * (ep->id + 1);
    core_.OnScrape(ep->id, r, now_);
  }
  auto ex = New();
  Feed(*ex, Headers("/v1/completions"));
  Feed(*ex, Body(Completion("hello"), true));
  ex->Close(now_, false);
  std::string text;
  stats_.AppendMetrics(text, "pool", core_.Gauges(now_));
  std::map<std::string, double> v;  // name{labels} -> value
  for (const auto& smp : metrics::ParseAllSamples(text)) {
    std::string key = smp.name;
    for (const auto& [k, val] : smp.labels) key += "," + k + "=" + val;
    v[key] += smp.value;
  }
  for (const auto& [now, old] : std::vector<std::pair<std::string, std::string>>{
           {"llm_d_epp_average_kv_cache_utilization", "inference_pool_average_kv_cache_utilization"},
           {"llm_d_epp_average_queue_size", "inference_pool_average_queue_size"},
           {"llm_d_epp_ready_endpoints", "inference_pool_ready_pods"},
           {"llm_d_epp_scheduler_e2e_duration_seconds_count", "inference_extension_scheduler_e2e_duration_seconds_count"}}) {
    bool found = false;
    for (const auto& [key, val] : v) {
      if (key.rfind(now + ",", 0) != 0 && key != now) continue;
      found = true;
      EXPECT_EQ(v[old + key.substr(now.size())], val) << key;
    }
    EXPECT_TRUE(found) << now << "\n" << text;
  }
  EXPECT_EQ(v["llm_d_epp_request_total,model_name=test/model,target_model_name=test/model,fairness_id=default-flow,"
              "priority=0"], 1);
  EXPECT_EQ(v["inference_objective_request_total,model_name=test/model,target_model_name=test/model"], 1);
  EXPECT_EQ(v["llm_d_epp_ready_endpoints,name=pool"], 4);
  // The request finished: the scraped figures exactly (queues 0..3, KV 0.1..0.4, running
  // 2..8), the spread as a population standard deviation.
  for (int i = 0; i < 4; ++i) {
    const std::string addr = "10.0.0." + std::to_string(i + 1) + ":8000";
    EXPECT_EQ(v["llm_d_epp_per_endpoint_queue_size,name=pool,model_server_endpoint=" + addr], i) << addr;
    EXPECT_EQ(v["inference_pool_per_pod_queue_size,name=pool,model_server_pod=" + addr], i) << addr;
  }
  EXPECT_DOUBLE_EQ(v["llm_d_epp_average_queue_size,name=pool"], 1.5);
  EXPECT_NEAR(v["llm_d_epp_std_dev_queue_size,name=pool"], std::sqrt(1.25), 1e-9);
  EXPECT_DOUBLE_EQ(v["llm_d_epp_average_running_requests,name=pool"], 5.0);
  // KV usage is the adjusted one: the finished request's estimate leaves a few millionths.
  EXPECT_NEAR(v["llm_d_epp_average_kv_cache_utilization,name=pool"], 0.25, 1e-4);
  EXPECT_NEAR(v["llm_d_epp_std_dev_kv_cache_utilization,name=pool"], std::sqrt(0.0125), 1e-4);
}

// llm_d_epp_request_*: a streamed request's duration, TTFT, time per output token and
// tokens land in the buckets its timeline gives; running while it is answered.
TEST_F(ExchangeTest, RequestSeriesFollowTheResponsesTimeline) {
  auto sample = [&](std::string_view name, std::vector<std::pair<std::string, std::string>> want) {
    std::string text;
    stats_.AppendMetrics(text, "pool", core_.Gauges(now_));
    for (const auto& smp : metrics::ParseAllSamples(text)) {
      if (smp.name != name) continue;
      bool all = true;
      for (const auto& w : want) {
        bool has = false;
        for (const auto& l : smp.labels) has = has || l == w;
        all = all && has;
      }
      if (all) return smp.value;
    }
    return -1.0;
  };
  auto ex = New();
  pb::ProcessingRequest h = Headers("/v1/completions");
  SetProtocol(h, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED);
  const double start = now_;
  Feed(*ex, h);
  now_ += 0.05;  // the body arrives: the pick
  Feed(*ex, Body(Completion("timeline"), true));
  EXPECT_EQ(sample("llm_d_epp_request_running", {{"model_name", kModel}}), 1);
  EXPECT_EQ(sample("llm_d_epp_scheduler_attempts_total", {{"status", "success"}}), 1);
  now_ += 0.1;
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "200");
  Feed(*ex, rh);
  now_ += 0.15;  // first byte 0.25 s after the pick
  pb::ProcessingRequest b1;
  b1.mutable_response_body()->set_body("data: {\"choices\":[{\"text\":\"a\"}]}\n\n");
  Feed(*ex, b1);
  now_ += 0.9;  // 10 more tokens: 90 ms each
  pb::ProcessingRequest b2;
  b2.mutable_response_body()->set_body(
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":11,"
      "\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n");
  b2.mutable_response_body()->set_end_of_stream(true);
  Feed(*ex, b2);
  EXPECT_EQ(sample("llm_d_epp_request_running", {{"model_name", kModel}}), 0);
  const std::vector<std::pair<std::string, std::string>> m = {{"model_name", kModel}};
  // Duration 1.2 s (headers to the end): in (1.0, 1.5].
  EXPECT_NEAR(sample("llm_d_epp_request_duration_seconds_sum", m), now_ - start, 1e-9);
  EXPECT_EQ(sample("llm_d_epp_request_duration_seconds_bucket", {{"model_name", kModel}, {"le", "1.0"}}), 0);
  EXPECT_EQ(sample("llm_d_epp_request_duration_seconds_bucket", {{"model_name", kModel}, {"le", "1.5"}}), 1);
  // TTFT 0.25 s (pick to first byte): in (0.1, 0.25].
  EXPECT_NEAR(sample("llm_d_epp_request_ttft_seconds_sum", m), 0.25, 1e-9);
  EXPECT_EQ(sample("llm_d_epp_request_ttft_seconds_bucket", {{"model_name", kModel}, {"le", "0.1"}}), 0);
  EXPECT_EQ(sample("llm_d_epp_request_ttft_seconds_bucket", {{"model_name", kModel}, {"le", "0.25"}}), 1);
  // 0.9 s over the 10 tokens after the first.
  EXPECT_NEAR(sample("llm_d_epp_request_ntpot_seconds_sum", m), 0.09, 1e-9);
  EXPECT_EQ(sample("llm_d_epp_request_input_tokens_sum", m), 40);
  EXPECT_EQ(sample("llm_d_epp_request_output_tokens_sum", m), 11);
  EXPECT_EQ(sample("llm_d_epp_request_cached_tokens_sum", m), 16);
  EXPECT_EQ(sample("llm_d_epp_request_cached_tokens_bucket", {{"model_name", kModel}, {"le", "8.0"}}), 0);
  EXPECT_EQ(sample("llm_d_epp_request_cached_tokens_bucket", {{"model_name", kModel}, {"le", "16.0"}}), 1);
  // A request refused for want of an endpoint counts as a failed attempt, never running.
  routing::ScrapeResult down;  // every endpoint refuses connections: nothing usable
  down.ok = false;
  down.connect_failed = true;
  down.sent_at_s = now_;
  ScrapeAll(down);
  auto refused = New();
  Feed(*refused, Headers("/v1/completions"));
  Feed(*refused, Body(Completion("none"), true));
  EXPECT_EQ(sample("llm_d_epp_scheduler_attempts_total", {{"status", "failure"}}), 1);
  EXPECT_EQ(sample("llm_d_epp_request_duration_seconds_count", m), 1);
}

// Deferred pick (flow control in `kvroute epp`): the exchange stops where it would pick,
// emits nothing, and answers exactly as it would have when Resume comes.
TEST_F(ExchangeTest, DeferredPickHoldsTheAnswerUntilResume) {
  settings_->defer_pick = true;
  const std::string body = Completion(LongPrompt(500, 'd'));
  auto ex = New();
  EXPECT_TRUE(Feed(*ex, Headers("/v1/completions")).empty());
  EXPECT_TRUE(Feed(*ex, Body(body, true)).empty());
  EXPECT_TRUE(ex->held());
  EXPECT_EQ(ex->priority(), 0);
  EXPECT_EQ(ex->held_bytes(), body.size());
  EXPECT_EQ(Inflight(), 0.0);
  // Envoy sends nothing more while it waits; anything it does send gets no answer.
  EXPECT_TRUE(Feed(*ex, Body("late", true)).empty());
  now_ += 0.5;
  Responses out;
  ex->Resume(now_, out);
  EXPECT_FALSE(ex->held());
  ASSERT_EQ(out.size(), 2u);
  CheckPick(out[0], out[0].request_headers().response(), 3);
  EXPECT_EQ(HeaderSet(out[0].request_headers().response(), "Content-Length"), std::to_string(body.size()));
  EXPECT_EQ(out[1].request_body().response().body_mutation().streamed_response().body(), body);
  EXPECT_EQ(Inflight(), 1.0);
  Responses again;
  ex->Resume(now_, again);  // not held any more: nothing
  EXPECT_TRUE(again.empty());
  ex->Close(now_, false);
  EXPECT_EQ(Inflight(), 0.0);
  EXPECT_EQ(Requests("200"), 1.0);
}

TEST_F(ExchangeTest, DeferredPickInBufferedModeAndOnHeadersAlone) {
  settings_->defer_pick = true;
  settings_->body_mode = BodyMode::kBuffered;
  auto ex = New();
  Responses h = Feed(*ex, Headers("/v1/completions"));
  ASSERT_EQ(h.size(), 1u);  // CONTINUE for the headers, as without deferral
  EXPECT_TRUE(h[0].has_request_headers());
  EXPECT_TRUE(Feed(*ex, Body(Completion("buffered"), true)).empty());
  ASSERT_TRUE(ex->held());
  Responses out;
  ex->Resume(now_, out);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_request_body());
  CheckPick(out[0], out[0].request_body().response(), 3);

  auto bodiless = New();
  EXPECT_TRUE(Feed(*bodiless, Headers("/v1/models", true, {{"x-gateway-model-name", kModel}})).empty());
  ASSERT_TRUE(bodiless->held());
  EXPECT_EQ(bodiless->held_bytes(), 0u);
  Responses out2;
  bodiless->Resume(now_, out2);
  ASSERT_EQ(out2.size(), 1u);
  CheckPick(out2[0], out2[0].request_headers().response(), 3);
}

TEST_F(ExchangeTest, DeferredPickAfterRequestTrailersEmitsTheTrailersAnswerOnResume) {
  settings_->defer_pick = true;
  auto ex = New();
  Feed(*ex, Headers("/v1/completions"));
  Feed(*ex, Body(Completion("trailers"), false));
  pb::ProcessingRequest t;
  t.mutable_request_trailers();
  EXPECT_TRUE(Feed(*ex, t).empty());
  Responses out;
  ex->Resume(now_, out);
  ASSERT_EQ(out.size(), 3u);
  CheckPick(out[0], out[0].request_headers().response(), 3);
  EXPECT_TRUE(out[2].has_request_trailers());
}

TEST_F(ExchangeTest, DeferredPickRefusedWithRetryAfterOr503) {
  settings_->defer_pick = true;
  settings_->objectives = {{"batch", -1}};
  now_ += 0.01;
  ScrapeAll(Idle(now_, /*waiting=*/20));  // saturated: the exchange still holds, not sheds
  auto ex = New();
  Feed(*ex, Headers("/v1/completions", false, {{"x-gateway-inference-objective", "batch"}}));
  EXPECT_TRUE(Feed(*ex, Body(Completion("x"), true)).empty());
  ASSERT_TRUE(ex->held());
  EXPECT_EQ(ex->priority(), -1);
  EXPECT_EQ(ex->objective(), "batch");
  Responses out;
  ex->Refuse(429, "Too many requests.", "1", "rejected-ttl-expired", now_, out);
  ASSERT_EQ(out.size(), 1u);
  const pb::ImmediateResponse& ir = out[0].immediate_response();
  EXPECT_EQ(static_cast<int>(ir.status().code()), 429);
  ASSERT_EQ(ir.headers().set_headers_size(), 3);
  EXPECT_EQ(ir.headers().set_headers(1).header().key(), "retry-after");
  EXPECT_EQ(ir.headers().set_headers(1).header().raw_value(), "1");
  EXPECT_EQ(ir.headers().set_headers(2).header().key(), "x-llm-d-request-dropped-reason");
  EXPECT_EQ(ir.headers().set_headers(2).header().raw_value(), "rejected-ttl-expired");
  EXPECT_NE(ir.body().find("RateLimitError"), std::string::npos) << ir.body();
  EXPECT_TRUE(ex->done());
  EXPECT_TRUE(ex->finished());
  EXPECT_EQ(Requests("429"), 1.0);

  auto ex2 = New();
  Feed(*ex2, Headers("/v1/completions"));
  Feed(*ex2, Body(Completion("y"), true));
  Responses out2;
  ex2->Refuse(503, "No usable endpoint.", "", "rejected-no-endpoints", now_, out2);
  ExpectImmediate(out2, 503, "rejected-no-endpoints");
  EXPECT_EQ(Requests("503"), 1.0);
  EXPECT_EQ(Inflight(), 0.0);
}

TEST_F(ExchangeTest, DeferredPickClosedWhileHeldFinishesAs499AndErrorsStayImmediate) {
  settings_->defer_pick = true;
  auto ex = New();
  Feed(*ex, Headers("/v1/completions"));
  Feed(*ex, Body(Completion("x"), true));
  ASSERT_TRUE(ex->held());
  ex->Close(now_, true);
  EXPECT_FALSE(ex->held());
  Responses out;
  ex->Resume(now_, out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(Inflight(), 0.0);
  EXPECT_EQ(Requests("499"), 1.0);
  // A malformed body is still answered at once: nothing to hold.
  auto bad = New();
  Feed(*bad, Headers("/v1/completions"));
  ExpectImmediate(Feed(*bad, Body("{\"model\":", true)), 400);
  EXPECT_FALSE(bad->held());
}

TEST_F(ExchangeTest, FlowKeyIsTheFlowHeaderElseTheFairnessIdElseTheObjective) {
  settings_->defer_pick = true;
  settings_->flow_header = "x-tenant-id";
  auto ex = New();
  Feed(*ex, Headers("/v1/completions", true, {{"x-gateway-inference-objective", "chat"}, {"X-Tenant-Id", " t1 "}}));
  EXPECT_EQ(ex->flow_key(), "t1");
  auto ex2 = New();
  Feed(*ex2, Headers("/v1/completions", true, {{"x-gateway-inference-objective", "chat"}}));
  EXPECT_EQ(ex2->flow_key(), "chat");
  // Without its flow header (or without one configured): the fairness id, llm-d's header
  // before the older one, whatever their order.
  settings_->flow_header.clear();
  auto ex3 = New();
  Feed(*ex3, Headers("/v1/completions", true,
                     {{"x-gateway-inference-objective", "chat"}, {"x-gateway-inference-fairness-id", "old"},
                      {"x-llm-d-inference-fairness-id", "team-a"}}));
  EXPECT_EQ(ex3->flow_key(), "team-a");
  auto ex4 = New();
  Feed(*ex4, Headers("/v1/completions", true,
                     {{"x-llm-d-inference-fairness-id", "team-b"}, {"x-gateway-inference-fairness-id", "old"}}));
  EXPECT_EQ(ex4->flow_key(), "team-b");
  auto ex5 = New();
  Feed(*ex5, Headers("/v1/completions", true, {{"x-gateway-inference-fairness-id", "team-c"}}));
  EXPECT_EQ(ex5->flow_key(), "team-c");
}

// The request series carry llm-d's {model_name, target_model_name, fairness_id,
// priority}; the older names keep {model_name, target_model_name}, summed over the rest.
TEST_F(ExchangeTest, RequestSeriesCarryTheFairnessIdAndPriority) {
  settings_->objectives = {{"critical", 2}, {"batch", -1}};
  auto run = [&](std::vector<std::pair<std::string, std::string>> headers, std::string body) {
    auto ex = New();
    Feed(*ex, Headers("/v1/completions", false, std::move(headers)));
    Feed(*ex, Body(std::move(body), true));
    ex->Close(now_, false);
  };
  run({{"x-llm-d-inference-fairness-id", "tenant-a"}, {"x-llm-d-inference-objective", "critical"}}, Completion("a"));
  run({{"x-llm-d-inference-fairness-id", "tenant-a"}, {"x-gateway-inference-objective", "critical"}}, Completion("b"));
  run({{"x-gateway-inference-fairness-id", "tenant-b"}, {"x-llm-d-inference-objective", "batch"}}, Completion("c"));
  run({}, Completion("d"));
  run({{"x-llm-d-inference-fairness-id", "tenant-b"}, {"x-gateway-model-name", "m2"}}, "[");
  std::string text;
  stats_.AppendMetrics(text, "pool", core_.Gauges(now_));
  for (std::string_view line : {
           "llm_d_epp_request_total{model_name=\"test/model\",target_model_name=\"test/model\","
           "fairness_id=\"default-flow\",priority=\"0\"} 1.0\n",
           "llm_d_epp_request_total{model_name=\"test/model\",target_model_name=\"test/model\","
           "fairness_id=\"tenant-a\",priority=\"2\"} 2.0\n",
           "llm_d_epp_request_total{model_name=\"test/model\",target_model_name=\"test/model\","
           "fairness_id=\"tenant-b\",priority=\"-1\"} 1.0\n",
           "llm_d_epp_request_total{model_name=\"m2\",target_model_name=\"m2\",fairness_id=\"tenant-b\","
           "priority=\"0\"} 1.0\n",
           "llm_d_epp_request_error_total{model_name=\"m2\",target_model_name=\"m2\",fairness_id=\"tenant-b\","
           "priority=\"0\",error_code=\"400\"} 1.0\n",
           "llm_d_epp_request_running{model_name=\"test/model\",target_model_name=\"test/model\","
           "fairness_id=\"tenant-a\",priority=\"2\"} 0.0\n",
           "llm_d_epp_request_duration_seconds_count{model_name=\"test/model\",target_model_name=\"test/model\","
           "fairness_id=\"tenant-a\",priority=\"2\"} 2.0\n",
           "inference_objective_request_total{model_name=\"test/model\",target_model_name=\"test/model\"} 4.0\n",
           "inference_objective_request_total{model_name=\"m2\",target_model_name=\"m2\"} 1.0\n",
           "inference_objective_request_error_total{model_name=\"m2\",target_model_name=\"m2\","
           "error_code=\"400\"} 1.0\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
  }
  EXPECT_EQ(text.find("inference_objective_request_total{model_name=\"test/model\",target_model_name=\"test/model\","
                      "fairness_id"),
            std::string::npos);
}

// A client names its fairness id: at most kMaxFairnessIds of them get series of their own
// per model, the rest count as "other".
TEST_F(ExchangeTest, FairnessIdsPerModelAreBoundedWithTheRestAsOther) {
  const std::size_t n = EppStats::kMaxFairnessIds + 5;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string id = "t" + std::to_string(i);
    const EppStats::RequestLabels l{kModel, kModel, id, 0};
    stats_.OnRequest(l);
    stats_.OnRequest(l);
  }
  stats_.OnRequest({kModel, kModel, "t0", 0});  // one already seen keeps its own
  stats_.OnRequest({"other-model", "other-model", "t40", 0});  // per model
  std::string text;
  stats_.AppendMetrics(text, "pool", core_.Gauges(now_));
  std::size_t own = 0;
  double other = -1;
  for (const auto& smp : metrics::ParseAllSamples(text)) {
    if (smp.name != "llm_d_epp_request_total") continue;
    std::string model, flow;
    for (const auto& [k, v] : smp.labels) {
      if (k == "model_name") model = v;
      if (k == "fairness_id") flow = v;
    }
    if (model == "other-model") {
      EXPECT_EQ(flow, "t40");
      continue;
    }
    if (flow == "other") {
      other = smp.value;
    } else {
      ++own;
      EXPECT_EQ(smp.value, flow == "t0" ? 3 : 2) << flow;
    }
  }
  EXPECT_EQ(own, EppStats::kMaxFairnessIds);
  EXPECT_EQ(other, 10);
}

// x-llm-d-model-name-rewrite: the body sent upstream names the new model where this
// answer can still change it (buffered: a body mutation; full duplex: the re-emitted
// body), the header is not forwarded, and target_model_name carries the new name.
TEST_F(ExchangeTest, ModelNameRewriteReplacesTheBodysModelAndIsConsumed) {
  const std::string body = Completion("rewrite me");
  std::string want = body;
  want.replace(want.find("\"test/model\""), std::string("\"test/model\"").size(), "\"adapter-7\"");
  {
    settings_->body_mode = BodyMode::kBuffered;
    auto ex = New();
    Feed(*ex, Headers("/v1/completions", false, {{"x-llm-d-model-name-rewrite", "adapter-7"}}));
    Responses out = Feed(*ex, Body(body, true));
    ASSERT_EQ(out.size(), 1u);
    const pb::CommonResponse& c = out[0].request_body().response();
    CheckPick(out[0], c, 3);
    EXPECT_EQ(c.body_mutation().body(), want);
    EXPECT_EQ(HeaderSet(c, "Content-Length"), std::to_string(want.size()));
    ASSERT_GE(c.header_mutation().remove_headers_size(), 1);
    EXPECT_EQ(c.header_mutation().remove_headers(0), "x-llm-d-model-name-rewrite");
    ex->Close(now_, false);
  }
  {
    settings_->body_mode = BodyMode::kFullDuplexStreamed;
    auto ex = New();
    Feed(*ex, Headers("/v1/completions", false, {{"X-LLM-D-Model-Name-Rewrite", " adapter-7 "}}));
    Responses out = Feed(*ex, Body(body, true));
    ASSERT_EQ(out.size(), 2u);
    const pb::CommonResponse& c = out[0].request_headers().response();
    EXPECT_EQ(HeaderSet(c, "Content-Length"), std::to_string(want.size()));
    EXPECT_EQ(c.header_mutation().remove_headers(0), "x-llm-d-model-name-rewrite");
    EXPECT_EQ(out[1].request_body().response().body_mutation().streamed_response().body(), want);
    ex->Close(now_, false);
  }
  {
    // Streamed: the earlier chunks went upstream as they were; the header is still
    // consumed and the series name the model it was asked to be.
    settings_->body_mode = BodyMode::kStreamed;
    auto ex = New();
    Feed(*ex, Headers("/v1/completions", false, {{"x-llm-d-model-name-rewrite", "adapter-7"}}));
    Feed(*ex, Body(body.substr(0, 10), false));
    Responses out = Feed(*ex, Body(body.substr(10), true));
    ASSERT_EQ(out.size(), 1u);
    const pb::CommonResponse& c = out[0].request_body().response();
    EXPECT_FALSE(c.has_body_mutation());
    EXPECT_EQ(c.header_mutation().remove_headers(0), "x-llm-d-model-name-rewrite");
    ex->Close(now_, false);
  }
  std::string text;
  stats_.AppendMetrics(text, "pool", core_.Gauges(now_));
  EXPECT_NE(text.find("llm_d_epp_request_total{model_name=\"test/model\",target_model_name=\"adapter-7\","
                      "fairness_id=\"default-flow\",priority=\"0\"} 3.0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("inference_objective_request_total{model_name=\"test/model\",target_model_name=\"adapter-7\"} 3.0\n"),
            std::string::npos);
}

// llm_d_epp_plugin_duration_seconds: each filter, scorer and the picker of the profile
// timed once per pick with the core's timer (here a clock that moves 1/1024 s per read:
// every call takes exactly that, in the (0.0005, 0.001] bucket).
TEST_F(ExchangeTest, PluginDurationsTimeEachPluginCallOfAPick) {
  double clock = 0.0;
  core_.set_pick_timer([&clock] { return clock += 1.0 / 1024; });
  for (int i = 0; i < 2; ++i) {
    auto ex = New();
    Feed(*ex, Headers("/v1/completions"));
    Feed(*ex, Body(Completion("p" + std::to_string(i)), true));
    ex->Close(now_, false);
  }
  std::string text;
  core_.AppendMetrics(text, now_);
  core_.set_pick_timer(nullptr);
  std::size_t families = 0;
  std::set<std::string> points;
  for (const auto& smp : metrics::ParseAllSamples(text)) {
    const bool now_name = smp.name == "llm_d_epp_plugin_duration_seconds_count";
    const bool old_name = smp.name == "inference_extension_plugin_duration_seconds_count";
    if (!now_name && !old_name) continue;
    ++families;
    std::string point, type, name;
    for (const auto& [k, v] : smp.labels) {
      if (k == "extension_point") point = v;
      if (k == "plugin_type") type = v;
      if (k == "plugin_name") name = v;
    }
    EXPECT_FALSE(type.empty());
    EXPECT_FALSE(name.empty());
    EXPECT_EQ(smp.value, 2) << point << " " << type;
    if (now_name) points.insert(point);
  }
  EXPECT_GE(families, 6u) << text;
  EXPECT_EQ(points, (std::set<std::string>{"Filter", "Scorer", "Picker"})) << text;
  for (std::string_view line : {
           "llm_d_epp_plugin_duration_seconds_sum{extension_point=\"Picker\",plugin_type=\"max-score-picker\","
           "plugin_name=\"max-score-picker\"} 0.001953125\n",
           "llm_d_epp_plugin_duration_seconds_bucket{extension_point=\"Scorer\",plugin_type=\"prefix-cache-scorer\","
           "plugin_name=\"prefix-cache-scorer\",le=\"0.0005\"} 0.0\n",
           "llm_d_epp_plugin_duration_seconds_bucket{extension_point=\"Scorer\",plugin_type=\"prefix-cache-scorer\","
           "plugin_name=\"prefix-cache-scorer\",le=\"0.001\"} 2.0\n",
           "inference_extension_plugin_duration_seconds_count{extension_point=\"Filter\","
           "plugin_type=\"saturation-filter\",plugin_name=\"saturation-filter\"} 2.0\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
  }
}

// capture: a request the sample takes is handed over when it ends, with what the gateway
// showed of it (served endpoint, first byte, usage); one it does not take never is.
class RecordingSink : public capture::Sink {
 public:
  bool Sample() override { return take; }
  uint64_t key() const override { return 42; }
  int64_t block_size() const override { return 4; }
  void Submit(capture::Entry&& e) override { entries.push_back(std::move(e)); }
  bool take = true;
  std::vector<capture::Entry> entries;
};

TEST_F(ExchangeTest, ACapturedRequestIsHandedOverWhenItEndsWithWhatTheGatewayShowed) {
  RecordingSink sink;
  ExchangeEnv env;
  env.core = &core_;
  env.stats = &stats_;
  env.timer = [this] { return now_; };
  env.capture = &sink;
  auto ex = std::make_unique<Exchange>(env, settings_);
  pb::ProcessingRequest h = Headers("/v1/completions?x=1");
  SetProtocol(h, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED, mode_pb::ProcessingMode::FULL_DUPLEX_STREAMED);
  Feed(*ex, h);
  Feed(*ex, Body(Completion("captured prompt text"), true));
  const std::string served = Split(ex->destination())[1];
  pb::ProcessingRequest rh;
  AddHeader(rh.mutable_response_headers(), ":status", "200");
  AddHeader(rh.mutable_response_headers(), std::string(kServedKey), served);
  now_ = 1.25;
  Feed(*ex, rh);
  pb::ProcessingRequest b;
  b.mutable_response_body()->set_body(
      "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15,"
      "\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n");
  b.mutable_response_body()->set_end_of_stream(true);
  EXPECT_TRUE(sink.entries.empty());  // not before it ends
  Feed(*ex, b);
  ASSERT_EQ(sink.entries.size(), 1u);
  const capture::Entry& e = sink.entries[0];
  EXPECT_EQ(e.status, 200);
  EXPECT_EQ(e.api, "/v1/completions");
  EXPECT_EQ(e.model, "test/model");
  for (const auto& ep : core_.table()->by_id) {
    if (ep->spec.address == served) {
      EXPECT_EQ(e.endpoint, ep->spec.name);
    }
  }
  EXPECT_DOUBLE_EQ(e.arrival_s, 1.0);
  EXPECT_DOUBLE_EQ(e.ttft_s, 0.25);
  EXPECT_EQ(e.prompt_tokens, 12);
  EXPECT_EQ(e.output_tokens, 3);
  EXPECT_EQ(e.cached_tokens, 8);
  EXPECT_EQ(e.prompt.hashes, capture::HashPrompt(42, {}, "captured prompt text", 4).hashes);

  // Not sampled: nothing, also when the request ends in an error.
  sink.take = false;
  auto other = std::make_unique<Exchange>(env, settings_);
  Feed(*other, Headers("/v1/completions"));
  Feed(*other, Body(Completion("x"), true));
  other->Close(now_, true);
  EXPECT_EQ(sink.entries.size(), 1u);
}

TEST(FindUsageTest, ReadsTheLastUsageObject) {
  Usage u = FindUsage("{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}} ... "
                      "{\"usage\": {\"prompt_tokens\": 40, \"completion_tokens\": 7}}");
  EXPECT_EQ(u.prompt_tokens, 40);
  EXPECT_EQ(u.completion_tokens, 7);
  u = FindUsage("no usage here");
  EXPECT_EQ(u.prompt_tokens, -1);
  u = FindUsage("\"usage\":null}");
  EXPECT_EQ(u.completion_tokens, -1);
}

}  // namespace
}  // namespace kvroute::extproc

namespace kvroute::extproc {
namespace {

TEST(FindUsageTest, ReadsTheNestedCachedTokens) {
  Usage u = FindUsage(
      R"(data: {"choices":[],"usage":{"prompt_tokens":800,"total_tokens":801,"completion_tokens":1,)"
      R"("prompt_tokens_details":{"cached_tokens":784}}})"
      "\n\ndata: [DONE]\n\n");
  EXPECT_EQ(u.prompt_tokens, 800);
  EXPECT_EQ(u.completion_tokens, 1);
  EXPECT_EQ(u.cached_tokens, 784);
  EXPECT_EQ(FindUsage(R"({"usage":{"prompt_tokens":3}})").cached_tokens, -1);
}

TEST_F(ExchangeTest, WithTokenIdsWantedThePickWaitsForThem) {
  ExchangeEnv env;
  env.core = &core_;
  env.stats = &stats_;
  env.want_token_ids = [] { return true; };
  Exchange ex(env, settings_);
  const std::string prompt = LongPrompt(200, 't');
  EXPECT_TRUE(Feed(ex, Headers("/v1/completions")).empty());
  EXPECT_TRUE(Feed(ex, Body(Completion(prompt), true)).empty());
  EXPECT_TRUE(ex.awaiting_token_ids());
  EXPECT_TRUE(ex.held());
  const TokenInput in = ex.token_input();
  EXPECT_EQ(in.endpoint, api::Endpoint::kCompletions);
  EXPECT_EQ(in.model, kModel);
  EXPECT_EQ(in.prompt, prompt);
  EXPECT_TRUE(in.body.empty());
  // Resume does nothing while the ids are awaited.
  Responses out;
  ex.Resume(now_, out);
  EXPECT_TRUE(out.empty());
  ex.OnTokenIds({1, 2, 3}, now_, out);
  EXPECT_FALSE(ex.held());
  ASSERT_EQ(out.size(), 2u);
  ASSERT_TRUE(out[0].has_request_headers());
  CheckPick(out[0], out[0].request_headers().response(), 3);
  EXPECT_EQ(Inflight(), 1.0);
  ex.Close(now_, false);
  EXPECT_EQ(Inflight(), 0.0);
}

TEST_F(ExchangeTest, ClosedWhileAwaitingTokenIdsFinishesAs499) {
  ExchangeEnv env;
  env.core = &core_;
  env.want_token_ids = [] { return true; };
  Exchange ex(env, settings_);
  Feed(ex, Headers("/v1/completions"));
  Feed(ex, Body(Completion("hello"), true));
  ASSERT_TRUE(ex.awaiting_token_ids());
  ex.Close(now_, true);
  Responses out;
  ex.OnTokenIds({}, now_, out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(Requests("499"), 1.0);
  EXPECT_EQ(Inflight(), 0.0);
}

}  // namespace
}  // namespace kvroute::extproc
