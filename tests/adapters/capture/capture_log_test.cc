// The capture file on a real file system: lines Mooncake's reader (simkit's trace parser)
// takes, rotation by size, a file left from before, a full buffer, failing writes.
#include "adapters/capture/capture_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "simkit/workload/trace.h"

namespace kvroute::capture {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t Lines(const std::string& text) { return static_cast<size_t>(std::count(text.begin(), text.end(), '\n')); }

class CaptureLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("kvroute-capture-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    options_.path = (dir_ / "cap.jsonl").string();
    options_.block_size = 4;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A request whose prompt is `blocks` blocks of 4 tokens, block i's hash `first + i`.
  static Entry Request(double at, uint64_t first, int blocks) {
    Entry e;
    e.arrival_s = at;
    for (int i = 0; i < blocks; ++i) e.prompt.hashes.push_back(first + static_cast<uint64_t>(i));
    e.prompt.tokens = 4 * blocks;
    e.output_tokens = 3;
    e.status = 200;
    e.api = "/v1/completions";
    return e;
  }

  fs::path dir_;
  CaptureOptions options_;
};

TEST_F(CaptureLogTest, WritesLinesMooncakesReaderTakes) {
  auto log = CaptureLog::Open(options_, 10.0);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  (*log)->Submit(Request(10.5, 100, 3));
  (*log)->Submit(Request(11.0, 100, 2));  // its two blocks are the first one's
  (*log)->Submit(Request(12.0, 500, 1));
  (*log)->Flush();
  const CaptureLog::Counts c = (*log)->counts();
  EXPECT_EQ(c.written, 3u);
  EXPECT_EQ(c.dropped, 0u);
  const std::string text = Slurp(options_.path);
  EXPECT_EQ(c.bytes, text.size());
  workload::TraceParseResult parsed = workload::ParseTraceMooncake(text, options_.path, 4);
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  ASSERT_EQ(parsed.rows.size(), 3u);
  EXPECT_EQ(parsed.rows[0].time_s, 0.0);  // from the earliest line
  EXPECT_EQ(parsed.rows[1].time_s, 0.5);
  EXPECT_EQ(parsed.rows[0].hash_ids, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(parsed.rows[1].hash_ids, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(parsed.rows[2].hash_ids, (std::vector<uint64_t>{3}));
  EXPECT_EQ(parsed.rows[0].context_tokens, 12);
  EXPECT_EQ(parsed.rows[0].generated_tokens, 3);
  std::string metrics;
  (*log)->AppendMetrics(metrics);
  EXPECT_NE(metrics.find("kvroute_capture_lines_total{result=\"written\"} 3\n"), std::string::npos);
  EXPECT_NE(metrics.find("kvroute_capture_bytes_total " + std::to_string(text.size()) + "\n"),
            std::string::npos);
}

TEST_F(CaptureLogTest, RotatesBySizeKeepingMaxFilesEachNumberedAfresh) {
  options_.max_bytes = 400;
  options_.max_files = 2;
  auto log = CaptureLog::Open(options_, 0.0);
  ASSERT_TRUE(log.ok());
  std::string one;
  {
    LineFormatter f(4);
    Entry e = Request(1.0, 1000, 2);
    f.Append(e, 0.0, one);
  }
  const size_t per_file = 400 / one.size();  // whole lines that fit
  ASSERT_GE(per_file, 2u);
  const size_t n = per_file * 4;  // four files' worth: the first is deleted
  for (size_t i = 0; i < n; ++i) (*log)->Submit(Request(1.0, 1000 + 10 * i, 2));
  (*log)->Flush();
  EXPECT_EQ((*log)->counts().written, n);
  EXPECT_EQ((*log)->counts().rotations, 3u);
  for (const std::string& path : {options_.path, options_.path + ".1", options_.path + ".2"}) {
    const std::string text = Slurp(path);
    EXPECT_EQ(Lines(text), per_file) << path;
    EXPECT_LE(text.size(), 400u) << path;
    // Each file numbers its own ids from 0.
    EXPECT_EQ(text.find("\"hash_ids\": [0, 1]"), text.find("\"hash_ids\"")) << path;
  }
  EXPECT_FALSE(fs::exists(options_.path + ".3"));
}

TEST_F(CaptureLogTest, AFileLeftFromBeforeIsRotatedAtOpen) {
  { std::ofstream(options_.path) << "old line\n"; }
  auto log = CaptureLog::Open(options_, 0.0);
  ASSERT_TRUE(log.ok());
  (*log)->Submit(Request(1.0, 1, 1));
  (*log)->Flush();
  EXPECT_EQ(Slurp(options_.path + ".1"), "old line\n");
  EXPECT_EQ(Lines(Slurp(options_.path)), 1u);
}

TEST_F(CaptureLogTest, AFullBufferDropsAndCountsWithoutWaiting) {
  options_.buffer_lines = 3;
  auto log = CaptureLog::Open(options_, 0.0);
  ASSERT_TRUE(log.ok());
  (*log)->Hold(true);
  for (int i = 0; i < 5; ++i) (*log)->Submit(Request(1.0, 10 * static_cast<uint64_t>(i), 1));
  EXPECT_EQ((*log)->counts().dropped, 2u);
  EXPECT_EQ((*log)->counts().written, 0u);
  (*log)->Hold(false);
  (*log)->Flush();
  EXPECT_EQ((*log)->counts().written, 3u);
  EXPECT_EQ(Lines(Slurp(options_.path)), 3u);
}

TEST_F(CaptureLogTest, AnUnwritablePathIsAnErrorAndFailedWritesAreCounted) {
  options_.path = (dir_ / "missing" / "cap.jsonl").string();
  auto bad = CaptureLog::Open(options_, 0.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("capture.path: cannot open '" + options_.path + "'"),
            std::string::npos)
      << bad.status().message();
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  options_.path = "/dev/full";  // every write fails with ENOSPC
  options_.max_files = 1;
  auto log = CaptureLog::Open(options_, 0.0);  // not a regular file: never rotated
  ASSERT_TRUE(log.ok());
  (*log)->Submit(Request(1.0, 1, 1));
  (*log)->Flush();
  EXPECT_EQ((*log)->counts().failed, 1u);
  EXPECT_EQ((*log)->counts().written, 0u);
  EXPECT_TRUE(fs::exists("/dev/full"));
}

}  // namespace
}  // namespace kvroute::capture
