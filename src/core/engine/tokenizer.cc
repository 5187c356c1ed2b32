#include "core/engine/tokenizer.h"

#include <array>
#include <cstring>

namespace kvroute::engine {
namespace {

// A 64-bit finalizer (splitmix64's): cheap, and it spreads the few packed bytes of a run
// over the whole word before the modulo, so neighbouring texts get unrelated ids.
constexpr uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Three letters and a space: every output token is exactly kBytesPerToken bytes, so a
// generated text tokenizes back to the ids the engine generated (see OutputTokenId).
constexpr std::array<std::string_view, 64> kWords = {
    "the ", "and ", "for ", "are ", "but ", "not ", "you ", "all ", "any ", "can ", "had ",
    "her ", "was ", "one ", "our ", "out ", "day ", "get ", "has ", "him ", "his ", "how ",
    "man ", "new ", "now ", "old ", "see ", "two ", "way ", "who ", "boy ", "did ", "its ",
    "let ", "put ", "say ", "she ", "too ", "use ", "cat ", "dog ", "sun ", "sky ", "sea ",
    "red ", "big ", "top ", "run ", "set ", "map ", "key ", "row ", "bit ", "log ", "sum ",
    "end ", "box ", "net ", "web ", "api ", "gpu ", "kv  ", "job ", "yes "};
static_assert(kWords.size() == 64);

}  // namespace

// Id of a run packed little-endian into `packed` with its length `n`. The length is part
// of the key so "a" and "a\0" differ.
static inline uint32_t PackedId(uint32_t packed, size_t n) {
  const uint64_t key = (static_cast<uint64_t>(n) << 32) | packed;
  return static_cast<uint32_t>(Mix64(key + 0x9e3779b97f4a7c15ULL) % kVocabSize);
}

uint32_t TokenId(std::string_view run) {
  uint32_t packed = 0;
  const size_t n = run.size() < kBytesPerToken ? run.size() : kBytesPerToken;
  std::memcpy(&packed, run.data(), n);
  return PackedId(packed, n);
}

void TokenizeInto(std::string_view text, std::vector<uint32_t>* out) {
  const size_t start = out->size();
  out->resize(start + CountTokens(text));
  uint32_t* dst = out->data() + start;
  const size_t full = text.size() / kBytesPerToken;
  // Whole runs with a fixed-size copy (one load each); the tail, if any, separately.
  for (size_t i = 0; i < full; ++i) {
    uint32_t packed;
    std::memcpy(&packed, text.data() + i * kBytesPerToken, kBytesPerToken);
    dst[i] = PackedId(packed, kBytesPerToken);
  }
  if (full * kBytesPerToken < text.size()) {
    dst[full] = TokenId(text.substr(full * kBytesPerToken));
  }
}

std::vector<uint32_t> Tokenize(std::string_view text) {
  std::vector<uint32_t> ids;
  TokenizeInto(text, &ids);
  return ids;
}

namespace {

size_t OutputWordIndex(uint64_t request_id, size_t index) {
  return Mix64(Mix64(request_id ^ 0x5851f42d4c957f2dULL) + index) % kWords.size();
}

}  // namespace

std::string_view OutputTokenText(uint64_t request_id, size_t index) {
  return kWords[OutputWordIndex(request_id, index)];
}

std::span<const std::string_view> OutputTokenWords() { return kWords; }

uint32_t OutputTokenId(uint64_t request_id, size_t index) {
  // Called once per generated token on the engine's hot path: look the id up.
  static const std::array<uint32_t, kWords.size()> kIds = [] {
    std::array<uint32_t, kWords.size()> ids{};
    for (size_t i = 0; i < kWords.size(); ++i) ids[i] = TokenId(kWords[i]);
    return ids;
  }();
  return kIds[OutputWordIndex(request_id, index)];
}

}  // namespace kvroute::engine
