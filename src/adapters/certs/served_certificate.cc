#include "adapters/certs/served_certificate.h"

#include <utility>

#include "core/metrics/prom_writer.h"

namespace kvroute::certs {

ServedCertificate::ServedCertificate(const tls::KeyPair& serving, std::optional<pool::CertWatch> watch,
                                     pool::FileSystem& fs, Install install, Log log, std::string source)
    : watch_(std::move(watch)), fs_(fs), install_(std::move(install)), log_(std::move(log)),
      source_(std::move(source)) {
  SetServing(serving.cert_pem);
  // The first poll records the stamps of what is served now (and takes a pair that
  // changed since the owner read it), so the next one reads only changed files.
  Poll();
}

void ServedCertificate::SetServing(const std::string& cert_pem) {
  Result<tls::CertificateInfo> info = tls::DescribeCertificate(cert_pem);
  std::lock_guard<std::mutex> lock(mu_);
  cert_pem_ = cert_pem;
  not_after_ = info.ok() ? info->not_after_unix_s : 0;
  fingerprint_ = info.ok() ? info->sha256_fingerprint : std::string();
}

bool ServedCertificate::Poll(bool force) {
  if (!watch_) return false;
  pool::CertDecision d = watch_->Poll(fs_, force);
  if (d.kind == pool::CertDecision::Kind::kApply) {
    if (Status st = install_(d.pair); !st.ok()) {
      d.kind = pool::CertDecision::Kind::kRejected;
      d.error = "cannot install the pair: " + st.message();
      d.log = true;
    } else {
      // Serving first, then counted: whoever sees the count sees the new certificate.
      SetServing(d.pair.cert_pem);
      applied_.fetch_add(1, std::memory_order_release);
      if (log_) {
        log_("tls: certificate reloaded from " + source_ + " (sha256 " + fingerprint() +
             "); new connections get it");
      }
      return true;
    }
  }
  if (d.kind == pool::CertDecision::Kind::kRejected) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    if (d.log && log_) {
      log_("tls: certificate from " + source_ + " not reloaded, serving the last good one: " + d.error);
    }
  }
  return false;
}

std::string ServedCertificate::cert_pem() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cert_pem_;
}

std::string ServedCertificate::fingerprint() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fingerprint_;
}

int64_t ServedCertificate::not_after() const {
  std::lock_guard<std::mutex> lock(mu_);
  return not_after_;
}

void ServedCertificate::AppendMetrics(std::string& out) const {
  using metrics::Label;
  metrics::AppendHeader(out, "kvroute_tls_cert_reloads_total",
                        "Changes of the served certificate's files: applied, or rejected (the "
                        "last good pair kept).",
                        metrics::MetricType::kCounter);
  const Label applied_l[] = {{"result", "applied"}}, rejected_l[] = {{"result", "rejected"}};
  metrics::AppendSample(out, "kvroute_tls_cert_reloads_total", applied_l, static_cast<double>(applied()));
  metrics::AppendSample(out, "kvroute_tls_cert_reloads_total", rejected_l, static_cast<double>(rejected()));
  metrics::AppendGauge(out, "kvroute_tls_cert_expiry_timestamp_seconds",
                       "When the served certificate expires (notAfter), seconds since the Unix epoch.",
                       {}, static_cast<double>(not_after()));
}

}  // namespace kvroute::certs
