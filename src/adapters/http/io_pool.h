// A fixed set of event loops: one asio::io_context per thread. Servers, timers and
// upstream clients are placed on one of these contexts and stay there, so the state
// they own is touched by one thread only and needs no locks.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <memory>
#include <thread>
#include <vector>

namespace kvroute::http {

class IoPool {
 public:
  // Creates `threads` (>= 1) contexts. No thread runs until Start().
  explicit IoPool(int threads);
  // Stops and joins.
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // Starts one thread per context. Each thread runs its context until Stop(); an idle
  // context keeps running (a work guard holds it). Call once.
  void Start();

  // Stops every context and joins the threads. Pending handlers are not run; they are
  // destroyed with the contexts (when the pool is destroyed). Idempotent; must not be
  // called from one of the pool's threads.
  void Stop();

  int size() const { return static_cast<int>(contexts_.size()); }
  boost::asio::io_context& context(int i) { return *contexts_[i]; }
  // Pointers to every context, for Server's constructor.
  std::vector<boost::asio::io_context*> contexts();

 private:
  using WorkGuard = boost::asio::executor_work_guard<boost::asio::io_context::executor_type>;
  std::vector<std::unique_ptr<boost::asio::io_context>> contexts_;
  std::vector<WorkGuard> guards_;
  std::vector<std::thread> threads_;
};

// Cancels the wait of `signals` (nothing when null), which runs on `io`'s context 0: a
// signal_set is not safe across threads, so the cancel is posted there. For a front end's
// Stop, whatever thread it is called on.
void CancelSignalWait(IoPool& io, boost::asio::signal_set* signals);

}  // namespace kvroute::http
