// LoRA adapters on the router side (issue 26): which requests name an adapter, and how
// attractive an endpoint is for one, from what the engines report in
// vllm:lora_requests_info (metrics::EngineMetrics' LoRA fields). Pure functions of the
// endpoint states; no allocation.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/sched/types.h"

namespace kvroute::sched {

// The endpoint's LoRA state is usable: its last scrape carried it (kLora present) and is
// not older than `stale_after_s`. Otherwise it is unknown (never attractive).
bool LoraKnown(const EndpointState& e, double now_s, double stale_after_s);

// The request's adapter as metrics::AdapterKey(model), or 0 for a base-model request (or
// one nothing tells apart). Decided from the endpoints whose LoRA state is known:
//   - some endpoint reports `model` as its base model (base_model_key): base model, 0;
//   - else some endpoint lists `model` among its running or waiting adapters: adapter;
//   - else some endpoint reports a base model, and it is another one: adapter (an adapter
//     nobody has loaded yet; vLLM loads it on demand);
//   - else (no LoRA state anywhere, or no base model known): 0.
// So a fleet without LoRA, and every base-model request, is treated exactly as before.
// One rule for the lora-affinity-scorer and for the prefix keys (prefix-cache-scorer's
// chains are rooted in the model name already; the precise index's keys take the adapter
// name as vLLM's extra keys do).
uint64_t AdapterRequestKey(std::string_view model, std::span<const EndpointState> endpoints,
                           double now_s, double stale_after_s);

// llm-d's lora-affinity rule for an endpoint whose LoRA state is known, `adapter` being an
// AdapterKey: 1.0 when the adapter has running requests there; else 0.8 when the engine has
// room to load another (distinct running and waiting adapters < max_lora: an adapter in
// both lists takes one batch slot; llm-d adds the two lists' lengths); else 0.6 when it has
// waiting requests there; else 0. With truncated lists (more adapters than
// EngineMetrics::kMaxLoraListed) an adapter not found may still be there and the room is
// unknown: neither counts.
double LoraAffinity(const metrics::EngineMetrics& m, uint64_t adapter);

}  // namespace kvroute::sched
