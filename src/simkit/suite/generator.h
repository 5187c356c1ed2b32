// The broad scenario suite's generator (issue 42): scenario families drawn at random from
// a seed, as `kvroute simulate` scenario YAML. A policy is judged on these, not on the
// hand-written examples alone; tune on some seeds, report on others.
//
// Families: chat with shared system prompts (from none to one hot prefix), multi-turn
// conversations, agentic sessions (long system prompts, many short turns, no think time),
// unshared random prompts, LoRA mixes, and a production trace time-scaled. Fleets of 2 to
// 64 replicas, some with heterogeneous KV capacity, a persistently slow replica or one that
// crashes mid-run. Load from 0.3x to 0.9x of the fleet's estimated capacity, steady, or
// with a burst of 2x to 10x, or a ramp to 2x and back.
//
// Capacity is estimated, not measured: EstimateCapacity's steady-state model of the engine
// preset's step time (core/engine/engine.h StepModel) with the family's mean lengths and an
// expected prefix reuse. It places the regimes (light, near capacity, overload), not
// exact figures. Pure: the same seed gives the same text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvroute::suite {

struct GeneratedScenario {
  std::string name;    // "gen-<seed>-<index>-<family>-<regime>"
  std::string family;  // chat, hot-prefix, multi-turn, agentic, no-sharing, lora, trace
  std::string regime;  // steady, burst, ramp
  std::string yaml;    // a complete scenario (no policies: the suite's apply)
};

struct GeneratorOptions {
  uint64_t seed = 1;
  int count = 60;
  // Traces the trace family replays (absolute paths; Mooncake JSON lines). None: no
  // trace family.
  std::vector<std::string> traces;
  // Requests per scenario are drawn in [min_requests, max_requests].
  int64_t min_requests = 600, max_requests = 1500;
};

std::vector<GeneratedScenario> Generate(const GeneratorOptions& options);

// Requests per second one replica of the llama3-8b-h100 preset with `kv_blocks` 16-token
// blocks sustains for prompts of `prompt_tokens` (of which the fraction `reuse` is served
// from the prefix cache) and `output_tokens` outputs: B concurrent sequences (as many as
// the KV holds, at most 256), each step costing the preset's step time, B / output steps
// finishing per step.
double EstimateCapacity(double prompt_tokens, double output_tokens, double reuse, int64_t kv_blocks);

}  // namespace kvroute::suite
