// A deterministic stand-in for a real tokenizer, so the simulated engine sees token
// counts and token ids that behave like real ones (about 4 characters per token, equal
// texts give equal ids, shared text prefixes give shared id prefixes) without any
// vocabulary files. Pure functions; thread-safe; no allocation except Tokenize's result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kvroute::engine {

// Ids are in [0, kVocabSize).
inline constexpr uint32_t kVocabSize = 32000;

// Bytes per token: the text is cut into consecutive runs of kBytesPerToken bytes (the
// last run may be shorter) and each run becomes one token whose id is a hash of its
// bytes mod kVocabSize.
inline constexpr size_t kBytesPerToken = 4;

// Tokenizes `text`. Deterministic across runs and processes. Prefix-stable: if `b`
// starts with `a`, Tokenize(b) starts with Tokenize(a) except possibly a's last token
// (when a's length is not a multiple of kBytesPerToken). Empty text -> no tokens.
std::vector<uint32_t> Tokenize(std::string_view text);

// Appends Tokenize(text) to `*out` (reuses its capacity).
void TokenizeInto(std::string_view text, std::vector<uint32_t>* out);

// Equal to Tokenize(text).size() (= ceil(len / kBytesPerToken)), without allocating.
constexpr size_t CountTokens(std::string_view text) {
  return (text.size() + kBytesPerToken - 1) / kBytesPerToken;
}

// The token id of a run of at most kBytesPerToken bytes (what Tokenize emits for it).
uint32_t TokenId(std::string_view run);

// The text of the `index`-th (0-based) generated token of request `request_id`: a short
// English word followed by a space, exactly kBytesPerToken bytes long, chosen by a hash
// of (request_id, index). Deterministic. The view points to static storage.
std::string_view OutputTokenText(uint64_t request_id, size_t index);

// The token id of that output token: TokenId(OutputTokenText(request_id, index)), so a
// later prompt that contains the generated text at a 4-byte-aligned offset re-tokenizes
// to the same ids (and can hit the prefix cache, as a follow-up chat turn does).
uint32_t OutputTokenId(uint64_t request_id, size_t index);

// Every text OutputTokenText can return (64 words of kBytesPerToken bytes), for a
// detokenizer that must show generated ids as text. Static storage.
std::span<const std::string_view> OutputTokenWords();

}  // namespace kvroute::engine
