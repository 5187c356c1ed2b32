// The cache view (cache_view.h): per candidate, the engines' figure where its KV-cache
// events are live, the approximate model's elsewhere, and which one each figure is.
#include "core/sched/cache_view.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/kvevents/event_index.h"
#include "sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;

kvevents::KvEventBatch Stored(const std::vector<uint32_t>& tokens, size_t blocks,
                              uint64_t first_hash, kvevents::Medium medium) {
  kvevents::KvEvent e;
  e.kind = kvevents::EventKind::kBlockStored;
  e.block_size = 16;
  e.medium = medium;
  for (size_t i = 0; i < blocks; ++i) e.block_hashes.push_back(first_hash + i);
  e.token_ids.assign(tokens.begin(), tokens.begin() + static_cast<long>(blocks * 16));
  kvevents::KvEventBatch b;
  b.events.push_back(e);
  return b;
}

// Five endpoints: 0 live with 8 of the request's 10 keys on the GPU, 1 live with 4 on the
// CPU, 2 expected but never heard from, 3 and 4 without events. The model was sent the
// request's 4-block chain on 0 and 2, and its first 2 blocks on 3.
struct Fixture {
  Fixture() : eps(MakeEndpoints(5)), tokens(160) {
    std::iota(tokens.begin(), tokens.end(), 500u);
    for (uint32_t id = 0; id < 3; ++id) index.Expect(id, 0.0);
    index.ApplyBatch(0, Stored(tokens, 8, 100, kvevents::Medium::kGpu), 0.0);
    index.ApplyBatch(1, Stored(tokens, 4, 200, kvevents::Medium::kCpu), 0.0);
    index.RequestKeys("", tokens, &keys);
    model.OnRouted(chain, 0, 100, 0.0);
    model.OnRouted(chain, 2, 100, 0.0);
    model.OnRouted(std::span<const uint64_t>(chain).first(2), 3, 100, 0.0);
    req.model = "m";
    req.token_ids = tokens;
    req.events = &index;
    req.event_keys = keys;
  }
  CacheView::Query Query(bool events) const {
    CacheView::Query q;
    q.model = &model;
    q.chain = chain;
    q.chain_block_tokens = 64;
    q.events = events;
    return q;
  }

  std::vector<EndpointState> eps;
  std::vector<uint32_t> tokens;
  kvevents::EventIndex index;  // 16-token keys, CPU weight 0.8
  std::vector<uint64_t> keys;
  ApproxPrefixModel model;
  std::vector<uint64_t> chain = {11, 12, 13, 14};
  SchedRequest req;
  std::vector<uint32_t> all = {0, 1, 2, 3, 4};
  CacheView view;
};

TEST(CacheView, LiveEventsWinTheModelCountsTheRest) {
  Fixture f;
  ASSERT_EQ(f.keys.size(), 10u);
  f.view.Fill(f.Query(true), f.req, f.eps, f.all, 1.0);
  ASSERT_EQ(f.view.size(), 5u);
  EXPECT_TRUE(f.view.events_used());
  EXPECT_EQ(f.view.event_block_tokens(), 16);
  EXPECT_EQ(f.view.max_id(), 4u);

  EXPECT_EQ(f.view[0].source, CacheSource::kEvents);
  EXPECT_EQ(f.view[0].blocks, 8u);
  EXPECT_DOUBLE_EQ(f.view.Share(0), 0.8);
  EXPECT_DOUBLE_EQ(f.view.Tokens(0), 128.0);
  EXPECT_EQ(f.view.RunTokens(0), 128);
  // CPU blocks count in the run and weigh 0.8 (the index's own tiers).
  EXPECT_EQ(f.view[1].source, CacheSource::kEvents);
  EXPECT_EQ(f.view[1].blocks, 4u);
  EXPECT_DOUBLE_EQ(f.view[1].weighted, 3.2);
  EXPECT_DOUBLE_EQ(f.view.Share(1), 0.32);
  EXPECT_EQ(f.view.RunTokens(1), 64);
  // Unknown is not zero: endpoint 2's events are expected but silent, so the model counts.
  EXPECT_EQ(f.view[2].source, CacheSource::kApprox);
  EXPECT_EQ(f.view[2].blocks, 4u);
  EXPECT_DOUBLE_EQ(f.view.Share(2), 1.0);
  EXPECT_DOUBLE_EQ(f.view.Tokens(2), 256.0);
  EXPECT_EQ(f.view[3].source, CacheSource::kApprox);
  EXPECT_DOUBLE_EQ(f.view.Share(3), 0.5);
  EXPECT_EQ(f.view.RunTokens(3), 128);
  // An id the event index has never seen: the model, which holds nothing there.
  EXPECT_EQ(f.view[4].source, CacheSource::kApprox);
  EXPECT_DOUBLE_EQ(f.view.Share(4), 0.0);
}

TEST(CacheView, ExplicitTierWeightsAndCandidateOrder) {
  Fixture f;
  const kvevents::TierWeights tiers{1.0, 0.5, 0.25, 0.0};
  CacheView::Query q = f.Query(true);
  q.tiers = &tiers;
  const std::vector<uint32_t> some = {3, 1};  // positions, in the caller's order
  f.view.Fill(q, f.req, f.eps, some, 1.0);
  ASSERT_EQ(f.view.size(), 2u);
  EXPECT_EQ(f.view.max_id(), 3u);
  EXPECT_EQ(f.view[0].source, CacheSource::kApprox);
  EXPECT_EQ(f.view[0].blocks, 2u);
  EXPECT_EQ(f.view[1].source, CacheSource::kEvents);
  EXPECT_DOUBLE_EQ(f.view[1].weighted, 2.0);
  EXPECT_DOUBLE_EQ(f.view.Tokens(1), 32.0);
}

TEST(CacheView, WithoutEventsOrAChainTheFiguresSaySo) {
  Fixture f;
  // Events off (or no index, or no keys for the request): the model alone.
  f.view.Fill(f.Query(false), f.req, f.eps, f.all, 1.0);
  EXPECT_FALSE(f.view.events_used());
  EXPECT_EQ(f.view.event_block_tokens(), 0);
  EXPECT_EQ(f.view[0].source, CacheSource::kApprox);
  EXPECT_EQ(f.view[0].blocks, 4u);
  SchedRequest no_keys = f.req;
  no_keys.event_keys = {};
  f.view.Fill(f.Query(true), no_keys, f.eps, f.all, 1.0);
  EXPECT_FALSE(f.view.events_used());
  EXPECT_EQ(f.view[1].source, CacheSource::kApprox);
  EXPECT_EQ(f.view[1].blocks, 0u);

  // A prompt shorter than one model block: no approximate figure at all.
  CacheView::Query q = f.Query(true);
  q.chain = {};
  f.view.Fill(q, f.req, f.eps, f.all, 1.0);
  EXPECT_EQ(f.view[0].source, CacheSource::kEvents);
  EXPECT_EQ(f.view[2].source, CacheSource::kNone);
  EXPECT_DOUBLE_EQ(f.view.Share(2), 0.0);
  EXPECT_DOUBLE_EQ(f.view.Tokens(2), 0.0);
  EXPECT_EQ(f.view.RunTokens(2), 0);
}

TEST(CacheView, AStaleEndpointFallsBackToTheModel) {
  Fixture f;
  // Work dispatched to endpoint 0 and no batch since, longer than stale_after_s (10 s).
  f.index.OnWorkDispatched(0, 1.0);
  f.view.Fill(f.Query(true), f.req, f.eps, f.all, 20.0);
  EXPECT_EQ(f.view[0].source, CacheSource::kApprox);
  EXPECT_EQ(f.view[0].blocks, 4u);
  EXPECT_EQ(f.view[1].source, CacheSource::kEvents);
}

}  // namespace
}  // namespace kvroute::sched
