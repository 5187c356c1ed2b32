// A periodic callback on an io_context: the clock side of file discovery's polling.
//
// Threads: `tick` runs on the io_context's thread. Start and Stop may be called from any
// thread except from inside `tick` (Stop waits for a running tick).
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>

namespace kvroute::pool {

class PollTimer {
 public:
  // Calls `tick` every `interval` (the first time one interval after Start).
  PollTimer(boost::asio::io_context& ctx, std::chrono::nanoseconds interval,
            std::function<void()> tick);
  // Stops.
  ~PollTimer();
  PollTimer(const PollTimer&) = delete;
  PollTimer& operator=(const PollTimer&) = delete;

  void Start();
  // When it returns, `tick` is not running and will not run again. Idempotent.
  void Stop();

 private:
  struct State;  // shared with the pending wait, which holds it weakly
  // Schedules the next tick. Caller holds the state's mutex.
  static void Arm(const std::shared_ptr<State>& s);
  std::shared_ptr<State> state_;
};

}  // namespace kvroute::pool
