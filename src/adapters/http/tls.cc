#include "adapters/http/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/ssl/context.hpp>

#include "adapters/tls/pki.h"

namespace kvroute::http {
namespace ssl = boost::asio::ssl;

namespace {

// TLS 1.2 and 1.3 only; no compression, no renegotiation.
void Harden(ssl::context& ctx) {
  ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                  ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                  ssl::context::no_compression);
  SSL_CTX_set_options(ctx.native_handle(), SSL_OP_NO_RENEGOTIATION);
}

Result<std::shared_ptr<ssl::context>> MakeServerContext(const std::string& cert_pem,
                                                        const std::string& key_pem) {
  if (Status s = tls::CheckKeyPair(cert_pem, key_pem); !s.ok()) return s;
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  Harden(*ctx);
  boost::system::error_code ec;
  ctx->use_certificate_chain(boost::asio::buffer(cert_pem), ec);
  if (!ec) ctx->use_private_key(boost::asio::buffer(key_pem), ssl::context::pem, ec);
  ERR_clear_error();
  if (ec) return Status::InvalidArgument("certificate: " + ec.message());
  // Sessions resumed by ticket: a reconnecting client skips the full handshake.
  SSL_CTX_set_session_cache_mode(ctx->native_handle(), SSL_SESS_CACHE_SERVER);
  return ctx;
}

}  // namespace

Result<std::shared_ptr<ServerTls>> ServerTls::Create(const std::string& cert_pem,
                                                     const std::string& key_pem) {
  auto ctx = MakeServerContext(cert_pem, key_pem);
  if (!ctx.ok()) return ctx.status();
  std::shared_ptr<ServerTls> tls(new ServerTls());
  tls->current_ = std::move(ctx).value();
  return tls;
}

Status ServerTls::Update(const std::string& cert_pem, const std::string& key_pem) {
  auto ctx = MakeServerContext(cert_pem, key_pem);
  if (!ctx.ok()) return ctx.status();
  std::shared_ptr<ssl::context> next = std::move(ctx).value();
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_.swap(next);
  }
  updates_.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

Result<std::shared_ptr<ssl::context>> MakeClientTls(const ClientTlsOptions& o) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  Harden(*ctx);
  boost::system::error_code ec;
  if (!o.ca_pem.empty()) {
    ctx->add_certificate_authority(boost::asio::buffer(o.ca_pem), ec);
    ERR_clear_error();
    if (ec) return Status::InvalidArgument("ca: no certificate in the PEM (" + ec.message() + ")");
  } else {
    ctx->set_default_verify_paths(ec);
    ERR_clear_error();
    if (ec) return Status::InvalidArgument("the system's trust store: " + ec.message());
  }
  if (o.cert_pem.empty() != o.key_pem.empty()) {
    return Status::InvalidArgument("client certificate: give both the certificate and its key");
  }
  if (!o.cert_pem.empty()) {
    if (Status s = tls::CheckKeyPair(o.cert_pem, o.key_pem); !s.ok()) {
      return Status::InvalidArgument("client certificate: " + s.message());
    }
    ctx->use_certificate_chain(boost::asio::buffer(o.cert_pem), ec);
    if (!ec) ctx->use_private_key(boost::asio::buffer(o.key_pem), ssl::context::pem, ec);
    ERR_clear_error();
    if (ec) return Status::InvalidArgument("client certificate: " + ec.message());
  }
  ctx->set_verify_mode(o.verify ? ssl::verify_peer : ssl::verify_none);
  return ctx;
}

}  // namespace kvroute::http
