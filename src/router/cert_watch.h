// serve's HTTPS certificate, kept current from its files: the certificate and key named
// by listen_tls are stat'ed on every poll (and read on SIGHUP); when either changed, both
// are read and swapped into the listener (http::ServerTls::Update), which serves
// connections accepted from then on; open connections keep theirs. A pair that does not
// load (a file missing or half written, not PEM, a key that is not the certificate's)
// leaves the running pair in place and is logged once until the next good pair (or a
// different error). "Changed" is pool::FileStamp's (device, inode, size, mtime, ctime), so
// an editor's rename-into-place and a Kubernetes Secret's symlink swap are both seen.
//
// Thread: Poll from one thread at a time (serve polls on worker 0, where SIGHUP lands
// too); the counters may be read from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/common/status.h"
#include "http/tls.h"
#include "pool/endpoints_watch.h"

namespace kvroute::router {

class CertWatch {
 public:
  // Reads the pair once and makes the listener's context; the error names the file
  // ("listen_tls.cert: tls.crt: cannot read file: ...") or the mismatch.
  static Result<std::unique_ptr<CertWatch>> Load(std::string cert_path, std::string key_path,
                                                 pool::FileSystem& fs,
                                                 std::function<void(std::string_view)> log);

  enum class Outcome { kUnchanged, kApplied, kRejected };
  // Looks at the files; `force` reads them even when their stat did not change.
  Outcome Poll(bool force = false);

  const std::shared_ptr<http::ServerTls>& tls() const { return tls_; }
  uint64_t applied() const { return applied_.load(std::memory_order_relaxed); }
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }
  // notAfter of the serving certificate, seconds since the epoch.
  int64_t not_after() const { return not_after_.load(std::memory_order_relaxed); }

  // kvroute_tls_cert_reloads_total{result="applied"|"rejected"} and
  // kvroute_tls_cert_expiry_timestamp_seconds, appended in Prometheus text.
  void AppendMetrics(std::string& out) const;

 private:
  CertWatch(std::string cert_path, std::string key_path, pool::FileSystem& fs,
            std::function<void(std::string_view)> log)
      : cert_path_(std::move(cert_path)), key_path_(std::move(key_path)), fs_(fs), log_(std::move(log)) {}
  // Both files' contents, or the error naming the one that failed.
  Status Read(std::string& cert, std::string& key);

  std::string cert_path_, key_path_;
  pool::FileSystem& fs_;
  std::function<void(std::string_view)> log_;
  std::shared_ptr<http::ServerTls> tls_;
  pool::FileStamp cert_stamp_, key_stamp_;
  std::string last_error_;  // logged already; "" after a good pair
  std::atomic<uint64_t> applied_{0}, rejected_{0};
  std::atomic<int64_t> not_after_{0};
};

}  // namespace kvroute::router
