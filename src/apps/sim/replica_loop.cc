// Replica's engine-driving loop: admission into the engine, Step -> timer -> Deliver ->
// next step while the engine has work, engine time, and the response path of latency_ms
// (Reply and its outbox).
#include <boost/asio/post.hpp>
#include <algorithm>
#include <chrono>
#include <optional>

#include "apps/sim/replica.h"
#include "apps/sim/replica_internal.h"

namespace kvroute::sim {

namespace asio = boost::asio;

using detail::RespondApiError;
using detail::WallDuration;

double Replica::EngineNow() const {
  double wall = 0.0;
  if (config_.time_scale > 0) {
    wall = std::chrono::duration<double>(Clock::now() - start_).count() / config_.time_scale;
  }
  return std::max(wall, last_step_end_);
}

void Replica::Admit(const std::shared_ptr<Live>& live) {
  if (live->pd_pull_pending) {
    live->pd_pull_pending = false;
    return StartPull(live);  // calls Admit again once the pull is settled
  }
  live->engine_req.arrival_s = EngineNow();
  if (auto err = engine_.AddRequest(std::move(live->engine_req))) {
    Reply(live->ex, [err = *err](http::Exchange& ex) { RespondApiError(ex, 400, err); });
    live_.erase(live->id);
    return;
  }
  live->admitted = true;
  if (config_.engine.lora.enabled) UpdateLoraInfo();
  if (live->req.stream) {
    Reply(live->ex, [](http::Exchange& ex) {
      ex.BeginStream(200, "text/event-stream", {{"cache-control", "no-cache"}});
    });
  }
  Kick();
}

void Replica::Reply(std::shared_ptr<http::Exchange> ex,
                    std::function<void(http::Exchange&)> send) {
  if (config_.latency_ms <= 0) return send(*ex);
  // A constant delay keeps due times in call order, so one FIFO and one timer suffice.
  outbox_.push_back({Clock::now() + WallDuration(config_.latency_ms / 1000.0), std::move(ex),
                     std::move(send)});
  if (outbox_.size() == 1) ArmOutbox();
}

void Replica::ArmOutbox() {
  outbox_timer_.expires_at(outbox_.front().due);
  outbox_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec && !shut_down_) FlushOutbox();
  });
}

void Replica::FlushOutbox() {
  const auto now = Clock::now();
  while (!outbox_.empty() && outbox_.front().due <= now) {
    Outgoing o = std::move(outbox_.front());
    outbox_.pop_front();
    o.send(*o.ex);
  }
  if (!outbox_.empty()) ArmOutbox();
}

void Replica::OnClientGone(uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  if (it->second->admitted) engine_.Abort(id);  // frees its KV blocks now
  if (it->second->delay) it->second->delay->cancel();
  live_.erase(it);
}

void Replica::Kick() {
  if (stepping_ && kv_wait_) {
    // The loop sleeps until a decode leg's KV arrives; new work must not wait for that.
    kv_wait_ = false;
    step_timer_.cancel();
    asio::post(ctx_, [this, epoch = epoch_] {
      if (epoch == epoch_) RunStep();
    });
    return;
  }
  if (stepping_ || shut_down_ || !engine_.HasWork()) return;
  stepping_ = true;
  asio::post(ctx_, [this, epoch = epoch_] {
    if (epoch == epoch_) RunStep();
  });
}

void Replica::RunStep() {
  if (shut_down_) return;
  if (!engine_.HasWork()) {
    stepping_ = false;
    return;
  }
  const double now = EngineNow();
  engine_.Step(now, &step_);
  PublishKvEvents();
  if (step_.duration_s <= 0) {
    if (std::optional<double> ready = engine_.NextKvReadyS(); ready && *ready > now) {
      // Only decode legs waiting for their KV: sleep until the first one's arrives.
      if (config_.time_scale <= 0) {
        last_step_end_ = *ready;  // no waiting: engine time jumps there
        asio::post(ctx_, [this, epoch = epoch_] {
          if (epoch == epoch_) RunStep();
        });
        return;
      }
      kv_wait_ = true;
      step_timer_.expires_after(WallDuration((*ready - now) * config_.time_scale) +
                                std::chrono::microseconds(1));
      // Kick may cut this sleep short after the timer already fired (cancel cannot stop a
      // queued handler): the sequence number makes such a handler a no-op, so only one
      // step chain ever runs.
      step_timer_.async_wait(
          [this, epoch = epoch_, seq = ++kv_wait_seq_](boost::system::error_code ec) {
            if (ec || epoch != epoch_ || !kv_wait_ || seq != kv_wait_seq_) return;
            kv_wait_ = false;
            RunStep();
          });
      return;
    }
    // Nothing could be scheduled although work is queued; retry shortly rather than spin.
    step_timer_.expires_after(std::chrono::milliseconds(1));
    step_timer_.async_wait([this, epoch = epoch_](boost::system::error_code ec) {
      if (!ec && epoch == epoch_) RunStep();
    });
    return;
  }
  // Thermal throttling: the same step, `factor` times longer.
  double duration_s = step_.duration_s;
  if (const fault::ActiveFault* slow = faults_.Find(fault::FaultKind::kSlow)) {
    duration_s *= slow->spec.factor;
  }
  last_step_end_ = now + duration_s;
  auto after = [this, epoch = epoch_](boost::system::error_code ec) {
    if (ec || shut_down_ || epoch != epoch_) return;
    Deliver();
    if (config_.engine.lora.enabled) UpdateLoraInfo();
    RunStep();
  };
  if (config_.time_scale <= 0) {
    asio::post(ctx_, [after] { after({}); });
    return;
  }
  step_timer_.expires_after(std::chrono::nanoseconds(
      static_cast<int64_t>(duration_s * config_.time_scale * 1e9)));
  step_timer_.async_wait(after);
}

}  // namespace kvroute::sim
