// Relaying an upstream's streamed answer to a client with back-pressure: what serve and
// the sidecar do with every chunk of an engine's stream.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "http/client.h"
#include "http/server.h"

namespace kvroute::http {

// Bytes queued for a client and not yet written past which a relay reads no more from the
// upstream until they drain.
inline constexpr std::size_t kMaxClientBacklog = 1u << 20;

// Sends `chunk` on `ex`'s open stream. When the client is slow (over kMaxClientBacklog
// queued), `call` is paused until this chunk, and so everything before it, has been
// written: the upstream's own flow control then holds the engine's output back. `owner`
// owns `call`; the resume runs only while it lives. Thread: the exchange's.
void RelayChunk(Exchange& ex, UpstreamCall& call, std::string chunk, std::weak_ptr<void> owner);

}  // namespace kvroute::http
