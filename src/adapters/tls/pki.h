// Certificates made with OpenSSL: a private certificate authority and the certificates it
// signs (tests, and the HTTPS/gRPC stand-ins they start), a self-signed certificate (what
// `kvroute epp` serves when it is given none, as the reference endpoint picker does), and
// the check that a certificate and a private key belong together (every TLS listener runs
// it before it swaps in a reloaded pair).
//
// Keys are EC P-256; certificates are X.509 v3 signed with SHA-256. Everything is PEM text
// in and out. Thread: any (no shared state besides an Authority's serial counter, which is
// not synchronised: one Authority per thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/common/status.h"

namespace kvroute::tls {

// A certificate and its private key, PEM.
struct KeyPair {
  std::string cert_pem;
  std::string key_pem;
};

// A subjectAltName in OpenSSL's configuration syntax, e.g. "DNS:localhost,IP:127.0.0.1";
// empty for none.
using SubjectAltName = std::string;

// A self-signed server and client certificate for `common_name` (valid from an hour ago,
// for `validity`). Errors only when OpenSSL fails (a malformed `san`).
Result<KeyPair> SelfSigned(const std::string& common_name, const SubjectAltName& san,
                           std::chrono::hours validity = std::chrono::hours(24 * 365));

// Ok when `cert_pem` holds at least one certificate, `key_pem` a private key, and the key
// is the first certificate's. Else InvalidArgument naming what is wrong ("no certificate
// in the PEM", "the private key does not match the certificate").
Status CheckKeyPair(const std::string& cert_pem, const std::string& key_pem);

// What a serving certificate shows: its SHA-256 fingerprint ("AB:CD:..", 32 bytes in
// upper-case hex joined by colons, as `openssl x509 -fingerprint -sha256` prints it) and
// the end of its validity (notAfter, seconds since the Unix epoch). Of the first
// certificate in `cert_pem`; InvalidArgument "no certificate in the PEM" when none.
struct CertificateInfo {
  std::string sha256_fingerprint;
  int64_t not_after_unix_s = 0;
};
Result<CertificateInfo> DescribeCertificate(const std::string& cert_pem);

// What a listener checks before it serves a pair: CheckKeyPair, then DescribeCertificate
// of the first certificate (a certificate whose validity cannot be read is refused:
// InvalidArgument "the certificate's notAfter cannot be read"). The info on success.
Result<CertificateInfo> CheckServingPair(const std::string& cert_pem, const std::string& key_pem);

// A private certificate authority and the certificates it signs.
class Authority {
 public:
  // A new CA named `name` (its own key).
  explicit Authority(const std::string& name = "kvroute-test-ca");
  // The CA whose certificate and key are given (as cert_pem() and key_pem() wrote them),
  // so that a server started later, or in another process, serves under a CA its client
  // already trusts. Throws std::invalid_argument when they are not a certificate and its
  // key.
  Authority(const std::string& ca_cert_pem, const std::string& ca_key_pem);
  ~Authority();
  Authority(const Authority&) = delete;
  Authority& operator=(const Authority&) = delete;

  // A certificate for `common_name` signed by this CA (server and client use), with
  // subjectAltName `san`, valid from an hour ago for `validity`. Throws
  // std::runtime_error when OpenSSL fails (a malformed `san`).
  KeyPair Issue(const std::string& common_name, const SubjectAltName& san,
                std::chrono::hours validity = std::chrono::hours(24));

  const std::string& cert_pem() const { return cert_pem_; }
  std::string key_pem() const;

 private:
  struct Impl;
  Impl* impl_;
  std::string cert_pem_;
};

}  // namespace kvroute::tls
