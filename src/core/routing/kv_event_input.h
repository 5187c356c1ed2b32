// The routing core's KV-cache event input: the precise prefix index (kvevents::EventIndex)
// behind its own reader/writer lock, fed by the subscriber adapters' decoded batches and
// what their transport found; the route receipts that check its predictions against what
// the engines report; and their /metrics series. RoutingCore owns one and forwards its
// OnKvEvents*, OnRouteReceipt and KvEventStats calls here.
//
// State lines (an endpoint's events going live, stale, resyncing) name endpoints from the
// table passed in and go to the caller's log or list, once per change.
//
// Threads: every method may be called from any thread. The index's lock is never the
// scheduler's; a pick that holds both takes the scheduler's first (KeysForPick).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/rw_spin_lock.h"
#include "core/kvevents/event_index.h"
#include "core/kvevents/kv_event.h"
#include "core/routing/endpoint_table.h"

namespace kvroute::routing {

class KvEventInput {
 public:
  using LogFn = std::function<void(std::string_view)>;

  KvEventInput();
  ~KvEventInput();
  KvEventInput(const KvEventInput&) = delete;
  KvEventInput& operator=(const KvEventInput&) = delete;

  // Follows a new endpoint table: endpoints with events configured (EndpointSpec::
  // kv_events) are expected from `now_s` on, an id taken over by another address starts
  // again, every other endpoint is forgotten. New states other than unknown and off are
  // appended to `logs`.
  void Configure(const kvevents::IndexOptions& options, const EndpointTable& table,
                 const EndpointTable& old_table, double now_s, std::vector<std::string>& logs);

  // Endpoint `id`'s decoded batch, and what its transport found: a gap (`repaired` when
  // replay filled it), a publisher restart, an undecodable batch. Each state change goes to
  // `log` (may be empty), named from `table`.
  void Apply(uint32_t id, const kvevents::KvEventBatch& batch, double now_s,
             const EndpointTable& table, const LogFn& log);
  void Gap(uint32_t id, bool repaired, double now_s, const EndpointTable& table, const LogFn& log);
  void Restart(uint32_t id, double now_s, const EndpointTable& table, const LogFn& log);
  void DecodeError(uint32_t id, double now_s, const EndpointTable& table, const LogFn& log);

  // Time-based states (stale, the end of a resync) and expired speculative entries; state
  // lines appended to `logs` when given.
  void Tick(double now_s, const EndpointTable& table, std::vector<std::string>* logs);

  // Some endpoint has events configured (front ends then tokenize requests).
  bool active() const { return active_.load(std::memory_order_relaxed); }

  // A pick's read: takes `lock` (shared) on the index, writes the request's block keys
  // (rooted in `root`: an adapter's name, or "" for the base model) into `keys` and returns
  // the index to rank with. The caller releases `lock` once the scheduler has ranked.
  const kvevents::EventIndex* KeysForPick(std::shared_lock<RwSpinLock>& lock, std::string_view root,
                                          std::span<const uint32_t> token_ids, std::vector<uint64_t>* keys);
  std::shared_lock<RwSpinLock> DeferredLock() const {
    return std::shared_lock<RwSpinLock>(mu_, std::defer_lock);
  }

  // A precise pick with `keys` (a prompt of `prompt_tokens`) was dispatched to `first`:
  // returns the cached prompt tokens the index says `first` holds (a multiple of the block
  // size, at most the prompt less its last token; -1 when its events are not live), records
  // speculative entries until the engine's events arrive, and starts the staleness clock
  // when the engine must store blocks.
  int64_t OnDispatched(std::span<const uint64_t> keys, std::size_t prompt_tokens, uint32_t first,
                       double now_s);

  // A route receipt (RoutingCore::OnRouteReceipt); `block_tokens`: the index's block size,
  // the error a receipt may have and still count as predicted. Lock-free.
  void OnRouteReceipt(int64_t predicted, int64_t reported, int64_t block_tokens);

  kvevents::EndpointEventStats Stats(uint32_t id, double now_s) const;

  // kvroute_kv_events_* for the endpoints of `table` with events configured, and
  // kvroute_route_receipt*.
  void AppendMetrics(std::string& out, const EndpointTable& table, double now_s) const;

  // "endpoint NAME KV events: FROM -> TO (REASON)", for logs.
  static std::string TransitionLine(const EndpointTable& table, const kvevents::StateTransition& t);

 private:
  // Route receipts: predicted against reported cached prompt tokens (many writers).
  struct Receipts {
    static constexpr std::array<double, 8> kBounds = {0, 16, 64, 256, 1024, 4096, 16384, 65536};
    std::array<std::atomic<uint64_t>, kBounds.size() + 1> abs_error{};
    std::atomic<uint64_t> receipts{0}, mispredicted{0}, unreported{0}, over{0}, under{0};
    std::atomic<uint64_t> abs_error_sum{0}, predicted_sum{0}, reported_sum{0};
  };

  template <typename F>
  void With(F&& f, const EndpointTable& table, const LogFn& log);
  void AppendReceiptMetrics(std::string& out) const;

  mutable RwSpinLock mu_;
  std::unique_ptr<kvevents::EventIndex> index_;  // guarded by mu_
  std::atomic<bool> active_{false};
  Receipts receipts_;
};

}  // namespace kvroute::routing
