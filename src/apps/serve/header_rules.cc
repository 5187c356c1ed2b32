// Which headers pass through the proxy: the request headers a replica sees
// (CollectForwardHeaders, then upstream_authorization: Router::Impl::RewriteAuthorization)
// and the replica's response headers the client sees (CollectResponseHeaders).
#include <boost/beast/core/string.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "apps/serve/api_key_auth.h"
#include "apps/serve/router_internal.h"
#include "core/api/openai.h"

namespace kvroute::router {

namespace bhttp = boost::beast::http;

namespace {

bool IEquals(std::string_view a, std::string_view b) {
  return boost::beast::iequals(boost::beast::string_view(a.data(), a.size()),
                               boost::beast::string_view(b.data(), b.size()));
}

// Whether `list` (a Connection header's value: comma-separated tokens) names `name`.
bool ConnectionNames(std::string_view list, std::string_view name) {
  while (!list.empty()) {
    const auto comma = list.find(',');
    std::string_view token = list.substr(0, comma);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\t')) token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
    if (IEquals(token, name)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

namespace detail {

// Every end-to-end request header goes to the replica (tracing's traceparent, tracestate
// and baggage, vLLM's own, the application's), except (issue 29, item 4):
//   - hop-by-hop ones (RFC 9110 section 7.6.1: Connection, Proxy-Connection, Keep-Alive,
//     TE, Transfer-Encoding, Upgrade, Proxy-Authorization, Trailer) and those the
//     Connection header names;
//   - the framing the upstream client writes itself (Host, Content-Length, Content-Type,
//     Expect);
//   - the router's own control headers, consumed here: the routing hint, the latency
//     objectives, the session id and token, the model-name rewrite.
// Names are passed on lower-cased (HTTP/1.1 names are case-insensitive).
void CollectForwardHeaders(const http::Request& req, const FrontSettings& fs,
                           std::vector<std::pair<std::string, std::string>>& out) {
  static constexpr std::string_view kDropped[] = {
      "connection", "proxy-connection", "keep-alive", "te", "transfer-encoding", "upgrade",
      "proxy-authorization", "trailer", "host", "content-length", "content-type", "expect",
      kRoutingHeader, api::kSloTtftHeader, api::kSloTpotHeader, api::kSloTtftHeaderOld,
      api::kSloTpotHeaderOld, api::kModelRewriteHeader};
  const std::string_view connection = HeaderValue(req, "connection");
  for (const auto& f : req) {
    const std::string_view name(f.name_string().data(), f.name_string().size());
    bool drop = fs.sessions && (IEquals(name, fs.session_header) || IEquals(name, fs.token_header));
    for (std::string_view d : kDropped) drop = drop || IEquals(name, d);
    if (drop || (!connection.empty() && ConnectionNames(connection, name))) continue;
    std::string lower(name);
    for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    out.emplace_back(std::move(lower), std::string(f.value()));
  }
}

// The end-to-end header fields of a replica's response, for the client: every one but
// hop-by-hop fields (RFC 9110 7.6.1, and those Connection names), the framing the server
// writes itself (content-type, content-length, transfer-encoding), and the router's own
// (x-kvroute-*, the session token header), which it writes. Appended to `out`.
void CollectResponseHeaders(const boost::beast::http::fields& fields, const FrontSettings& fs,
                            http::Fields& out) {
  static constexpr std::string_view kDropped[] = {
      "connection", "proxy-connection", "keep-alive", "te", "transfer-encoding", "upgrade",
      "proxy-authenticate", "trailer", "content-length", "content-type", kEndpointHeader,
      kAttemptsHeader, kPrefillHeader};
  std::string_view connection;
  for (const auto& f : fields) {
    if (f.name() == bhttp::field::connection) connection = std::string_view(f.value().data(), f.value().size());
  }
  for (const auto& f : fields) {
    const std::string_view name(f.name_string().data(), f.name_string().size());
    bool drop = fs.sessions && IEquals(name, fs.token_header);
    for (std::string_view d : kDropped) drop = drop || IEquals(name, d);
    if (drop || (!connection.empty() && ConnectionNames(connection, name))) continue;
    std::string lower(name);
    for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    out.emplace_back(std::move(lower), std::string(f.value()));
  }
}

}  // namespace detail

void Router::Impl::RewriteAuthorization(int worker,
                                        std::vector<std::pair<std::string, std::string>>& headers) {
  if (!auth || auth->upstream_mode() == config::UpstreamAuthorization::kForward) return;
  std::erase_if(headers, [](const auto& h) { return h.first == "authorization"; });
  if (auth->upstream_mode() == config::UpstreamAuthorization::kReplace) {
    headers.emplace_back("authorization", std::string(auth->UpstreamAuthorization(worker)));
  }
}

}  // namespace kvroute::router
