// A KV-event publisher that behaves as vLLM's ZmqEventPublisher (REFERENCE.md section 5),
// for the simulator and for tests.
//
// Live messages go out on a PUB socket as [topic, seq (8 bytes BE), payload], seq counting
// batches from 0 for this instance. The PUB endpoint is bound when it has a wildcard host
// or is ipc/inproc, and connected otherwise (ShouldBind): a router can bind one SUB socket
// and let publishers connect (centralized mode). With a replay endpoint, a ROUTER socket
// (always bound) answers [identity, "", start_seq] with every kept batch whose seq >=
// start_seq, as [identity, "", topic, seq, payload] (kTopicSeqPayload, vLLM after PR 45177,
// the default) or [identity, "", seq, payload] (kSeqPayload, before it), then the end
// marker: seq -1 (FF x 8) with an empty payload. The last `buffer_steps` batches are kept.
//
// Threads: the sockets live on the publisher's own thread. Publish may be called from any
// thread and only encodes the batch, queues it and wakes that thread (an eventfd), so a
// simulator's io thread pays for the encoding and a lock, never for socket I/O.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/common/status.h"
#include "core/kvevents/kv_event.h"
#include "adapters/kvevents/codec.h"

namespace kvroute::kvevents {

enum class ReplayReplyForm : uint8_t { kTopicSeqPayload, kSeqPayload };

struct PublisherOptions {
  std::string endpoint = "tcp://*:5557";  // "tcp://127.0.0.1:*": any free port
  std::optional<bool> bind;               // nullopt: vLLM's rule (ShouldBind)
  std::string replay_endpoint;            // "": no replay socket
  std::string topic;                      // "": an empty topic frame
  size_t buffer_steps = 10000;            // batches kept for replay (>= 1)
  int hwm = 100000;                       // PUB send high-water mark
  ReplayReplyForm replay_form = ReplayReplyForm::kTopicSeqPayload;
  Format format = Format::kArray;
  HashForm hash_form = HashForm::kInt;
};

// What happens to one published batch on the PUB socket. Either way it gets the next seq
// and is kept for replay.
enum class SendMode : uint8_t {
  kSend,        // sent live
  kBufferOnly,  // not sent (a high-water-mark drop, or a stalled sender): replay only
};

struct PublisherCounters {
  uint64_t published = 0;        // batches given a seq
  uint64_t sent = 0;             // of which sent live
  uint64_t replay_requests = 0;  // well-formed replay requests answered
  uint64_t bad_requests = 0;     // malformed replay requests ignored
};

class Publisher {
 public:
  // Opens the sockets and starts the thread. Unavailable when a socket cannot be bound or
  // connected ("kv events: bind tcp://*:5557: Address already in use"), InvalidArgument
  // for buffer_steps 0.
  static Result<std::unique_ptr<Publisher>> Start(PublisherOptions options);
  // Stops (see Stop).
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Encodes `batch` with the options' format and hash form and queues it. Returns its seq.
  // Thread: any.
  uint64_t Publish(const KvEventBatch& batch, SendMode mode = SendMode::kSend);
  // Same with an already encoded payload (tests send malformed ones). Thread: any.
  uint64_t PublishPayload(std::string payload, SendMode mode = SendMode::kSend);
  // Waits until every batch queued so far has been handed to the sockets (or the
  // publisher stopped). Thread: any but the publisher's.
  void Flush();
  // Closes the sockets (unsent messages are dropped: linger 0) and joins the thread.
  // Idempotent; fast.
  void Stop();

  // The endpoints as bound (a wildcard port resolved, "tcp://127.0.0.1:40123") or as
  // given when connected; replay "" when none.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  const PublisherOptions& options() const { return options_; }
  PublisherCounters Counters() const;

 private:
  struct Impl;
  explicit Publisher(PublisherOptions options);
  void Run();

  PublisherOptions options_;
  std::string endpoint_;
  std::string replay_endpoint_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace kvroute::kvevents
