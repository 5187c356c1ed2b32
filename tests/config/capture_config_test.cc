// The `capture:` section of the router configuration (serve and epp).
#include <gtest/gtest.h>

#include <string>

#include "config/router_config.h"

#include "router_config_util.h"

namespace kvroute::config {
namespace {

using config_test::ParseErr;
using config_test::ParseOk;

TEST(CaptureConfigTest, OffWhenAbsent) {
  EXPECT_FALSE(ParseOk("pool: {endpoints: [127.0.0.1:1]}\n").capture.enabled());
}

TEST(CaptureConfigTest, ReadsEveryKeyAndSizeSuffix) {
  const RouterConfig c = ParseOk(
      "capture:\n"
      "  path: /var/log/kvroute/capture.jsonl\n"
      "  block_size: 16\n"
      "  max_bytes: 64MiB\n"
      "  max_files: 3\n"
      "  sample: 0.25\n"
      "  buffer_lines: 100\n");
  EXPECT_EQ(c.capture.path, "/var/log/kvroute/capture.jsonl");
  EXPECT_EQ(c.capture.block_size, 16);
  EXPECT_EQ(c.capture.max_bytes, int64_t{64} << 20);
  EXPECT_EQ(c.capture.max_files, 3);
  EXPECT_DOUBLE_EQ(c.capture.sample, 0.25);
  EXPECT_EQ(c.capture.buffer_lines, 100);
  const RouterConfig d = ParseOk("capture: {path: cap.jsonl}\n");
  EXPECT_EQ(d.capture.block_size, 512);  // Mooncake's
  EXPECT_EQ(d.capture.max_bytes, int64_t{256} << 20);
  EXPECT_DOUBLE_EQ(d.capture.sample, 1.0);
  for (const auto& [text, bytes] :
       {std::pair<std::string, int64_t>{"1G", 1000000000}, {"2GiB", int64_t{2} << 30},
        {"5000", 5000}, {"8KB", 8000}, {"4KiB", 4096}, {"3M", 3000000}}) {
    EXPECT_EQ(ParseOk("capture: {path: c, max_bytes: " + text + "}\n").capture.max_bytes, bytes) << text;
  }
}

TEST(CaptureConfigTest, ErrorsNameTheLineAndField) {
  EXPECT_EQ(ParseErr("capture:\n  sample: 0.5\n"), "t.yaml:2: capture: path is required in the capture block");
  EXPECT_EQ(ParseErr("capture:\n  path: c\n  sample: 0\n"),
            "t.yaml:3: capture.sample: must be in (0, 1] (got '0')");
  EXPECT_EQ(ParseErr("capture:\n  path: c\n  sample: 1.5\n"),
            "t.yaml:3: capture.sample: must be in (0, 1] (got '1.5')");
  EXPECT_EQ(ParseErr("capture:\n  path: c\n  max_bytes: 12 MB\n"),
            "t.yaml:3: capture.max_bytes: must be a size in bytes such as 268435456, 256MiB or 1G "
            "(got '12 MB')");
  EXPECT_EQ(ParseErr("capture:\n  path: c\n  max_bytes: 1K\n"),
            "t.yaml:3: capture.max_bytes: must be at least 4096 bytes (got '1K')");
  EXPECT_EQ(ParseErr("capture:\n  path: c\n  block_size: 0\n").rfind("t.yaml:3: capture.block_size: ", 0), 0u);
  EXPECT_EQ(ParseErr("capture:\n  path: c\n  smaple: 1\n").rfind("t.yaml:3: capture.smaple: unknown key", 0), 0u);
  EXPECT_EQ(ParseErr("capture:\n  path: \"\"\n"), "t.yaml:2: capture.path: must not be empty");
}

}  // namespace
}  // namespace kvroute::config
