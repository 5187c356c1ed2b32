// Relaying an upstream's streamed answer to a client with back-pressure: what serve and
// the sidecar do with every chunk of an engine's stream.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "adapters/http/client.h"
#include "adapters/http/server.h"

namespace kvroute::http {

// Bytes queued for a client and not yet written past which a relay reads no more from the
// upstream until they drain.
inline constexpr std::size_t kMaxClientBacklog = 1u << 20;

// Sends `chunk` on `ex`'s open stream. When the client is slow (over kMaxClientBacklog
// queued), `call` is paused until this chunk, and so everything before it, has been
// written: the upstream's own flow control then holds the engine's output back. `owner`
// (an enable_shared_from_this) owns `call`; the resume runs only while it lives. Only the
// slow path takes a weak reference: a chunk to a keeping-up client costs no atomic.
// Thread: the exchange's.
template <typename Owner>
void RelayChunk(Exchange& ex, UpstreamCall& call, std::string chunk, Owner& owner) {
  if (ex.pending_write_bytes() + chunk.size() <= kMaxClientBacklog) {
    ex.SendChunk(std::move(chunk));
    return;
  }
  call.Pause();
  ex.SendChunk(std::move(chunk), [&call, weak = owner.weak_from_this()](bool) {
    if (auto alive = weak.lock()) call.Resume();
  });
}

}  // namespace kvroute::http
