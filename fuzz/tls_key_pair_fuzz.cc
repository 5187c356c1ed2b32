// Fuzz target: the certificate and key files `kvroute epp --cert-path` reads (at start and
// at each change --enable-cert-reload sees) through tls::CheckKeyPair and
// tls::DescribeCertificate, and tls::CheckServingPair (both: what is run before a pair is
// served). The input is split at
// its first NUL byte: tls.crt before it, tls.key after (no NUL: both files hold the input).
//
// Invariants: never a crash; an error has a message; a pair CheckServingPair accepts passes
// CheckKeyPair and has a 32-byte fingerprint ("AB:..", 95 characters) and a notAfter.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "adapters/tls/pki.h"

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
  const Result<tls::CertificateInfo> serving = tls::CheckServingPair(cert, key);
  if (!serving.ok()) {
    Check(!serving.status().message().empty(), "CheckServingPair error without a message");
    return 0;
  }
  Check(st.ok() && info.ok(), "CheckServingPair accepts what CheckKeyPair or DescribeCertificate refuse");
  Check(serving->sha256_fingerprint.size() == 95, "fingerprint not 32 bytes in hex with colons");
  Check(serving->sha256_fingerprint == info->sha256_fingerprint, "two fingerprints of one certificate");
  return 0;
}
