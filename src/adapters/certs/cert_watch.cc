#include "adapters/certs/cert_watch.h"

namespace kvroute::pool {

namespace {

std::string Join(const std::string& dir, const char* name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

}  // namespace

std::string CertFileIn(const std::string& dir) { return Join(dir, "tls.crt"); }
std::string KeyFileIn(const std::string& dir) { return Join(dir, "tls.key"); }

Result<tls::KeyPair> ReadKeyPair(FileSystem& fs, const std::string& cert_file, const std::string& key_file) {
  config::ConfigOr<std::string> cert = fs.Read(cert_file);
  if (!cert.ok()) return Status::InvalidArgument(cert.error.ToString());
  config::ConfigOr<std::string> key = fs.Read(key_file);
  if (!key.ok()) return Status::InvalidArgument(key.error.ToString());
  if (Result<tls::CertificateInfo> ok = tls::CheckServingPair(*cert.value, *key.value); !ok.ok()) {
    // Name the file at fault: the key file for a missing or mismatched key, else the
    // certificate file.
    const std::string& why = ok.status().message();
    const bool key_bad = why.find("private key") != std::string::npos;
    return Status::InvalidArgument((key_bad ? key_file : cert_file) + ": " + why);
  }
  return tls::KeyPair{std::move(*cert.value), std::move(*key.value)};
}

CertWatch::CertWatch(std::string cert_file, std::string key_file, tls::KeyPair serving)
    : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)), serving_(std::move(serving)) {}

CertWatch CertWatch::InDirectory(const std::string& dir, tls::KeyPair serving) {
  return CertWatch(CertFileIn(dir), KeyFileIn(dir), std::move(serving));
}

CertDecision CertWatch::Poll(FileSystem& fs, bool force) {
  // Stat before reading: a write landing between the two shows as a new stamp next time.
  const FileStamp cs = fs.Stat(cert_file_), ks = fs.Stat(key_file_);
  if (primed_ && !force && cs == cert_stamp_ && ks == key_stamp_) return {};
  primed_ = true;
  cert_stamp_ = cs;
  key_stamp_ = ks;
  Result<tls::KeyPair> pair = ReadKeyPair(fs, cert_file_, key_file_);
  if (!pair.ok()) return Reject(pair.status().message());
  last_error_.clear();
  if (pair->cert_pem == serving_.cert_pem && pair->key_pem == serving_.key_pem) return {};
  serving_ = *pair;
  CertDecision d;
  d.kind = CertDecision::Kind::kApply;
  d.pair = std::move(pair).value();
  return d;
}

CertDecision CertWatch::Reject(const std::string& error) {
  return RejectOnce<CertDecision>(error, last_error_);
}

}  // namespace kvroute::pool
