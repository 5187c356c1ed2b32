// What a configuration sets in the running router: Router::Impl::Apply (the pool, the
// upstream TLS, the front end's FrontSettings, published whole) and Reload (SIGHUP).
#include <boost/asio/post.hpp>
#include <algorithm>
#include <memory>
#include <string>

#include "adapters/http/client.h"
#include "adapters/http/io_pool.h"
#include "adapters/pool/pool.h"
#include "apps/serve/api_key_auth.h"
#include "apps/serve/router_internal.h"
#include "config/router_config.h"
#include "core/routing/routing_core.h"

namespace kvroute::router {

namespace asio = boost::asio;
using detail::FrontSettings;
using detail::kEndpointHeader;
using detail::Ms;

// ---- configuration ----

Status Router::Impl::Apply(config::RouterConfig cfg) {
  if (options.listen) {
    cfg.listen_addr = *options.listen;
    cfg.listen = options.listen->ToString();
  }
  if (options.threads) cfg.threads = *options.threads;
  if (options.region) cfg.locality.region = *options.region;
  if (started_listen && started_listen->ToString() != cfg.listen_addr.ToString()) {
    Log("listen address change to " + cfg.listen_addr.ToString() + " needs a restart; ignored");
  }
  Status st = core_pool->Apply(cfg);
  if (!st.ok()) return st;
  // https:// endpoints: new connections use the applied upstream_tls (pooled ones keep
  // theirs until they close).
  if (auto tls = core_pool->upstream_tls(); tls != upstream_tls) {
    upstream_tls = tls;
    for (int i = 0; i < io->size(); ++i) {
      asio::post(io->context(i), [c = clients[i].get(), tls] { c->set_tls(tls); });
    }
  }
  auto fs = std::make_shared<FrontSettings>();
  fs->connect_timeout = Ms(cfg.timeouts.connect_s);
  fs->first_byte_timeout = Ms(cfg.timeouts.first_byte_s);
  fs->idle_timeout = Ms(cfg.timeouts.idle_s);
  fs->max_attempts = static_cast<std::size_t>(std::max(1, cfg.retries.max_attempts));
  fs->allow_routing_headers = cfg.allow_routing_headers;
  fs->objectives = cfg.epp.objectives;
  fs->objective_slos = cfg.epp.objective_slos;
  fs->flow_header = cfg.flow.flow_header;
  fs->sessions = cfg.sessions.enabled;
  fs->session_header = cfg.sessions.header;
  fs->token_header = cfg.sessions.token_header;
  if (started_listen && cfg.flow.enabled != (flow_gate != nullptr)) {
    Log("flow.enabled change needs a restart; ignored");
  }
  if (started_listen && cfg.auth != started_auth) {
    Log("auth change needs a restart; ignored (SIGHUP re-reads the key files)");
  }
  auto table = core().table();
  fs->version = table->version;
  fs->head_fields.resize(table->by_id.size());
  for (const auto& ep : table->by_id) {
    if (!ep) continue;
    fs->head_fields[ep->id] = {{std::string(kEndpointHeader), ep->spec.name}};
    if (fs->sessions) fs->head_fields[ep->id].emplace_back(fs->token_header, routing::SessionToken(*ep));
  }
  settings.store(std::move(fs));
  return Status::Ok();
}

Status Router::Impl::Reload() {
  if (options.config_path.empty()) {
    return Status::FailedPrecondition("no configuration file to reload");
  }
  if (auth) auth->Reload();  // SIGHUP re-reads the key files too, whatever the config says
  config::ConfigOr<config::RouterConfig> loaded = config::LoadRouterConfig(options.config_path);
  Status st = loaded.ok() ? Apply(std::move(*loaded.value)) : loaded.status();
  if (st.ok()) {
    Log("configuration reloaded from " + options.config_path);
  } else {
    core().OnReloadFailed();
    Log("reload failed, keeping the running configuration: " + st.message());
  }
  return st;
}

}  // namespace kvroute::router
