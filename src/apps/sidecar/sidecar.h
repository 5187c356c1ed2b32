// `kvroute sidecar`: the decode pod's side of prefill/decode disaggregation behind a
// gateway whose endpoint picker is `kvroute epp` (issue 25; REFERENCE.md section 20).
//
// The picker routes a disaggregated request to the decode pod and names its prefill pod in
// `x-prefiller-host-port: ip:port`. The sidecar listens where the pool's target port
// points, in front of the pod's own engine (--vllm-port), and for POST /v1/completions and
// /v1/chat/completions carrying that header runs the two legs as serve does
// (core/api/pd_legs.h): the prefill leg to the named pod (stream off, limits 1,
// kv_transfer_params asking for a remote decode), then the client's body plus prefill's
// kv_transfer_params to the local engine, whose answer streams back with usage's
// cached_tokens rewritten to prefill's. One X-Request-Id on both legs (made up when the
// client sent none). Without the header, and for every other path and method (/metrics,
// /v1/models, /health...), the request goes to the local engine unchanged: the picker
// scrapes the engine through the sidecar.
//
// Failures lose no request: a prefill leg that fails before answering (connect failure,
// reset, 502/503/504) is sent again to the same pod up to --prefill-max-retries times, then
// the local engine prefills the request itself (the client's body as it came); a prefill
// answer without kv_transfer_params, any other error status, a header that does not name an
// IP address and port, or a prefill pod outside --prefiller-allow does the same. A decode
// leg that fails before its first byte (a 5xx, a reset: e.g. the KV transfer failed under
// kv_load_failure_policy fail) is sent again once as an ordinary request.
//
// Its own counters are on GET /sidecar/metrics (kvroute_pd_legs_total and
// kvroute_pd_fallbacks_total as serve writes them, kvroute_sidecar_requests_total,
// kvroute_sidecar_prefiller_refused_total); GET /sidecar/healthz answers 200.
//
// Threads: N workers (an IoPool), each with its own upstream client; no lock on the
// request path.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/status.h"

namespace kvroute::sidecar {

// An address range: an IPv4 or IPv6 address and a prefix length (a single address when
// written without one).
struct Cidr {
  std::array<uint8_t, 16> bytes{};  // IPv4 in the first 4
  bool v4 = true;
  int bits = 32;
};

// "10.0.0.0/8,fd00::/8,192.168.1.7": comma separated, spaces around entries ignored.
// nullopt (and *error set) when an entry is not an address or its length is out of range.
std::optional<std::vector<Cidr>> ParseCidrList(std::string_view text, std::string* error = nullptr);

// The prefill pod a request names.
struct Prefiller {
  std::string host;  // an IP address literal, without brackets
  uint16_t port = 0;
};
enum class PrefillerRefusal : uint8_t { kNone, kInvalid, kNotAllowed };
inline constexpr std::size_t kPrefillerRefusals = 3;
// "", "invalid", "not_allowed".
std::string_view PrefillerRefusalName(PrefillerRefusal r);

// Reads an x-prefiller-host-port value: "ip:port" or "[v6]:port"; a comma-separated list
// names its first entry. kInvalid unless the host is an IP address literal (no name is
// resolved on the request path) and the port 1-65535; kNotAllowed when `allow` is not empty
// and no range of it holds the address.
PrefillerRefusal ParsePrefiller(std::string_view value, const std::vector<Cidr>& allow, Prefiller* out);

struct SidecarOptions {
  std::string listen_host = "0.0.0.0";
  uint16_t listen_port = 8000;  // 0: the kernel picks (read port())
  std::string engine_host = "127.0.0.1";
  uint16_t engine_port = 8200;
  int threads = 0;  // 0: one per core
  // A prefill leg failing before it answers (connect failure, reset, 502/503/504) is sent
  // again to the same pod this many times before the local engine prefills.
  int prefill_max_retries = 0;
  std::vector<Cidr> prefiller_allow;  // empty: any address
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds first_byte_timeout{120000};
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds request_read_timeout{30000};
  std::size_t max_body_bytes = 16u << 20;
  std::size_t max_header_bytes = 64u << 10;
  bool handle_signals = false;  // SIGINT/SIGTERM end WaitForShutdown
  bool log = true;
};

class Sidecar {
 public:
  explicit Sidecar(SidecarOptions options);
  ~Sidecar();
  Sidecar(const Sidecar&) = delete;
  Sidecar& operator=(const Sidecar&) = delete;

  // Starts the workers and listens. Thread: any; once.
  Status Start();
  // Stops accepting and the workers (in-flight requests are dropped). Idempotent.
  void Stop();
  uint16_t port() const;
  // Blocks until SIGINT/SIGTERM (with handle_signals).
  void WaitForShutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute::sidecar
