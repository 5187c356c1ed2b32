#include "core/kvevents/kv_event.h"

#include <xxhash.h>

namespace kvroute::kvevents {

std::string_view MediumName(Medium m) {
  switch (m) {
    case Medium::kGpu: return "GPU";
    case Medium::kCpu: return "CPU";
    case Medium::kDisk: return "DISK";
    case Medium::kOther: break;
  }
  return "OTHER";
}

Medium MediumFromName(std::string_view s) {
  if (s == "GPU") return Medium::kGpu;
  if (s == "CPU") return Medium::kCpu;
  if (s == "DISK") return Medium::kDisk;
  return Medium::kOther;
}

uint64_t FoldHashBytes(std::span<const uint8_t> digest) {
  return XXH3_64bits(digest.data(), digest.size());
}

}  // namespace kvroute::kvevents
