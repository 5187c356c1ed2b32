// The router's own accounting of requests it has in flight, per endpoint, and the load it
// adds on top of the last scrape.
//
// Why: metrics are scraped every 50 ms or more; a burst arriving between two scrapes sees
// the same scraped numbers for every request and would pile onto one replica. So each
// dispatched request is recorded with its estimated KV blocks (uncached prompt blocks plus
// expected output) and the time it was sent. Until a scrape taken after that time arrives,
// it is "pending" and added to the scraped numbers; once such a scrape arrives the scrape
// itself counts it and the tracker stops adding it (no double counting beyond one scrape
// interval). A request that the last scrape counted and that has finished since is
// "released": its blocks are subtracted until the next scrape.
//
//   adjusted waiting = scraped waiting + pending requests not yet started
//   adjusted running = scraped running + pending requests started - released requests
//   adjusted kv      = scraped kv + (pending blocks - released blocks) / capacity blocks
//
// Single-threaded, like the Scheduler that owns it. Times are the caller's clock and must be
// non-decreasing per endpoint.
#pragma once

#include <cstdint>
#include <vector>

#include "core/sched/types.h"

namespace kvroute::sched {

// An endpoint's load as policies read it: scraped values, adjusted when in-flight accounting
// is on.
struct EndpointLoad {
  double kv_usage = 0.0;   // may exceed 1 when pending work is more than the free cache
  double waiting = 0.0;
  double running = 0.0;
  uint32_t inflight = 0;   // router's own in-flight requests there (always, adjusted or not)
  double active_blocks = 0.0;  // estimated blocks of all its in-flight requests
};

class InflightTracker {
 public:
  // `slot` identifies a request: a small dense integer the caller allocates (the scheduler
  // uses its request-table slot). One request per slot at a time.
  void Add(uint32_t slot, uint32_t endpoint_id, double now_s, double est_blocks);
  // First token seen: no longer counted as waiting. No-op for unknown slots.
  void MarkStarted(uint32_t slot);
  // Finished or moved: releases the slot. No-op for unknown slots.
  void Remove(uint32_t slot, double now_s);
  // Endpoint's metrics now reflect time `scraped_at_s`.
  void OnScrape(uint32_t endpoint_id, double scraped_at_s);
  // Forget everything about the endpoint except requests still in flight.
  void ResetEndpoint(uint32_t endpoint_id);

  // Whether `slot` is currently tracked, and where.
  bool Tracked(uint32_t slot) const;
  uint32_t EndpointOf(uint32_t slot) const;

  uint32_t InFlight(uint32_t endpoint_id) const;
  uint32_t PendingNotStarted(uint32_t endpoint_id) const;
  uint32_t PendingStarted(uint32_t endpoint_id) const;
  double PendingBlocks(uint32_t endpoint_id) const;
  double ReleasedBlocks(uint32_t endpoint_id) const;
  uint32_t ReleasedCount(uint32_t endpoint_id) const;
  double ActiveBlocks(uint32_t endpoint_id) const;

  // `e`'s load: scraped values plus the adjustments above when `adjust`, else the scraped
  // values as they are (inflight and active_blocks are filled either way).
  // `capacity_blocks` > 0 is the endpoint's KV capacity in blocks.
  EndpointLoad Load(const EndpointState& e, double capacity_blocks, bool adjust) const;

 private:
  static constexpr uint32_t kNil = 0xffffffffu;
  struct Record {
    bool live = false;
    bool counted = false;  // a scrape taken after dispatch has arrived
    bool started = false;
    uint32_t endpoint = 0;
    double dispatched_at = 0.0;
    double blocks = 0.0;
    uint32_t prev = kNil, next = kNil;  // the endpoint's list, in dispatch order
  };
  struct Release {
    double at;
    double blocks;
  };
  struct PerEndpoint {
    uint32_t head = kNil, tail = kNil;
    uint32_t inflight = 0;
    uint32_t pending_not_started = 0;
    uint32_t pending_started = 0;
    double pending_blocks = 0.0;
    double active_blocks = 0.0;
    double last_scrape = -1e300;
    std::vector<Release> released;  // counted requests finished after the last scrape
  };
  PerEndpoint& Ep(uint32_t id);
  const PerEndpoint* FindEp(uint32_t id) const;
  // Endpoint `id`'s `field`, 0 for an endpoint never tracked.
  template <class T>
  T FieldOf(uint32_t id, T PerEndpoint::*field) const {
    const PerEndpoint* ep = FindEp(id);
    return ep ? ep->*field : T{};
  }

  std::vector<Record> records_;
  std::vector<PerEndpoint> endpoints_;
};

}  // namespace kvroute::sched
