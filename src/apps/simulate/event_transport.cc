#include "apps/simulate/event_transport.h"

#include <utility>

namespace kvroute::simulate {

uint64_t EventPublisher::Publish(BatchPtr batch) {
  buffer_.push_back(std::move(batch));
  while (buffer_.size() > buffer_steps_) buffer_.pop_front();
  return next_++;
}

void EventPublisher::Restart() {
  next_ = 0;
  buffer_.clear();
}

bool EventPublisher::Replay(uint64_t from, uint64_t to, std::vector<BatchPtr>* out) const {
  const uint64_t first = next_ - buffer_.size();
  if (from > to || from < first || to > next_) return false;
  for (uint64_t s = from; s < to; ++s) out->push_back(buffer_[static_cast<size_t>(s - first)]);
  return true;
}

void EventReceiver::Deliver(uint64_t seq, BatchPtr batch, std::vector<Delivery>* out) {
  Delivery d;
  d.kind = Delivery::Kind::kBatch;
  d.seq = seq;
  d.batch = std::move(batch);
  out->push_back(std::move(d));
  ++stats_.delivered;
  expected_ = seq + 1;
}

bool EventReceiver::Arrive(uint64_t seq, BatchPtr batch, const EventPublisher& publisher,
                           std::vector<Delivery>* out) {
  if (pending_) {
    held_.emplace_back(seq, std::move(batch));
    return false;
  }
  if (seq == expected_) {
    Deliver(seq, std::move(batch), out);
    return false;
  }
  if (seq < expected_) {
    ++stats_.restarts;
    out->push_back({Delivery::Kind::kRestart, false, 0, nullptr});
    Deliver(seq, std::move(batch), out);
    return false;
  }
  ++stats_.gaps;
  replay_batches_.clear();
  if (replay_ && publisher.Replay(expected_, seq, &replay_batches_)) {
    pending_ = true;
    replay_from_ = expected_;
    trigger_seq_ = seq;
    trigger_ = std::move(batch);
    return true;
  }
  ++stats_.unrepaired;
  out->push_back({Delivery::Kind::kGap, false, 0, nullptr});
  Deliver(seq, std::move(batch), out);
  return false;
}

bool EventReceiver::ReplayArrived(const EventPublisher& publisher, std::vector<Delivery>* out) {
  if (!pending_) return false;
  pending_ = false;
  out->push_back({Delivery::Kind::kGap, true, 0, nullptr});
  for (size_t i = 0; i < replay_batches_.size(); ++i) {
    Deliver(replay_from_ + i, std::move(replay_batches_[i]), out);
    ++stats_.replayed;
  }
  replay_batches_.clear();
  Deliver(trigger_seq_, std::move(trigger_), out);
  trigger_ = nullptr;
  while (!held_.empty()) {
    auto [seq, batch] = std::move(held_.front());
    held_.pop_front();
    if (Arrive(seq, std::move(batch), publisher, out)) return true;
  }
  return false;
}

}  // namespace kvroute::simulate
