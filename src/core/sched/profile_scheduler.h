// The weighted-scorer Scheduler: filters -> weighted scorers -> picker, built from a
// validated SchedulingSpec (registry.h) or a named plugin-based policy.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/sched/plugin.h"
#include "core/sched/plugins/locality_filter/locality_filter.h"
#include "core/sched/plugins/prefix_cache_scorer/prefix_cache_scorer.h"
#include "core/sched/scheduler_base.h"

namespace kvroute::sched {

class ProfileScheduler : public SchedulerBase {
 public:
  struct WeightedScorer {
    std::unique_ptr<Scorer> scorer;
    double weight = 1.0;
  };
  struct Parts {
    std::string policy = "custom";
    std::vector<std::unique_ptr<Filter>> filters;
    std::vector<WeightedScorer> scorers;
    std::unique_ptr<Picker> picker;  // null: max-score-picker
    bool inflight_adjustment = false;
    // Plugins that only hook the lifecycle (inflight-accounting); kept for their hooks.
    std::vector<std::unique_ptr<Plugin>> others;
  };
  ProfileScheduler(Parts parts, const SchedulerOptions& options);

  std::string_view policy() const override { return policy_; }
  PickResult Pick(const SchedRequest& req, std::span<const EndpointState> endpoints,
                  double now_s) override;
  // Ranking touches no shared state (plugins write into the scratch): concurrent.
  bool concurrent_picks() const override { return true; }
  PickResult Rank(const SchedRequest& req, std::span<const EndpointState> endpoints,
                  double now_s, PickScratch& scratch) override;
  void OnEndpointRemoved(uint32_t endpoint_id) override;
  // The first prefix-cache scorer's model (PrefixEntries, HeldBlocks); null without one.
  const PrefixModel* prefix_model() const override {
    return prefix_ ? &prefix_->prefix_model() : nullptr;
  }
  // The first prefix-cache scorer's chain (nothing without one).
  void PrefixKey(const SchedRequest& req, std::vector<uint64_t>& out) const override;

  // Commit, then the locality-filters' bookkeeping (spill mode, counters).
  RequestHandle Commit(PickScratch& scratch, std::span<const EndpointState> endpoints) override;
  // Forwarded to every locality-filter of the profile (stats: the first one's).
  void SetRegionRtt(std::string_view region, double seconds) override;
  LocalityStats locality_stats() const override;

  // The union of its plugins' Plugin::consumed_fields.
  uint32_t consumed_fields() const override { return consumed_fields_; }

  void set_plugin_timer(const std::function<double()>* seconds) override { timer_ = seconds; }
  void TimedPlugins(std::vector<TimedPlugin>& out) const override;

  bool inflight_adjustment() const { return inflight_adjustment_; }
  // The plugins, in order: filters, scorers, picker, others.
  const std::vector<Plugin*>& plugins() const { return all_; }

 private:
  static size_t CountPlugins(const Parts& p);
  // Plugins are matched by type and name, else by type when the type is unique on both
  // sides.
  void AdoptPolicyState(SchedulerBase& previous) override;
  // The plugins record the dispatch (OnDispatched); the in-flight record's blocks come
  // from the largest cached share any of them reports.
  double OnRequestDispatched(PendingRequest& p, uint32_t endpoint_id, const EndpointState& e,
                             double now_s) override;

  std::string policy_;
  std::vector<std::unique_ptr<Filter>> filters_;
  std::vector<WeightedScorer> scorers_;
  std::unique_ptr<Picker> picker_;
  std::vector<std::unique_ptr<Plugin>> others_;
  bool inflight_adjustment_;
  std::vector<Plugin*> all_;
  // The first scorer whose role is kPrefix, when it is a PrefixCacheScorer (the prefix
  // model behind PrefixEntries, PrefixKey and HeldBlocks); null otherwise.
  const PrefixCacheScorer* prefix_ = nullptr;
  std::vector<LocalityFilter*> localities_;     // the locality-filters, in order
  uint32_t consumed_fields_ = 0;
  const std::function<double()>* timer_ = nullptr;  // set_plugin_timer
};

}  // namespace kvroute::sched
