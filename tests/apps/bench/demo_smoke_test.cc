// `kvroute demo` end to end with tiny durations: the scaling runs in virtual time, then
// the binary starts fleets and routers, drives traffic through them with the doctor
// scraping, prints the scaling table, the diagnoses and the live table, and writes its
// files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/test_paths.h"

namespace {

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A row of the scaling table: the policy left-aligned in 15 columns, then the fleet size
// right-aligned in 8 (report::ScalingText).
std::string ScalingRow(const std::string& policy, int replicas) {
  std::string row = policy;
  row.resize(15, ' ');
  std::string n = std::to_string(replicas);
  return row + " " + std::string(8 - n.size(), ' ') + n + " ";
}

TEST(DemoSmokeTest, RunsScalingAndTwoPoliciesWithTheDoctorAndWritesTheReport) {
  const std::string bin = kvroute::test_support::KvrouteBinary();
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << "kvroute binary not built: " << bin;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvroute-demo-smoke-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  // A few seconds in all: small scaling runs (virtual time), 1 s of live traffic per policy
  // with the doctor scraping from its start.
  const std::string cmd = "cd " + kvroute::test_support::SourceDir() + " && timeout 60 " + bin +
                          " demo --duration 1 --drain 3 --rate 6 --output-scale 0.02 -q"
                          " --policies round-robin,kvroute --scaling-requests 20"
                          " --doctor-warmup 0 --doctor-window 1"
                          " --out " + dir.string() + " > " + (dir.string() + ".log") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = ReadFile(dir.string() + ".log");
  ASSERT_EQ(rc, 0) << log;
  for (const char* policy : {"round-robin", "kvroute"}) {
    for (int n : {2, 4, 8}) {
      EXPECT_NE(log.find("\n" + ScalingRow(policy, n)), std::string::npos)
          << policy << " " << n << "\n" << log;
    }
    EXPECT_NE(log.find(std::string(policy) + ": 2 -> 8 replicas"), std::string::npos) << log;
    EXPECT_NE(log.find(std::string("kvroute doctor, live fleet behind ") + policy),
              std::string::npos)
        << log;
  }
  EXPECT_NE(log.find("Live comparison:"), std::string::npos) << log;
  for (const char* f : {"report.json", "report.md", "report.html", "ttft_cdf.svg",
                        "kv_heatmap.svg", "scaling.svg"}) {
    EXPECT_TRUE(std::filesystem::exists(dir / f)) << f;
    EXPECT_NE(log.find((dir / f).string()), std::string::npos) << f;
  }
  const std::string json = ReadFile(dir / "report.json");
  EXPECT_NE(json.find("\"schema\": \"kvroute.report/v1\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"policy\": \"round-robin\""), std::string::npos);
  EXPECT_NE(json.find("\"policy\": \"kvroute\""), std::string::npos);
  EXPECT_NE(json.find("\"scaling\": {\"points\": ["), std::string::npos);
  EXPECT_NE(json.find("\"doctor\": [{\"policy\": \"round-robin\""), std::string::npos);
  const std::string html = ReadFile(dir / "report.html");
  for (const char* id : {"scaling", "doctor-round-robin", "doctor-kvroute", "live", "charts"}) {
    EXPECT_NE(html.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  }
  EXPECT_NE(html.find("<rect class=\"kv\""), std::string::npos);     // the heatmap, inline
  EXPECT_NE(html.find("<circle class=\"pt\""), std::string::npos);  // the scaling chart
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(ReadFile(dir / "kv_heatmap.svg").find("<svg"), std::string::npos);
  std::filesystem::remove_all(dir);
  std::filesystem::remove(dir.string() + ".log");
}

}  // namespace
