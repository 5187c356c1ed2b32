// The scans a front end runs over bytes it relays without parsing them: an integer after a
// key, and the count of streamed chunks that carry a choice (TPOT's token count).
#include "core/api/json_scan.h"

#include <gtest/gtest.h>

#include <string>

namespace kvroute::api {
namespace {

// A stream as vLLM (and kvroute sim) write it: `n` token chunks, then a usage-only chunk
// and [DONE].
std::string Stream(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,"
         "\"text\":\"t" + std::to_string(i) + "\"}]}\n\n";
  }
  s += "data: {\"id\":\"cmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,"
       "\"completion_tokens\":" + std::to_string(n) + "}}\n\ndata: [DONE]\n\n";
  return s;
}

TEST(JsonScan, IntAfterKey) {
  EXPECT_EQ(IntAfterKey("{\"cached_tokens\": 48}", "\"cached_tokens\""), 48);
  EXPECT_EQ(IntAfterKey("{\"cached_tokens\":\"x\"}", "\"cached_tokens\""), -1);
  EXPECT_EQ(IntAfterKey("{}", "\"cached_tokens\""), -1);
}

TEST(JsonScan, CountsChoiceChunksNotTheUsageChunk) {
  ChoiceChunkCounter c;
  c.Feed(Stream(7));
  EXPECT_EQ(c.chunks(), 7);
  c.Reset();
  EXPECT_EQ(c.chunks(), 0);
  c.Feed(Stream(0));
  EXPECT_EQ(c.chunks(), 0);
}

TEST(JsonScan, CountsTheSameWhereverTheReadsSplitTheStream) {
  const std::string s = Stream(5);
  // Every split into two reads, and reads of every fixed size from 1 byte up.
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    ChoiceChunkCounter c;
    c.Feed(std::string_view(s).substr(0, cut));
    c.Feed(std::string_view(s).substr(cut));
    ASSERT_EQ(c.chunks(), 5) << "cut at " << cut;
  }
  for (size_t step = 1; step <= 16; ++step) {
    ChoiceChunkCounter c;
    for (size_t at = 0; at < s.size(); at += step) c.Feed(std::string_view(s).substr(at, step));
    ASSERT_EQ(c.chunks(), 5) << "reads of " << step;
  }
  // Marks back to back, and one split over three reads.
  ChoiceChunkCounter c;
  c.Feed("\"choices\":[{\"choi");
  c.Feed("ces\":[");
  c.Feed("{");
  EXPECT_EQ(c.chunks(), 2);
}

}  // namespace
}  // namespace kvroute::api
