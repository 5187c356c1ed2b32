#include "adapters/tls/pki.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>
#include <stdexcept>

namespace kvroute::tls {
namespace {

struct Free {
  void operator()(X509* x) const { X509_free(x); }
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
  void operator()(BIO* b) const { BIO_free(b); }
};
using CertPtr = std::unique_ptr<X509, Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Free>;
using BioPtr = std::unique_ptr<BIO, Free>;

// OpenSSL's last error as text, and the queue cleared.
std::string LastError() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

bool AddExt(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer ? issuer : cert, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext) return false;
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return true;
}

// A certificate for `key` named `cn`, signed by `issuer_key` (nullptr: self-signed). Empty
// with `error` set when OpenSSL refuses (a malformed SAN).
CertPtr Make(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key, bool ca,
             const SubjectAltName& san, long serial, std::chrono::hours validity,
             std::string& error) {
  CertPtr x(X509_new());
  X509_set_version(x.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x.get()), static_cast<long>(validity.count()) * 3600);
  X509_set_pubkey(x.get(), key);
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(x.get(), issuer ? X509_get_subject_name(issuer) : name);
  bool ok = true;
  if (ca) {
    ok = AddExt(x.get(), issuer, NID_basic_constraints, "critical,CA:TRUE") &&
         AddExt(x.get(), issuer, NID_key_usage, "critical,keyCertSign,cRLSign") &&
         AddExt(x.get(), issuer, NID_subject_key_identifier, "hash");
  } else {
    ok = AddExt(x.get(), issuer, NID_basic_constraints, "critical,CA:FALSE") &&
         AddExt(x.get(), issuer, NID_key_usage, "critical,digitalSignature") &&
         AddExt(x.get(), issuer, NID_ext_key_usage, "serverAuth,clientAuth") &&
         (san.empty() || AddExt(x.get(), issuer, NID_subject_alt_name, san.c_str()));
  }
  if (!ok) {
    error = "bad certificate extension (subjectAltName '" + san + "'): " + LastError();
    return nullptr;
  }
  if (X509_sign(x.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0) {
    error = "signing failed: " + LastError();
    return nullptr;
  }
  return x;
}

std::string Drain(BIO* b) {
  char* data = nullptr;
  long n = BIO_get_mem_data(b, &data);
  return std::string(data, static_cast<std::size_t>(n));
}
std::string CertPem(X509* x) {
  BioPtr b(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(b.get(), x);
  return Drain(b.get());
}
std::string KeyPem(EVP_PKEY* k) {
  BioPtr b(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(b.get(), k, nullptr, nullptr, 0, nullptr, nullptr);
  return Drain(b.get());
}
BioPtr Reader(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}
CertPtr ReadCert(const std::string& pem) {
  return CertPtr(PEM_read_bio_X509(Reader(pem).get(), nullptr, nullptr, nullptr));
}
KeyPtr ReadKey(const std::string& pem) {
  return KeyPtr(PEM_read_bio_PrivateKey(Reader(pem).get(), nullptr, nullptr, nullptr));
}

}  // namespace

Result<KeyPair> SelfSigned(const std::string& common_name, const SubjectAltName& san,
                           std::chrono::hours validity) {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return Status::Internal("generating a key: " + LastError());
  // A random serial: a client that saw an earlier self-signed certificate of the same name
  // must not take this one for it.
  long serial = static_cast<long>(std::time(nullptr)) ^ static_cast<long>(reinterpret_cast<std::uintptr_t>(key.get()) >> 4);
  if (serial < 0) serial = -serial;
  std::string error;
  CertPtr cert = Make(key.get(), common_name, nullptr, nullptr, false, san, serial, validity, error);
  if (!cert) return Status::InvalidArgument(error);
  return KeyPair{CertPem(cert.get()), KeyPem(key.get())};
}

Status CheckKeyPair(const std::string& cert_pem, const std::string& key_pem) {
  CertPtr cert = ReadCert(cert_pem);
  if (!cert) {
    ERR_clear_error();
    return Status::InvalidArgument("no certificate in the PEM");
  }
  KeyPtr key = ReadKey(key_pem);
  if (!key) {
    ERR_clear_error();
    return Status::InvalidArgument("no private key in the PEM");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return Status::InvalidArgument("the private key does not match the certificate");
  }
  return Status::Ok();
}

Result<CertificateInfo> DescribeCertificate(const std::string& cert_pem) {
  CertPtr cert = ReadCert(cert_pem);
  if (!cert) {
    ERR_clear_error();
    return Status::InvalidArgument("no certificate in the PEM");
  }
  CertificateInfo info;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (X509_digest(cert.get(), EVP_sha256(), md, &n) != 1) {
    return Status::Internal("fingerprint: " + LastError());
  }
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (unsigned int i = 0; i < n; ++i) {
    if (i > 0) info.sha256_fingerprint += ':';
    info.sha256_fingerprint += kHex[md[i] >> 4];
    info.sha256_fingerprint += kHex[md[i] & 15];
  }
  struct tm t {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &t) != 1) {
    ERR_clear_error();
    return Status::InvalidArgument("the certificate's notAfter cannot be read");
  }
  info.not_after_unix_s = static_cast<int64_t>(timegm(&t));
  return info;
}

Result<CertificateInfo> CheckServingPair(const std::string& cert_pem, const std::string& key_pem) {
  if (Status st = CheckKeyPair(cert_pem, key_pem); !st.ok()) return st;
  return DescribeCertificate(cert_pem);
}

struct Authority::Impl {
  KeyPtr key;
  CertPtr cert;
  long serial = 0;
};

Authority::Authority(const std::string& name) : impl_(new Impl) {
  impl_->key.reset(EVP_EC_gen("P-256"));
  std::string error;
  impl_->cert = Make(impl_->key.get(), name, nullptr, nullptr, true, "", ++impl_->serial,
                     std::chrono::hours(24 * 30), error);
  if (!impl_->cert) {
    delete impl_;
    throw std::runtime_error("Authority: " + error);
  }
  cert_pem_ = CertPem(impl_->cert.get());
}

Authority::Authority(const std::string& ca_cert_pem, const std::string& ca_key_pem)
    : impl_(new Impl) {
  impl_->cert = ReadCert(ca_cert_pem);
  impl_->key = ReadKey(ca_key_pem);
  if (!impl_->cert || !impl_->key || X509_check_private_key(impl_->cert.get(), impl_->key.get()) != 1) {
    ERR_clear_error();
    delete impl_;
    throw std::invalid_argument("Authority: not a CA certificate and its key");
  }
  cert_pem_ = CertPem(impl_->cert.get());
  impl_->serial = static_cast<long>(std::time(nullptr));  // no serial the CA issued before
}

Authority::~Authority() { delete impl_; }

KeyPair Authority::Issue(const std::string& common_name, const SubjectAltName& san,
                         std::chrono::hours validity) {
  KeyPtr key(EVP_EC_gen("P-256"));
  std::string error;
  CertPtr cert = Make(key.get(), common_name, impl_->cert.get(), impl_->key.get(), false, san,
                      ++impl_->serial, validity, error);
  if (!cert) throw std::runtime_error("Authority::Issue: " + error);
  return KeyPair{CertPem(cert.get()), KeyPem(key.get())};
}

std::string Authority::key_pem() const { return KeyPem(impl_->key.get()); }

}  // namespace kvroute::tls
