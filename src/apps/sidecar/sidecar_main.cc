#include "apps/sidecar/sidecar_main.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>

#include "config/yaml_reader.h"
#include "apps/sidecar/sidecar.h"

namespace kvroute::sidecar {

namespace {

constexpr const char* kFooter = R"(
The decode pod's side of prefill/decode disaggregation behind `kvroute epp`
(docs/POLICIES.md, "Behind a gateway"; deploy/kubernetes-pd): point the InferencePool's
target port at --port and run the engine on --vllm-port.
POST /v1/completions and /v1/chat/completions with x-prefiller-host-port: IP:PORT (the
picker's pick of a prefill pod) run two legs: prefill there (stream off, max_tokens 1,
kv_transfer_params asking for a remote decode), then the client's body plus prefill's
kv_transfer_params to the local engine, streamed back with usage's cached_tokens set to
prefill's; one X-Request-Id on both. Everything else goes to the local engine unchanged
(the picker scrapes /metrics through the sidecar). A prefill leg that fails, a header
that is not IP:PORT, or a prefill pod outside --prefiller-allow: the local engine
prefills (no request fails for it); a decode leg failing before its first byte is sent
again once as an ordinary request. GET /sidecar/metrics: kvroute_pd_legs_total,
kvroute_pd_fallbacks_total, kvroute_sidecar_requests_total,
kvroute_sidecar_prefiller_refused_total. GET /sidecar/healthz: 200.)";

bool Duration(const std::string& flag, const std::string& text, std::chrono::milliseconds& out) {
  std::optional<double> s = config::ParseDuration(text);
  if (!s || *s <= 0) {
    std::fprintf(stderr, "kvroute sidecar: %s '%s': not a duration (\"500ms\", \"2s\", \"1m\")\n", flag.c_str(),
                 text.c_str());
    return false;
  }
  out = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(*s * 1000)));
  return true;
}

}  // namespace

int SidecarMain(int argc, char** argv) {
  CLI::App app{"Run prefill/decode legs for the decode pod: the prefill pod named in\n"
               "x-prefiller-host-port, then the local engine.",
               "kvroute sidecar"};
  SidecarOptions o;
  o.handle_signals = true;
  int port = 8000, vllm_port = 8200;
  std::string allow, connect = "2s", first_byte = "120s", idle = "60s";
  app.add_option("--port", port, "Port to listen on (default 8000)")->check(CLI::Range(0, 65535));
  app.add_option("--host", o.listen_host, "Address to listen on (default 0.0.0.0)");
  app.add_option("--vllm-port", vllm_port, "The local engine's port (default 8200)")->check(CLI::Range(1, 65535));
  app.add_option("--vllm-host", o.engine_host, "The local engine's address (default 127.0.0.1)");
  app.add_option("--prefill-max-retries", o.prefill_max_retries,
                 "A prefill leg failing before it answers (connect failure, reset, 502/503/504) is\n"
                 "sent again to the same pod this many times before the local engine prefills\n"
                 "(default 0)")
      ->check(CLI::Range(0, 10));
  app.add_option("--prefiller-allow", allow,
                 "Comma-separated IP ranges (10.0.0.0/8, fd00::/8) a prefill pod must be in;\n"
                 "others are not contacted (the local engine prefills). Default: any");
  app.add_option("--threads", o.threads, "Worker threads (0 = one per core)")->check(CLI::Range(0, 1024));
  app.add_option("--connect-timeout", connect, "Upstream TCP connect (default 2s)");
  app.add_option("--first-byte-timeout", first_byte, "Request sent -> response head (default 120s)");
  app.add_option("--idle-timeout", idle, "No bytes either way on an upstream exchange (default 60s)");
  app.footer(kFooter);
  CLI11_PARSE(app, argc, argv);

  o.listen_port = static_cast<uint16_t>(port);
  o.engine_port = static_cast<uint16_t>(vllm_port);
  if (!Duration("--connect-timeout", connect, o.connect_timeout) ||
      !Duration("--first-byte-timeout", first_byte, o.first_byte_timeout) ||
      !Duration("--idle-timeout", idle, o.idle_timeout)) {
    return 2;
  }
  if (!allow.empty()) {
    std::string error;
    auto ranges = ParseCidrList(allow, &error);
    if (!ranges) {
      std::fprintf(stderr, "kvroute sidecar: --prefiller-allow: %s\n", error.c_str());
      return 2;
    }
    o.prefiller_allow = std::move(*ranges);
  }
  Sidecar sidecar(o);
  if (Status st = sidecar.Start(); !st.ok()) {
    std::fprintf(stderr, "kvroute sidecar: %s\n", st.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "kvroute sidecar: listening on port %u, engine %s:%u\n", sidecar.port(),
               o.engine_host.c_str(), static_cast<unsigned>(o.engine_port));
  sidecar.WaitForShutdown();
  sidecar.Stop();
  return 0;
}

}  // namespace kvroute::sidecar
