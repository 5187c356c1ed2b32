#include "epp/cert_watch.h"

namespace kvroute::epp {

namespace {

std::string Join(const std::string& dir, const char* name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

}  // namespace

Result<tls::KeyPair> ReadKeyPair(pool::FileSystem& fs, const std::string& dir) {
  const std::string cert_file = Join(dir, "tls.crt"), key_file = Join(dir, "tls.key");
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

CertWatch::CertWatch(std::string dir, tls::KeyPair serving)
    : cert_file_(Join(dir, "tls.crt")), key_file_(Join(dir, "tls.key")), serving_(std::move(serving)) {}

CertDecision CertWatch::Poll(pool::FileSystem& fs) {
  // Stat before reading: a write landing between the two shows as a new stamp next time.
  const pool::FileStamp cs = fs.Stat(cert_file_), ks = fs.Stat(key_file_);
  if (primed_ && cs == cert_stamp_ && ks == key_stamp_) return {};
  primed_ = true;
  cert_stamp_ = cs;
  key_stamp_ = ks;
  const std::string dir = cert_file_.substr(0, cert_file_.size() - 8);  // minus "/tls.crt"
  Result<tls::KeyPair> pair = ReadKeyPair(fs, dir);
  if (!pair.ok()) return Reject(pair.status().message());
  last_error_.clear();
  if (pair->cert_pem == serving_.cert_pem && pair->key_pem == serving_.key_pem) return {};
  serving_ = *pair;
  CertDecision d;
  d.kind = CertDecision::Kind::kApply;
  d.pair = std::move(pair).value();
  return d;
}

CertDecision CertWatch::Reject(std::string error) {
  CertDecision d;
  d.kind = CertDecision::Kind::kRejected;
  d.log = error != last_error_;
  last_error_ = error;
  d.error = std::move(error);
  return d;
}

}  // namespace kvroute::epp
