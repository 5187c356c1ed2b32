// A value published whole by one thread and read by many: readers get a shared_ptr to an
// immutable snapshot that stays valid as long as they hold it; a writer replaces it whole.
//
// Why not std::atomic<std::shared_ptr>: libstdc++ 12's implementation guards the pointer
// with a lock bit that ThreadSanitizer cannot see, so every reader/writer pair reports as a
// race and real races would hide among them. A mutex held for one reference-count
// increment costs about the same. The request path takes it a few times per request
// (serve's settings, the core's endpoint slots and options): uncontended, tens of ns each.
//
// Thread: any.
#pragma once

#include <memory>
#include <mutex>

namespace kvroute {

template <typename T>
class Published {
 public:
  Published() = default;
  explicit Published(std::shared_ptr<const T> initial) : ptr_(std::move(initial)) {}

  std::shared_ptr<const T> load() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ptr_;
  }
  // The previous value is released after the lock (its destructor may be expensive).
  void store(std::shared_ptr<const T> next) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ptr_.swap(next);
    }
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const T> ptr_;
};

}  // namespace kvroute
