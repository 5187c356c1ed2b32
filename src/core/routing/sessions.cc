#include "core/routing/sessions.h"

#include <algorithm>
#include <limits>

#include "core/common/base64.h"

namespace kvroute::routing {

uint64_t SessionKey(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

}  // namespace

std::string EncodeSessionToken(std::string_view address) { return EncodeBase64(address); }

std::optional<std::string_view> DecodeSessionToken(std::string_view token, std::span<char> buf) {
  while (!token.empty() && IsSpace(token.front())) token.remove_prefix(1);
  while (!token.empty() && IsSpace(token.back())) token.remove_suffix(1);
  // Up to two padding characters, only at the end.
  std::size_t pad = 0;
  while (pad < 2 && pad < token.size() && token[token.size() - 1 - pad] == '=') ++pad;
  const std::string_view digits = token.substr(0, token.size() - pad);
  if (digits.empty() || digits.size() % 4 == 1) return std::nullopt;
  if (pad > 0 && (digits.size() + pad) % 4 != 0) return std::nullopt;
  const std::size_t n = digits.size() / 4 * 3 + (digits.size() % 4 == 0 ? 0 : digits.size() % 4 - 1);
  if (n > buf.size()) return std::nullopt;
  std::size_t w = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : digits) {
    const int d = Base64DigitValue(c);
    if (d < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(d);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      buf[w++] = static_cast<char>((acc >> bits) & 0xff);
    }
  }
  // The leftover bits of a partial group must be zero (a canonical encoding).
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return std::nullopt;
  return std::string_view(buf.data(), w);
}

SessionTable::SessionTable(const SessionOptions& options)
    : ttl_s_(options.ttl_s), max_sessions_(std::max<std::size_t>(options.max_sessions, 1)) {}

void SessionTable::SetOptions(const SessionOptions& options) {
  ttl_s_.store(options.ttl_s, std::memory_order_relaxed);
  max_sessions_.store(std::max<std::size_t>(options.max_sessions, 1), std::memory_order_relaxed);
}

void SessionTable::EraseLocked(Shard& shard, std::unordered_map<uint64_t, Entry>::iterator it) {
  shard.order.erase(it->second.order);
  shard.map.erase(it);
  size_.fetch_sub(1, std::memory_order_relaxed);
}

void SessionTable::ExpireLocked(Shard& shard, double now_s, double ttl_s) {
  // The idle order is by last use, so expired bindings are at its front.
  while (!shard.order.empty()) {
    auto it = shard.map.find(shard.order.front());
    if (now_s - it->second.last_used_s < ttl_s) break;
    EraseLocked(shard, it);
    expired_.fetch_add(1, std::memory_order_relaxed);
  }
}

std::optional<SessionTable::Binding> SessionTable::Find(uint64_t key, double now_s) {
  Shard& shard = ShardOf(key);
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.map.find(key);
  if (it == shard.map.end()) return std::nullopt;
  if (now_s - it->second.last_used_s >= ttl_s_.load(std::memory_order_relaxed)) {
    EraseLocked(shard, it);
    expired_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  return it->second.binding;
}

void SessionTable::Bind(uint64_t key, const Binding& binding, double now_s) {
  {
    Shard& shard = ShardOf(key);
    std::lock_guard<std::mutex> lock(shard.mu);
    ExpireLocked(shard, now_s, ttl_s_.load(std::memory_order_relaxed));
    auto it = shard.map.find(key);
    if (it != shard.map.end()) {
      it->second.binding = binding;
      it->second.last_used_s = std::max(it->second.last_used_s, now_s);
      shard.order.splice(shard.order.end(), shard.order, it->second.order);
      return;
    }
    shard.order.push_back(key);
    Entry e;
    e.binding = binding;
    e.last_used_s = now_s;
    e.order = std::prev(shard.order.end());
    shard.map.emplace(key, e);
    size_.fetch_add(1, std::memory_order_relaxed);
  }
  while (size_.load(std::memory_order_relaxed) > max_sessions_.load(std::memory_order_relaxed)) {
    if (!EvictOldest()) break;
  }
}

bool SessionTable::EvictOldest() {
  // Each shard's front is its longest idle; the oldest of those goes. A binding touched in
  // between moves off the front, and then the shard's new front goes instead: close enough
  // under contention, exact for one caller.
  Shard* oldest = nullptr;
  double oldest_s = std::numeric_limits<double>::infinity();
  for (Shard& shard : shards_) {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.order.empty()) continue;
    const double t = shard.map.find(shard.order.front())->second.last_used_s;
    if (oldest == nullptr || t < oldest_s) {
      oldest = &shard;
      oldest_s = t;
    }
  }
  if (oldest == nullptr) return false;
  std::lock_guard<std::mutex> lock(oldest->mu);
  if (oldest->order.empty()) return true;
  EraseLocked(*oldest, oldest->map.find(oldest->order.front()));
  evicted_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void SessionTable::Erase(uint64_t key) {
  Shard& shard = ShardOf(key);
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.map.find(key);
  if (it != shard.map.end()) EraseLocked(shard, it);
}

void SessionTable::Sweep(double now_s) {
  const double ttl = ttl_s_.load(std::memory_order_relaxed);
  for (Shard& shard : shards_) {
    std::lock_guard<std::mutex> lock(shard.mu);
    ExpireLocked(shard, now_s, ttl);
  }
}

}  // namespace kvroute::routing
