// A reader/writer lock for critical sections of a few microseconds: readers share it,
// a writer excludes everyone, and a waiting writer stops new readers from entering (so
// commits are not starved by a stream of picks). Waiters spin with a pause, then yield
// the CPU, instead of sleeping in the kernel: for sections this short a futex sleep and
// wake-up costs more than the section itself (measured in bench/routing_bench: with
// std::shared_mutex two threads picking over 100 endpoints got 0.69x the request rate of
// one; see docs/BENCHMARKS.md). No packaged library offers this (std::shared_mutex and
// boost::shared_mutex both block in the kernel).
//
// Meets SharedLockable: use with std::shared_lock and std::unique_lock. Not recursive.
// Thread: any.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace kvroute {

class RwSpinLock {
 public:
  void lock_shared() {
    for (uint32_t spins = 0;; ++spins) {
      if (writers_waiting_.load(std::memory_order_relaxed) == 0) {
        int32_t s = state_.load(std::memory_order_relaxed);
        if (s >= 0 && state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                                   std::memory_order_relaxed)) {
          return;
        }
      }
      Backoff(spins);
    }
  }
  void unlock_shared() { state_.fetch_sub(1, std::memory_order_release); }

  void lock() {
    writers_waiting_.fetch_add(1, std::memory_order_relaxed);
    for (uint32_t spins = 0;; ++spins) {
      int32_t expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_weak(expected, -1, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
        writers_waiting_.fetch_sub(1, std::memory_order_relaxed);
        return;
      }
      Backoff(spins);
    }
  }
  void unlock() { state_.store(0, std::memory_order_release); }

 private:
  static void Backoff(uint32_t spins) {
    if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      // The holder may have been preempted (a busy or virtualised machine): let it run.
      std::this_thread::yield();
    }
  }

  std::atomic<int32_t> state_{0};  // > 0: readers inside; -1: a writer inside; 0: free
  std::atomic<int32_t> writers_waiting_{0};
};

}  // namespace kvroute
