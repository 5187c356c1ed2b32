#include "core/engine/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace kvroute::engine {
namespace {

TEST(TokenizerTest, FourBytesPerToken) {
  EXPECT_TRUE(Tokenize("").empty());
  EXPECT_EQ(Tokenize("a").size(), 1u);
  EXPECT_EQ(Tokenize("abcd").size(), 1u);
  EXPECT_EQ(Tokenize("abcde").size(), 2u);
  EXPECT_EQ(Tokenize("Hello, world! How are you?").size(), 7u);  // 26 bytes
}

TEST(TokenizerTest, CountTokensMatchesTokenize) {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(CountTokens(text), Tokenize(text).size()) << "length " << i;
    text.push_back(static_cast<char>('a' + i % 26));
  }
  static_assert(CountTokens("12345678") == 2);
}

TEST(TokenizerTest, DeterministicAndInVocabulary) {
  const std::string text = "The quick brown fox jumps over the lazy dog.";
  const auto a = Tokenize(text);
  const auto b = Tokenize(std::string(text));
  EXPECT_EQ(a, b);
  for (uint32_t id : a) EXPECT_LT(id, kVocabSize);
  EXPECT_EQ(a[0], TokenId("The "));
  EXPECT_NE(TokenId("abcd"), TokenId("abce"));
  EXPECT_NE(TokenId("a"), TokenId(std::string_view("a\0", 2)));
}

TEST(TokenizerTest, PrefixStable) {
  const std::string shorter = "You are a helpful assistant. Answer";  // 35 bytes: 9 tokens
  const std::string longer = shorter + " briefly, please.";
  const auto s = Tokenize(shorter);
  const auto l = Tokenize(longer);
  ASSERT_EQ(s.size(), 9u);
  // All full 4-byte runs agree; the partial last run of `shorter` may differ.
  for (size_t i = 0; i + 1 < s.size(); ++i) EXPECT_EQ(s[i], l[i]) << i;
  // A prefix of whole runs agrees entirely.
  const auto aligned = Tokenize(std::string_view(longer).substr(0, 32));
  EXPECT_EQ(aligned, std::vector<uint32_t>(l.begin(), l.begin() + 8));
}

TEST(TokenizerTest, TokenizeIntoAppends) {
  std::vector<uint32_t> ids = {7};
  TokenizeInto("abcdefgh", &ids);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 7u);
  EXPECT_EQ(ids[1], TokenId("abcd"));
  EXPECT_EQ(ids[2], TokenId("efgh"));
}

TEST(TokenizerTest, OutputTokensAreDeterministicWordsThatRetokenize) {
  std::string text;
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < 50; ++i) {
    const std::string_view word = OutputTokenText(42, i);
    EXPECT_EQ(word.size(), kBytesPerToken);
    EXPECT_EQ(word.back(), ' ');
    EXPECT_EQ(word, OutputTokenText(42, i));
    EXPECT_EQ(OutputTokenId(42, i), TokenId(word));
    text += word;
    ids.push_back(OutputTokenId(42, i));
  }
  EXPECT_EQ(Tokenize(text), ids);
  // Different requests produce different texts.
  std::string other;
  for (size_t i = 0; i < 50; ++i) other += OutputTokenText(43, i);
  EXPECT_NE(text, other);
}

TEST(OutputTokenWords, ListsEveryOutputTokenText) {
  const std::span<const std::string_view> words = OutputTokenWords();
  ASSERT_EQ(words.size(), 64u);
  for (std::string_view w : words) EXPECT_EQ(w.size(), kBytesPerToken) << w;
  for (uint64_t request = 1; request < 20; ++request) {
    for (size_t i = 0; i < 40; ++i) {
      const std::string_view t = OutputTokenText(request, i);
      EXPECT_NE(std::find(words.begin(), words.end(), t), words.end()) << t;
    }
  }
}

}  // namespace
}  // namespace kvroute::engine
