// The router's own /metrics exposition (Router::Impl::MetricsText): the routing core's
// and the pool's series, then the front end's own (client-facing servers, listener
// certificates, flow control, tokenizer, P/D legs, API keys, capture).
#include <array>
#include <cstddef>
#include <string>

#include "adapters/certs/listener_certs.h"
#include "adapters/http/server.h"
#include "adapters/pool/pool.h"
#include "adapters/tokenize/http_tokenizer.h"
#include "adapters/tokenize/tokenize_metrics.h"
#include "apps/pd/pd_counters.h"
#include "apps/serve/api_key_auth.h"
#include "apps/serve/router_internal.h"
#include "core/flow/flow_gate.h"
#include "core/flow/flow_metrics.h"
#include "core/metrics/prom_writer.h"
#include "core/routing/routing_core.h"

namespace kvroute::router {

namespace {

// The client-facing servers' counters (limits and connections), as kvroute_http_*: the
// plaintext and the HTTPS listener summed.
void AppendServerMetrics(std::string& out, const http::Server* plain, const http::Server* tls) {
  const http::ServerStats* all[2] = {plain ? &plain->stats() : nullptr, tls ? &tls->stats() : nullptr};
  // A counter of every listener, summed; `field` picks it from a ServerStats.
  auto sum = [&](auto field) {
    double v = 0;
    for (const http::ServerStats* st : all) {
      if (st) v += static_cast<double>(field(*st).load(std::memory_order_relaxed));
    }
    return v;
  };
  struct {
    double open_connections, connections_accepted, connections_rejected, accept_errors, idle_closed,
        tls_handshake_failures;
    std::array<double, http::kRejectReasons> requests_rejected;
  } s{};
  s.open_connections = sum([](const http::ServerStats& st) -> const auto& { return st.open_connections; });
  s.connections_accepted = sum([](const http::ServerStats& st) -> const auto& { return st.connections_accepted; });
  s.connections_rejected = sum([](const http::ServerStats& st) -> const auto& { return st.connections_rejected; });
  s.accept_errors = sum([](const http::ServerStats& st) -> const auto& { return st.accept_errors; });
  s.idle_closed = sum([](const http::ServerStats& st) -> const auto& { return st.idle_closed; });
  s.tls_handshake_failures = sum([](const http::ServerStats& st) -> const auto& { return st.tls_handshake_failures; });
  for (std::size_t i = 0; i < http::kRejectReasons; ++i) {
    s.requests_rejected[i] = sum([i](const http::ServerStats& st) -> const auto& { return st.requests_rejected[i]; });
  }
  metrics::AppendGauge(out, "kvroute_http_open_connections", "Client connections open now.", {},
                       s.open_connections);
  metrics::AppendCounter(out, "kvroute_http_connections_accepted_total",
                         "Client connections accepted and served.", {}, s.connections_accepted);
  metrics::AppendCounter(out, "kvroute_http_connections_rejected_total",
                         "Client connections refused with 503 over limits.max_connections.", {},
                         s.connections_rejected);
  metrics::AppendCounter(out, "kvroute_http_accept_errors_total",
                         "Failed accepts (out of descriptors...), each retried after a back-off.",
                         {}, s.accept_errors);
  metrics::AppendCounter(out, "kvroute_http_idle_closed_total",
                         "Client connections closed silently with no request started "
                         "(timeouts.keepalive_idle, or nothing sent within timeouts.request_read).",
                         {}, s.idle_closed);
  metrics::AppendHeader(out, "kvroute_http_requests_rejected_total",
                        "Requests the server refused itself, then closed the connection, by reason.",
                        metrics::MetricType::kCounter);
  for (std::size_t i = 0; i < http::kRejectReasons; ++i) {
    const metrics::Label reason{"reason", http::RejectReasonName(static_cast<http::RejectReason>(i))};
    metrics::AppendSample(out, "kvroute_http_requests_rejected_total", {&reason, 1},
                          s.requests_rejected[i]);
  }
  if (tls) {
    metrics::AppendCounter(out, "kvroute_http_tls_handshake_failures_total",
                           "HTTPS connections closed because their TLS handshake failed or did not "
                           "complete within timeouts.request_read.",
                           {}, s.tls_handshake_failures);
  }
}

}  // namespace

std::string Router::Impl::MetricsText() {
  std::string out;
  out.reserve(16384);
  if (core_pool) core().AppendMetrics(out, Now());
  if (core_pool) core_pool->AppendMetrics(out);
  if (server || tls_server) AppendServerMetrics(out, server.get(), tls_server.get());
  if (cert_watch) cert_watch->AppendMetrics(out);
  if (flow_gate) flow::AppendFlowMetrics(out, flow_gate->stats());
  if (core_pool && core().kv_events_active()) AppendTokenizerMetrics(out);
  pd::AppendPdMetrics(out, pd_counters);
  if (auth) auth->AppendMetrics(out);
  if (capture_log) capture_log->AppendMetrics(out);
  return out;
}

// kvroute_tokenize_*: every worker's tokenizer calls, failures and latency, summed.
void Router::Impl::AppendTokenizerMetrics(std::string& out) {
  tokenize::TokenizerStats::Snapshot sum;
  for (const auto& t : tokenizers) tokenize::AddSnapshot(sum, t->stats().Read());
  tokenize::AppendTokenizerMetrics(out, sum);
}

}  // namespace kvroute::router
