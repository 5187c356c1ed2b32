#include "core/sched/prefix_model.h"

#include <algorithm>

namespace kvroute::sched {

void ApproxPrefixModel::Apply(uint32_t endpoint_id, const CacheUpdate& update, double now_s) {
  switch (update.kind) {
    case CacheUpdate::Kind::kStored: {
      if (update.blocks.empty()) return;
      // Bounded like routed chains; before any routing, never evict to make room.
      const size_t capacity =
          capacity_ > 0 ? capacity_ : index_.Size(endpoint_id) + update.blocks.size();
      index_.Record(update.blocks, endpoint_id, capacity, now_s);
      return;
    }
    case CacheUpdate::Kind::kRemoved:
      for (uint64_t key : update.blocks) index_.Erase(key, endpoint_id);
      return;
    case CacheUpdate::Kind::kCleared:
      index_.RemoveEndpoint(endpoint_id);
      return;
  }
}

std::unique_ptr<PrefixModel> MakeApproxPrefixModel() { return std::make_unique<ApproxPrefixModel>(); }

}  // namespace kvroute::sched
