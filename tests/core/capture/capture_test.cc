#include "core/capture/capture.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvroute::capture {
namespace {

// A sink for StartEntry: fixed key and block size.
class FixedSink : public Sink {
 public:
  FixedSink(uint64_t key, int64_t block_size) : key_(key), block_size_(block_size) {}
  bool Sample() override { return true; }
  uint64_t key() const override { return key_; }
  int64_t block_size() const override { return block_size_; }
  void Submit(Entry&&) override {}

 private:
  uint64_t key_;
  int64_t block_size_;
};

TEST(HashPromptTest, TextBlocksChainAndShareExactlyTheCommonLeadingBlocks) {
  // Block size 2 tokens = 8 bytes of text.
  const std::string a = "aaaaaaaabbbbbbbbcccccccc";         // 3 full blocks
  const std::string b = "aaaaaaaabbbbbbbbdddddddd";         // shares the first two
  const std::string c = "xxxxxxxxbbbbbbbbcccccccc";         // same later bytes, other first
  const std::string d = "aaaaaaaabbbbbbbbcccccccce";        // a's blocks and a partial fourth
  PromptBlocks ha = HashPrompt(7, {}, a, 2), hb = HashPrompt(7, {}, b, 2),
               hc = HashPrompt(7, {}, c, 2), hd = HashPrompt(7, {}, d, 2);
  ASSERT_EQ(ha.hashes.size(), 3u);
  EXPECT_EQ(ha.tokens, 6);
  EXPECT_FALSE(ha.exact);
  EXPECT_EQ(hb.hashes[0], ha.hashes[0]);
  EXPECT_EQ(hb.hashes[1], ha.hashes[1]);
  EXPECT_NE(hb.hashes[2], ha.hashes[2]);
  // A chain: equal bytes after a different block hash differently.
  EXPECT_NE(hc.hashes[1], ha.hashes[1]);
  EXPECT_NE(hc.hashes[2], ha.hashes[2]);
  ASSERT_EQ(hd.hashes.size(), 4u);
  EXPECT_EQ(hd.tokens, 7);  // 25 bytes: ceil(25 / 4)
  EXPECT_EQ(std::vector<uint64_t>(hd.hashes.begin(), hd.hashes.begin() + 3), ha.hashes);
  // The key changes every hash: another process's file cannot be matched against this one.
  PromptBlocks other_key = HashPrompt(8, {}, a, 2);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(other_key.hashes[i], ha.hashes[i]);
  EXPECT_TRUE(HashPrompt(7, {}, "", 2).hashes.empty());
}

TEST(HashPromptTest, TokenIdsWinOverTheTextAndCountExactly) {
  const std::vector<uint32_t> ids = {1, 2, 3, 4, 5};
  const std::vector<uint32_t> same_start = {1, 2, 3, 4, 9, 9};
  PromptBlocks p = HashPrompt(1, ids, "text the ids were made from", 2);
  EXPECT_TRUE(p.exact);
  EXPECT_EQ(p.tokens, 5);
  ASSERT_EQ(p.hashes.size(), 3u);
  PromptBlocks q = HashPrompt(1, same_start, "", 2);
  ASSERT_EQ(q.hashes.size(), 3u);
  EXPECT_EQ(q.hashes[0], p.hashes[0]);
  EXPECT_EQ(q.hashes[1], p.hashes[1]);
  EXPECT_NE(q.hashes[2], p.hashes[2]);
}

TEST(FitBlocksTest, CutsOrContinuesTheChainToCeilOfLengthOverBlockSize) {
  std::vector<uint64_t> a = {10, 20, 30};
  FitBlocks(a, 4, 2);  // ceil(4/2) = 2
  EXPECT_EQ(a, (std::vector<uint64_t>{10, 20}));
  std::vector<uint64_t> b = {10, 20}, c = {10, 20}, d = {10, 21};
  FitBlocks(b, 7, 2);  // 4 ids
  FitBlocks(c, 8, 2);
  FitBlocks(d, 8, 2);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b, c);  // equal chains continue equally
  EXPECT_NE(b[2], d[2]);
  EXPECT_NE(b[2], b[3]);
  std::vector<uint64_t> e;
  FitBlocks(e, 0, 2);
  EXPECT_TRUE(e.empty());
}

TEST(SamplerTest, TakesTheRateEvenly) {
  Sampler quarter(0.25);
  std::string taken;
  for (int i = 0; i < 12; ++i) taken += quarter.Take() ? 'x' : '.';
  EXPECT_EQ(taken, "...x...x...x");
  Sampler all(1.0);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(all.Take());
  Sampler tenth(0.1);
  int n = 0;
  for (int i = 0; i < 1000; ++i) n += tenth.Take();
  EXPECT_EQ(n, 100);
}

TEST(LineFormatterTest, WritesMooncakeLinesWithIdsAndSessionsNumberedPerFile) {
  LineFormatter f(2);
  Entry e;
  e.arrival_s = 101.25;
  e.prompt.hashes = {900, 901, 902};
  e.prompt.tokens = 6;
  e.prompt_tokens = 5;  // the engine's count wins: ceil(5/2) = 3 ids
  e.output_tokens = 7;
  e.max_tokens = 16;
  e.cached_tokens = 2;
  e.ttft_s = 0.013;
  e.status = 200;
  e.api = "/v1/chat/completions";
  e.model = "m\"x";
  e.endpoint = "r0";
  e.session = "user-42";
  std::string out;
  f.Append(e, 100.0, out);
  EXPECT_EQ(out,
            "{\"timestamp\": 1250, \"input_length\": 5, \"output_length\": 7, \"hash_ids\": [0, 1, 2], "
            "\"api\": \"/v1/chat/completions\", \"model\": \"m\\\"x\", \"status\": 200, "
            "\"endpoint\": \"r0\", \"session\": 0, \"ttft_ms\": 13, \"cached_tokens\": 2, "
            "\"blocks\": \"text\"}\n");
  // A second request: shared leading id keeps its number; no usage: the router's count,
  // and max_tokens for the output; no endpoint, session, TTFT or cached tokens.
  Entry g;
  g.arrival_s = 100.5;
  g.prompt.hashes = {900, 777};
  g.prompt.tokens = 3;
  g.prompt.exact = true;
  g.max_tokens = 4;
  g.status = 503;
  g.api = "/v1/completions";
  out.clear();
  f.Append(g, 100.0, out);
  EXPECT_EQ(out,
            "{\"timestamp\": 500, \"input_length\": 3, \"output_length\": 4, \"hash_ids\": [0, 3], "
            "\"api\": \"/v1/completions\", \"status\": 503, \"blocks\": \"tokens\"}\n");
  EXPECT_EQ(f.distinct_ids(), 4u);
  // A new file numbers from 0 again; an arrival before the origin is clamped to 0.
  f.Reset();
  g.arrival_s = 99.0;
  g.prompt.hashes = {777, 900};
  out.clear();
  f.Append(g, 100.0, out);
  const std::string head =
      "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"hash_ids\": [0, 1], ";
  EXPECT_EQ(out.substr(0, head.size()), head);
}

TEST(StartEntryTest, TakesThePromptPathModelLimitAndSession) {
  FixedSink sink(5, 2);
  api::ParsedRequest r;
  r.model = "llama";
  r.prompt_text = "aaaaaaaabbbb";
  r.max_tokens = 9;
  Entry e = StartEntry(sink, r, "/v1/completions", "s1", 3.5);
  EXPECT_EQ(e.arrival_s, 3.5);
  EXPECT_EQ(e.prompt.hashes, HashPrompt(5, {}, r.prompt_text, 2).hashes);
  EXPECT_EQ(e.prompt.tokens, 3);
  EXPECT_EQ(e.max_tokens, 9);
  EXPECT_EQ(e.api, "/v1/completions");
  EXPECT_EQ(e.model, "llama");
  EXPECT_EQ(e.session, "s1");
  r.token_ids = {1, 2, 3, 4, 5};
  EXPECT_TRUE(StartEntry(sink, r, "/v1/completions", "", 0).prompt.exact);
}

}  // namespace
}  // namespace kvroute::capture
