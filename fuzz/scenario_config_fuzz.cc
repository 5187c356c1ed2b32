// Fuzz target: a scenario file (`kvroute simulate`, `kvroute bench`) through ParseScenario.
// Relative trace paths resolve against examples/scenarios, so the seed azure-trace.yaml
// reads the real sample trace. Inputs naming /dev, /proc or /sys are skipped: reading
// /dev/zero as a trace would never end, and that is the operator's choice, not a bug.
//
// Invariants: an error names the file and a line or field, with a message; a scenario that
// loads has a valid workload (WorkloadSpec::Validate), a positive scrape interval,
// ascending positive sweep rates, and a fleet whose engine config can be built.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "config/scenario_config.h"
#include "fuzz_check.h"

namespace {

using namespace kvroute;
using fuzz::Check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (std::string_view special : {"/dev", "/proc", "/sys"}) {
    if (text.find(special) != std::string_view::npos) return 0;
  }
  constexpr std::string_view kFile = "scenario.yaml";
  const config::ConfigOr<config::Scenario> r =
      config::ParseScenario(text, kFile, KVROUTE_SOURCE_DIR "/examples/scenarios");
  if (!r.ok()) {
    fuzz::CheckConfigError(r.error, kFile);
    return 0;
  }
  const config::Scenario& s = *r.value;
  Check(!s.name.empty(), "scenario without a name");
  Check(s.source == kFile, "scenario source is not the file given");
  Check(s.workload.Validate().ok(), "a workload that fails Validate() was accepted");
  Check(s.fleet.scrape_interval_s > 0 && s.fleet.network_delay_s >= 0, "fleet timing");
  int64_t replicas = 0;
  for (const config::FleetGroup& g : s.fleet.Groups()) {
    Check(g.replicas >= 1 && g.network_delay_s >= 0, "a fleet group without replicas or timing");
    replicas += g.replicas;
    (void)g.EngineConfigFor();  // every group's preset must exist too
  }
  Check(replicas == s.fleet.replicas, "fleet.replicas is not the groups' total");
  for (size_t i = 0; i < s.sweep_rates.size(); ++i) {
    Check(s.sweep_rates[i] > 0 && (i == 0 || s.sweep_rates[i] > s.sweep_rates[i - 1]),
          "sweep rates not positive and ascending");
  }
  Check(s.sweep_ttft_p99_bound_s >= 0, "negative sweep bound");
  (void)s.fleet.EngineConfigFor();  // dereferences the preset: must exist once loaded
  return 0;
}
