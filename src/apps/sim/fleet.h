// A fleet of simulated replicas in one process: each replica is a Replica plus its own
// HTTP server on its own port, pinned to one event loop of a shared IoPool (replica i
// on loop i % threads). Used by `kvroute sim`, the demo and loopback tests.
//
// P/D: the fleet is the directory its replicas pull KV from (KvPeerDirectory): replica i's
// remote_engine_id is its config's pd.engine_id, else "kvroute-sim-<i>-<name>"; it
// announces its HTTP host and bound port as remote_host/remote_port. A decode leg can pull
// only from a replica of the same fleet.
#pragma once

#include "core/common/status.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "adapters/http/io_pool.h"
#include "adapters/http/server.h"
#include "config/fleet_config.h"
#include "apps/sim/replica.h"

namespace kvroute::sim {

class Fleet {
 public:
  // `threads` <= 0: one per replica, capped at the hardware's concurrency.
  Fleet(std::vector<ReplicaConfig> replicas, int threads = 0);
  // Stops (see Stop).
  ~Fleet();
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Replica i's Unix clock (Replica::SetUnixClock: vllm:lora_requests_info's values).
  // Call before Start; `clock` is called on replica i's thread.
  void SetUnixClock(int i, std::function<double()> clock) {
    replicas_[i]->SetUnixClock(std::move(clock));
  }

  // Binds every replica's port and starts the loops. Returns Unavailable with the first
  // error ("replica-0: bind 127.0.0.1:18001: Address already in use"); nothing keeps
  // running then. Call once.
  Status Start();
  // Stops accepting, stops the loops and drops in-flight requests. Idempotent.
  // Must not be called from a fleet thread.
  void Stop();

  int size() const { return static_cast<int>(replicas_.size()); }
  // The bound port of replica i (after Start); the same across crash and restart
  // downtime (the port is reopened).
  uint16_t port(int i) const { return ports_[i]; }
  const ReplicaConfig& config(int i) const { return configs_[i]; }
  // Replica i's remote_engine_id (P/D).
  const std::string& engine_id(int i) const { return engine_ids_[i]; }
  // Replica i's KV-event PUB and replay endpoints as bound ("tcp://127.0.0.1:40123"), ""
  // when it publishes none (after Start; unchanged by restarts).
  const std::string& kv_events_endpoint(int i) const { return kv_endpoints_[i]; }
  const std::string& kv_events_replay_endpoint(int i) const { return kv_replay_endpoints_[i]; }

  // Engine counters of replica i, read on its own thread. nullopt if the fleet is not
  // running or the read took over 2 s. Thread: any but a fleet thread.
  std::optional<engine::EngineStats> Stats(int i);
  // Requests replica i has accepted and not yet finished; -1 as for Stats.
  int LiveRequests(int i);
  // PeekCachedTokens of replica i's engine for `ids` (how many of them a request would
  // find cached); nullopt as for Stats.
  std::optional<int> PeekCachedTokens(int i, std::vector<uint32_t> ids);
  // The faults active on replica i (FaultSet::ToJson at this moment); "" as for Stats.
  std::string FaultsJson(int i);

 private:
  std::unique_ptr<http::Server> MakeServer(int i, uint16_t port);
  // Replica i's listen control (crash and restart downtime); on its thread.
  bool SetListening(int i, bool listen);
  // Runs `fn` on replica i's thread and waits (at most 2 s); false if it did not run.
  bool RunOn(int i, std::function<void()> fn);

  std::vector<ReplicaConfig> configs_;
  std::vector<std::string> engine_ids_;
  http::IoPool pool_;
  KvPeerDirectory peers_;  // filled in the constructor, read-only once the loops run
  // Destroyed before pool_ (declared after): servers and replicas own sockets and timers
  // that belong to the pool's io_contexts.
  std::vector<std::unique_ptr<Replica>> replicas_;
  // servers_[i] is null while replica i is down; only its thread touches it once
  // running. A server closed for downtime is kept (retired_) until Stop: its
  // connections may still be open.
  std::vector<std::unique_ptr<http::Server>> servers_;
  std::vector<std::unique_ptr<http::Server>> retired_;
  std::vector<uint16_t> ports_;
  std::vector<std::string> kv_endpoints_, kv_replay_endpoints_;
  bool running_ = false;
  bool stopped_ = false;
};

}  // namespace kvroute::sim
