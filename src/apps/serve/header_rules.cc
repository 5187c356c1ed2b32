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

namespace {

// The fields Beast knows by name that never pass, in either direction: hop-by-hop ones
// (RFC 9110 section 7.6.1) and the framing each side writes itself. A switch on the parsed
// field code, not a string comparison per name: this runs for every header of every request.
bool HopOrFraming(bhttp::field f) {
  switch (f) {
    case bhttp::field::connection:
    case bhttp::field::proxy_connection:
    case bhttp::field::keep_alive:
    case bhttp::field::te:
    case bhttp::field::transfer_encoding:
    case bhttp::field::upgrade:
    case bhttp::field::trailer:
    case bhttp::field::content_length:
    case bhttp::field::content_type:
      return true;
    default:
      return false;
  }
}

// One more field for each direction: the request's credentials for a proxy and framing the
// upstream client writes (Host, Expect); the response's challenge for a proxy.
bool DroppedRequestField(bhttp::field f) {
  return HopOrFraming(f) || f == bhttp::field::proxy_authorization || f == bhttp::field::host ||
         f == bhttp::field::expect;
}
bool DroppedResponseField(bhttp::field f) {
  return HopOrFraming(f) || f == bhttp::field::proxy_authenticate;
}

// Whether `name` (a field Beast does not know) is one of `names`.
template <size_t N>
bool Named(std::string_view name, const std::string_view (&names)[N]) {
  for (std::string_view d : names) {
    if (IEquals(name, d)) return true;
  }
  return false;
}

void AppendLowerCased(std::string_view name, std::string_view value,
                      std::vector<std::pair<std::string, std::string>>& out) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  out.emplace_back(std::move(lower), std::string(value));
}

}  // namespace

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
  // The router's own headers; none is a name Beast knows.
  static constexpr std::string_view kOwn[] = {
      kRoutingHeader,         api::kSloTtftHeader,        api::kSloTpotHeader,
      api::kSloTtftHeaderOld, api::kSloTpotHeaderOld,     api::kModelRewriteHeader};
  const std::string_view connection = HeaderValue(req, "connection");
  for (const auto& f : req) {
    const bhttp::field code = f.name();
    if (DroppedRequestField(code)) continue;
    const std::string_view name(f.name_string().data(), f.name_string().size());
    if (code == bhttp::field::unknown && Named(name, kOwn)) continue;
    if (fs.sessions && (IEquals(name, fs.session_header) || IEquals(name, fs.token_header))) {
      continue;
    }
    if (!connection.empty() && ConnectionNames(connection, name)) continue;
    AppendLowerCased(name, std::string_view(f.value().data(), f.value().size()), out);
  }
}

// The end-to-end header fields of a replica's response, for the client: every one but
// hop-by-hop fields (RFC 9110 7.6.1, and those Connection names), the framing the server
// writes itself (content-type, content-length, transfer-encoding), and the router's own
// (x-kvroute-*, the session token header), which it writes. Appended to `out`.
void CollectResponseHeaders(const boost::beast::http::fields& fields, const FrontSettings& fs,
                            http::Fields& out) {
  static constexpr std::string_view kOwn[] = {kEndpointHeader, kAttemptsHeader, kPrefillHeader};
  std::string_view connection;
  for (const auto& f : fields) {
    if (f.name() == bhttp::field::connection) connection = std::string_view(f.value().data(), f.value().size());
  }
  for (const auto& f : fields) {
    const bhttp::field code = f.name();
    if (DroppedResponseField(code)) continue;
    const std::string_view name(f.name_string().data(), f.name_string().size());
    if (code == bhttp::field::unknown && Named(name, kOwn)) continue;
    if (fs.sessions && IEquals(name, fs.token_header)) continue;
    if (!connection.empty() && ConnectionNames(connection, name)) continue;
    AppendLowerCased(name, std::string_view(f.value().data(), f.value().size()), out);
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
