// Fuzz target: a `kvroute serve` config file through ParseRouterConfig, the loader the
// router runs at start-up and on every reload.
//
// Invariants: an error names the file and a line or field, with a message; a config that
// loads meets the documented contract (a bindable listen address that round-trips through
// ParseHostPort, staleness >= scrape interval, unique endpoint names, every endpoint
// address parsed, at least one attempt per request).
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "config/router_config.h"
#include "fuzz_check.h"

namespace {

using namespace kvroute;
using fuzz::Check;

void CheckHostPort(const config::HostPort& hp) {
  Check(hp.port >= 1 && !hp.host.empty(), "host:port without a host or port");
  std::string error;
  const auto again = config::ParseHostPort(hp.ToString(), &error);
  Check(again && again->host == hp.host && again->port == hp.port,
        "HostPort::ToString does not parse back to itself");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kFile = "router.yaml";
  const config::ConfigOr<config::RouterConfig> r = config::ParseRouterConfig(text, kFile);
  if (!r.ok()) {
    fuzz::CheckConfigError(r.error, kFile);
    return 0;
  }
  const config::RouterConfig& c = *r.value;
  CheckHostPort(c.listen_addr);
  Check(c.threads >= 0, "negative thread count");
  Check(c.pool.scrape_interval_s > 0, "scrape_interval <= 0");
  Check(c.pool.staleness_s >= c.pool.scrape_interval_s, "staleness < scrape_interval");
  std::set<std::string> names;
  for (const config::EndpointConfig& e : c.pool.endpoints) {
    CheckHostPort(e.host_port);
    Check(!e.name.empty(), "endpoint without a name");
    Check(names.insert(e.name).second, "duplicate endpoint name accepted");
  }
  Check(c.limits.max_body_bytes > 0 && c.limits.max_header_bytes > 0 && c.limits.max_headers > 0,
        "a zero limit accepted");
  Check(c.timeouts.connect_s > 0 && c.timeouts.first_byte_s > 0 && c.timeouts.idle_s > 0,
        "a non-positive timeout accepted");
  Check(c.retries.max_attempts >= 1, "max_attempts < 1 accepted");
  return 0;
}
