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
  // Found by the trace fuzz target: an infinite time was accepted and broke time order.
  EXPECT_EQ(ParseTraceCsv("TIMESTAMP,ContextTokens,GeneratedTokens\n20201e308,5,12\n1,4,1\n",
                          "w.csv")
                .error,
            "w.csv:2: TIMESTAMP: not seconds or YYYY-MM-DD HH:MM:SS[.f]: '20201e308'");
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


TEST(TraceTest, ParsesMooncakeLinesInMillisecondsWithExtraFields) {
  const char* jsonl =
      R"({"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]})"
      "\n\n"
      R"({"timestamp": 500, "input_length": 512, "output_length": 3, "hash_ids": [0], )"
      R"("model": "m", "status": 200})"
      "\r\n"
      R"({"timestamp": 2500.5, "input_length": 1, "output_length": 1, "hash_ids": [9]})";
  TraceParseResult r = ParseTraceMooncake(jsonl, "t.jsonl", 512);
  ASSERT_TRUE(r.ok()) << r.error;
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_DOUBLE_EQ(r.rows[0].time_s, 0.0);  // sorted; times from the earliest row
  EXPECT_EQ(r.rows[0].context_tokens, 512);
  EXPECT_EQ(r.rows[0].hash_ids, std::vector<uint64_t>{0});
  EXPECT_DOUBLE_EQ(r.rows[1].time_s, 1.0);
  EXPECT_EQ(r.rows[1].context_tokens, 1100);
  EXPECT_EQ(r.rows[1].generated_tokens, 7);
  EXPECT_EQ(r.rows[1].hash_ids, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(r.rows[2].time_s, 2.0005);
  EXPECT_EQ(r.rows[2].prefix_group, -1);
}

TEST(TraceTest, MooncakeErrorsNameSourceLineAndField) {
  auto err = [](const std::string& text, int64_t block_size = 512) {
    return ParseTraceMooncake(text, "m.jsonl", block_size).error;
  };
  const std::string ok =
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [4]})"
      "\n";
  EXPECT_EQ(err(ok + "{\"timestamp\": 0,\n"), "m.jsonl:2: not a JSON object");
  EXPECT_EQ(err(ok + "[1, 2]\n"), "m.jsonl:2: not a JSON object");
  EXPECT_EQ(err(R"({"input_length": 10, "output_length": 1, "hash_ids": [4]})"),
            "m.jsonl:1: timestamp: missing");
  EXPECT_EQ(err(R"({"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [4]})"),
            "m.jsonl:1: timestamp: expected milliseconds, 0 to 1e15");
  EXPECT_EQ(err(R"({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []})"),
            "m.jsonl:1: input_length: expected an integer >= 1");
  EXPECT_EQ(err(R"({"timestamp": 0, "input_length": 10, "output_length": "5", "hash_ids": [4]})"),
            "m.jsonl:1: output_length: expected an integer >= 1");
  EXPECT_EQ(err(R"({"timestamp": 0, "input_length": 10, "output_length": 1})"),
            "m.jsonl:1: hash_ids: missing");
  EXPECT_EQ(err(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-4]})"),
            "m.jsonl:1: hash_ids: expected an array of integers >= 0");
  EXPECT_EQ(err(R"({"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [4]})"),
            "m.jsonl:1: hash_ids: 1 ids for input_length 513 at block_size 512 (expected 2)");
  EXPECT_EQ(err(R"({"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [4]})", 16),
            "m.jsonl:1: hash_ids: 1 ids for input_length 40 at block_size 16 (expected 3)");
  EXPECT_EQ(err(ok, 0), "m.jsonl: block_size must be >= 1");
}

// One segment per hash id, block_size tokens each and the last partial; equal ids render
// equal text, so prompts share exactly their common leading ids.
TEST(TraceTest, MooncakeReplayIsOneSegmentPerHashId) {
  auto parsed = ParseTraceMooncake(
      R"({"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]})"
      "\n"
      R"({"timestamp": 1000, "input_length": 36, "output_length": 6, "hash_ids": [1, 2, 7]})"
      "\n"
      R"({"timestamp": 3000, "input_length": 48, "output_length": 2, "hash_ids": [1, 2, 3]})",
      "t", 16);
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  WorkloadSpec w;
  w.kind = WorkloadKind::kTrace;
  w.trace = std::make_shared<std::vector<TraceRow>>(parsed.rows);
  w.block_size = 16;
  w.time_scale = 2.0;
  ASSERT_EQ(w.Validate().ToString(), "OK");
  ArrivalSpec a;
  RequestGenerator gen(w, a, 3);
  std::vector<RequestSpec> reqs;
  RequestSpec r;
  while (gen.Next(&r)) reqs.push_back(r);
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_DOUBLE_EQ(reqs[2].arrival_s, 1.5);
  std::vector<std::string> text(3);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(reqs[i].segments.size(), 3u);
    EXPECT_EQ(reqs[i].segments[0].tokens, 16);
    EXPECT_EQ(reqs[i].segments[1].tokens, 16);
    EXPECT_EQ(reqs[i].prompt_tokens, parsed.rows[i].context_tokens);
    EXPECT_EQ(reqs[i].max_tokens, parsed.rows[i].generated_tokens);
    EXPECT_EQ(reqs[i].group_id, 1);
    RenderPrompt(reqs[i], nullptr, &text[i]);
    EXPECT_EQ(text[i].size(), static_cast<size_t>(reqs[i].prompt_tokens) * kBytesPerToken);
  }
  EXPECT_EQ(reqs[0].segments[2].tokens, 8);
  EXPECT_EQ(reqs[1].segments[2].tokens, 4);
  EXPECT_EQ(reqs[2].segments[2].tokens, 16);
  // Ids 1 and 2 are the same 32 tokens everywhere; id 3's 8 tokens are the first 8 of its 16.
  EXPECT_EQ(text[0].substr(0, 128), text[1].substr(0, 128));
  EXPECT_NE(text[0].substr(128, 16), text[1].substr(128, 16));
  EXPECT_EQ(text[2].substr(0, text[0].size()), text[0]);
  // Truncation by the request count.
  a.num_requests = 2;
  RequestGenerator two(w, a, 3);
  int n = 0;
  while (two.Next(&r)) ++n;
  EXPECT_EQ(n, 2);
}

TEST(TraceTest, ExampleMooncakeTraceParses) {
  std::ifstream f(kvroute::test_support::SourceDir() +
                  "/examples/traces/mooncake-synthetic.jsonl");
  ASSERT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  TraceParseResult r = ParseTrace(TraceFormat::kMooncake, ss.str(), "mooncake-synthetic.jsonl", 512);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.rows.size(), 3993u);
  EXPECT_DOUBLE_EQ(r.rows.back().time_s, 1022.025);
}

TEST(TraceFormatTest, NamedElseByTheFilesExtension) {
  EXPECT_EQ(DefaultTraceFormat("/x/capture.jsonl"), TraceFormat::kMooncake);
  EXPECT_EQ(DefaultTraceFormat("azure.csv"), TraceFormat::kAzureCsv);
  EXPECT_EQ(DefaultTraceFormat("jsonl"), TraceFormat::kAzureCsv);
  EXPECT_EQ(TraceFormatNamed("mooncake"), TraceFormat::kMooncake);
  EXPECT_EQ(TraceFormatNamed("azure"), TraceFormat::kAzureCsv);
  EXPECT_EQ(TraceFormatNamed("csv"), TraceFormat::kAzureCsv);
  EXPECT_FALSE(TraceFormatNamed("sharegpt").has_value());
  EXPECT_EQ(TraceFormatName(TraceFormat::kMooncake), "mooncake");
  EXPECT_EQ(TraceFormatName(TraceFormat::kAzureCsv), "azure");
}

}  // namespace
}  // namespace kvroute::workload
