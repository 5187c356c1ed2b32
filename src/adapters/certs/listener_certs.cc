#include "adapters/certs/listener_certs.h"

#include "core/metrics/prom_writer.h"
#include "adapters/tls/pki.h"

namespace kvroute::router {

Result<std::unique_ptr<ListenerCerts>> ListenerCerts::Load(const std::string& cert_file,
                                                           const std::string& key_file,
                                                           pool::FileSystem& fs,
                                                           std::function<void(std::string_view)> log) {
  Result<tls::KeyPair> pair = pool::ReadKeyPair(fs, cert_file, key_file);
  if (!pair.ok()) return Status::InvalidArgument("listen_tls: " + pair.status().message());
  auto tls = http::ServerTls::Create(pair->cert_pem, pair->key_pem);
  if (!tls.ok()) return Status::InvalidArgument("listen_tls: " + tls.status().message());
  const std::string cert = pair->cert_pem;
  std::unique_ptr<ListenerCerts> c(
      new ListenerCerts(pool::CertWatch(cert_file, key_file, std::move(pair).value()), fs, std::move(log)));
  c->watch_.Poll(fs);  // records the stamps of what is served now
  c->tls_ = std::move(tls).value();
  if (auto info = tls::DescribeCertificate(cert); info.ok()) c->not_after_.store(info->not_after_unix_s);
  return c;
}

bool ListenerCerts::Poll(bool force) {
  pool::CertDecision d = watch_.Poll(fs_, force);
  if (d.kind == pool::CertDecision::Kind::kApply) {
    if (Status st = tls_->Update(d.pair.cert_pem, d.pair.key_pem); !st.ok()) {
      d.kind = pool::CertDecision::Kind::kRejected;
      d.error = st.message();
      d.log = true;
    } else {
      applied_.fetch_add(1, std::memory_order_relaxed);
      if (auto info = tls::DescribeCertificate(d.pair.cert_pem); info.ok()) {
        not_after_.store(info->not_after_unix_s);
      }
      if (log_) log_("TLS certificate reloaded; new connections get it");
      return true;
    }
  }
  if (d.kind == pool::CertDecision::Kind::kRejected) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    if (d.log && log_) log_("TLS certificate not reloaded, serving the last good one: " + d.error);
  }
  return false;
}

void ListenerCerts::AppendMetrics(std::string& out) const {
  using metrics::Label;
  metrics::AppendHeader(out, "kvroute_tls_cert_reloads_total",
                        "Changes of the HTTPS listener's certificate files: applied, or rejected "
                        "(the last good pair kept).",
                        metrics::MetricType::kCounter);
  const Label applied_l[] = {{"result", "applied"}}, rejected_l[] = {{"result", "rejected"}};
  metrics::AppendSample(out, "kvroute_tls_cert_reloads_total", applied_l, static_cast<double>(applied()));
  metrics::AppendSample(out, "kvroute_tls_cert_reloads_total", rejected_l, static_cast<double>(rejected()));
  metrics::AppendGauge(out, "kvroute_tls_cert_expiry_timestamp_seconds",
                       "When the serving certificate expires (notAfter), seconds since the Unix epoch.",
                       {}, static_cast<double>(not_after()));
}

}  // namespace kvroute::router
