// Fuzz target: a `kvroute sim` fleet file through ParseFleetYaml, then ResolveFleet as
// `kvroute sim` runs it (no command-line overrides).
//
// Invariants: a parse error names the file and a line or field, with a message; a resolve
// error has a message; every replica ResolveFleet returns passes ValidateReplica, and
// (when small enough to build quickly) constructs an engine::Engine without tripping the
// constructor's asserts: ValidateReplica claims to check exactly those.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/fleet_config.h"
#include "core/engine/engine.h"
#include "fuzz_check.h"

namespace {

using namespace kvroute;
using fuzz::Check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kFile = "fleet.yaml";
  const config::ConfigOr<config::FleetFile> r = config::ParseFleetYaml(text, kFile);
  if (!r.ok()) {
    fuzz::CheckConfigError(r.error, kFile);
    return 0;
  }
  const config::FleetFile& f = *r.value;
  if (f.replicas.size() > 64) return 0;  // each replica costs an engine below
  std::vector<config::ReplicaConfig> replicas;
  const Status s = config::ResolveFleet(f, {}, 0, f.base_port.value_or(18001), &replicas);
  if (!s.ok()) {
    Check(!s.message().empty(), "ResolveFleet error without a message");
    return 0;
  }
  Check(!replicas.empty(), "ResolveFleet ok with no replica");
  for (const config::ReplicaConfig& rc : replicas) {
    Check(config::ValidateReplica(rc).ok(), "ResolveFleet returned an invalid replica");
    Check(!rc.name.empty(), "replica without a name");
    if (rc.engine.num_gpu_blocks <= (1 << 16) && rc.engine.max_num_seqs <= (1 << 16)) {
      engine::Engine e(rc.engine);
    }
  }
  return 0;
}
