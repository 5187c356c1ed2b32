// Fuzz target: an endpoints file (pool.endpoints_file) through ParseEndpointsFile, the
// parser the pool runs at every Apply and at every change the watcher sees.
//
// Invariants: an error names the file and a line or field, with a message; a list that
// loads has every address parsed (round-tripping through ParseHostPort), a name on every
// entry, and no two entries sharing a name or a normalised address.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "config/endpoints_file.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvroute;
  using fuzz::Check;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kFile = "eps.yaml";
  const config::ConfigOr<std::vector<config::EndpointConfig>> r =
      config::ParseEndpointsFile(text, kFile);
  if (!r.ok()) {
    fuzz::CheckConfigError(r.error, kFile);
    return 0;
  }
  std::set<std::string> names, addresses;
  for (const config::EndpointConfig& e : *r.value) {
    const config::HostPort& hp = e.host_port;
    Check(hp.port >= 1 && !hp.host.empty(), "endpoint without a host or port");
    const auto again = config::ParseHostPort(hp.ToString());
    Check(again && again->host == hp.host && again->port == hp.port,
          "HostPort::ToString does not parse back to itself");
    Check(!e.name.empty(), "endpoint without a name");
    Check(e.line >= 1, "endpoint without a line");
    Check(names.insert(e.name).second, "duplicate endpoint name accepted");
    Check(addresses.insert(hp.ToString()).second, "duplicate endpoint address accepted");
  }
  return 0;
}
