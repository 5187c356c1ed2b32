// CertWatch's decisions over an in-memory file system: no files, no clock; each Poll is
// one tick of the reload timer.
#include "pool/cert_watch.h"

#include <gtest/gtest.h>

#include <map>

namespace kvroute::pool {
namespace {

using Kind = CertDecision::Kind;

class FakeFs : public pool::FileSystem {
 public:
  void Put(const std::string& path, std::string text) {
    files_[path] = std::move(text);
    stamps_[path] = {.exists = true, .inode = ++inode_, .size = files_[path].size()};
  }
  void Touch(const std::string& path) { stamps_[path].mtime_ns += 1; }
  void Remove(const std::string& path) {
    files_.erase(path);
    stamps_[path] = {.exists = false, .error = 2};
  }
  pool::FileStamp Stat(const std::string& path) override {
    ++stats;
    auto it = stamps_.find(path);
    return it == stamps_.end() ? pool::FileStamp{.exists = false, .error = 2} : it->second;
  }
  config::ConfigOr<std::string> Read(const std::string& path) override {
    ++reads;
    config::ConfigOr<std::string> out;
    auto it = files_.find(path);
    if (it == files_.end()) {
      out.error.file = path;
      out.error.message = "cannot read file: No such file or directory";
    } else {
      out.value = it->second;
    }
    return out;
  }
  int stats = 0, reads = 0;

 private:
  std::map<std::string, std::string> files_;
  std::map<std::string, pool::FileStamp> stamps_;
  uint64_t inode_ = 0;
};

class CertWatchTest : public ::testing::Test {
 protected:
  CertWatchTest() : a_(ca_.Issue("a", "DNS:localhost")), b_(ca_.Issue("b", "DNS:localhost")) {
    fs_.Put("/certs/tls.crt", a_.cert_pem);
    fs_.Put("/certs/tls.key", a_.key_pem);
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
  fs_.Put("/certs/tls.crt", b_.cert_pem);
  fs_.Put("/certs/tls.key", b_.key_pem);
  CertDecision d = w.Poll(fs_);
  ASSERT_EQ(d.kind, Kind::kApply);
  EXPECT_EQ(d.pair.cert_pem, b_.cert_pem);
  EXPECT_EQ(d.pair.key_pem, b_.key_pem);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);
  // Back to A: applied again.
  fs_.Put("/certs/tls.crt", a_.cert_pem);
  fs_.Put("/certs/tls.key", a_.key_pem);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kApply);
}

TEST_F(CertWatchTest, AHalfWrittenPairIsRejectedThenAppliedWhenComplete) {
  CertWatch w = CertWatch::InDirectory("/certs", a_);
  w.Poll(fs_);
  fs_.Put("/certs/tls.crt", b_.cert_pem);  // the key still A's
  CertDecision d = w.Poll(fs_);
  ASSERT_EQ(d.kind, Kind::kRejected);
  EXPECT_EQ(d.error, "/certs/tls.key: the private key does not match the certificate");
  EXPECT_TRUE(d.log);
  fs_.Put("/certs/tls.key", b_.key_pem);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kApply);
}

TEST_F(CertWatchTest, TheSameErrorIsLoggedOnceUntilAGoodPairOrAnotherError) {
  CertWatch w = CertWatch::InDirectory("/certs", a_);
  w.Poll(fs_);
  fs_.Put("/certs/tls.key", "garbage");
  CertDecision d = w.Poll(fs_);
  ASSERT_EQ(d.kind, Kind::kRejected);
  EXPECT_EQ(d.error, "/certs/tls.key: no private key in the PEM");
  EXPECT_TRUE(d.log);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);  // nothing changed: not read again
  fs_.Put("/certs/tls.key", "more garbage");
  d = w.Poll(fs_);
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_FALSE(d.log);
  fs_.Remove("/certs/tls.crt");
  d = w.Poll(fs_);
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_EQ(d.error, "/certs/tls.crt: cannot read file: No such file or directory");
  EXPECT_TRUE(d.log);
  fs_.Put("/certs/tls.crt", "not a certificate");
  d = w.Poll(fs_);
  EXPECT_EQ(d.error, "/certs/tls.crt: no certificate in the PEM");
  EXPECT_TRUE(d.log);
  // Good again (the serving pair): no decision to apply, and the next error logs anew.
  fs_.Put("/certs/tls.crt", a_.cert_pem);
  fs_.Put("/certs/tls.key", a_.key_pem);
  EXPECT_EQ(w.Poll(fs_).kind, Kind::kUnchanged);
  fs_.Put("/certs/tls.key", "garbage");
  d = w.Poll(fs_);
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_TRUE(d.log);
}

}  // namespace
}  // namespace kvroute::pool
