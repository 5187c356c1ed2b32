#include "http/relay.h"

#include <utility>

namespace kvroute::http {

void RelayChunk(Exchange& ex, UpstreamCall& call, std::string chunk, std::weak_ptr<void> owner) {
  if (ex.pending_write_bytes() + chunk.size() <= kMaxClientBacklog) {
    ex.SendChunk(std::move(chunk));
    return;
  }
  call.Pause();
  ex.SendChunk(std::move(chunk), [&call, owner = std::move(owner)](bool) {
    if (auto alive = owner.lock()) call.Resume();
  });
}

}  // namespace kvroute::http
