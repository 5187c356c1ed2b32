#include "adapters/tls/pki.h"

#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <cctype>
#include <chrono>
#include <memory>
#include <string>

namespace kvroute::tls {
namespace {

// The certificate in `pem`.
std::unique_ptr<X509, decltype(&X509_free)> Read(const std::string& pem) {
  BIO* b = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* x = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
  BIO_free(b);
  return {x, &X509_free};
}

// Whether `leaf` verifies against the CA certificate `ca`.
bool Verifies(const std::string& leaf, const std::string& ca) {
  auto l = Read(leaf), c = Read(ca);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, c.get());
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, l.get(), nullptr);
  bool ok = X509_verify_cert(ctx) == 1;
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return ok;
}

std::string CommonName(const std::string& pem) {
  auto x = Read(pem);
  char buf[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(x.get()), NID_commonName, buf, sizeof(buf));
  return buf;
}

TEST(PkiTest, IssuedCertificatesVerifyAgainstTheirAuthorityOnly) {
  Authority ca("test-ca");
  Authority other("other-ca");
  KeyPair leaf = ca.Issue("replica-a", "IP:127.0.0.1,DNS:localhost");
  EXPECT_TRUE(CheckKeyPair(leaf.cert_pem, leaf.key_pem).ok());
  EXPECT_EQ(CommonName(leaf.cert_pem), "replica-a");
  EXPECT_TRUE(Verifies(leaf.cert_pem, ca.cert_pem()));
  EXPECT_FALSE(Verifies(leaf.cert_pem, other.cert_pem()));
  EXPECT_EQ(X509_check_ip_asc(Read(leaf.cert_pem).get(), "127.0.0.1", 0), 1);
  EXPECT_EQ(X509_check_host(Read(leaf.cert_pem).get(), "localhost", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_host(Read(leaf.cert_pem).get(), "example.com", 0, 0, nullptr), 0);
}

TEST(PkiTest, AnAuthorityReloadedFromItsPemIssuesUnderTheSameName) {
  Authority ca("reloaded-ca");
  Authority again(ca.cert_pem(), ca.key_pem());
  EXPECT_EQ(again.cert_pem(), ca.cert_pem());
  EXPECT_TRUE(Verifies(again.Issue("x", "").cert_pem, ca.cert_pem()));
  EXPECT_THROW(Authority(ca.cert_pem(), Authority("b").key_pem()), std::invalid_argument);
}

TEST(PkiTest, SelfSignedCertificatesAreTheirOwnTrustRoot) {
  Result<KeyPair> pair = SelfSigned("kvroute-epp", "DNS:localhost");
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  EXPECT_TRUE(CheckKeyPair(pair->cert_pem, pair->key_pem).ok());
  EXPECT_EQ(CommonName(pair->cert_pem), "kvroute-epp");
  EXPECT_TRUE(Verifies(pair->cert_pem, pair->cert_pem));
  Result<KeyPair> second = SelfSigned("kvroute-epp", "DNS:localhost");
  ASSERT_TRUE(second.ok());
  EXPECT_NE(second->cert_pem, pair->cert_pem);
  EXPECT_FALSE(SelfSigned("x", "NOT-A-SAN-TYPE:foo").ok());
}

TEST(PkiTest, CheckKeyPairNamesWhatIsWrong) {
  Authority ca;
  KeyPair a = ca.Issue("a", ""), b = ca.Issue("b", "");
  EXPECT_EQ(CheckKeyPair("garbage", a.key_pem).message(), "no certificate in the PEM");
  EXPECT_EQ(CheckKeyPair(a.cert_pem, "").message(), "no private key in the PEM");
  EXPECT_EQ(CheckKeyPair(a.cert_pem, b.key_pem).message(),
            "the private key does not match the certificate");
  EXPECT_TRUE(CheckKeyPair(b.cert_pem, b.key_pem).ok());
}

TEST(DescribeCertificate, FingerprintAndNotAfterOfTheFirstCertificate) {
  const auto before = std::chrono::system_clock::now();
  Authority ca;
  KeyPair p = ca.Issue("svc", "DNS:localhost", std::chrono::hours(48));
  Result<CertificateInfo> info = DescribeCertificate(p.cert_pem + ca.cert_pem());
  ASSERT_TRUE(info.ok()) << info.status().message();
  ASSERT_EQ(info->sha256_fingerprint.size(), 95u);
  for (std::size_t i = 0; i < info->sha256_fingerprint.size(); ++i) {
    const char c = info->sha256_fingerprint[i];
    EXPECT_TRUE(i % 3 == 2 ? c == ':' : std::isxdigit(static_cast<unsigned char>(c)) && !std::islower(c)) << i;
  }
  EXPECT_NE(DescribeCertificate(ca.cert_pem())->sha256_fingerprint, info->sha256_fingerprint);
  const int64_t expect = std::chrono::duration_cast<std::chrono::seconds>(
      (before + std::chrono::hours(48)).time_since_epoch()).count();
  EXPECT_NEAR(static_cast<double>(info->not_after_unix_s), static_cast<double>(expect), 5.0);
  EXPECT_EQ(DescribeCertificate("junk").status().message(), "no certificate in the PEM");
  Result<CertificateInfo> serving = CheckServingPair(p.cert_pem, p.key_pem);
  ASSERT_TRUE(serving.ok());
  EXPECT_EQ(serving->sha256_fingerprint, info->sha256_fingerprint);
  EXPECT_EQ(CheckServingPair(p.cert_pem, ca.key_pem()).status().message(),
            "the private key does not match the certificate");
}

// Found by tls_key_pair_fuzz: a certificate whose notAfter does not parse passes
// CheckKeyPair (its signature is not checked there) but must not be served.
TEST(CheckServingPair, RefusesACertificateWhoseValidityCannotBeRead) {
  const std::string bundle = R"(-----BEGIN CERTIFICATE-----
MIIBdDCCARmgAwIBAgIUKHHN4aUwRVEefNxnIAIEVSyUU/AwCgYIKoZIzj0EAwIw
DzENMAsGA1UEAwwEc2VlZDAeFw0yNjEyMDMwMzM4MzBaFw0yNjEyMDQwMzM4Mza
BMA8xDTALBgNVBAMMBHNlZWQwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAQx/us9
Fmk5dHOfGva1JyU4QlYFlKMUNFBGZlgGvfLuvGcuns9NPfOyPkkjgaYiD6BaPYu+
nijaCKXpzYZ5KxeVo1MwUTAdBgNVHQ4EFgQU84TtvTM97QAxJpVp/BPWowk/oiMw
HwYDVR0jBBgwFoAU84TtvTM97QAxJpVp/BPWowk/oiMwDwYDVR0TAQH/BAUwAwEB
/zAKBggqhkjOPQQDAgNJADBGAiEArv5YQMNkzAaF2+tfZk2tENK8GdfA/EpXtsum
T0iPGGECIQCHr9c2zOVC8FjyLrkkgawKOKFZk9FhQS9MvsPuapYDXA==
-----END CERTIFICATE-----
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg99KoYsBh3nXsP7TX
TEzjAxlzLjvhsAxFY8s7kbA4cDGhRANCAAQx/us9Fmk5dHOfGva1JyU4QlYFlKMU
NFBGZlgGvfLuvGcuns9NPfOyPkkjgaYiD6BaPYu+nijaCKXpzYZ5KxeV
-----END PRIVATE KEY-----
)";
  EXPECT_TRUE(CheckKeyPair(bundle, bundle).ok());
  EXPECT_EQ(CheckServingPair(bundle, bundle).status().message(), "the certificate's notAfter cannot be read");
}

}  // namespace
}  // namespace kvroute::tls
