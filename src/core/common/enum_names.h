// An enum's names as one table of {value, name} pairs: the name of a value (NameOf) and the
// value of a name (ValueOf). Tables are a handful of entries, searched in order; no
// allocation.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace kvroute {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

// The name `names` gives `value`, or `unknown` when it lists none.
template <class E, std::size_t N>
constexpr std::string_view NameOf(const EnumName<E> (&names)[N], E value,
                                  std::string_view unknown) {
  for (const EnumName<E>& n : names) {
    if (n.value == value) return n.name;
  }
  return unknown;
}

// The value `names` lists under `name`, or nullopt.
template <class E, std::size_t N>
constexpr std::optional<E> ValueOf(const EnumName<E> (&names)[N], std::string_view name) {
  for (const EnumName<E>& n : names) {
    if (n.name == name) return n.value;
  }
  return std::nullopt;
}

}  // namespace kvroute
