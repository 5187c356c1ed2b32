// The KV pull rule of a decode leg (core/engine/kv_transfer.h).
#include "core/engine/kv_transfer.h"

#include <gtest/gtest.h>

namespace kvroute::engine {
namespace {

TEST(KvTransferTest, OnlyWholeHeldBlocksOfThePromptTravel) {
  EXPECT_EQ(PullableTokens(1000, 62, 16), 992);   // every full block of the prompt
  EXPECT_EQ(PullableTokens(1000, 100, 16), 992);  // more held than the prompt's full blocks
  EXPECT_EQ(PullableTokens(1000, 10, 16), 160);   // fewer held
  EXPECT_EQ(PullableTokens(15, 1, 16), 0);        // shorter than one block
  EXPECT_EQ(PullableTokens(1000, 0, 16), 0);
  EXPECT_EQ(PullableTokens(1000, 62, 0), 0);
}

TEST(KvTransferTest, PullTakesMissingBytesOverBandwidth) {
  const KvTransferModel m{131072, 25e9, 64};
  const KvPull p = PlanKvPull(992, 0, m);
  EXPECT_TRUE(p.pulls());
  EXPECT_EQ(p.load_tokens, 992);
  EXPECT_EQ(p.missing_tokens, 992);
  EXPECT_DOUBLE_EQ(p.transfer_s, 992 * 131072 / 25e9);
  // Tokens the decode replica already caches do not travel; the load still covers them.
  const KvPull warm = PlanKvPull(992, 512, m);
  EXPECT_EQ(warm.load_tokens, 992);
  EXPECT_EQ(warm.missing_tokens, 480);
  EXPECT_DOUBLE_EQ(warm.transfer_s, 480 * 131072 / 25e9);
}

TEST(KvTransferTest, FewerMissingTokensThanTheMinimumAreRecomputed) {
  const KvTransferModel m{131072, 25e9, 64};
  EXPECT_FALSE(PlanKvPull(992, 929, m).pulls());  // 63 missing
  EXPECT_TRUE(PlanKvPull(992, 928, m).pulls());   // 64 missing
  EXPECT_FALSE(PlanKvPull(0, 0, m).pulls());
  // With no minimum, a pull still needs something to pull.
  const KvTransferModel any{131072, 25e9, 0};
  EXPECT_FALSE(PlanKvPull(992, 992, any).pulls());
  EXPECT_FALSE(PlanKvPull(160, 992, any).pulls());
  EXPECT_EQ(PlanKvPull(992, 991, any).missing_tokens, 1);
}

}  // namespace
}  // namespace kvroute::engine
