// Shared machinery of every built-in Scheduler: request handles over a pooled table of
// PendingRequest, the InflightTracker, the Rng, endpoint capacities remembered from picks,
// and the reused result buffers. Internal to kvroute_sched (tests may use it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/sched/inflight_tracker.h"
#include "core/sched/plugin.h"
#include "core/sched/scheduler.h"

namespace kvroute::sched {

class SchedulerBase : public Scheduler {
 public:
  // `hash_rows`: how many hash chains each PendingRequest keeps (one per plugin).
  SchedulerBase(const SchedulerOptions& options, size_t hash_rows);

  // The request's in-flight record moves to the endpoint (a re-dispatch moves it), with
  // the engine blocks OnRequestDispatched expects it to hold there.
  void OnDispatched(RequestHandle handle, uint32_t endpoint_id, double now_s) override;
  void OnFirstToken(RequestHandle handle, double now_s) override;
  void OnFinished(RequestHandle handle, double now_s) override;
  void OnMetricsUpdated(uint32_t endpoint_id, double scraped_at_s) override;
  const InflightTracker& inflight() const override { return tracker_; }
  std::span<const ScorerRole> scorer_roles() const override { return scorer_roles_; }
  // Moves the request table, in-flight accounting and remembered endpoint capacities,
  // then AdoptPolicyState. In-flight requests keep their handles; their cached prompt
  // hashes are dropped (a retry after the reload records no prefix), since hash rows
  // belong to the previous plugin layout.
  bool AdoptStateFrom(Scheduler& previous) override;

  size_t PendingCount() const { return live_; }

  // The policy's approximate prefix model (prefix_model.h), or null when it keeps none
  // (round-robin, least-request, sglang-cache-aware's tree). PrefixEntries and HeldBlocks
  // answer from it.
  virtual const PrefixModel* prefix_model() const { return nullptr; }
  // Its Size for the endpoint; -1 without a model.
  int64_t PrefixEntries(uint32_t endpoint_id) const override;
  // Its MatchOne; 0 without a model or for an empty key.
  size_t HeldBlocks(std::span<const uint64_t> key, uint32_t endpoint_id) const override;

  // Allocates the handle for a successful Rank into `scratch` (its request's hash rows
  // move into the request table) and remembers the ranked endpoints' capacities.
  RequestHandle Commit(PickScratch& scratch, std::span<const EndpointState> endpoints) override;

 protected:
  // A fresh request record (buffers reused) filled from `req`. Never fails.
  PendingRequest& NewRequest(const SchedRequest& req);
  // A fresh live slot, fields as the previous occupant left them (hash rows sized).
  PendingRequest& AllocateRequest();
  RequestHandle HandleOf(const PendingRequest& p) const;
  // nullptr for unknown, stale or finished handles.
  PendingRequest* Find(RequestHandle handle);
  void Release(PendingRequest& p);

  // Capacity numbers, with the option defaults when the scrape did not say.
  int64_t BlockSize(const EndpointState& e) const;
  double CapacityBlocks(const EndpointState& e) const;
  // Engine blocks the request will hold on `e` with `cached_chars` of its prompt cached:
  // ceil((uncached prompt tokens + expected output tokens) / block size).
  double EstimateBlocks(const PendingRequest& p, const EndpointState& e,
                        int64_t cached_chars) const;

  // Remembers the numeric fields of `e` (for dispatch-time estimates); the last values
  // seen in a Pick are used by OnDispatched.
  void Remember(const EndpointState& e);
  const EndpointState& Known(uint32_t endpoint_id);

  // Fills loads[i] for every candidate position (adjusted or not).
  void ComputeLoads(std::span<const EndpointState> endpoints, bool adjust) {
    ComputeLoads(own_, endpoints, adjust);
  }
  void ComputeLoads(PickScratch& sc, std::span<const EndpointState> endpoints, bool adjust) const;
  // The request-level estimates of `req` into `p` (hash rows sized and cleared).
  void FillPending(PendingRequest& p, const SchedRequest& req) const;

  // Result assembly: copies ids of `candidates` (positions) and `order` (indexes into
  // candidates) into the id buffers and returns the spans. The own-scratch form also
  // remembers the ranked endpoints (the concurrent path does that in Commit).
  PickResult Finish(RequestHandle handle, std::span<const EndpointState> endpoints,
                    std::span<const uint32_t> order);
  PickResult Finish(PickScratch& sc, std::span<const EndpointState> endpoints) const;
  PickResult Fail(PickStatus status) const;
  // candidates_ = the positions of the healthy endpoints; false when there is none.
  bool HealthyCandidates(std::span<const EndpointState> endpoints);
  // Ranks the own scratch's candidates by `keys` (one per candidate: the highest first,
  // ties at random, at most options_.max_ranked; RankByMaxScore) into order_, then
  // Finish for `pending`.
  PickResult FinishByMaxScore(const PendingRequest& pending,
                              std::span<const EndpointState> endpoints,
                              std::span<const double> keys);

  // The scheduler's own scratch, for Pick; the members below are views into it so that
  // schedulers written for the single-threaded path read as before.
  PickScratch own_;

  // The policy-specific part of AdoptStateFrom (prefix index, radix tree); default none.
  virtual void AdoptPolicyState(SchedulerBase& previous) {}
  // The policy-specific part of OnDispatched, for a known handle: `e` is the endpoint as
  // last seen in a Pick (Known). Returns the engine blocks the request will hold there, for
  // the in-flight record. Default: EstimateBlocks with nothing cached.
  virtual double OnRequestDispatched(PendingRequest& p, uint32_t endpoint_id,
                                     const EndpointState& e, double now_s);
  // The policy-specific parts of OnFirstToken (after the in-flight record is marked) and
  // of OnFinished (before the request is released), for a known handle; default none.
  virtual void OnRequestStarted(PendingRequest& p, double now_s) {}
  virtual void OnRequestEnded(PendingRequest& p, double now_s) {}

  SchedulerOptions options_;
  InflightTracker tracker_;
  std::vector<ScorerRole> scorer_roles_;  // parallel to scorer_names_
  Rng& rng_ = own_.rng;

  // Per-pick buffers of the own scratch.
  std::vector<uint32_t>& candidates_ = own_.candidates;  // positions into the endpoint span
  std::vector<EndpointLoad>& loads_ = own_.loads;        // by position
  std::vector<uint32_t>& order_ = own_.order;            // indexes into candidates_, best first
  std::vector<uint32_t>& ranked_ids_ = own_.ranked_ids;
  std::vector<uint32_t>& candidate_ids_ = own_.candidate_ids;
  std::vector<double>& scores_ = own_.scores;            // [scorer][candidate]
  std::vector<double>& totals_ = own_.totals;
  std::vector<std::string> scorer_names_;
  std::vector<double> weights_;
  // FinishByMaxScore's buffers.
  std::vector<uint32_t> rank_scratch_;
  std::vector<uint64_t> rank_tiebreak_;

 private:
  struct Slot {
    uint32_t generation = 1;
    bool live = false;
    PendingRequest req;
  };
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  size_t hash_rows_;
  size_t live_ = 0;
  std::vector<EndpointState> known_;
};

}  // namespace kvroute::sched
