// `kvroute epp --cert-path DIR --enable-cert-reload`: the decision whether a changed
// DIR/tls.crt and DIR/tls.key become the serving pair, apart from its I/O (the FileSystem
// is injected; epp.cc polls the real one on a timer and installs what this accepts).
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
// "Changed" is FileStamp inequality (pool/endpoints_watch.h: device, inode, size, mtime,
// ctime; symlinks followed, so a Kubernetes Secret volume's `..data` swap shows). A pair
// written non-atomically (the certificate, then the key) may be seen half-written: it is
// rejected once and applied at the poll after the second write.
//
// Thread: not thread-safe (one timer calls it).
#pragma once

#include <string>

#include "pool/endpoints_watch.h"
#include "tls/pki.h"

namespace kvroute::epp {

struct CertDecision {
  enum class Kind { kUnchanged, kApply, kRejected };
  Kind kind = Kind::kUnchanged;
  tls::KeyPair pair;  // kApply
  std::string error;  // kRejected: "DIR/tls.key: no private key in the PEM", ...
  bool log = false;   // kRejected: not the error the previous poll reported
};

class CertWatch {
 public:
  // `dir` holds tls.crt and tls.key; `serving` is the pair served at start (read from
  // there and checked by the caller).
  CertWatch(std::string dir, tls::KeyPair serving);

  // One poll. The first poll only records the stamps, unless the files differ from
  // `serving` by then.
  CertDecision Poll(pool::FileSystem& fs);

  const std::string& cert_file() const { return cert_file_; }
  const std::string& key_file() const { return key_file_; }

 private:
  CertDecision Reject(std::string error);

  std::string cert_file_, key_file_;
  tls::KeyPair serving_;
  bool primed_ = false;
  pool::FileStamp cert_stamp_, key_stamp_;
  std::string last_error_;  // empty: the last poll reported no error
};

// Reads DIR/tls.crt and DIR/tls.key and checks that they are a certificate and its key.
// InvalidArgument "DIR/tls.key: no private key in the PEM" (the file at fault named)
// otherwise.
Result<tls::KeyPair> ReadKeyPair(pool::FileSystem& fs, const std::string& dir);

}  // namespace kvroute::epp
