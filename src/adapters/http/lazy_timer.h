// A timeout that costs almost nothing to move: per-request deadlines (read, write, first
// byte, idle) are pushed back on every request or body piece, and cancelling and
// re-waiting an Asio timer each time posts an aborted handler, wakes the event loop and
// touches the timer queue. Here a later deadline only stores the new time; the pending
// wait re-checks when it fires and waits again for the remainder. Only an earlier
// deadline (or Cancel) touches the underlying timer.
//
// Threads: one io_context thread, like the socket it guards. Lifetime: a pending wait
// holds `keep` (the owner's shared_ptr), so the owner, which holds this timer, stays
// alive until the wait ends; Cancel() ends it promptly (e.g. when the socket closes).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace kvroute::http {

class LazyTimer {
 public:
  using Clock = std::chrono::steady_clock;
  // Called with keep.get() of the Set call that armed the wait, once the deadline passed.
  using Callback = void (*)(void* owner);

  LazyTimer(const boost::asio::io_context::executor_type& ex, Callback cb)
      : timer_(ex), cb_(cb) {}

  // Expires at `when`, replacing any earlier setting. `keep` is a shared_ptr to the owner
  // or a raw pointer to an owner derived from enable_shared_from_this; it is copied only
  // when a new wait must start.
  template <typename Ptr>
  void Set(Clock::time_point when, const Ptr& keep) {
    deadline_ = when;
    if (waiting_ && wait_until_ <= when) return;  // the pending wait will re-check
    if constexpr (std::is_pointer_v<Ptr>) {
      Wait(when, std::shared_ptr<void>(keep->shared_from_this()));
    } else {
      Wait(when, std::shared_ptr<void>(keep));
    }
  }
  // Disarms. The pending wait (if any) stays and finds nothing to do.
  void Clear() { deadline_ = Clock::time_point::max(); }
  // Disarms and ends the pending wait now (its handler sees operation_aborted).
  void Cancel() {
    deadline_ = Clock::time_point::max();
    if (!waiting_) return;
    waiting_ = false;
    ++gen_;
    timer_.cancel();
  }
  bool armed() const { return deadline_ != Clock::time_point::max(); }

 private:
  void Wait(Clock::time_point at, std::shared_ptr<void> keep) {
    if (waiting_) timer_.cancel();  // superseded; its handler sees a stale generation
    waiting_ = true;
    wait_until_ = at;
    uint64_t gen = ++gen_;
    timer_.expires_at(at);
    timer_.async_wait([this, gen, keep = std::move(keep)](const boost::system::error_code& ec) mutable {
      // `keep` pins the owner, and so this timer, for as long as the handler exists.
      if (gen != gen_) return;
      waiting_ = false;
      if (ec || deadline_ == Clock::time_point::max()) return;
      if (Clock::now() < deadline_) return Wait(deadline_, std::move(keep));
      deadline_ = Clock::time_point::max();
      cb_(keep.get());
    });
  }

  boost::asio::basic_waitable_timer<Clock, boost::asio::wait_traits<Clock>,
                                    boost::asio::io_context::executor_type>
      timer_;
  Callback cb_;
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point wait_until_{};
  uint64_t gen_ = 0;
  bool waiting_ = false;
};

}  // namespace kvroute::http
