// The X-Request-Id both legs of a prefill/decode pair carry when the client sent none
// (serve and the sidecar): "kvroute-" and 16 hex digits.
#pragma once

#include <string>

namespace kvroute::pd {

// Thread: any (each thread draws from its own generator).
std::string NewRequestId();

}  // namespace kvroute::pd
