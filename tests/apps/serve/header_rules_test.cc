// Which headers serve passes on, in each direction (apps/serve/header_rules.cc): hop-by-hop
// and framing fields are dropped by Beast's field code, the router's own by name.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "apps/serve/router_internal.h"
#include "core/api/openai.h"

namespace kvroute::router {
namespace {

namespace bhttp = boost::beast::http;
using Pairs = std::vector<std::pair<std::string, std::string>>;

TEST(HeaderRulesTest, RouterOwnHeadersAreNotFieldsBeastKnows) {
  // The collectors test these by name only for fields Beast does not know.
  for (std::string_view h : std::initializer_list<std::string_view>{detail::kRoutingHeader, api::kSloTtftHeader, api::kSloTpotHeader,
                             api::kSloTtftHeaderOld, api::kSloTpotHeaderOld,
                             api::kModelRewriteHeader, detail::kEndpointHeader, detail::kAttemptsHeader,
                             detail::kPrefillHeader}) {
    EXPECT_EQ(bhttp::string_to_field(boost::beast::string_view(h.data(), h.size())),
              bhttp::field::unknown)
        << h;
  }
}

TEST(HeaderRulesTest, RequestKeepsEndToEndHeadersLowerCasedAndDropsTheRest) {
  http::Request req;
  req.set("Host", "router:8000");
  req.set("Content-Type", "application/json");
  req.set("Content-Length", "17");
  req.set("Connection", "keep-alive, X-Hop");
  req.set("X-Hop", "1");
  req.set("Keep-Alive", "timeout=5");
  req.set("TE", "trailers");
  req.set("Proxy-Authorization", "Basic abc");
  req.set("Expect", "100-continue");
  req.set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  req.set("Authorization", "Bearer k");
  req.set("X-Gateway-Destination-Endpoint", "10.0.0.1:8000");
  req.set("x-llm-d-slo-ttft-ms", "500");
  req.set("X-SLO-TPOT-MS", "50");
  req.set("x-llm-d-model-name-rewrite", "m2");
  req.set("X-Session-Id", "s1");
  req.set("X-Session-Token", "t1");
  req.set("Accept", "*/*");
  detail::FrontSettings fs;
  fs.sessions = true;
  fs.session_header = "x-session-id";
  fs.token_header = "x-session-token";
  Pairs out;
  detail::CollectForwardHeaders(req, fs, out);
  EXPECT_EQ(out, (Pairs{{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                        {"authorization", "Bearer k"},
                        {"accept", "*/*"}}));
  // Sessions off: their headers are the application's, passed on.
  fs.sessions = false;
  out.clear();
  detail::CollectForwardHeaders(req, fs, out);
  EXPECT_EQ(out, (Pairs{{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                        {"authorization", "Bearer k"},
                        {"x-session-id", "s1"},
                        {"x-session-token", "t1"},
                        {"accept", "*/*"}}));
}

TEST(HeaderRulesTest, ResponseKeepsEndToEndHeadersAndDropsHopByHopFramingAndOwn) {
  bhttp::fields fields;
  fields.set("Content-Type", "text/event-stream");
  fields.set("Transfer-Encoding", "chunked");
  fields.set("Connection", "close, X-Hop");
  fields.set("X-Hop", "1");
  fields.set("Proxy-Authenticate", "Basic");
  fields.set("Upgrade", "h2c");
  fields.set("X-Request-Id", "r-1");
  fields.set("x-kvroute-endpoint", "sim0");
  fields.set("X-Kvroute-Attempts", "2");
  fields.set("x-kvroute-prefill", "p0");
  fields.set("X-Session-Token", "t9");
  fields.set("Date", "Sat, 05 Dec 2026 12:00:00 GMT");
  detail::FrontSettings fs;
  fs.sessions = true;
  fs.token_header = "x-session-token";
  http::Fields out;
  detail::CollectResponseHeaders(fields, fs, out);
  EXPECT_EQ(out, (Pairs{{"x-request-id", "r-1"}, {"date", "Sat, 05 Dec 2026 12:00:00 GMT"}}));
}

}  // namespace
}  // namespace kvroute::router
