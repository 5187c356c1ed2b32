// serve's HTTPS certificate: the listener's TLS context (http::ServerTls) and the
// ServedCertificate that keeps it current from listen_tls's cert and key (polled, and
// re-read on SIGHUP): a good new pair is swapped into the context (ServerTls::Update) and
// serves connections accepted from then on; open ones keep theirs.
//
// Thread: Poll from one thread at a time (serve polls on worker 0, where SIGHUP lands
// too); the counters may be read from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "adapters/certs/served_certificate.h"
#include "adapters/http/tls.h"
#include "core/common/status.h"

namespace kvroute::router {

class ListenerCerts {
 public:
  // Reads the pair once and makes the listener's context; the error names the file at
  // fault ("listen_tls: certs/tls.key: no private key in the PEM", "...: cannot read file").
  static Result<std::unique_ptr<ListenerCerts>> Load(const std::string& cert_file,
                                                     const std::string& key_file,
                                                     pool::FileSystem& fs,
                                                     std::function<void(std::string_view)> log);

  // Looks at the files (`force`: reads them even when their stat did not change); true
  // when a new pair now serves.
  bool Poll(bool force = false) { return served_->Poll(force); }

  const std::shared_ptr<http::ServerTls>& tls() const { return tls_; }
  uint64_t applied() const { return served_->applied(); }
  uint64_t rejected() const { return served_->rejected(); }
  int64_t not_after() const { return served_->not_after(); }  // Unix seconds
  void AppendMetrics(std::string& out) const { served_->AppendMetrics(out); }

 private:
  ListenerCerts() = default;

  std::shared_ptr<http::ServerTls> tls_;
  std::unique_ptr<certs::ServedCertificate> served_;
};

}  // namespace kvroute::router
