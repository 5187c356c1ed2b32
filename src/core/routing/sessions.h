// Session affinity as pure logic (issue 26, item 3): a conversation named by the client
// (x-session-id) is bound to the endpoint that served it, and stays there while that
// endpoint is a candidate and not saturated (the routing core decides that; this table
// only remembers). A binding expires after `ttl_s` seconds without use, and the table
// holds at most `max_sessions` of them: binding one more evicts the one idle longest.
//
// The stateless form for clients that carry it: a session token, base64 (standard
// alphabet, padded) of the serving endpoint's address ("host:port", its identity across
// reloads), written by the front end on every response and sent back on the next request.
//
// Threads. Every method may be called from any thread. Sessions are spread over shards by
// their key (a 64-bit hash of the id), each a mutex, a hash map and an idle-order list:
// a pick holds one shard's mutex for a lookup or a touch, never with another lock. Using a
// known session allocates nothing; binding a new one allocates its entry once. No clock:
// every call takes the time.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kvroute::routing {

struct SessionOptions {
  bool enabled = true;
  double ttl_s = 300.0;              // idle time after which a binding expires (> 0)
  std::size_t max_sessions = 100000;  // >= 1; the oldest-idle binding makes room
  // The request headers the front ends read the session id and the token from, and the
  // response header they write the token on (lower case). The core never reads them.
  std::string header = "x-session-id";
  std::string token_header = "x-session-token";
};

// The key of a session id (FNV-1a, 64 bits); also used for endpoint addresses, so that a
// binding recognises an id that a reload gave to another address.
uint64_t SessionKey(std::string_view s);

// The token of an endpoint address: base64 of the address.
std::string EncodeSessionToken(std::string_view address);
// The address a token names, written into `buf`; nullopt when the token is not base64
// of 1..buf.size() bytes (whitespace around it is ignored; padding is optional). Never
// allocates: a token is outside input, read on the request path.
std::optional<std::string_view> DecodeSessionToken(std::string_view token,
                                                   std::span<char> buf);

class SessionTable {
 public:
  struct Binding {
    uint32_t endpoint = 0;      // the endpoint's id
    uint64_t address_key = 0;   // SessionKey(its address)
  };

  explicit SessionTable(const SessionOptions& options = {});
  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;

  // New options from the next call on; a smaller bound evicts at the next Bind, a shorter
  // TTL expires at the next lookup or sweep. Bindings are kept.
  void SetOptions(const SessionOptions& options);

  // The binding of `key` unless it has been idle ttl_s or longer at `now_s` (then it is
  // dropped). Does not refresh it: Bind does.
  std::optional<Binding> Find(uint64_t key, double now_s);
  // Binds `key` to `binding` (new, the same or another endpoint) and refreshes its idle
  // clock at `now_s`. Expired bindings of the shard go first; then, when the table holds
  // more than max_sessions, the bindings idle longest (over all shards) are evicted.
  void Bind(uint64_t key, const Binding& binding, double now_s);
  // Drops `key`'s binding (no-op when there is none).
  void Erase(uint64_t key);
  // Drops every binding idle ttl_s or longer at `now_s`.
  void Sweep(double now_s);

  // Bindings held (expired ones count until a lookup or sweep drops them).
  std::size_t size() const { return size_.load(std::memory_order_relaxed); }
  uint64_t expired() const { return expired_.load(std::memory_order_relaxed); }
  uint64_t evicted() const { return evicted_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::size_t kShards = 16;
  struct Entry {
    Binding binding;
    double last_used_s = 0.0;
    std::list<uint64_t>::iterator order;  // its place in the shard's idle order
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<uint64_t, Entry> map;
    std::list<uint64_t> order;  // least recently used first
  };
  Shard& ShardOf(uint64_t key) { return shards_[(key >> 59) & (kShards - 1)]; }
  // Drops the shard's bindings idle ttl_s or longer at `now_s` (caller holds its mutex).
  void ExpireLocked(Shard& shard, double now_s, double ttl_s);
  void EraseLocked(Shard& shard, std::unordered_map<uint64_t, Entry>::iterator it);
  // Evicts the binding idle longest over every shard; false when the table is empty.
  bool EvictOldest();

  std::atomic<double> ttl_s_;
  std::atomic<std::size_t> max_sessions_;
  std::array<Shard, kShards> shards_;
  std::atomic<std::size_t> size_{0};
  std::atomic<uint64_t> expired_{0}, evicted_{0};
};

}  // namespace kvroute::routing
