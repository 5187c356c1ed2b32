// The endpoint list of file discovery (`pool.endpoints_file`): YAML text to the same
// validated EndpointConfig entries `pool.endpoints` gives, through the same code.
//
// File shape: a top-level list, each item an address or {address, name?, labels?}:
//
//   - address: 10.0.0.7:8000
//     name: eu-1                  # defaults to the address; unique in the file
//     labels: {region: eu}
//   - 10.0.0.8:8000               # shorthand: just the address
//
// An empty file, `[]` or `~` is an empty list (legal: the pool then has no endpoint and
// picks answer 503). Addresses are unique after normalisation ("host:port").
//
// Errors name the endpoints file, the line and the field, the field written as if the
// list were called `endpoints`: "eps.yaml:4: endpoints[1].address: bad address
// '10.0.0.8': expected host:port".
//
// Pure: no I/O (ReadEndpoints is also what router_config.cc calls for pool.endpoints).
// Thread: values only.
#pragma once

#include <string_view>
#include <vector>

#include "config/router_config.h"
#include "config/yaml_reader.h"

namespace kvroute::config {

// Reads the list `list` (null: empty) into `out`, failing the load (ConfigNode::Fail) on
// the first bad entry, a duplicate name or a duplicate address. Field paths are the
// node's ("pool.endpoints[1].address" for the router config).
void ReadEndpoints(const ConfigNode& list, std::vector<EndpointConfig>& out);

// Parses an endpoints file; `filename` names it in errors. Never throws.
ConfigOr<std::vector<EndpointConfig>> ParseEndpointsFile(std::string_view text,
                                                         std::string_view filename);

}  // namespace kvroute::config
