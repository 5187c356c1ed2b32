// File discovery's decision (pool/endpoints_watch.h) over an in-memory file system: each
// Poll is one tick of virtual time, the test decides what the file looks like in between.
#include "adapters/pool/endpoints_watch.h"
#include "support/memory_file_system.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <map>
#include <string>

namespace kvroute::pool {
namespace {

using Kind = WatchDecision::Kind;

using FakeFileSystem = test_support::MemoryFileSystem;

constexpr const char* kPath = "eps.yaml";
constexpr const char* kTwo = "- 10.0.0.1:80\n- 10.0.0.2:80\n";
constexpr const char* kThree = "- 10.0.0.1:80\n- 10.0.0.2:80\n- 10.0.0.3:80\n";

// Polls and, for kApply, reports success, as the pool does.
WatchDecision Tick(EndpointsFileWatch& w, FileSystem& fs) {
  WatchDecision d = w.Poll(fs);
  if (d.kind == Kind::kApply) w.Applied();
  return d;
}

TEST(EndpointsFileWatch, FirstPollReadsAndAppliesThenUnchangedFilesAreNotRead) {
  FakeFileSystem fs;
  fs.Write(kPath, kTwo);
  EndpointsFileWatch w(kPath);
  WatchDecision d = Tick(w, fs);
  ASSERT_EQ(d.kind, Kind::kApply) << d.error;
  ASSERT_EQ(d.endpoints.size(), 2u);
  EXPECT_EQ(d.endpoints[1].address, "10.0.0.2:80");
  EXPECT_TRUE(w.valid());
  for (int t = 1; t <= 100; ++t) EXPECT_EQ(Tick(w, fs).kind, Kind::kUnchanged);
  EXPECT_EQ(fs.reads, 1);  // 100 polls, one stat each, no read
  EXPECT_EQ(fs.stats, 101);
}

TEST(EndpointsFileWatch, RenamedInPlaceFileIsAppliedAtTheNextPoll) {
  FakeFileSystem fs;
  fs.Write(kPath, kTwo);
  EndpointsFileWatch w(kPath);
  ASSERT_EQ(Tick(w, fs).kind, Kind::kApply);
  fs.Write(kPath, kThree);  // between two ticks
  WatchDecision d = Tick(w, fs);
  ASSERT_EQ(d.kind, Kind::kApply);
  EXPECT_EQ(d.endpoints.size(), 3u);
  EXPECT_EQ(Tick(w, fs).kind, Kind::kUnchanged);
}

TEST(EndpointsFileWatch, SameContentsUnderANewStampAreNotReapplied) {
  FakeFileSystem fs;
  fs.Write(kPath, kTwo);
  EndpointsFileWatch w(kPath);
  ASSERT_EQ(Tick(w, fs).kind, Kind::kApply);
  fs.Write(kPath, kTwo);  // a ConfigMap swap to equal data; a touch
  EXPECT_EQ(Tick(w, fs).kind, Kind::kUnchanged);
  fs.WriteInPlace(kPath, kTwo);
  EXPECT_EQ(Tick(w, fs).kind, Kind::kUnchanged);
  EXPECT_EQ(fs.reads, 3);
}

TEST(EndpointsFileWatch, BrokenFileIsReportedOncePerDistinctErrorAndKeepsTheLastGoodSet) {
  FakeFileSystem fs;
  fs.Write(kPath, kTwo);
  EndpointsFileWatch w(kPath);
  ASSERT_EQ(Tick(w, fs).kind, Kind::kApply);

  fs.Write(kPath, "- 10.0.0.1:80\n- 10.0.0.1:80\n");
  WatchDecision d = Tick(w, fs);
  ASSERT_EQ(d.kind, Kind::kRejected);
  EXPECT_TRUE(d.log);
  EXPECT_EQ(d.error,
            "eps.yaml:2: endpoints[1]: duplicate endpoint address '10.0.0.1:80' (first at line 1)");
  EXPECT_FALSE(w.valid());
  // Nothing changes: not read again, not reported again.
  for (int t = 0; t < 10; ++t) EXPECT_EQ(Tick(w, fs).kind, Kind::kUnchanged);
  // Edited, still the same error: rejected, not logged again.
  fs.WriteInPlace(kPath, "- 10.0.0.1:80\n- 10.0.0.1:80\n# still\n");
  d = Tick(w, fs);
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_FALSE(d.log);
  // A different error is logged.
  fs.Write(kPath, "- 10.0.0.1:80\n- 10.0.0.2\n");
  d = Tick(w, fs);
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_TRUE(d.log);
  EXPECT_EQ(d.error, "eps.yaml:2: endpoints[1]: bad address '10.0.0.2': expected host:port");
  // Fixed: applied.
  fs.Write(kPath, kThree);
  d = Tick(w, fs);
  ASSERT_EQ(d.kind, Kind::kApply);
  EXPECT_EQ(d.endpoints.size(), 3u);
  EXPECT_TRUE(w.valid());
  // Broken again with the first error: logged again (it is not the previous poll's).
  fs.Write(kPath, "- 10.0.0.1:80\n- 10.0.0.1:80\n");
  EXPECT_TRUE(Tick(w, fs).log);
}

TEST(EndpointsFileWatch, RevertToTheAppliedContentsRecoversWithoutReapplying) {
  FakeFileSystem fs;
  fs.Write(kPath, kTwo);
  EndpointsFileWatch w(kPath);
  ASSERT_EQ(Tick(w, fs).kind, Kind::kApply);
  fs.Write(kPath, "- :80\n");
  ASSERT_EQ(Tick(w, fs).kind, Kind::kRejected);
  fs.Write(kPath, kTwo);
  WatchDecision d = Tick(w, fs);
  EXPECT_EQ(d.kind, Kind::kUnchanged);
  EXPECT_TRUE(d.recovered);
  EXPECT_TRUE(w.valid());
}

TEST(EndpointsFileWatch, MissingFileIsAnErrorUntilItComesBack) {
  FakeFileSystem fs;
  fs.Write(kPath, kTwo);
  EndpointsFileWatch w(kPath);
  ASSERT_EQ(Tick(w, fs).kind, Kind::kApply);
  fs.Remove(kPath);  // an editor between unlink and create, a deleted file
  WatchDecision d = Tick(w, fs);
  ASSERT_EQ(d.kind, Kind::kRejected);
  EXPECT_TRUE(d.log);
  EXPECT_EQ(d.error, "eps.yaml: cannot read file: No such file or directory");
  for (int t = 0; t < 5; ++t) EXPECT_EQ(Tick(w, fs).kind, Kind::kUnchanged);
  fs.Write(kPath, kThree);
  EXPECT_EQ(Tick(w, fs).kind, Kind::kApply);
}

TEST(EndpointsFileWatch, MissingOrBrokenAtTheFirstPollIsRejected) {
  FakeFileSystem fs;
  EndpointsFileWatch w(kPath);
  EXPECT_EQ(Tick(w, fs).kind, Kind::kRejected);
  EXPECT_FALSE(w.has_applied());
  fs.Write(kPath, "- [\n");
  WatchDecision d = Tick(w, fs);
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_NE(d.error.find("YAML syntax error"), std::string::npos) << d.error;
}

TEST(EndpointsFileWatch, EmptyListIsApplied) {
  FakeFileSystem fs;
  fs.Write(kPath, kTwo);
  EndpointsFileWatch w(kPath);
  ASSERT_EQ(Tick(w, fs).kind, Kind::kApply);
  fs.Write(kPath, "[]\n");
  WatchDecision d = Tick(w, fs);
  ASSERT_EQ(d.kind, Kind::kApply);
  EXPECT_TRUE(d.endpoints.empty());
}

TEST(EndpointsFileWatch, ApplyFailureIsTreatedAsABrokenFile) {
  FakeFileSystem fs;
  fs.Write(kPath, kTwo);
  EndpointsFileWatch w(kPath);
  ASSERT_EQ(Tick(w, fs).kind, Kind::kApply);
  fs.Write(kPath, kThree);
  ASSERT_EQ(w.Poll(fs).kind, Kind::kApply);
  WatchDecision d = w.Rejected("eps.yaml: core said no");
  EXPECT_EQ(d.kind, Kind::kRejected);
  EXPECT_TRUE(d.log);
  EXPECT_FALSE(w.valid());
  // The same file is not retried; the applied contents are still kTwo.
  EXPECT_EQ(Tick(w, fs).kind, Kind::kUnchanged);
  fs.Write(kPath, kTwo);
  EXPECT_TRUE(Tick(w, fs).recovered);
}

// Many ticks of virtual time with writes at random ticks: every write is applied at the
// first poll after it, exactly once, and nothing else is.
TEST(EndpointsFileWatch, EveryChangeIsAppliedOnceAtTheNextPoll) {
  FakeFileSystem fs;
  fs.Write(kPath, "[]\n");
  EndpointsFileWatch w(kPath);
  ASSERT_EQ(Tick(w, fs).kind, Kind::kApply);
  uint64_t x = 12345;
  int writes = 0, applies = 0;
  std::string last = "[]\n";
  for (int t = 1; t <= 2000; ++t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    bool wrote = false;
    if ((x >> 33) % 7 == 0) {
      const int n = static_cast<int>((x >> 40) % 5);
      std::string text;
      for (int i = 0; i < n; ++i) text += "- 10.0.0." + std::to_string(i + 1) + ":80\n";
      if (text.empty()) text = "[]\n";
      wrote = text != last;
      if (wrote) ++writes;
      last = text;
      if ((x >> 50) % 2) {
        fs.Write(kPath, text);
      } else {
        fs.WriteInPlace(kPath, text);
      }
    }
    const WatchDecision d = Tick(w, fs);
    EXPECT_EQ(d.kind == Kind::kApply, wrote) << "tick " << t;
    applies += d.kind == Kind::kApply;
  }
  EXPECT_EQ(applies, writes);
  EXPECT_GT(writes, 100);
}

}  // namespace
}  // namespace kvroute::pool
