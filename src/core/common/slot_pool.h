// Slots reused through a free list: a vector of entries and the indexes of released ones.
// Header-only; allocates only when the vector grows.
#pragma once

#include <cstdint>
#include <vector>

namespace kvroute {

struct TakenSlot {
  uint32_t index;
  bool fresh;  // appended (default-constructed), not a released one reused
};

// A slot of `items` for a new occupant: the last index released to `free` when there is
// one, else a new entry appended. The caller resets what a reused slot still holds.
template <class T>
TakenSlot TakeSlot(std::vector<T>& items, std::vector<uint32_t>& free) {
  if (!free.empty()) {
    const uint32_t s = free.back();
    free.pop_back();
    return {s, false};
  }
  items.emplace_back();
  return {static_cast<uint32_t>(items.size() - 1), true};
}

}  // namespace kvroute
