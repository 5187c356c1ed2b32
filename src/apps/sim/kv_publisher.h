// A simulated replica's KV-event publisher (docs/KV_EVENTS.md): vLLM's ZMQ publisher
// (kvevents::Publisher) fed one batch per engine step, with the replica's event faults.
//
//  - One batch per engine step when it has events, ts = wall time, data_parallel_rank 0.
//  - events_stall: batches get their seq and go into the replay buffer but are not sent
//    (a stalled sender): a subscriber that replays later repairs the gap.
//  - events_drop: the batches FaultSet::DropsEventBatch picks are not sent but are kept
//    for replay, as a PUB high-water-mark drop would lose them.
//  - Restart (restart and crash faults): a new publisher instance on the same ports, so
//    seq starts again at 0 and the replay buffer is empty.
//
// Thread: the replica's (the publisher's own thread does the socket I/O).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/fleet_config.h"
#include "core/common/status.h"
#include "core/kvevents/kv_event.h"
#include "adapters/kvevents/publisher.h"
#include "simkit/fault/fault.h"

namespace kvroute::sim {

class KvPublisher {
 public:
  // Binds PUB on tcp://<host>:<port> (port 0: any free port), or connects it to
  // config.connect (topic default kv@<host>@<model>), and, with a replay port, binds
  // ROUTER on tcp://<host>:<replay_port>. Unavailable when a port cannot be bound.
  static Result<std::unique_ptr<KvPublisher>> Start(const std::string& host, const std::string& model,
                                                    const config::KvPublishConfig& config);

  // Publishes one step's events (nothing when empty) under `faults`.
  void PublishStep(std::vector<kvevents::KvEvent> events, const fault::FaultSet& faults);
  // Closes the publisher (a dead process publishes nothing); Restart opens it again.
  void Close();
  // A new instance on the same ports: seq 0, empty replay buffer. Unavailable when a
  // port cannot be bound again.
  Status Restart();

  // "tcp://127.0.0.1:40123"; "" for no replay socket.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  uint64_t next_seq() const { return next_seq_; }

 private:
  KvPublisher(std::string host, config::KvPublishConfig config)
      : host_(std::move(host)), config_(std::move(config)) {}
  Status Open(const std::string& pub, const std::string& replay);

  std::string host_;
  config::KvPublishConfig config_;
  std::unique_ptr<kvevents::Publisher> pub_;
  std::string endpoint_, replay_endpoint_;
  uint64_t next_seq_ = 0;
};

}  // namespace kvroute::sim
