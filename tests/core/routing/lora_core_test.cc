// LoRA adapters in the routing core, in virtual time (issue 26): scrapes of
// vllm:lora_requests_info as the scraper adapter hands them over (RoutingCore::OnScrape),
// picks by the kvroute policy's lora-affinity-scorer, the precise index's keys rooted in
// the adapter, and stale LoRA state unknown.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "core/routing/routing_core.h"
#include "support/routing_fixture.h"

namespace kvroute::routing {
namespace {

using kvevents::EventKind;
using kvevents::KvEvent;
using kvevents::KvEventBatch;
using test_support::Scraped;
using test_support::TestEndpoint;

constexpr const char* kBase = "meta-llama/Llama-3.1-8B-Instruct";  // the fixture's model

// The v0.10 fixture (vLLM serving kBase), idle, plus the current lora_requests_info series
// and an older one that must not count.
ScrapeResult ScrapedLora(int max_lora, const std::string& running, const std::string& waiting,
                         double at) {
  std::string text = metrics::testing::V010With("0", "0", "0.1");
  text += "vllm:lora_requests_info{max_lora=\"" + std::to_string(max_lora) +
          "\",running_lora_adapters=\"stale-lora\",waiting_lora_adapters=\"\"} 100\n";
  text += "vllm:lora_requests_info{max_lora=\"" + std::to_string(max_lora) +
          "\",running_lora_adapters=\"" + running + "\",waiting_lora_adapters=\"" + waiting +
          "\"} 200\n";
  return Scraped(text, at);
}

std::vector<uint32_t> Tokens(size_t n, uint32_t first) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

KvEventBatch StoredBatch(const std::vector<uint32_t>& tokens, uint64_t first_hash,
                         const std::string& lora_name) {
  KvEvent e;
  e.kind = EventKind::kBlockStored;
  e.block_size = 16;
  e.lora_name = lora_name;
  const size_t blocks = tokens.size() / 16;
  for (size_t i = 0; i < blocks; ++i) e.block_hashes.push_back(first_hash + i);
  e.token_ids.assign(tokens.begin(), tokens.begin() + static_cast<long>(blocks * 16));
  KvEventBatch b;
  b.events.push_back(e);
  return b;
}

class LoraCore : public ::testing::Test {
 protected:
  void Configure(bool events) {
    std::vector<EndpointSpec> eps;
    for (int i = 0; i < 3; ++i) {
      eps.push_back(TestEndpoint("r" + std::to_string(i), 9100 + i));
      if (events) eps.back().kv_events = "tcp://127.0.0.1:" + std::to_string(5557 + i);
    }
    CoreOptions o;
    o.scheduling.policy = "kvroute";
    o.health.staleness_s = 2.0;
    ASSERT_TRUE(core.Configure(o, eps, 0).ok());
  }
  // Picks, dispatches and finishes one request for `model` at `now`; returns the endpoint.
  uint32_t PickOne(const std::string& model, double now, std::vector<uint32_t> tokens = {}) {
    const std::string prompt = tokens.empty() ? "short" : std::string(tokens.size() * 4, 'x');
    PickRequest pr;
    pr.request.model = model;
    pr.request.prompt = prompt;
    pr.request.token_ids = tokens;
    pr.dispatch_first = true;
    PickResult r = core.Pick(pr, now);
    EXPECT_TRUE(r.ok());
    if (!r.ok()) return ~0u;
    core.OnFinished(r.handle, r.ranked[0], 200, now);
    return r.ranked[0];
  }
  RoutingCore core{[](std::string_view) {}};
};

// A queue waiting for adapter slots is not saturation (issue 43): with every slot running an
// adapter and another adapter waiting, 8 waiting requests leave the endpoint unsaturated
// with room for one; the same queue is saturation when the waiting adapters are running
// ones (the batch is the limit) or the engine says nothing of its adapters.
TEST_F(LoraCore, AnAdapterBoundQueueIsNotSaturation) {
  Configure(false);
  auto scrape = [&](uint32_t id, const std::string& running, const std::string& waiting,
                    bool lora) {
    std::string text = metrics::testing::V010With("2", "8", "0.3");
    if (lora) {
      text += "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"" + running +
              "\",waiting_lora_adapters=\"" + waiting + "\"} 200\n";
    }
    core.OnScrape(id, Scraped(text, 1.0), 1.0);
  };
  scrape(0, "a,b", "c", true);   // adapter-bound
  scrape(1, "a,b", "a", true);   // waits for the batch, not for a slot
  scrape(2, "", "", false);      // no adapter information
  const RoutingCore::PoolLoad load = core.Load(1.0);
  EXPECT_EQ(load.ready, 3u);
  EXPECT_EQ(load.saturated, 2u);
  EXPECT_EQ(load.room, 1);
  EXPECT_EQ(load.roomiest, 0u);
  EXPECT_FALSE(load.saturated_pool());
  scrape(0, "a", "c", true);  // a free slot: c is loaded at the next step
  EXPECT_TRUE(core.Load(1.0).saturated_pool());
}

TEST_F(LoraCore, PicksFollowTheScrapedAdapters) {
  Configure(false);
  core.OnScrape(0, ScrapedLora(2, "lora-a", "", 0), 0);
  core.OnScrape(1, ScrapedLora(2, "lora-b", "", 0), 0);
  core.OnScrape(2, ScrapedLora(2, "lora-x,lora-y", "", 0), 0);  // full
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(PickOne("lora-a", 0.1), 0u) << i;
    EXPECT_EQ(PickOne("lora-b", 0.1), 1u) << i;
    EXPECT_EQ(PickOne("lora-x", 0.1), 2u) << i;
  }
  // A new adapter: never the full replica.
  for (int i = 0; i < 4; ++i) EXPECT_NE(PickOne("lora-c", 0.2), 2u) << i;
  // r0 full too (one running, one waiting): only r1 has room.
  core.OnScrape(0, ScrapedLora(2, "lora-a", "lora-d", 0.3), 0.3);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(PickOne("lora-e", 0.4), 1u) << i;
}

// A scrape without the family (LoRA off, or an older vLLM) leaves the state unknown: the
// replica listing the adapter wins over it, even when it is r0's own adapter by history.
TEST_F(LoraCore, MissingOrStaleLoraStateIsUnknown) {
  Configure(false);
  core.OnScrape(0, Scraped(metrics::testing::V010With("0", "0", "0.1"), 0), 0);
  core.OnScrape(1, ScrapedLora(4, "", "", 0), 0);
  core.OnScrape(2, ScrapedLora(4, "", "", 0), 0);
  for (int i = 0; i < 6; ++i) EXPECT_NE(PickOne("lora-a", 0.1), 0u) << i;
  // r1 keeps scraping; r0 and r2's last scrapes, at 0, are stale from 2 s on. r2 lists
  // lora-a in that old scrape: stale, so not a reason to go there (stale load counts as
  // full anyway: the pick is r1 either way, never a stale replica).
  core.OnScrape(2, ScrapedLora(4, "lora-a", "", 0.5), 0.5);
  core.OnScrape(1, ScrapedLora(4, "", "", 3.0), 3.0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(PickOne("lora-a", 3.0), 1u) << i;
}

// The precise index roots an adapter request's keys in the adapter's name, as vLLM roots
// its blocks (extra keys) and the events carry lora_name: blocks stored under lora-a
// attract lora-a's requests and not the base model's; blocks of the base model attract the
// base model's and not lora-a's. Base-model requests hash as before (root "").
TEST_F(LoraCore, PreciseKeysRootedInTheAdapter) {
  Configure(true);
  for (uint32_t id = 0; id < 3; ++id) core.OnScrape(id, ScrapedLora(4, "", "", 0), 0);
  const auto prompt = Tokens(320, 1000);  // 20 blocks
  core.OnKvEvents(1, StoredBatch(prompt, 500, ""), 0.5);        // the base model's blocks
  core.OnKvEvents(2, StoredBatch(prompt, 900, "lora-a"), 0.5);  // the same tokens, lora-a
  EXPECT_EQ(PickOne("lora-a", 0.5, prompt), 2u);
  EXPECT_EQ(PickOne(kBase, 0.5, prompt), 1u);
  EXPECT_EQ(PickOne("lora-a", 0.6, prompt), 2u);
  EXPECT_EQ(PickOne(kBase, 0.6, prompt), 1u);
}

}  // namespace
}  // namespace kvroute::routing
