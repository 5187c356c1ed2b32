// Waiting in tests that talk to real servers on loopback: poll a condition with a deadline.
// (Virtual-time tests never wait: they pass the time in.)
#pragma once

#include <chrono>
#include <thread>

namespace kvroute::test_support {

// Polls `pred` every `every` until it holds or `limit` has passed; returns whether it held
// (checked once more at the deadline).
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(5000),
             std::chrono::milliseconds every = std::chrono::milliseconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(every);
  }
  return pred();
}

}  // namespace kvroute::test_support
