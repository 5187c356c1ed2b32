#include "simkit/workload/trace.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "simkit/workload/workload.h"
#include "support/test_paths.h"

namespace kvroute::workload {
namespace {

TEST(TraceTest, ParsesAzureDateTimesAndOptionalColumns) {
  const char* csv =
      "TIMESTAMP,ContextTokens,GeneratedTokens,PrefixGroup\n"
      "2023-11-16 18:15:46.5000000,4808,10,1\n"
      "2023-11-16 18:15:46.0000000,3180,8,\n"
      "2023-11-16 18:15:47.2500000,110,27,1\r\n";
  TraceParseResult r = ParseTraceCsv(csv, "t.csv");
  ASSERT_TRUE(r.ok()) << r.error;
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_DOUBLE_EQ(r.rows[0].time_s, 0.0);
  EXPECT_EQ(r.rows[0].context_tokens, 3180);
  EXPECT_EQ(r.rows[0].prefix_group, -1);
  EXPECT_NEAR(r.rows[1].time_s, 0.5, 1e-6);
  EXPECT_EQ(r.rows[1].prefix_group, 1);
  EXPECT_NEAR(r.rows[2].time_s, 1.25, 1e-6);
  EXPECT_EQ(r.rows[2].generated_tokens, 27);
}

TEST(TraceTest, ErrorsNameSourceAndLine) {
  EXPECT_EQ(ParseTraceCsv("a,b\n", "x.csv").error,
            "x.csv:1: header must name TIMESTAMP, ContextTokens and GeneratedTokens");
  EXPECT_EQ(
      ParseTraceCsv("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,1\n1,zz,2\n", "y.csv").error,
      "y.csv:3: ContextTokens: expected an integer >= 1");
  EXPECT_EQ(ParseTraceCsv("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5\n", "z.csv").error,
            "z.csv:2: expected 3 columns, got 2");
}

TEST(TraceTest, ReplayBuildsSharedPrefixesAndScalesTime) {
  auto parsed = ParseTraceCsv(
      "TIMESTAMP,ContextTokens,GeneratedTokens,PrefixGroup,PrefixTokens\n"
      "0,100,5,7,\n2,300,6,7,\n4,50,7,-1,\n6,80,8,7,200\n",
      "t");
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  WorkloadSpec w;
  w.kind = WorkloadKind::kTrace;
  w.trace = std::make_shared<std::vector<TraceRow>>(parsed.rows);
  w.time_scale = 2.0;
  w.prefix_len = 64;
  ASSERT_EQ(w.Validate().ToString(), "OK");
  ArrivalSpec a;
  RequestGenerator gen(w, a, 1);
  std::vector<RequestSpec> reqs;
  RequestSpec r;
  while (gen.Next(&r)) reqs.push_back(r);
  ASSERT_EQ(reqs.size(), 4u);
  EXPECT_DOUBLE_EQ(reqs[1].arrival_s, 1.0);
  EXPECT_EQ(reqs[0].segments[0].tokens, 64);
  EXPECT_EQ(reqs[1].segments[0].key, reqs[0].segments[0].key);
  EXPECT_EQ(reqs[1].segments[1].tokens, 236);
  EXPECT_EQ(reqs[2].segments.size(), 1u);  // no group: nothing shared
  EXPECT_EQ(reqs[3].segments.size(), 1u);  // whole 80-token context is the prefix
  EXPECT_EQ(reqs[3].segments[0].tokens, 80);
  for (const auto& q : reqs) EXPECT_EQ(q.prompt_tokens, parsed.rows[q.id].context_tokens);
}

TEST(TraceTest, ExampleTraceParses) {
  std::ifstream f(kvroute::test_support::SourceDir() + "/examples/traces/azure-sample.csv");
  ASSERT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  TraceParseResult r = ParseTraceCsv(ss.str(), "azure-sample.csv");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_GE(r.rows.size(), 100u);
}

}  // namespace
}  // namespace kvroute::workload
