#include "adapters/kvevents/zmq_util.h"

#include <sys/eventfd.h>
#include <unistd.h>

namespace kvroute::kvevents {

bool ShouldBind(std::string_view endpoint) {
  if (endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")) return true;
  return endpoint.find('*') != std::string_view::npos ||
         endpoint.find("::") != std::string_view::npos;
}

std::array<uint8_t, 8> SeqFrame(uint64_t seq) {
  std::array<uint8_t, 8> b{};
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(seq >> (56 - 8 * i));
  return b;
}

uint64_t ParseSeqFrame(const void* data) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

Waker::Waker() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Waker::~Waker() {
  if (fd_ >= 0) close(fd_);
}

void Waker::Notify() {
  const uint64_t one = 1;
  // A full counter (never in practice) still leaves the fd readable: nothing is lost.
  [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof one);
}

void Waker::Drain() {
  uint64_t v = 0;
  [[maybe_unused]] ssize_t n = read(fd_, &v, sizeof v);
}

}  // namespace kvroute::kvevents
