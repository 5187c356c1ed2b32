#include "apps/bench/options.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "apps/bench/bench_main.h"

namespace kvroute::bench {
namespace {

TEST(OptionsTest, ParsesUrls) {
  std::string err;
  auto a = ParseUrl("http://127.0.0.1:8080", &err);
  ASSERT_TRUE(a.has_value()) << err;
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8080);
  auto b = ParseUrl("http://localhost:9000/v1/completions", &err);
  ASSERT_TRUE(b.has_value()) << err;
  EXPECT_EQ(b->host, "localhost");
  EXPECT_EQ(b->port, 9000);
  auto c = ParseUrl("example.com", &err);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->port, 80);
  auto d = ParseUrl("http://[::1]:81", &err);
  ASSERT_TRUE(d.has_value()) << err;
  EXPECT_EQ(d->host, "::1");
  EXPECT_EQ(d->ToString(), "[::1]:81");
  EXPECT_FALSE(ParseUrl("https://x:1", &err));
  EXPECT_FALSE(ParseUrl("http://x:0", &err));
  EXPECT_FALSE(ParseUrl("http://x:port", &err));
}

TEST(OptionsTest, ParsesFleetListsAndRanges) {
  std::string err;
  auto f = ParseFleetList("10.0.0.1:8000, :8001,8002", "127.0.0.1", &err);
  ASSERT_TRUE(f.has_value()) << err;
  ASSERT_EQ(f->size(), 3u);
  EXPECT_EQ((*f)[0].ToString(), "10.0.0.1:8000");
  EXPECT_EQ((*f)[1].ToString(), "127.0.0.1:8001");
  EXPECT_EQ((*f)[2].ToString(), "127.0.0.1:8002");
  EXPECT_FALSE(ParseFleetList("a:1,b:x", "h", &err));
  EXPECT_EQ(err, "bad host:port 'b:x'");
  EXPECT_FALSE(ParseFleetList("", "h", &err));
  // A replica's URL (as --url takes it) names it too; a scheme left in a host does not.
  auto u = ParseFleetList("http://10.0.0.2:8000,http://[::1]:81/metrics", "h", &err);
  ASSERT_TRUE(u.has_value()) << err;
  ASSERT_EQ(u->size(), 2u);
  EXPECT_EQ((*u)[0].ToString(), "10.0.0.2:8000");
  EXPECT_EQ((*u)[1].ToString(), "[::1]:81");
  EXPECT_FALSE(ParseFleetList("https://10.0.0.2:8000", "h", &err));
  EXPECT_EQ(err, "bad host:port 'https://10.0.0.2:8000'");

  auto r = ParsePortRange("18001-18008", "h", &err);
  ASSERT_TRUE(r.has_value()) << err;
  ASSERT_EQ(r->size(), 8u);
  EXPECT_EQ(r->front().ToString(), "h:18001");
  EXPECT_EQ(r->back().ToString(), "h:18008");
  EXPECT_EQ(ParsePortRange("5", "h", &err)->size(), 1u);
  EXPECT_FALSE(ParsePortRange("9-8", "h", &err));
  EXPECT_FALSE(ParsePortRange("1-70000", "h", &err));
}

TEST(OptionsTest, ParsesSlos) {
  std::string err;
  auto s = ParseSlo("ttft=2s,tpot=50ms", &err);
  ASSERT_TRUE(s.has_value()) << err;
  EXPECT_DOUBLE_EQ(s->ttft_s, 2.0);
  EXPECT_DOUBLE_EQ(s->tpot_s, 0.05);
  EXPECT_EQ(s->e2e_s, 0.0);
  auto t = ParseSlo("e2e=30", &err);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->e2e_s, 30.0);
  EXPECT_FALSE(ParseSlo("ttft=1,ttft=2", &err));
  EXPECT_EQ(err, "SLO 'ttft' given twice");
  EXPECT_FALSE(ParseSlo("latency=1", &err));
  EXPECT_FALSE(ParseSlo("ttft=-1", &err));
  EXPECT_FALSE(ParseSlo("ttft", &err));
}

TEST(OptionsTest, ParsesLengthsAndStages) {
  std::string err;
  auto fixed = ParseLength("128", &err);
  ASSERT_TRUE(fixed.has_value());
  ASSERT_EQ(fixed->components.size(), 1u);
  EXPECT_EQ(fixed->components[0].min, 128);
  EXPECT_EQ(fixed->components[0].max, 128);
  auto normal = ParseLength("200:50:100:300", &err);
  ASSERT_TRUE(normal.has_value()) << err;
  EXPECT_EQ(normal->components[0].min, 100);
  EXPECT_EQ(normal->components[0].max, 300);
  EXPECT_EQ(normal->components[0].mean, 200.0);
  EXPECT_EQ(normal->components[0].std_dev, 50.0);
  auto open = ParseLength("100:10", &err);
  ASSERT_TRUE(open.has_value());
  EXPECT_EQ(open->components[0].min, 1);
  EXPECT_EQ(open->components[0].max, 140);
  EXPECT_FALSE(ParseLength("1:2:3", &err));
  EXPECT_FALSE(ParseLength("x", &err));
  EXPECT_FALSE(ParseLength("100:10:50:20", &err));

  auto st = ParseStages("10:30, 20:inf", &err);
  ASSERT_TRUE(st.has_value()) << err;
  ASSERT_EQ(st->size(), 2u);
  EXPECT_EQ((*st)[0].rate, 10.0);
  EXPECT_EQ((*st)[0].duration_s, 30.0);
  EXPECT_TRUE(std::isinf((*st)[1].duration_s));
  EXPECT_FALSE(ParseStages("10", &err));
  EXPECT_FALSE(ParseStages("0:5", &err));
}

TEST(OptionsTest, ParsesHeaders) {
  std::string err;
  auto a = ParseHeader("x-gateway-inference-objective:batch", &err);
  ASSERT_TRUE(a.has_value()) << err;
  EXPECT_EQ(a->name, "x-gateway-inference-objective");
  EXPECT_EQ(a->value, "batch");
  // curl's spelling: whitespace around the value is not part of it; later colons are.
  auto b = ParseHeader("X-Tenant:  a:b c \t", &err);
  ASSERT_TRUE(b.has_value()) << err;
  EXPECT_EQ(b->name, "X-Tenant");
  EXPECT_EQ(b->value, "a:b c");
  auto empty = ParseHeader("x-empty:", &err);
  ASSERT_TRUE(empty.has_value()) << err;
  EXPECT_EQ(empty->value, "");

  EXPECT_FALSE(ParseHeader("x-tenant", &err));
  EXPECT_EQ(err, "bad header 'x-tenant' (want NAME:VALUE)");
  EXPECT_FALSE(ParseHeader(":batch", &err));
  EXPECT_EQ(err, "bad header ':batch': no name before ':'");
  EXPECT_FALSE(ParseHeader("x tenant:a", &err));
  EXPECT_EQ(err, "bad header name 'x tenant' (letters, digits and !#$%&'*+-.^_`|~ only)");
  EXPECT_FALSE(ParseHeader("x-tenant :a", &err));  // no space before the colon
  EXPECT_FALSE(ParseHeader("", &err));
  EXPECT_FALSE(ParseHeader("Content-Length:5", &err));
  EXPECT_EQ(err, "header 'Content-Length' is set by kvroute bench itself");
  EXPECT_FALSE(ParseHeader("host:x", &err));
  EXPECT_FALSE(ParseHeader("x-a:b\r\nx-injected: 1", &err));
  EXPECT_EQ(err, "bad value for header 'x-a': control character");
}

}  // namespace
}  // namespace kvroute::bench

namespace kvroute::bench {
namespace {

// BenchMain's exit code and what it printed to stderr, for these arguments.
std::pair<int, std::string> RunMain(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  const int rc = BenchMain(static_cast<int>(argv.size()), argv.data());
  return {rc, ::testing::internal::GetCapturedStderr()};
}

TEST(BenchMainTest, RefusesBadTraceFlagsAndNamesTheTracesLine) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/kvroute-bench-good.jsonl";
  const std::string bad = dir + "/kvroute-bench-bad.jsonl";
  std::ofstream(good) << R"({"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]})"
                      << "\n";
  std::ofstream(bad) << R"({"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]})"
                     << "\n"
                     << R"({"timestamp": 5, "input_length": 600, "output_length": 2})" << "\n";
  // Port 1: nothing is sent, the flags fail first.
  auto [rc1, err1] = RunMain({"bench", "--url", "http://127.0.0.1:1", "--model", "m", "--trace",
                              good, "--trace-format", "sharegpt"});
  EXPECT_EQ(rc1, 2);
  EXPECT_NE(err1.find("unknown --trace-format 'sharegpt' (mooncake or azure)"), std::string::npos)
      << err1;
  auto [rc2, err2] = RunMain({"bench", "--url", "http://127.0.0.1:1", "--model", "m", "--trace",
                              good, "--block-size", "0"});
  EXPECT_EQ(rc2, 2);
  EXPECT_NE(err2.find("--block-size: must be >= 1"), std::string::npos) << err2;
  // .jsonl reads as Mooncake by default: the second line lacks hash_ids.
  auto [rc3, err3] =
      RunMain({"bench", "--url", "http://127.0.0.1:1", "--model", "m", "--trace", bad});
  EXPECT_EQ(rc3, 2);
  EXPECT_NE(err3.find(bad + ":2: "), std::string::npos) << err3;
  EXPECT_NE(err3.find("hash_ids"), std::string::npos) << err3;
}

}  // namespace
}  // namespace kvroute::bench
