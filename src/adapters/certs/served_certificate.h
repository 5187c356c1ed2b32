// A served certificate, kept current from its files: the one reload component of every
// TLS listener the project runs (serve's HTTPS listener, epp's ext_proc port; ready for
// the sidecar's). Each Poll asks the CertWatch (cert_watch.h: did either file's stat
// change; then both read and checked) and hands a good new pair to the owner's `install`
// (serve: the listener's TLS context, whose new connections get it; epp: the file gRPC
// watches). Then the pair is what is served, counted as applied and logged. A pair that does
// not load, or that `install` refuses, leaves the serving one in place, is counted as
// rejected and is logged once until the next good pair (or a different error).
//
// Without a watch (a self-signed certificate, or reload off) the pair never changes, and
// the counters stay at zero.
//
// Thread: Poll from one thread at a time (a timer, or the thread SIGHUP lands on); the
// accessors and AppendMetrics from any. An applied count seen implies the new certificate
// is what cert_pem() returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "adapters/certs/cert_watch.h"
#include "adapters/tls/pki.h"
#include "core/common/status.h"

namespace kvroute::certs {

class ServedCertificate {
 public:
  // Puts a checked pair in service; an error keeps the serving pair.
  using Install = std::function<Status(const tls::KeyPair&)>;
  using Log = std::function<void(std::string_view)>;

  // `serving`: the pair served from now on (already checked and installed by the owner).
  // `source`: where new pairs come from, for log lines ("certs/", "listen_tls").
  ServedCertificate(const tls::KeyPair& serving, std::optional<pool::CertWatch> watch,
                    pool::FileSystem& fs, Install install, Log log, std::string source);

  // Looks at the files (`force`: reads them even when their stat did not change, for a
  // SIGHUP); true when a new pair now serves. False at once without a watch.
  bool Poll(bool force = false);

  std::string cert_pem() const;     // the serving certificate (PEM)
  std::string fingerprint() const;  // its SHA-256 fingerprint; "" when it cannot be read
  int64_t not_after() const;        // its notAfter, Unix seconds; 0 when it cannot be read
  uint64_t applied() const { return applied_.load(std::memory_order_acquire); }
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }

  // kvroute_tls_cert_reloads_total{result="applied"|"rejected"} and
  // kvroute_tls_cert_expiry_timestamp_seconds, in Prometheus text.
  void AppendMetrics(std::string& out) const;

 private:
  void SetServing(const std::string& cert_pem);

  std::optional<pool::CertWatch> watch_;
  pool::FileSystem& fs_;
  Install install_;
  Log log_;
  std::string source_;
  mutable std::mutex mu_;  // guards the three below
  std::string cert_pem_;
  std::string fingerprint_;
  int64_t not_after_ = 0;
  std::atomic<uint64_t> applied_{0}, rejected_{0};
};

}  // namespace kvroute::certs
