// CertWatch's decisions over an in-memory file system: no files, no clock; each Poll is
// one tick of the reload timer.
#include "adapters/certs/cert_watch.h"
#include "support/memory_file_system.h"

#include <gtest/gtest.h>

#include <map>

namespace kvroute::pool {
namespace {

using Kind = CertDecision::Kind;

using FakeFs = test_support::MemoryFileSystem;

class CertWatchTest : public ::testing::Test {
 protected:
  CertWatchTest() : a_(ca_.Issue("a", "DNS:localhost")), b_(ca_.Issue("b", "DNS:localhost")) {
    fs_.Write("/certs/tls.crt", a_.cert_pem);
    fs_.Write("/certs/tls.key", a_.key_pem);
  }
  tls::Authority ca_;
  tls::KeyPair a_, b_;
  FakeFs fs_;
};

TEST_F(CertWatchTest, ServingPairOnDiskIsUnchangedAndUnchangedStampsAreNotRead) {
  CertWatch w = CertWatch::InDirectory("/certs", a_);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);
  const int reads = fs_.reads;
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);
  EXPECT_EQ(fs_.reads, reads);
  // A touch is read but is the same pair.
  fs_.Touch("/certs/tls.crt");
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);
  EXPECT_EQ(fs_.reads, reads + 2);
}

TEST_F(CertWatchTest, ANewMatchingPairIsAppliedOnce) {
  CertWatch w = CertWatch::InDirectory("/certs/", a_);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);
  fs_.Write("/certs/tls.crt", b_.cert_pem);
  fs_.Write("/certs/tls.key", b_.key_pem);
  CertDecision d = w.Poll(fs_);
  ASSERT_EQ(d.kind, Kind::kApply);
  EXPECT_EQ(d.pair.cert_pem, b_.cert_pem);
  EXPECT_EQ(d.pair.key_pem, b_.key_pem);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);
  // Back to A: applied again.
  fs_.Write("/certs/tls.crt", a_.cert_pem);
  fs_.Write("/certs/tls.key", a_.key_pem);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kApply);
}

TEST_F(CertWatchTest, AHalfWrittenPairIsRejectedThenAppliedWhenComplete) {
  CertWatch w = CertWatch::InDirectory("/certs", a_);
  w.Poll(fs_);
  fs_.Write("/certs/tls.crt", b_.cert_pem);  // the key still A's
  CertDecision d = w.Poll(fs_);
  ASSERT_EQ(d.kind, Kind::kRejected);
  EXPECT_EQ(d.error, "/certs/tls.key: the private key does not match the certificate");
  EXPECT_TRUE(d.log);
  fs_.Write("/certs/tls.key", b_.key_pem);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kApply);
}

TEST_F(CertWatchTest, TheSameErrorIsLoggedOnceUntilAGoodPairOrAnotherError) {
  CertWatch w = CertWatch::InDirectory("/certs", a_);
  w.Poll(fs_);
  fs_.Write("/certs/tls.key", "garbage");
  CertDecision d = w.Poll(fs_);
  ASSERT_EQ(d.kind, Kind::kRejected);
  EXPECT_EQ(d.error, "/certs/tls.key: no private key in the PEM");
  EXPECT_TRUE(d.log);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);  // nothing changed: not read again
  fs_.Write("/certs/tls.key", "more garbage");
  d = w.Poll(fs_);
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_FALSE(d.log);
  fs_.Remove("/certs/tls.crt");
  d = w.Poll(fs_);
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_EQ(d.error, "/certs/tls.crt: cannot read file: No such file or directory");
  EXPECT_TRUE(d.log);
  fs_.Write("/certs/tls.crt", "not a certificate");
  d = w.Poll(fs_);
  EXPECT_EQ(d.error, "/certs/tls.crt: no certificate in the PEM");
  EXPECT_TRUE(d.log);
  // Good again (the serving pair): no decision to apply, and the next error logs anew.
  fs_.Write("/certs/tls.crt", a_.cert_pem);
  fs_.Write("/certs/tls.key", a_.key_pem);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);
  fs_.Write("/certs/tls.key", "garbage");
  d = w.Poll(fs_);
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_TRUE(d.log);
}

}  // namespace
}  // namespace kvroute::pool
