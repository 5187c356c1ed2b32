// Fuzz target: the session token a client sends back (x-session-token, core/routing/
// sessions.h), as the routing core reads it on the request path.
//
// Invariants: decoding never writes past its buffer and never allocates; a token that
// decodes re-encodes (padded) to itself, whitespace and padding aside; whatever an
// address is, its token decodes back to it; a session id's key is deterministic.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/routing/sessions.h"

#include "fuzz_check.h"

namespace {

using namespace kvroute;

using fuzz::Check;

std::string_view Stripped(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r' || s.front() == '\n')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  while (!s.empty() && s.back() == '=') s.remove_suffix(1);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  std::array<char, 256> buf;
  const auto address = routing::DecodeSessionToken(in, buf);
  if (address) {
    Check(address->data() == buf.data() && address->size() <= buf.size(), "decoded outside the buffer");
    Check(!address->empty(), "a token decoded to nothing");
    const std::string again = routing::EncodeSessionToken(*address);
    Check(Stripped(again) == Stripped(in), "a decoded token does not encode back to itself");
  }
  // A buffer of one byte: at most one byte decoded.
  std::array<char, 1> tiny;
  if (const auto t = routing::DecodeSessionToken(in, tiny)) Check(t->size() == 1, "overran a small buffer");

  // The round trip from the other side, for addresses that fit.
  if (size <= buf.size() && size > 0) {
    const std::string token = routing::EncodeSessionToken(in);
    const auto back = routing::DecodeSessionToken(token, buf);
    Check(back && *back == in, "an address's token does not decode back to it");
  }
  Check(routing::SessionKey(in) == routing::SessionKey(std::string(in)), "a key that is not deterministic");
  return 0;
}
