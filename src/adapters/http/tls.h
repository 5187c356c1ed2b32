// TLS for the HTTP server and the upstream client (OpenSSL through Boost.Asio's ssl
// layer): the contexts they use, built from PEM text, and swapped whole when certificates
// change.
//
// ServerTls holds the server's current context: each accepted connection takes the
// context current at its accept and keeps it for its life, so Update (a certificate
// reloaded from disk) never disturbs a connection already open, and the next accept uses
// the new pair. A pair that does not load (not PEM, the key not the certificate's) is
// refused and the running one stays.
//
// MakeClientTls builds the upstream client's context: which certificate authorities it trusts (a
// CA bundle, or the system's store), whether it verifies at all, and an optional client
// certificate for replicas that require one.
//
// Threads: Update and context() may be called from any thread (the context pointer is
// swapped under a mutex, taken once per accepted connection: not std::atomic<shared_ptr>,
// whose libstdc++ 12 lock bit ThreadSanitizer cannot see, see core/common/published.h; a
// context, once built, is only read).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "core/common/status.h"

namespace boost::asio::ssl {
class context;
}

namespace kvroute::http {

class ServerTls {
 public:
  // A context serving `cert_pem` (the certificate, then any intermediates) with `key_pem`.
  // InvalidArgument naming what is wrong when they do not load.
  static Result<std::shared_ptr<ServerTls>> Create(const std::string& cert_pem,
                                                   const std::string& key_pem);
  // Replaces the pair for connections accepted from now on; on error keeps the running
  // one and says why.
  Status Update(const std::string& cert_pem, const std::string& key_pem);
  // The context for a connection being accepted now. Never null.
  std::shared_ptr<boost::asio::ssl::context> context() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }
  // How many times Update succeeded.
  uint64_t updates() const { return updates_.load(std::memory_order_relaxed); }

 private:
  ServerTls() = default;
  mutable std::mutex mu_;
  std::shared_ptr<boost::asio::ssl::context> current_;
  std::atomic<uint64_t> updates_{0};
};

struct ClientTlsOptions {
  // PEM certificates of the authorities replicas' certificates are checked against;
  // empty: the system's trust store (OpenSSL's default paths).
  std::string ca_pem;
  // Check the replica's certificate (chain and host name or IP). false: accept any
  // certificate (a test fleet with self-signed certificates); traffic is still encrypted.
  bool verify = true;
  // A client certificate and its key for replicas that require one; both or neither.
  std::string cert_pem;
  std::string key_pem;
};

// The upstream client's context; InvalidArgument naming the bad piece ("ca: no
// certificate in the PEM", "client certificate: the private key does not match...").
Result<std::shared_ptr<boost::asio::ssl::context>> MakeClientTls(const ClientTlsOptions& options);

}  // namespace kvroute::http
