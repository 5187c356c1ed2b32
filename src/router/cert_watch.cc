#include "router/cert_watch.h"

#include "core/metrics/prom_writer.h"
#include "tls/pki.h"

namespace kvroute::router {

Status CertWatch::Read(std::string& cert, std::string& key) {
  auto c = fs_.Read(cert_path_);
  if (!c.ok()) return Status::InvalidArgument("listen_tls.cert: " + c.error.ToString());
  auto k = fs_.Read(key_path_);
  if (!k.ok()) return Status::InvalidArgument("listen_tls.key: " + k.error.ToString());
  cert = std::move(*c.value);
  key = std::move(*k.value);
  return Status::Ok();
}

Result<std::unique_ptr<CertWatch>> CertWatch::Load(std::string cert_path, std::string key_path,
                                                   pool::FileSystem& fs,
                                                   std::function<void(std::string_view)> log) {
  std::unique_ptr<CertWatch> w(new CertWatch(std::move(cert_path), std::move(key_path), fs, std::move(log)));
  w->cert_stamp_ = fs.Stat(w->cert_path_);
  w->key_stamp_ = fs.Stat(w->key_path_);
  std::string cert, key;
  if (Status st = w->Read(cert, key); !st.ok()) return st;
  auto tls = http::ServerTls::Create(cert, key);
  if (!tls.ok()) {
    return Status::InvalidArgument("listen_tls: " + w->cert_path_ + " and " + w->key_path_ + ": " +
                                   tls.status().message());
  }
  w->tls_ = std::move(tls).value();
  if (auto info = tls::DescribeCertificate(cert); info.ok()) w->not_after_.store(info->not_after_unix_s);
  return w;
}

CertWatch::Outcome CertWatch::Poll(bool force) {
  pool::FileStamp cert_stamp = fs_.Stat(cert_path_), key_stamp = fs_.Stat(key_path_);
  if (!force && cert_stamp == cert_stamp_ && key_stamp == key_stamp_) return Outcome::kUnchanged;
  cert_stamp_ = cert_stamp;
  key_stamp_ = key_stamp;
  std::string cert, key;
  Status st = Read(cert, key);
  if (st.ok()) {
    st = tls_->Update(cert, key);
    if (!st.ok()) st = Status::InvalidArgument(cert_path_ + " and " + key_path_ + ": " + st.message());
  }
  if (!st.ok()) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    if (st.message() != last_error_) {
      last_error_ = st.message();
      if (log_) log_("TLS certificate not reloaded, serving the last good one: " + last_error_);
    }
    return Outcome::kRejected;
  }
  last_error_.clear();
  applied_.fetch_add(1, std::memory_order_relaxed);
  if (auto info = tls::DescribeCertificate(cert); info.ok()) not_after_.store(info->not_after_unix_s);
  if (log_) log_("TLS certificate reloaded from " + cert_path_);
  return Outcome::kApplied;
}

void CertWatch::AppendMetrics(std::string& out) const {
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
