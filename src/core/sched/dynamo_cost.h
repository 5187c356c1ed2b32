// A re-implementation of NVIDIA Dynamo's KV router cost function from its public
// description (REFERENCE.md section 7), without KV events: the block index is predicted
// from the router's own decisions with a TTL, as Dynamo's approximate mode does.
//   cost(worker) = overlap_weight * prefill_blocks + decode_blocks
// prefill_blocks: the request's prompt blocks not (predicted) cached on the worker;
// decode_blocks: estimated KV blocks of the router's requests in flight there.
#pragma once

#include <cstdint>
#include <vector>

#include "core/sched/prefix_index.h"
#include "core/sched/scheduler_base.h"

namespace kvroute::sched {

class DynamoCostScheduler : public SchedulerBase {
 public:
  struct Config {
    double overlap_weight = 1.0;
    int64_t block_size = 16;      // tokens per block; hashed as 4 * block_size characters
    size_t max_blocks = 1 << 16;  // longest prompt prefix hashed, in blocks
    double temperature = 0.0;     // 0: lowest cost wins; > 0: softmax sampling over -cost
    double ttl_s = 120.0;         // predicted blocks expire after this
  };
  DynamoCostScheduler(const Config& config, const SchedulerOptions& options);

  std::string_view policy() const override { return "dynamo-cost"; }
  // Scores reported: row "cost" (raw block count, not clamped) and row "overlap"
  // (matched blocks / prompt blocks). totals = -cost.
  PickResult Pick(const SchedRequest& req, std::span<const EndpointState> endpoints,
                  double now_s) override;
  void OnDispatched(RequestHandle handle, uint32_t endpoint_id, double now_s) override;
  void OnEndpointRemoved(uint32_t endpoint_id) override;

  const ApproxPrefixIndex& index() const { return index_; }
  int64_t PrefixEntries(uint32_t endpoint_id) const override {
    return static_cast<int64_t>(index_.Size(endpoint_id));
  }

 private:
  // Takes the previous dynamo-cost scheduler's index when block_size and max_blocks match.
  void AdoptPolicyState(SchedulerBase& previous) override;

  Config config_;
  ApproxPrefixIndex index_;
  std::vector<uint32_t> match_;
  std::vector<double> keys_;
  std::vector<uint32_t> scratch_;
  std::vector<uint64_t> tiebreak_;
};

}  // namespace kvroute::sched
