// Simulation's scrapes (simulator_internal.h): the translation of a replica's simulated
// engine state into the scrape result the router's core receives (routing::ScrapeResult,
// metrics::EngineMetrics), as vLLM's /metrics would carry it, LoRA series included.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/simulate/simulator_internal.h"
#include "core/engine/scrape_signals.h"
#include "core/metrics/engine_metrics.h"
#include "core/routing/routing_core.h"

namespace kvroute::simulate::detail {

void Simulation::Scrape(double t) {
  for (size_t i = 0; i < replicas_.size(); ++i) {
    routing::ScrapeResult r;
    r.sent_at_s = t;
    const engine::EngineStats st = replicas_[i].engine.Stats();
    if (replicas_[i].down) {
      r.ok = false;
      r.connect_failed = true;
    } else {
      r.ok = true;
      metrics::EngineMetrics& m = r.metrics;
      m = engine::ScrapeSignals(st, replicas_[i].config);
      // The served model, as the model_name label of vLLM's load series tells it: what
      // tells an adapter nobody has loaded yet from the base model (core/sched/lora.h).
      m.base_model_key = model_key_;
      if (replicas_[i].config.lora.enabled) FillLora(replicas_[i], &m);
    }
    for (size_t k = 0; k < cores_.size(); ++k) {
      cores_[k]->OnScrape(static_cast<uint32_t>(i), r, t);
      Tap(static_cast<uint32_t>(k), CoreCall::Kind::kScrape, t, [&](CoreCall& c) {
        c.endpoint = static_cast<uint32_t>(i);
        c.scrape = r;
      });
    }
    kv_[i] = st.kv_cache_usage;
    replicas_[i].kv_sum += st.kv_cache_usage;
    waiting_[i] = st.waiting;
  }
  fleet_.AddSample(t, kv_, waiting_);
  if (!Done()) Push(t + sc_.fleet.scrape_interval_s, Ev::kScrape, 0);
  Pump();
}

void Simulation::FillLora(const Replica& r, metrics::EngineMetrics* m) {
  using F = metrics::EngineMetrics;
  r.engine.LoraActivity(&lora_running_, &lora_waiting_);
  m->max_lora = r.config.lora.max_loras;
  m->lora_truncated = false;
  auto fill = [&](const std::vector<std::string>& names, std::array<uint64_t, F::kMaxLoraListed>* keys,
                  uint8_t* n) {
    *n = 0;
    for (const std::string& name : names) {
      if (*n == F::kMaxLoraListed) {
        m->lora_truncated = true;
        break;
      }
      (*keys)[(*n)++] = metrics::AdapterKey(name);
    }
  };
  fill(lora_running_, &m->running_loras, &m->n_running_loras);
  fill(lora_waiting_, &m->waiting_loras, &m->n_waiting_loras);
  m->present |= F::kLora;
}

}  // namespace kvroute::simulate::detail
