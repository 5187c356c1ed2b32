#include "adapters/certs/listener_certs.h"

#include <utility>

namespace kvroute::router {

Result<std::unique_ptr<ListenerCerts>> ListenerCerts::Load(const std::string& cert_file,
                                                           const std::string& key_file,
                                                           pool::FileSystem& fs,
                                                           std::function<void(std::string_view)> log) {
  Result<tls::KeyPair> pair = pool::ReadKeyPair(fs, cert_file, key_file);
  if (!pair.ok()) return Status::InvalidArgument("listen_tls: " + pair.status().message());
  auto tls = http::ServerTls::Create(pair->cert_pem, pair->key_pem);
  if (!tls.ok()) return Status::InvalidArgument("listen_tls: " + tls.status().message());
  std::unique_ptr<ListenerCerts> c(new ListenerCerts());
  c->tls_ = std::move(tls).value();
  http::ServerTls* context = c->tls_.get();
  c->served_ = std::make_unique<certs::ServedCertificate>(
      *pair, pool::CertWatch(cert_file, key_file, *pair), fs,
      [context](const tls::KeyPair& p) { return context->Update(p.cert_pem, p.key_pem); },
      std::move(log), "listen_tls " + cert_file);
  return c;
}

}  // namespace kvroute::router
