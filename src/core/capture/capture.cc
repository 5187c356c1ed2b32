#include "core/capture/capture.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>

#include "core/api/openai.h"

namespace kvroute::capture {

namespace {

// The next link of the chain: the block's bytes hashed with the previous link and the key.
uint64_t Link(uint64_t key, uint64_t prev, const void* data, std::size_t size) {
  return XXH3_64bits_withSeed(data, size, prev ^ key);
}

}  // namespace

PromptBlocks HashPrompt(uint64_t key, std::span<const uint32_t> token_ids, std::string_view text,
                        int64_t block_size) {
  PromptBlocks b;
  const std::size_t bs = static_cast<std::size_t>(std::max<int64_t>(1, block_size));
  uint64_t prev = 0;
  if (!token_ids.empty()) {
    b.exact = true;
    b.tokens = static_cast<int64_t>(token_ids.size());
    b.hashes.reserve((token_ids.size() + bs - 1) / bs);
    for (std::size_t at = 0; at < token_ids.size(); at += bs) {
      const std::size_t n = std::min(bs, token_ids.size() - at);
      prev = Link(key, prev, token_ids.data() + at, n * sizeof(uint32_t));
      b.hashes.push_back(prev);
    }
    return b;
  }
  const std::size_t block_bytes = bs * static_cast<std::size_t>(kBytesPerToken);
  b.tokens = static_cast<int64_t>((text.size() + kBytesPerToken - 1) / kBytesPerToken);
  b.hashes.reserve((text.size() + block_bytes - 1) / block_bytes);
  for (std::size_t at = 0; at < text.size(); at += block_bytes) {
    const std::size_t n = std::min(block_bytes, text.size() - at);
    prev = Link(key, prev, text.data() + at, n);
    b.hashes.push_back(prev);
  }
  return b;
}

void FitBlocks(std::vector<uint64_t>& hashes, int64_t input_length, int64_t block_size) {
  const int64_t bs = std::max<int64_t>(1, block_size);
  const std::size_t want = static_cast<std::size_t>(std::max<int64_t>(0, (input_length + bs - 1) / bs));
  if (hashes.size() >= want) {
    hashes.resize(want);
    return;
  }
  uint64_t prev = hashes.empty() ? 0 : hashes.back();
  for (uint64_t i = hashes.size(); i < want; ++i) {
    prev = XXH3_64bits_withSeed(&i, sizeof(i), prev);
    hashes.push_back(prev);
  }
}

bool Sampler::Take() {
  if (rate_ >= 1.0) return true;
  if (!(rate_ > 0.0)) return false;
  const uint64_t n = n_.fetch_add(1, std::memory_order_relaxed);
  return std::floor(static_cast<double>(n + 1) * rate_) > std::floor(static_cast<double>(n) * rate_);
}

Entry StartEntry(const Sink& sink, const api::ParsedRequest& request, std::string_view path,
                 std::string_view session, double arrival_s) {
  Entry e;
  e.arrival_s = arrival_s;
  e.prompt = HashPrompt(sink.key(), request.token_ids, request.prompt_text, sink.block_size());
  e.max_tokens = request.max_tokens.value_or(-1);
  e.api = std::string(path);
  e.model = request.model;
  e.session = std::string(session);
  return e;
}

void LineFormatter::Reset() {
  ids_.clear();
  sessions_.clear();
}

void LineFormatter::Append(Entry& e, double origin_s, std::string& out) {
  // The engine's count when it reported one (exact), else the router's.
  const int64_t input = e.prompt_tokens >= 0 ? e.prompt_tokens : e.prompt.tokens;
  FitBlocks(e.prompt.hashes, input, block_size_);
  const int64_t output = e.output_tokens >= 0 ? e.output_tokens : std::max<int64_t>(0, e.max_tokens);
  const double ms = std::max(0.0, (e.arrival_s - origin_s) * 1000.0);
  out += "{\"timestamp\": ";
  out += std::to_string(static_cast<int64_t>(std::llround(ms)));
  out += ", \"input_length\": ";
  out += std::to_string(input);
  out += ", \"output_length\": ";
  out += std::to_string(output);
  out += ", \"hash_ids\": [";
  for (std::size_t i = 0; i < e.prompt.hashes.size(); ++i) {
    if (i > 0) out += ", ";
    auto [it, fresh] = ids_.try_emplace(e.prompt.hashes[i], ids_.size());
    out += std::to_string(it->second);
  }
  out += "]";
  // Extra fields (Mooncake's readers ignore them): what the router saw of the request.
  out += ", \"api\": ";
  api::AppendJsonString(out, e.api);
  if (!e.model.empty()) {
    out += ", \"model\": ";
    api::AppendJsonString(out, e.model);
  }
  out += ", \"status\": ";
  out += std::to_string(e.status);
  if (!e.endpoint.empty()) {
    out += ", \"endpoint\": ";
    api::AppendJsonString(out, e.endpoint);
  }
  if (!e.session.empty()) {
    auto [it, fresh] = sessions_.try_emplace(e.session, sessions_.size());
    out += ", \"session\": ";
    out += std::to_string(it->second);
  }
  if (e.ttft_s >= 0) {
    out += ", \"ttft_ms\": ";
    out += std::to_string(static_cast<int64_t>(std::llround(e.ttft_s * 1000.0)));
  }
  if (e.cached_tokens >= 0) {
    out += ", \"cached_tokens\": ";
    out += std::to_string(e.cached_tokens);
  }
  // What the blocks were cut from: the engines' token ids, or the text.
  out += ", \"blocks\": ";
  out += e.prompt.exact ? "\"tokens\"" : "\"text\"";
  out += "}\n";
}

}  // namespace kvroute::capture
