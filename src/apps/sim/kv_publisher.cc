#include "apps/sim/kv_publisher.h"

#include <chrono>

namespace kvroute::sim {

namespace {

std::string Endpoint(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  const std::string h = v6 ? "[" + host + "]" : host;
  return "tcp://" + h + ":" + (port == 0 ? std::string("*") : std::to_string(port));
}

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<std::unique_ptr<KvPublisher>> KvPublisher::Start(const std::string& host, const std::string& model,
                                                        const config::KvPublishConfig& config) {
  std::unique_ptr<KvPublisher> p(new KvPublisher(host, config));
  if (!config.connect.empty() && p->config_.topic.empty()) {
    p->config_.topic = "kv@" + host + "@" + model;  // what a centralized router matches
  }
  const std::string pub = config.connect.empty() ? Endpoint(host, config.port.value_or(0)) : config.connect;
  const std::string replay = config.replay_port ? Endpoint(host, *config.replay_port) : "";
  if (Status s = p->Open(pub, replay); !s.ok()) return s;
  return p;
}

Status KvPublisher::Open(const std::string& pub, const std::string& replay) {
  kvevents::PublisherOptions o;
  // vLLM's rule would connect to a named host; the sim's port means "listen on this port",
  // and only `connect` connects.
  o.endpoint = pub;
  o.bind = config_.connect.empty();
  o.replay_endpoint = replay;
  o.topic = config_.topic;
  o.format = config_.format == "map" ? kvevents::Format::kMap : kvevents::Format::kArray;
  o.hash_form = config_.hash == "bytes" ? kvevents::HashForm::kBytes : kvevents::HashForm::kInt;
  Result<std::unique_ptr<kvevents::Publisher>> started = kvevents::Publisher::Start(o);
  if (!started.ok()) return started.status();
  pub_ = std::move(*started);
  endpoint_ = pub_->endpoint();
  replay_endpoint_ = pub_->replay_endpoint();
  next_seq_ = 0;
  return Status::Ok();
}

void KvPublisher::PublishStep(std::vector<kvevents::KvEvent> events, const fault::FaultSet& faults) {
  if (events.empty() || !pub_) return;
  kvevents::KvEventBatch batch;
  batch.ts = WallNow();
  batch.events = std::move(events);
  const uint64_t seq = next_seq_++;
  const bool silent = faults.active(fault::FaultKind::kEventsStall) || faults.DropsEventBatch(seq);
  pub_->Publish(batch, silent ? kvevents::SendMode::kBufferOnly : kvevents::SendMode::kSend);
}

void KvPublisher::Close() { pub_.reset(); }

Status KvPublisher::Restart() {
  // Destroying the old instance terminates its ZMQ context, which waits until its
  // listening sockets are closed: the same ports can be bound again at once.
  pub_.reset();
  return Open(endpoint_, replay_endpoint_);
}

}  // namespace kvroute::sim
