#include "core/sched/inflight_tracker.h"

#include <algorithm>

namespace kvroute::sched {

InflightTracker::PerEndpoint& InflightTracker::Ep(uint32_t id) {
  if (id >= endpoints_.size()) endpoints_.resize(id + 1);
  return endpoints_[id];
}

const InflightTracker::PerEndpoint* InflightTracker::FindEp(uint32_t id) const {
  return id < endpoints_.size() ? &endpoints_[id] : nullptr;
}

void InflightTracker::Add(uint32_t slot, uint32_t endpoint_id, double now_s, double est_blocks) {
  if (slot >= records_.size()) records_.resize(slot + 1);
  if (records_[slot].live) Remove(slot, now_s);
  PerEndpoint& ep = Ep(endpoint_id);
  Record& r = records_[slot];
  r = Record{};
  r.live = true;
  r.endpoint = endpoint_id;
  r.dispatched_at = now_s;
  r.blocks = est_blocks;
  // A request sent at or before the time of the scrape we already have is, as far as we
  // can tell, in that scrape; only later ones are added on top.
  r.counted = now_s <= ep.last_scrape;
  r.prev = ep.tail;
  r.next = kNil;
  if (ep.tail != kNil) records_[ep.tail].next = slot;
  else ep.head = slot;
  ep.tail = slot;
  ep.inflight++;
  ep.active_blocks += est_blocks;
  if (!r.counted) {
    ep.pending_not_started++;
    ep.pending_blocks += est_blocks;
  }
}

void InflightTracker::MarkStarted(uint32_t slot) {
  if (slot >= records_.size() || !records_[slot].live) return;
  Record& r = records_[slot];
  if (r.started) return;
  r.started = true;
  if (!r.counted) {
    PerEndpoint& ep = endpoints_[r.endpoint];
    ep.pending_not_started--;
    ep.pending_started++;
  }
}

void InflightTracker::Remove(uint32_t slot, double now_s) {
  if (slot >= records_.size() || !records_[slot].live) return;
  Record& r = records_[slot];
  PerEndpoint& ep = endpoints_[r.endpoint];
  if (r.prev != kNil) records_[r.prev].next = r.next;
  else ep.head = r.next;
  if (r.next != kNil) records_[r.next].prev = r.prev;
  else ep.tail = r.prev;
  ep.inflight--;
  ep.active_blocks = std::max(0.0, ep.active_blocks - r.blocks);
  if (r.counted) {
    // The last scrape still shows this request's blocks; discount them until a scrape
    // taken after now arrives.
    ep.released.push_back({now_s, r.blocks});
  } else {
    if (r.started) ep.pending_started--;
    else ep.pending_not_started--;
    ep.pending_blocks = std::max(0.0, ep.pending_blocks - r.blocks);
  }
  r.live = false;
}

void InflightTracker::OnScrape(uint32_t endpoint_id, double scraped_at_s) {
  PerEndpoint& ep = Ep(endpoint_id);
  if (scraped_at_s < ep.last_scrape) return;  // an older scrape answering late: ignore
  ep.last_scrape = scraped_at_s;
  // Requests are in dispatch order: walk back from the newest, skip those sent after the
  // scrape, and stop at the first one already counted (everything older is counted too).
  uint32_t s = ep.tail;
  while (s != kNil && records_[s].dispatched_at > scraped_at_s) s = records_[s].prev;
  for (; s != kNil && !records_[s].counted; s = records_[s].prev) {
    Record& r = records_[s];
    r.counted = true;
    if (r.started) ep.pending_started--;
    else ep.pending_not_started--;
    ep.pending_blocks = std::max(0.0, ep.pending_blocks - r.blocks);
  }
  if (ep.pending_not_started == 0 && ep.pending_started == 0) ep.pending_blocks = 0.0;
  // Releases before the scrape are reflected in it now.
  std::erase_if(ep.released, [&](const Release& x) { return x.at <= scraped_at_s; });
}

void InflightTracker::ResetEndpoint(uint32_t endpoint_id) {
  if (endpoint_id >= endpoints_.size()) return;
  PerEndpoint& ep = endpoints_[endpoint_id];
  ep.released.clear();
  ep.last_scrape = -1e300;
}

bool InflightTracker::Tracked(uint32_t slot) const {
  return slot < records_.size() && records_[slot].live;
}
uint32_t InflightTracker::EndpointOf(uint32_t slot) const {
  return Tracked(slot) ? records_[slot].endpoint : kNil;
}

uint32_t InflightTracker::InFlight(uint32_t id) const {
  return FieldOf(id, &PerEndpoint::inflight);
}
uint32_t InflightTracker::PendingNotStarted(uint32_t id) const {
  return FieldOf(id, &PerEndpoint::pending_not_started);
}
uint32_t InflightTracker::PendingStarted(uint32_t id) const {
  return FieldOf(id, &PerEndpoint::pending_started);
}
double InflightTracker::PendingBlocks(uint32_t id) const {
  return FieldOf(id, &PerEndpoint::pending_blocks);
}
double InflightTracker::ReleasedBlocks(uint32_t id) const {
  const PerEndpoint* ep = FindEp(id);
  double sum = 0.0;
  if (ep) {
    for (const Release& r : ep->released) sum += r.blocks;
  }
  return sum;
}
uint32_t InflightTracker::ReleasedCount(uint32_t id) const {
  const PerEndpoint* ep = FindEp(id);
  return ep ? static_cast<uint32_t>(ep->released.size()) : 0;
}
double InflightTracker::ActiveBlocks(uint32_t id) const {
  return FieldOf(id, &PerEndpoint::active_blocks);
}

EndpointLoad InflightTracker::Load(const EndpointState& e, double capacity_blocks,
                                   bool adjust) const {
  EndpointLoad l;
  l.kv_usage = e.kv_usage;
  l.waiting = e.waiting;
  l.running = e.running;
  const PerEndpoint* ep = FindEp(e.id);
  if (ep == nullptr) return l;
  l.inflight = ep->inflight;
  l.active_blocks = ep->active_blocks;
  if (!adjust) return l;
  double released_blocks = 0.0;
  for (const Release& r : ep->released) released_blocks += r.blocks;
  l.waiting += ep->pending_not_started;
  l.running = std::max(0.0, l.running + ep->pending_started -
                                static_cast<double>(ep->released.size()));
  if (capacity_blocks > 0) {
    l.kv_usage = std::max(0.0, l.kv_usage + (ep->pending_blocks - released_blocks) /
                                                capacity_blocks);
  }
  return l;
}

}  // namespace kvroute::sched
