// serve's HTTPS certificate, kept current from its files: listen_tls's cert and key are
// looked at on every poll (pool/cert_watch.h decides: stat changed, both read, checked)
// and on SIGHUP (read whatever the stat says); a good new pair is swapped into the
// listener (http::ServerTls::Update) and serves connections accepted from then on, open
// ones keep theirs. A pair that does not load leaves the running pair in place and is
// logged once until the next good pair (or a different error).
//
// Thread: Poll from one thread at a time (serve polls on worker 0, where SIGHUP lands
// too); the counters may be read from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/common/status.h"
#include "adapters/http/tls.h"
#include "adapters/certs/cert_watch.h"

namespace kvroute::router {

class ListenerCerts {
 public:
  // Reads the pair once and makes the listener's context; the error names the file at
  // fault ("certs/tls.key: no private key in the PEM", "...: cannot read file: ...").
  static Result<std::unique_ptr<ListenerCerts>> Load(const std::string& cert_file,
                                                     const std::string& key_file,
                                                     pool::FileSystem& fs,
                                                     std::function<void(std::string_view)> log);

  // Looks at the files (`force`: reads them even when their stat did not change); true
  // when a new pair now serves.
  bool Poll(bool force = false);

  const std::shared_ptr<http::ServerTls>& tls() const { return tls_; }
  uint64_t applied() const { return applied_.load(std::memory_order_relaxed); }
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }
  // notAfter of the serving certificate, seconds since the epoch.
  int64_t not_after() const { return not_after_.load(std::memory_order_relaxed); }

  // kvroute_tls_cert_reloads_total{result="applied"|"rejected"} and
  // kvroute_tls_cert_expiry_timestamp_seconds (the names epp uses), in Prometheus text.
  void AppendMetrics(std::string& out) const;

 private:
  ListenerCerts(pool::CertWatch watch, pool::FileSystem& fs, std::function<void(std::string_view)> log)
      : watch_(std::move(watch)), fs_(fs), log_(std::move(log)) {}

  pool::CertWatch watch_;
  pool::FileSystem& fs_;
  std::function<void(std::string_view)> log_;
  std::shared_ptr<http::ServerTls> tls_;
  std::atomic<uint64_t> applied_{0}, rejected_{0};
  std::atomic<int64_t> not_after_{0};
};

}  // namespace kvroute::router
