#include "adapters/pool/poll_timer.h"

#include <boost/asio/steady_timer.hpp>
#include <mutex>

namespace kvroute::pool {

struct PollTimer::State {
  State(boost::asio::io_context& ctx, std::chrono::nanoseconds i, std::function<void()> t)
      : timer(ctx), interval(i), tick(std::move(t)) {}
  // Guards the timer (a steady_timer is not thread-safe) and `stopped`; held while `tick`
  // runs, which is what lets Stop promise that no tick runs after it returns.
  std::mutex mu;
  boost::asio::steady_timer timer;
  std::chrono::nanoseconds interval;
  std::function<void()> tick;
  bool stopped = false;
};

PollTimer::PollTimer(boost::asio::io_context& ctx, std::chrono::nanoseconds interval,
                     std::function<void()> tick)
    : state_(std::make_shared<State>(ctx, interval, std::move(tick))) {}

PollTimer::~PollTimer() { Stop(); }

void PollTimer::Arm(const std::shared_ptr<State>& s) {
  s->timer.expires_after(s->interval);
  // Weak: a wait still queued when the owner goes must not keep the state (and the
  // owner's callback) alive.
  s->timer.async_wait([weak = std::weak_ptr<PollTimer::State>(s)](boost::system::error_code ec) {
    if (ec) return;
    std::shared_ptr<PollTimer::State> st = weak.lock();
    if (!st) return;
    std::lock_guard<std::mutex> lock(st->mu);
    if (st->stopped) return;
    st->tick();
    Arm(st);
  });
}

void PollTimer::Start() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->stopped) return;
  Arm(state_);
}

void PollTimer::Stop() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->stopped = true;
  state_->timer.cancel();
}

}  // namespace kvroute::pool
