// What a scrape of a simulated engine's vLLM /metrics tells a router, computed from the
// engine's own state: the one translation from engine state to the router's signals
// (metrics::EngineMetrics). `kvroute sim`'s /metrics writer prints its values under vLLM's
// names, and `kvroute simulate` hands them to the routing core as a scrape result without
// the text in between, so the two cannot drift apart. A new engine signal is added here
// (and to the parser's field), not in each front end.
#pragma once

#include "core/engine/engine.h"
#include "core/metrics/engine_metrics.h"

namespace kvroute::engine {

// The load, cache and capacity signals of one engine (running, waiting, KV usage, prefix
// query and hit tokens, preemptions, block size, GPU blocks), all present; one engine. The
// LoRA series and the model are the caller's (they depend on the served model's name).
metrics::EngineMetrics ScrapeSignals(const EngineStats& stats, const EngineConfig& config);

}  // namespace kvroute::engine
