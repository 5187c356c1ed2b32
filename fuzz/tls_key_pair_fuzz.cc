// Fuzz target: the certificate and key files `kvroute epp --cert-path` reads (at start and
// at each change --enable-cert-reload sees) through tls::CheckKeyPair and
// tls::DescribeCertificate, the checks run before a pair is served. The input is split at
// its first NUL byte: tls.crt before it, tls.key after (no NUL: both files hold the input).
//
// Invariants: never a crash; an error has a message; a pair that passes has a certificate
// DescribeCertificate reads, with a 32-byte fingerprint ("AB:..", 95 characters).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "tls/pki.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvroute;
  using fuzz::Check;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string cert = nul == std::string::npos ? input : input.substr(0, nul);
  const std::string key = nul == std::string::npos ? input : input.substr(nul + 1);
  const Status st = tls::CheckKeyPair(cert, key);
  const Result<tls::CertificateInfo> info = tls::DescribeCertificate(cert);
  if (!st.ok()) Check(!st.message().empty(), "CheckKeyPair error without a message");
  if (!info.ok()) Check(!info.status().message().empty(), "DescribeCertificate error without a message");
  if (st.ok()) {
    Check(info.ok(), "a checked pair whose certificate DescribeCertificate cannot read");
    Check(info->sha256_fingerprint.size() == 95, "fingerprint not 32 bytes in hex with colons");
  }
  return 0;
}
