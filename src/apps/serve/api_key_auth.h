// `kvroute serve`'s API keys (the `auth:` section; config/api_keys.h for the file format).
//
// Request path (Check, on the worker thread that owns the connection): the Authorization
// header's bearer token is hashed (SHA-256) and its digest compared with every loaded
// key's digest by CRYPTO_memcmp, all of them, without an early exit: the time taken says
// neither how much of a key matched nor how long the keys are. No lock and no allocation:
// each worker keeps its own reference to the running key set and refreshes it only when
// the set's generation (one atomic) moved.
//
// Reload (Poll: the stat of either file changed; Reload: unconditionally, SIGHUP): both
// files are read and parsed whole; a good pair replaces the running set at once (requests
// after the swap see it); a bad one keeps the running set and is logged once per distinct
// error, never with a key in the line. Contents equal to the running ones change nothing.
//
// Keys never leave this class: not in logs, error bodies or metrics (which name keys by
// their NAME from the file).
//
// Threads: Check and UpstreamAuthorization on worker `worker`'s thread only; Load, Poll,
// Reload and AppendMetrics from any thread (serialised by an internal mutex).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "config/router_config.h"
#include "core/common/published.h"
#include "core/common/status.h"
#include "adapters/pool/endpoints_watch.h"

namespace kvroute::router {

enum class AuthVerdict {
  kAccepted,
  kMissing,  // no Authorization header (or an empty one)
  kInvalid,  // another scheme than Bearer, or a key that is not loaded
};

class ApiKeyAuth {
 public:
  // `workers`: how many worker threads call Check (indices 0..workers-1). `fs` is the
  // file access (tests may pass their own) and must outlive this. `log` gets one line
  // per reload outcome.
  ApiKeyAuth(config::AuthConfig config, int workers, pool::FileSystem& fs,
             std::function<void(std::string_view)> log);

  // The first read of the files. Error: InvalidArgument "file:line: field: message" (or
  // the file's read error); nothing is loaded then and every request under /v1 is refused.
  Status Load();
  // Re-reads the files when either one's stat changed since the last read.
  void Poll();
  // Re-reads the files whatever their stat says.
  void Reload();

  // Whether `authorization` (the request's Authorization header value; empty when absent)
  // carries a loaded key. Counts the outcome (per key name when accepted, unless
  // `count_accepted` is false: a check at header time that the handler repeats).
  AuthVerdict Check(std::string_view authorization, int worker, bool count_accepted = true);

  // What goes upstream as Authorization under upstream_authorization: replace ->
  // "Bearer <upstream key>"; forward and drop -> empty. The view is valid until this
  // worker's next Check or call here.
  std::string_view UpstreamAuthorization(int worker);
  config::UpstreamAuthorization upstream_mode() const { return config_.upstream_authorization; }

  // kvroute_auth_requests_total{key}, kvroute_auth_rejected_total{reason},
  // kvroute_auth_keys, kvroute_auth_reloads_total{result}.
  void AppendMetrics(std::string& out);

  const config::AuthConfig& config() const { return config_; }

 private:
  struct KeySet;
  struct alignas(64) WorkerView {
    uint64_t generation = ~uint64_t{0};
    std::shared_ptr<const KeySet> set;
  };

  // This worker's current set (refreshed when the generation moved).
  const KeySet* View(int worker);
  // Reads and parses both files; on success swaps the set in. `initial`: Load's call.
  Status ReadAndApply(bool initial);

  const config::AuthConfig config_;
  pool::FileSystem& fs_;
  std::function<void(std::string_view)> log_;

  Published<KeySet> current_;
  std::atomic<uint64_t> generation_{0};
  std::vector<WorkerView> views_;  // views_[w]: worker w's thread only

  std::atomic<uint64_t> rejected_missing_{0}, rejected_invalid_{0};

  std::mutex mu_;  // guards everything below
  bool primed_ = false;
  pool::FileStamp keys_stamp_, upstream_stamp_;
  uint64_t applied_hash_ = 0;
  bool has_applied_ = false;
  std::string last_error_;
  uint64_t reloads_applied_ = 0, reloads_rejected_ = 0;
  std::size_t keys_loaded_ = 0;
  // Accepted requests per key name, every name ever loaded (a counter never goes back);
  // the key sets point at these. std::map: nodes never move.
  std::map<std::string, std::atomic<uint64_t>, std::less<>> accepted_;
};

}  // namespace kvroute::router
