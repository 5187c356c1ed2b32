#include "core/engine/scrape_signals.h"

namespace kvroute::engine {

metrics::EngineMetrics ScrapeSignals(const EngineStats& st, const EngineConfig& config) {
  using F = metrics::EngineMetrics;
  F m;
  m.running = static_cast<double>(st.running);
  m.waiting = static_cast<double>(st.waiting);
  m.kv_usage = st.kv_cache_usage;
  m.prefix_queries = static_cast<double>(st.prefix_queries_tokens);
  m.prefix_hits = static_cast<double>(st.prefix_hits_tokens);
  m.preemptions = static_cast<double>(st.preemptions);
  m.block_size = config.block_size;
  m.num_gpu_blocks = config.num_gpu_blocks;
  m.engines = 1;
  m.present = F::kRunning | F::kWaiting | F::kKvUsage | F::kPrefixQueries | F::kPrefixHits |
              F::kPreemptions | F::kBlockSize | F::kNumGpuBlocks;
  return m;
}

}  // namespace kvroute::engine
