// The simulated replica the loopback tests run in sim::Fleet: vLLM's behaviour and
// /metrics with the llama3-8b-h100 preset's timings, serving kTestModel. Tests choose
// only what they depend on; the rest stays at these defaults.
#pragma once

#include <string>

#include "core/engine/engine.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"

namespace kvroute::test_support {

struct SimReplicaOptions {
  std::string name = "r";
  int kv_blocks = 512;  // of 16 tokens
  int max_model_len = 8192;
  // 0: steps back to back (fast, still ordered); 1: real time, ~6 ms a decode step, so
  // requests stay in flight while a test looks.
  double time_scale = 0.0;
};

// E.g. SimReplica({.name = "r0", .kv_blocks = 128, .time_scale = 1.0}).
inline sim::ReplicaConfig SimReplica(const SimReplicaOptions& o = {}) {
  sim::ReplicaConfig r;
  r.name = o.name;
  r.engine = *engine::PresetConfig("llama3-8b-h100");
  r.engine.model_name = std::string(kTestModel);
  r.engine.num_gpu_blocks = o.kv_blocks;
  r.engine.max_model_len = o.max_model_len;
  r.time_scale = o.time_scale;
  return r;
}

}  // namespace kvroute::test_support
