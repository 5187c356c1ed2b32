// Replica's glue to its KV-event publisher (docs/KV_EVENTS.md): starting it, publishing
// what each engine step recorded, POST /reset_prefix_cache (whose AllBlocksCleared event
// is its outcome), and the hash seed of each process generation.
#include <cstdio>
#include <memory>
#include <utility>

#include "apps/sim/kv_publisher.h"
#include "apps/sim/replica.h"

namespace kvroute::sim {

Status Replica::StartKvEvents() {
  if ((!config_.kv_events.port && config_.kv_events.connect.empty()) || kv_) return Status::Ok();
  Result<std::unique_ptr<KvPublisher>> p =
      KvPublisher::Start(config_.host, config_.engine.model_name, config_.kv_events);
  if (!p.ok()) return p.status();
  kv_ = std::move(*p);
  return Status::Ok();
}

void Replica::PublishKvEvents() {
  if (!kv_) return;
  engine_.DrainKvEvents(&kv_scratch_);
  if (kv_scratch_.empty()) return;
  kv_->PublishStep(std::move(kv_scratch_), faults_);
  kv_scratch_.clear();
}

void Replica::HandleResetPrefixCache(const std::shared_ptr<http::Exchange>& ex) {
  // vLLM answers 200 with an empty body whether or not the pool agreed (it only logs
  // "Failed to reset prefix cache ... some blocks are not freed yet"); the
  // AllBlocksCleared event, or its absence, is the outcome.
  if (!engine_.ResetPrefixCache()) {
    std::fprintf(stderr, "%s: failed to reset prefix cache: some blocks are not freed yet\n",
                 config_.name.c_str());
  }
  PublishKvEvents();  // its own batch: an idle engine has no next step to carry it
  ex->Respond(200, {}, {});
}

engine::EngineConfig Replica::GenerationEngineConfig() const {
  engine::EngineConfig c = config_.engine;
  if (generation_ > 0) {
    uint64_t x = c.hash_seed + generation_ * 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    c.hash_seed = x ^ (x >> 31);
  }
  return c;
}

}  // namespace kvroute::sim
