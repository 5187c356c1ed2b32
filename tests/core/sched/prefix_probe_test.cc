// The prefix probe flow control binds late with (Scheduler::PrefixKey / HeldBlocks): what
// a policy learned from dispatches, asked per endpoint, without picking.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sched_test_util.h"

namespace kvroute::sched {
namespace {

using testing::MakeEndpoints;
using testing::MustBuildPolicy;

SchedRequest Req(const std::string& prompt) {
  SchedRequest r;
  r.model = "m";
  r.prompt = prompt;
  r.max_tokens = 16;
  return r;
}

// Sends `prompt` to endpoint `id` and finishes it.
void SendTo(Scheduler& s, const std::vector<EndpointState>& eps, const std::string& prompt,
            uint32_t id, double now) {
  PickResult r = s.Pick(Req(prompt), eps, now);
  ASSERT_TRUE(r.ok());
  s.OnDispatched(r.handle, id, now);
  s.OnFinished(r.handle, now);
}

class PrefixProbe : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixProbe, HeldBlocksCountsTheLeadingBlocksAnEndpointWasSent) {
  std::unique_ptr<Scheduler> s = MustBuildPolicy(GetParam());
  const std::vector<EndpointState> eps = MakeEndpoints(3);
  const std::string head(1024, 'h');
  SendTo(*s, eps, head + std::string(1024, 'a'), 1, 1.0);  // endpoint 1: head + a
  SendTo(*s, eps, head, 2, 1.0);                            // endpoint 2: the head only

  std::vector<uint64_t> key;
  s->PrefixKey(Req(head + std::string(1024, 'a')), key);
  ASSERT_FALSE(key.empty());
  EXPECT_EQ(s->HeldBlocks(key, 1), key.size());  // all of it
  std::vector<uint64_t> head_key;
  s->PrefixKey(Req(head), head_key);
  EXPECT_EQ(s->HeldBlocks(key, 2), head_key.size());  // the shared head
  EXPECT_EQ(s->HeldBlocks(key, 0), 0u);                // nothing
  EXPECT_EQ(s->HeldBlocks(key, 77), 0u);               // unknown endpoint
  EXPECT_EQ(s->HeldBlocks({}, 1), 0u);

  // The key is reused (cleared first) and is the same chain every time.
  std::vector<uint64_t> again = {1, 2, 3};
  s->PrefixKey(Req(head + std::string(1024, 'a')), again);
  EXPECT_EQ(again, key);
}

INSTANTIATE_TEST_SUITE_P(HashedPrefixPolicies, PrefixProbe,
                         ::testing::Values("kvroute", "gie-default", "dynamo-cost", "llm-d-sticky"));

// Policies without a hashed prefix model answer nothing.
TEST(PrefixProbeNone, PoliciesWithoutAPrefixModelGiveAnEmptyKey) {
  for (const char* policy : {"round-robin", "least-request", "sglang-cache-aware"}) {
    std::unique_ptr<Scheduler> s = MustBuildPolicy(policy);
    const std::vector<EndpointState> eps = MakeEndpoints(2);
    SendTo(*s, eps, std::string(2048, 'p'), 1, 1.0);
    std::vector<uint64_t> key = {9};
    s->PrefixKey(Req(std::string(2048, 'p')), key);
    EXPECT_TRUE(key.empty()) << policy;
    EXPECT_EQ(s->HeldBlocks(std::vector<uint64_t>{1, 2}, 1), 0u) << policy;
  }
}

}  // namespace
}  // namespace kvroute::sched
