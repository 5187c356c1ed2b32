// A TLS listener's certificate files (`kvroute epp --cert-path DIR --enable-cert-reload`:
// DIR/tls.crt and DIR/tls.key; serve's listen_tls cert and key): the decision whether
// changed files become the serving pair, apart from its I/O (the FileSystem is injected;
// epp and serve poll the real one on a timer and install what this accepts).
//
//   neither file's stat changed since the last poll   -> kUnchanged (nothing is read)
//   changed, both contents equal to the serving pair   -> kUnchanged (a touch, a revert,
//                                                          a Secret swap to equal data)
//   changed, a file unreadable / no certificate /
//     no key / key not the certificate's               -> kRejected: the serving pair
//                                                          stays; `log` only the first
//                                                          time this error is seen in a row
//   changed, a matching pair                           -> kApply with it; the serving
//                                                          pair is that from now on
//
// "Changed" is FileStamp inequality (adapters/pool/endpoints_watch.h: device, inode, size, mtime,
// ctime; symlinks followed, so a Kubernetes Secret volume's `..data` swap shows). A pair
// written non-atomically (the certificate, then the key) may be seen half-written: it is
// rejected once and applied at the poll after the second write.
//
// Thread: not thread-safe (one timer calls it).
#pragma once

#include <string>

#include "adapters/pool/endpoints_watch.h"
#include "adapters/tls/pki.h"

namespace kvroute::pool {

struct CertDecision {
  enum class Kind { kUnchanged, kApply, kRejected };
  Kind kind = Kind::kUnchanged;
  tls::KeyPair pair;  // kApply
  std::string error;  // kRejected: "DIR/tls.key: no private key in the PEM", ...
  bool log = false;   // kRejected: not the error the previous poll reported
};

class CertWatch {
 public:
  // `serving` is the pair served at start (read from the files and checked by the caller).
  CertWatch(std::string cert_file, std::string key_file, tls::KeyPair serving);
  // The pair in `dir`: tls.crt and tls.key (a Kubernetes TLS Secret's keys).
  static CertWatch InDirectory(const std::string& dir, tls::KeyPair serving);

  // One poll. The first poll only records the stamps, unless the files differ from
  // `serving` by then. `force`: read the files even when their stamps did not change (a
  // SIGHUP).
  CertDecision Poll(FileSystem& fs, bool force = false);

  const std::string& cert_file() const { return cert_file_; }
  const std::string& key_file() const { return key_file_; }

 private:
  CertDecision Reject(const std::string& error);

  std::string cert_file_, key_file_;
  tls::KeyPair serving_;
  bool primed_ = false;
  FileStamp cert_stamp_, key_stamp_;
  std::string last_error_;  // empty: the last poll reported no error
};

// Reads `cert_file` and `key_file` and checks that they are a certificate and its key
// (tls::CheckServingPair). InvalidArgument "DIR/tls.key: no private key in the PEM" (the
// file at fault named) otherwise.
Result<tls::KeyPair> ReadKeyPair(FileSystem& fs, const std::string& cert_file, const std::string& key_file);
// DIR/tls.crt and DIR/tls.key.
std::string CertFileIn(const std::string& dir);
std::string KeyFileIn(const std::string& dir);

}  // namespace kvroute::pool
