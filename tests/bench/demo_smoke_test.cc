// `kvroute demo` end to end with a tiny duration: the binary starts fleets and routers,
// drives traffic through them, prints the table and writes its files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(DemoSmokeTest, RunsTwoPoliciesAndWritesTheReport) {
  const std::string bin = KVROUTE_BINARY;
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << "kvroute binary not built: " << bin;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvroute-demo-smoke-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const std::string cmd = "cd " KVROUTE_SOURCE_DIR " && timeout 60 " + bin +
                          " demo --duration 1 --drain 3 --rate 6 --output-scale 0.02 -q"
                          " --policies round-robin,kvroute"
                          " --out " + dir.string() + " > " + (dir.string() + ".log") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = ReadFile(dir.string() + ".log");
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("round-robin"), std::string::npos) << log;
  EXPECT_NE(log.find("kvroute"), std::string::npos) << log;
  for (const char* f : {"report.json", "report.md", "ttft_cdf.svg", "kv_usage.svg"}) {
    EXPECT_TRUE(std::filesystem::exists(dir / f)) << f;
    EXPECT_NE(log.find((dir / f).string()), std::string::npos) << f;
  }
  const std::string json = ReadFile(dir / "report.json");
  EXPECT_NE(json.find("\"schema\": \"kvroute.report/v1\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"policy\": \"round-robin\""), std::string::npos);
  EXPECT_NE(json.find("\"policy\": \"kvroute\""), std::string::npos);
  EXPECT_NE(ReadFile(dir / "kv_usage.svg").find("<svg"), std::string::npos);
  std::filesystem::remove_all(dir);
  std::filesystem::remove(dir.string() + ".log");
}

}  // namespace
