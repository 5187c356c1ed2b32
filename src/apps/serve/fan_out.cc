// Requests sent to every usable endpoint (FanOutCall): GET /v1/models (the union of the
// replicas' listings) and runtime LoRA loading and unloading (Router::Impl::Models and
// FanOut).
#include <simdjson.h>
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "adapters/http/client.h"
#include "adapters/http/server.h"
#include "apps/serve/router_internal.h"
#include "core/routing/routing_core.h"

namespace kvroute::router {

namespace bhttp = boost::beast::http;
using detail::CollectForwardHeaders;
using detail::ErrorJson;
using detail::FrontSettings;
using detail::kMaxBufferedResponse;
using detail::Path;
using detail::RespondNoEndpoint;

namespace {

// One request sent to every usable endpoint, answered once all have answered (or failed).
// GET /v1/models: the union of what every endpoint lists, each model once (the first
// endpoint to list an id wins) and as that replica wrote it (`parent`, `root`,
// `max_model_len` kept). Otherwise (runtime LoRA loading): every endpoint's 2xx gives the
// first one's answer, else the first error answer; x-kvroute-fanout says "<2xx>/<sent>".
// All of it runs on the exchange's worker: no lock.
struct FanOutCall : std::enable_shared_from_this<FanOutCall> {
  std::shared_ptr<http::Exchange> ex;
  std::shared_ptr<const routing::EndpointTable> table;  // holds the endpoints alive
  bool models = true;
  std::vector<http::UpstreamCall> calls;
  std::vector<std::string> bodies;
  std::vector<std::string> content_types;
  std::vector<int> statuses;
  std::size_t pending = 0;

  ~FanOutCall() {
    if (ex) ex->OnClientGone({});
  }

  void Start(http::UpstreamClient& client, const FrontSettings& fs, std::span<const uint32_t> ids,
             const std::vector<std::pair<std::string, std::string>>* headers) {
    pending = ids.size();
    bodies.resize(ids.size());
    content_types.resize(ids.size());
    statuses.assign(ids.size(), 0);
    const http::Request& in = ex->request();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const routing::Endpoint& ep = *table->by_id[ids[i]];
      http::UpstreamRequest req;
      req.method = models ? bhttp::verb::get : in.method();
      req.target = models ? std::string_view("/v1/models")
                          : std::string_view(in.target().data(), in.target().size());
      if (!models) req.body = in.body();
      req.headers = headers;
      req.connect_timeout = fs.connect_timeout;
      req.first_byte_timeout = fs.first_byte_timeout;
      req.idle_timeout = fs.idle_timeout;
      http::UpstreamCallbacks cb;
      cb.on_head = [this, i](const http::ResponseHead& h) {
        statuses[i] = h.status;
        content_types[i].assign(h.content_type);
      };
      cb.on_data = [this, i](std::string_view d) {
        if (bodies[i].size() + d.size() <= kMaxBufferedResponse) bodies[i].append(d);
      };
      cb.on_done = [this, i](http::UpstreamResult&& r) {
        if (!r.ok()) statuses[i] = 0;
        if (--pending == 0) Finish();
      };
      cb.owner = shared_from_this();
      req.tls = ep.spec.tls;
      calls.push_back(client.Start(ep.spec.host, ep.spec.port, req, std::move(cb)));
    }
  }

  void Finish() {
    if (!models) return FinishAll();
    std::string out = "{\"object\":\"list\",\"data\":[";
    std::set<std::string, std::less<>> seen;
    bool any = false;
    simdjson::dom::parser dom;
    for (std::size_t i = 0; i < bodies.size(); ++i) {
      if (statuses[i] != 200) continue;
      simdjson::dom::element root;
      simdjson::dom::array data;
      if (dom.parse(bodies[i]).get(root) || root["data"].get_array().get(data)) continue;
      any = true;
      for (simdjson::dom::element m : data) {
        std::string_view id;
        if (m["id"].get_string().get(id) || seen.count(id)) continue;
        seen.emplace(id);
        if (out.back() != '[') out.push_back(',');
        out += simdjson::minify(m);
      }
    }
    out += "]}";
    if (!any) {
      ex->Respond(502, ErrorJson(502, "No endpoint answered GET /v1/models."));
      return;
    }
    ex->Respond(200, std::move(out));
  }

  void FinishAll() {
    std::size_t ok = 0;
    std::optional<std::size_t> first_ok, first_error;
    for (std::size_t i = 0; i < statuses.size(); ++i) {
      if (statuses[i] >= 200 && statuses[i] < 300) {
        ++ok;
        if (!first_ok) first_ok = i;
      } else if (statuses[i] != 0 && !first_error) {
        first_error = i;
      }
    }
    const std::string_view path = Path(std::string_view(ex->request().target().data(),
                                                        ex->request().target().size()));
    if (!first_ok && !first_error) {
      ex->Respond(502, ErrorJson(502, "No endpoint answered POST " + std::string(path) + "."));
      return;
    }
    const std::size_t i = first_error ? *first_error : *first_ok;
    ex->Respond(statuses[i], std::move(bodies[i]), content_types[i],
                {{"x-kvroute-fanout", std::to_string(ok) + "/" + std::to_string(statuses.size())}});
  }
};

}  // namespace

void Router::Impl::FanOut(std::shared_ptr<http::Exchange> ex) { Models(std::move(ex), false); }

void Router::Impl::Models(std::shared_ptr<http::Exchange> ex, bool models) {
  auto table = core().table();
  std::vector<uint32_t> ids(std::max<std::size_t>(1, table->by_id.size()));
  ids.resize(core().AnyUsable(Now(), ids.data(), ids.size()));
  if (ids.empty()) {
    RespondNoEndpoint(*ex, "No usable endpoint: no healthy endpoint is available.");
    core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint, 503, Now());
    return;
  }
  auto mc = std::make_shared<FanOutCall>();
  mc->ex = std::move(ex);
  mc->table = std::move(table);
  mc->models = models;
  FanOutCall* raw = mc.get();
  mc->ex->OnClientGone([raw] {
    for (auto& c : raw->calls) c.Cancel();
  });
  std::vector<std::pair<std::string, std::string>> headers;
  CollectForwardHeaders(mc->ex->request(), *settings.load(), headers);
  RewriteAuthorization(mc->ex->worker(), headers);
  mc->Start(*clients[mc->ex->worker()], *settings.load(), ids, headers.empty() ? nullptr : &headers);
}

}  // namespace kvroute::router
