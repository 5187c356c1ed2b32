// An enum's names, written once. An enum that declares its count keeps them in an array
// indexed by value and sized by that count (NameAt: a name too many does not compile);
// any other keeps a table of {value, name} pairs: the name of a value (NameOf) and the
// value of a name (ValueOf). Tables are a handful of entries, searched in order; no
// allocation.
#pragma once

#include <array>
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

// The name at `value`'s index in `names` (one per value, in declaration order), or
// `unknown` past its end.
template <class E, std::size_t N>
constexpr std::string_view NameAt(const std::array<std::string_view, N>& names, E value,
                                  std::string_view unknown) {
  const auto i = static_cast<std::size_t>(value);
  return i < N ? names[i] : unknown;
}

}  // namespace kvroute
