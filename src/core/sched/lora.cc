#include "core/sched/lora.h"

namespace kvroute::sched {

namespace {

bool Listed(const std::array<uint64_t, metrics::EngineMetrics::kMaxLoraListed>& keys, uint8_t n,
            uint64_t key) {
  for (size_t i = 0; i < n && i < keys.size(); ++i) {
    if (keys[i] == key) return true;
  }
  return false;
}

}  // namespace

bool LoraKnown(const EndpointState& e, double now_s, double stale_after_s) {
  return e.engine.Has(metrics::EngineMetrics::kLora) && e.MetricsFresh(now_s, stale_after_s);
}

uint64_t AdapterRequestKey(std::string_view model, std::span<const EndpointState> endpoints,
                           double now_s, double stale_after_s) {
  if (model.empty()) return 0;
  const uint64_t key = metrics::AdapterKey(model);
  bool listed = false;
  bool other_base = false;
  for (const EndpointState& e : endpoints) {
    if (!LoraKnown(e, now_s, stale_after_s)) continue;
    const metrics::EngineMetrics& m = e.engine;
    if (m.base_model_key == key) return 0;
    listed = listed || Listed(m.running_loras, m.n_running_loras, key) ||
             Listed(m.waiting_loras, m.n_waiting_loras, key);
    other_base = other_base || m.base_model_key != 0;
  }
  return listed || other_base ? key : 0;
}

double LoraAffinity(const metrics::EngineMetrics& m, uint64_t adapter) {
  if (Listed(m.running_loras, m.n_running_loras, adapter)) return 1.0;
  if (!m.lora_truncated) {
    // Distinct adapters: one listed as both running and waiting (a request of it queued
    // behind its running ones) takes one slot of the batch, not two.
    int64_t distinct = m.n_running_loras;
    for (uint8_t i = 0; i < m.n_waiting_loras; ++i) {
      if (!Listed(m.running_loras, m.n_running_loras, m.waiting_loras[i])) ++distinct;
    }
    if (distinct < m.max_lora) return 0.8;
  }
  if (Listed(m.waiting_loras, m.n_waiting_loras, adapter)) return 0.6;
  return 0.0;
}

}  // namespace kvroute::sched
