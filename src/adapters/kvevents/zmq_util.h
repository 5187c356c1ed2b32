// Pieces shared by the KV-event publisher and subscriber: vLLM's frame conventions and a
// wake-up file descriptor that a zmq poll loop can wait on next to its sockets.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvroute::kvevents {

// vLLM binds an endpoint with a wildcard host (`*`, `::`) or an ipc/inproc address and
// connects to anything else (REFERENCE.md section 5).
bool ShouldBind(std::string_view endpoint);

// The 8-byte big-endian seq frame; -1 (FF x 8) is the replay end marker.
inline constexpr uint64_t kEndMarkerSeq = ~uint64_t{0};
std::array<uint8_t, 8> SeqFrame(uint64_t seq);
uint64_t ParseSeqFrame(const void* data);  // reads 8 bytes

// An eventfd: Notify from any thread; the loop polls fd() and calls Drain.
class Waker {
 public:
  Waker();
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  int fd() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  void Notify();
  void Drain();

 private:
  int fd_ = -1;
};

}  // namespace kvroute::kvevents
