// PoolWatchState: list and watch results in, the endpoint set out. Fed with decoded
// fixtures (testdata/) and small pods built here. No cluster runs here.
#include "adapters/k8s/objects/pool_watch_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "adapters/k8s/objects/objects.h"

#include "testdata.h"

namespace kvroute::k8s {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

using testing::Fixture;
using testing::Lines;

InferencePool Pool(Labels selector, std::vector<uint16_t> ports, std::string rv = "1") {
  InferencePool p;
  p.meta.name = "pool";
  p.meta.resource_version = std::move(rv);
  p.selector = std::move(selector);
  p.target_ports = std::move(ports);
  return p;
}

Pod MakePod(std::string name, std::string ip, bool ready, Labels labels = {{"app", "vllm"}}) {
  Pod p;
  p.meta.name = std::move(name);
  p.meta.labels = std::move(labels);
  p.ip = std::move(ip);
  p.ready = ready;
  return p;
}

PodEvent Event(WatchEventType type, Pod pod, std::string rv) {
  PodEvent e;
  e.type = type;
  e.pod = std::move(pod);
  e.pod.meta.resource_version = std::move(rv);
  return e;
}

// "address name" per endpoint: the shape the tests compare against.
std::vector<std::string> Summary(const std::vector<routing::EndpointSpec>& eps) {
  std::vector<std::string> out;
  for (const auto& e : eps) out.push_back(e.address + " " + e.name);
  return out;
}

class PoolWatchStateTest : public ::testing::Test {
 protected:
  PoolWatchStateTest() : state_("pool") {
    state_.ApplyPool(Pool({{"app", "vllm"}}, {8000}));
    PodList list;
    list.resource_version = "100";
    list.items = {MakePod("a", "10.0.0.1", true), MakePod("b", "10.0.0.2", true)};
    state_.ApplyPodList(list);
    state_.TakeEndpoints();
  }
  std::vector<std::string> Endpoints() const { return Summary(state_.endpoints()); }

  PoolWatchState state_;
};

TEST(PoolWatchState, StartsNeedingBothListsWithNoEndpoints) {
  PoolWatchState s("pool");
  EXPECT_TRUE(s.pool_relist_needed());
  EXPECT_TRUE(s.pods_relist_needed());
  EXPECT_TRUE(s.endpoints().empty());
  EXPECT_TRUE(s.endpoints_changed());  // the first Configure must happen
  EXPECT_TRUE(s.TakeEndpoints().empty());
  EXPECT_FALSE(s.endpoints_changed());
  EXPECT_EQ(s.PodLabelSelector(), "");
}

TEST(PoolWatchState, FixturesEndToEnd) {
  PoolWatchState s("vllm-llama");
  Result<InferencePool> pool = DecodeInferencePool(Fixture("pool_v1.json"));
  ASSERT_TRUE(pool.ok());
  s.ApplyPool(*pool);
  EXPECT_FALSE(s.pool_relist_needed());
  EXPECT_EQ(s.pool_resource_version(), "47001");
  EXPECT_EQ(s.PodLabelSelector(), "app=vllm-llama");

  Result<PodList> list = DecodePodList(Fixture("podlist.json"));
  ASSERT_TRUE(list.ok());
  s.ApplyPodList(*list);
  EXPECT_FALSE(s.pods_relist_needed());
  EXPECT_EQ(s.pods_resource_version(), "48211");
  EXPECT_EQ(s.pod_count(), 3u);
  // Only the Ready pod with an IP; one port, so the name is the pod's.
  ASSERT_EQ(s.endpoints().size(), 1u);
  const routing::EndpointSpec& e = s.endpoints()[0];
  EXPECT_EQ(e.address, "10.8.1.23:8000");
  EXPECT_EQ(e.name, "vllm-llama-7d9c8b6f4-abcde");
  EXPECT_EQ(e.host, "10.8.1.23");
  EXPECT_EQ(e.port, 8000);
  EXPECT_THAT(e.labels,
              ElementsAre(Pair("app", "vllm-llama"), Pair("pod-template-hash", "7d9c8b6f4"),
                          Pair("topology.kubernetes.io/region", "us-east1"),
                          Pair("topology.kubernetes.io/zone", "us-east1-b")));
  EXPECT_TRUE(s.endpoints_changed());
  s.TakeEndpoints();

  const std::vector<std::string> lines = Lines(Fixture("pod_watch.jsonl"));
  std::vector<std::vector<std::string>> after;
  std::vector<bool> changed;
  std::vector<std::string> rvs;
  for (const std::string& line : lines) {
    Result<PodEvent> ev = DecodePodEvent(line);
    ASSERT_TRUE(ev.ok()) << ev.status().ToString();
    EXPECT_TRUE(s.ApplyPodEvent(*ev).ok());
    after.push_back(Summary(s.endpoints()));
    changed.push_back(s.endpoints_changed());
    rvs.push_back(s.pods_resource_version());
    s.TakeEndpoints();
  }
  const std::string abcde = "10.8.1.23:8000 vllm-llama-7d9c8b6f4-abcde";
  const std::string pqrst = "10.8.3.4:8000 vllm-llama-7d9c8b6f4-pqrst";
  // ADDED (pending, no IP), MODIFIED (Ready), BOOKMARK, deletionTimestamp set, DELETED.
  EXPECT_THAT(after, ElementsAre(ElementsAre(abcde), ElementsAre(abcde, pqrst),
                                 ElementsAre(abcde, pqrst), ElementsAre(pqrst),
                                 ElementsAre(pqrst)));
  EXPECT_THAT(changed, ElementsAre(false, true, false, true, false));
  EXPECT_THAT(rvs, ElementsAre("48300", "48310", "48400", "48420", "48431"));
  EXPECT_EQ(s.pod_count(), 3u);  // fghij, klmno, pqrst

  Result<PodEvent> gone = DecodePodEvent(Fixture("watch_error_410.json"));
  ASSERT_TRUE(gone.ok());
  Status st = s.ApplyPodEvent(*gone);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "pods watch: ERROR 410 Expired: too old resource version: 48211 (48950) "
            "(resourceVersion expired: relist)");
  EXPECT_TRUE(s.pods_relist_needed());
  EXPECT_THAT(Summary(s.endpoints()), ElementsAre(pqrst));  // kept until the relist
  EXPECT_FALSE(s.endpoints_changed());
}

TEST_F(PoolWatchStateTest, ListGivesOneEndpointPerReadyPod) {
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a", "10.0.0.2:8000 b"));
  EXPECT_FALSE(state_.endpoints_changed());
}

TEST_F(PoolWatchStateTest, PodBecomesNotReadyThenReadyAgain) {
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified,
                                         MakePod("a", "10.0.0.1", false), "101")).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.2:8000 b"));
  EXPECT_TRUE(state_.endpoints_changed());
  state_.TakeEndpoints();
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified,
                                         MakePod("a", "10.0.0.1", true), "102")).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a", "10.0.0.2:8000 b"));
  EXPECT_TRUE(state_.endpoints_changed());
  EXPECT_EQ(state_.pods_resource_version(), "102");
}

TEST_F(PoolWatchStateTest, ModifiedWithoutEndpointChangeIsNotAChange) {
  Pod a = MakePod("a", "10.0.0.1", true);
  a.phase = "Running";  // something discovery does not look at
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified, a, "101")).ok());
  EXPECT_FALSE(state_.endpoints_changed());
  EXPECT_EQ(state_.pods_resource_version(), "101");
}

TEST_F(PoolWatchStateTest, Deleted) {
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kDeleted,
                                         MakePod("b", "10.0.0.2", true), "101")).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a"));
  EXPECT_EQ(state_.pod_count(), 1u);
  EXPECT_TRUE(state_.endpoints_changed());
  state_.TakeEndpoints();
  // Deleting a pod never seen is nothing.
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kDeleted,
                                         MakePod("zz", "10.0.0.9", true), "102")).ok());
  EXPECT_FALSE(state_.endpoints_changed());
  EXPECT_EQ(state_.pods_resource_version(), "102");
}

TEST_F(PoolWatchStateTest, DeletionTimestampRemovesAtOnce) {
  Pod a = MakePod("a", "10.0.0.1", true);  // still Ready: terminating, not yet NotReady
  a.meta.being_deleted = true;
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified, a, "101")).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.2:8000 b"));
  EXPECT_TRUE(state_.endpoints_changed());
}

TEST_F(PoolWatchStateTest, IpChange) {
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified,
                                         MakePod("a", "10.0.0.7", true), "101")).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.7:8000 a", "10.0.0.2:8000 b"));
  EXPECT_TRUE(state_.endpoints_changed());
  state_.TakeEndpoints();
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified,
                                         MakePod("a", "", true), "102")).ok());  // IP gone
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.2:8000 b"));
}

TEST_F(PoolWatchStateTest, LabelChangeReachesEndpointLabels) {
  ASSERT_TRUE(state_.ApplyPodEvent(
                        Event(WatchEventType::kModified,
                              MakePod("a", "10.0.0.1", true,
                                      {{"app", "vllm"}, {"topology.kubernetes.io/zone", "z1"}}),
                              "101"))
                  .ok());
  EXPECT_TRUE(state_.endpoints_changed());
  EXPECT_THAT(state_.endpoints()[0].labels,
              ElementsAre(Pair("app", "vllm"), Pair("topology.kubernetes.io/zone", "z1")));
}

TEST_F(PoolWatchStateTest, PodNoLongerMatchingSelectorLeaves) {
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified,
                                         MakePod("a", "10.0.0.1", true, {{"app", "other"}}),
                                         "101")).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.2:8000 b"));
}

TEST_F(PoolWatchStateTest, SelectorChange) {
  PodList list;
  list.resource_version = "200";
  list.items = {MakePod("a", "10.0.0.1", true, {{"app", "vllm"}, {"tier", "gold"}}),
                MakePod("b", "10.0.0.2", true)};
  state_.ApplyPodList(list);
  state_.TakeEndpoints();
  state_.ApplyPool(Pool({{"app", "vllm"}, {"tier", "gold"}}, {8000}, "2"));
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a"));  // b leaves at once
  EXPECT_TRUE(state_.endpoints_changed());
  EXPECT_TRUE(state_.pods_relist_needed());  // pods matching only the new one are unknown
  EXPECT_EQ(state_.PodLabelSelector(), "app=vllm,tier=gold");
  EXPECT_EQ(state_.pool_resource_version(), "2");
}

TEST_F(PoolWatchStateTest, SamePoolAgainIsNotAChange) {
  state_.ApplyPool(Pool({{"app", "vllm"}}, {8000}, "5"));
  EXPECT_FALSE(state_.endpoints_changed());
  EXPECT_FALSE(state_.pods_relist_needed());
  EXPECT_EQ(state_.pool_resource_version(), "5");
}

TEST_F(PoolWatchStateTest, TargetPortsChangeToTwoPortsPerPod) {
  PoolEvent ev;
  ev.type = WatchEventType::kModified;
  ev.pool = Pool({{"app", "vllm"}}, {8001, 8000}, "3");
  ASSERT_TRUE(state_.ApplyPoolEvent(ev).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8001 a:8001", "10.0.0.1:8000 a:8000",
                                       "10.0.0.2:8001 b:8001", "10.0.0.2:8000 b:8000"));
  EXPECT_TRUE(state_.endpoints_changed());
  EXPECT_FALSE(state_.pods_relist_needed());  // same selector: the pods known still hold
  EXPECT_FALSE(state_.pool_relist_needed());
  EXPECT_EQ(state_.pool_resource_version(), "3");
  const routing::EndpointSpec& e = state_.endpoints()[1];
  EXPECT_EQ(e.host, "10.0.0.1");
  EXPECT_EQ(e.port, 8000);
  EXPECT_THAT(e.labels, ElementsAre(Pair("app", "vllm")));
}

// Data-parallel engines: one endpoint per pod and target port, narrowed by the pod's
// active-ports annotation; a change of the annotation moves the endpoints.
TEST_F(PoolWatchStateTest, ActivePortsNarrowAPodsEndpoints) {
  PoolEvent ev;
  ev.type = WatchEventType::kModified;
  ev.pool = Pool({{"app", "vllm"}}, {8000, 8001, 8002}, "3");
  ASSERT_TRUE(state_.ApplyPoolEvent(ev).ok());
  Pod a = MakePod("a", "10.0.0.1", true);
  a.active_ports = std::vector<uint16_t>{8002, 8000, 9000};  // 9000 is no target port
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified, a, "101")).ok());
  Pod b = MakePod("b", "10.0.0.2", true);
  b.active_ports = std::vector<uint16_t>{};  // declares none active
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified, b, "102")).ok());
  Pod c = MakePod("c", "10.0.0.3", true);  // no annotation: every target port
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kAdded, c, "103")).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a:8000", "10.0.0.1:8002 a:8002", "10.0.0.3:8000 c:8000",
                                       "10.0.0.3:8001 c:8001", "10.0.0.3:8002 c:8002"));
  // Rank 1 of a comes up.
  a.active_ports->push_back(8001);
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kModified, a, "104")).ok());
  EXPECT_TRUE(state_.endpoints_changed());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a:8000", "10.0.0.1:8001 a:8001", "10.0.0.1:8002 a:8002",
                                       "10.0.0.3:8000 c:8000", "10.0.0.3:8001 c:8001", "10.0.0.3:8002 c:8002"));
}

TEST_F(PoolWatchStateTest, PoolEventsForAnotherPoolAreIgnored) {
  PoolEvent ev;
  ev.type = WatchEventType::kModified;
  ev.pool = Pool({{"app", "other"}}, {9000}, "3");
  ev.pool.meta.name = "someone-elses";
  ASSERT_TRUE(state_.ApplyPoolEvent(ev).ok());
  EXPECT_FALSE(state_.endpoints_changed());
  EXPECT_EQ(state_.pool_resource_version(), "1");
}

TEST_F(PoolWatchStateTest, PoolDeletedThenCreated) {
  PoolEvent del;
  del.type = WatchEventType::kDeleted;
  del.pool = Pool({{"app", "vllm"}}, {8000}, "4");
  ASSERT_TRUE(state_.ApplyPoolEvent(del).ok());
  EXPECT_TRUE(state_.endpoints().empty());
  EXPECT_TRUE(state_.endpoints_changed());
  EXPECT_FALSE(state_.pool().has_value());
  EXPECT_TRUE(state_.pool_relist_needed());
  EXPECT_TRUE(state_.pods_relist_needed());
  EXPECT_EQ(state_.pod_count(), 0u);
  EXPECT_EQ(state_.PodLabelSelector(), "");
  state_.TakeEndpoints();

  state_.ApplyPool(Pool({{"app", "vllm"}}, {8000}, "9"));
  EXPECT_FALSE(state_.pool_relist_needed());
  EXPECT_TRUE(state_.pods_relist_needed());
  EXPECT_TRUE(state_.endpoints().empty());  // until the pods are listed again
  PodList list;
  list.resource_version = "300";
  list.items = {MakePod("c", "10.0.0.3", true)};
  state_.ApplyPodList(list);
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.3:8000 c"));
  EXPECT_TRUE(state_.endpoints_changed());
}

TEST(PoolWatchStateList, ListWithoutThePoolWatchesFromTheListsVersion) {
  PoolWatchState s("pool");
  s.ApplyPoolList(std::nullopt, "40");
  EXPECT_FALSE(s.pool().has_value());
  EXPECT_FALSE(s.pool_relist_needed());  // its creation comes on the watch, from 40
  EXPECT_EQ(s.pool_resource_version(), "40");
  EXPECT_TRUE(s.pods_relist_needed());
  EXPECT_EQ(s.PodLabelSelector(), "");  // nothing to list pods with
  EXPECT_TRUE(s.endpoints().empty());
  EXPECT_TRUE(s.endpoints_changed());  // the first take, even empty

  s.ApplyPoolList(Pool({{"app", "vllm"}}, {8000}, "12"), "41");
  ASSERT_TRUE(s.pool().has_value());
  EXPECT_EQ(s.pool_resource_version(), "41");  // the list's, not the object's
  EXPECT_FALSE(s.pool_relist_needed());
  EXPECT_TRUE(s.pods_relist_needed());
  EXPECT_EQ(s.PodLabelSelector(), "app=vllm");
}

TEST_F(PoolWatchStateTest, ListWithoutThePoolDropsItsPods) {
  state_.ApplyPoolList(std::nullopt, "500");
  EXPECT_FALSE(state_.pool().has_value());
  EXPECT_TRUE(state_.endpoints().empty());
  EXPECT_TRUE(state_.endpoints_changed());
  EXPECT_EQ(state_.pod_count(), 0u);
  EXPECT_FALSE(state_.pool_relist_needed());
  EXPECT_TRUE(state_.pods_relist_needed());
}

TEST_F(PoolWatchStateTest, PoolMissingAtStart) {
  PoolWatchState s("pool");
  s.ApplyPoolMissing();
  EXPECT_TRUE(s.pool_relist_needed());
  EXPECT_TRUE(s.endpoints().empty());
}

TEST_F(PoolWatchStateTest, BookmarksAdvanceTheResourceVersionOnly) {
  PodEvent pb;
  pb.type = WatchEventType::kBookmark;
  pb.pod.meta.resource_version = "150";
  ASSERT_TRUE(state_.ApplyPodEvent(pb).ok());
  EXPECT_EQ(state_.pods_resource_version(), "150");
  EXPECT_EQ(state_.pod_count(), 2u);
  EXPECT_FALSE(state_.endpoints_changed());
  PoolEvent qb;
  qb.type = WatchEventType::kBookmark;
  qb.pool.meta.resource_version = "77";
  ASSERT_TRUE(state_.ApplyPoolEvent(qb).ok());
  EXPECT_EQ(state_.pool_resource_version(), "77");
  EXPECT_TRUE(state_.pool().has_value());
}

TEST_F(PoolWatchStateTest, Error410OnPoolWatch) {
  PoolEvent e;
  e.type = WatchEventType::kError;
  e.status = {410, "Gone", "too old"};
  Status st = state_.ApplyPoolEvent(e);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(state_.pool_relist_needed());
  EXPECT_FALSE(state_.pods_relist_needed());
  EXPECT_TRUE(state_.pool().has_value());  // kept until the GET answers
}

TEST_F(PoolWatchStateTest, OtherErrorsDoNotAskForARelist) {
  PodEvent e;
  e.type = WatchEventType::kError;
  e.status = {500, "InternalError", "etcdserver: request timed out"};
  Status st = state_.ApplyPodEvent(e);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "pods watch: ERROR 500 InternalError: etcdserver: request timed out");
  EXPECT_FALSE(state_.pods_relist_needed());
  EXPECT_EQ(state_.pods_resource_version(), "100");
  EXPECT_FALSE(state_.endpoints_changed());
}

TEST_F(PoolWatchStateTest, RelistReplacesEveryPod) {
  PodEvent e;
  e.type = WatchEventType::kError;
  e.status = {410, "Expired", ""};
  EXPECT_FALSE(state_.ApplyPodEvent(e).ok());
  ASSERT_TRUE(state_.pods_relist_needed());
  PodList list;  // b went away while the watch was down; c came
  list.resource_version = "500";
  list.items = {MakePod("a", "10.0.0.1", true), MakePod("c", "10.0.0.3", true)};
  state_.ApplyPodList(list);
  EXPECT_FALSE(state_.pods_relist_needed());
  EXPECT_EQ(state_.pods_resource_version(), "500");
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a", "10.0.0.3:8000 c"));
}

TEST_F(PoolWatchStateTest, SharedIpGivesOneEndpoint) {
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kAdded,
                                         MakePod("c", "10.0.0.1", true), "101")).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a", "10.0.0.2:8000 b"));
}

TEST_F(PoolWatchStateTest, Ipv6AddressIsBracketed) {
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kAdded,
                                         MakePod("c", "fd00::5", true), "101")).ok());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a", "10.0.0.2:8000 b", "[fd00::5]:8000 c"));
  EXPECT_EQ(state_.endpoints()[2].host, "fd00::5");
}

TEST(PoolWatchState, V1Alpha2Pool) {
  PoolWatchState s("vllm-llama");
  Result<InferencePool> pool = DecodeInferencePool(Fixture("pool_v1alpha2.json"));
  ASSERT_TRUE(pool.ok());
  s.ApplyPool(*pool);
  Result<PodList> list = DecodePodList(Fixture("podlist.json"));
  ASSERT_TRUE(list.ok());
  s.ApplyPodList(*list);
  EXPECT_THAT(Summary(s.endpoints()), ElementsAre("10.8.1.23:8000 vllm-llama-7d9c8b6f4-abcde"));
}

TEST(PoolWatchState, PoolWatchFixture) {
  PoolWatchState s("vllm-llama");
  Result<InferencePool> pool = DecodeInferencePool(Fixture("pool_v1.json"));
  ASSERT_TRUE(pool.ok());
  s.ApplyPool(*pool);
  Result<PodList> list = DecodePodList(Fixture("podlist.json"));
  ASSERT_TRUE(list.ok());
  s.ApplyPodList(*list);
  const std::vector<std::string> lines = Lines(Fixture("pool_watch.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  Result<PoolEvent> two_ports = DecodePoolEvent(lines[0]);
  ASSERT_TRUE(two_ports.ok());
  ASSERT_TRUE(s.ApplyPoolEvent(*two_ports).ok());
  EXPECT_THAT(Summary(s.endpoints()),
              ElementsAre("10.8.1.23:8000 vllm-llama-7d9c8b6f4-abcde:8000",
                          "10.8.1.23:8001 vllm-llama-7d9c8b6f4-abcde:8001"));
  Result<PoolEvent> bookmark = DecodePoolEvent(lines[1]);
  ASSERT_TRUE(bookmark.ok());
  ASSERT_TRUE(s.ApplyPoolEvent(*bookmark).ok());
  EXPECT_EQ(s.pool_resource_version(), "47200");
  Result<PoolEvent> deleted = DecodePoolEvent(lines[2]);
  ASSERT_TRUE(deleted.ok());
  ASSERT_TRUE(s.ApplyPoolEvent(*deleted).ok());
  EXPECT_TRUE(s.endpoints().empty());
  EXPECT_TRUE(s.pool_relist_needed());
}

TEST(MatchesSelector, EveryKeyEqual) {
  const Labels pod = {{"app", "vllm"}, {"tier", "gold"}, {"zone", "a"}};
  EXPECT_TRUE(MatchesSelector({{"app", "vllm"}}, pod));
  EXPECT_TRUE(MatchesSelector({{"app", "vllm"}, {"zone", "a"}}, pod));
  EXPECT_FALSE(MatchesSelector({{"app", "vllm"}, {"zone", "b"}}, pod));
  EXPECT_FALSE(MatchesSelector({{"missing", "x"}}, pod));
  EXPECT_FALSE(MatchesSelector({{"app", "vllm"}}, {}));
  EXPECT_TRUE(MatchesSelector({}, pod));  // the decoder refuses an empty pool selector
}

using Op = SelectorRequirement::Op;

SelectorRequirement Req(std::string key, Op op, std::vector<std::string> values = {}) {
  SelectorRequirement r;
  r.key = std::move(key);
  r.op = op;
  r.values = std::move(values);
  return r;
}

PoolEvent PoolModified(InferencePool pool) {
  PoolEvent e;
  e.type = WatchEventType::kModified;
  e.pool = std::move(pool);
  return e;
}

TEST(Matches, EachOperator) {
  const Labels pod = {{"app", "vllm"}, {"tier", "gold"}, {"zone", "a"}};
  const Labels bare = {{"app", "vllm"}};
  // In: present and one of the values.
  EXPECT_TRUE(Matches(Req("zone", Op::kIn, {"a", "b"}), pod));
  EXPECT_FALSE(Matches(Req("zone", Op::kIn, {"b", "c"}), pod));
  EXPECT_FALSE(Matches(Req("zone", Op::kIn, {"a"}), bare));  // absent never matches In
  // NotIn: absent, or none of the values.
  EXPECT_TRUE(Matches(Req("zone", Op::kNotIn, {"b", "c"}), pod));
  EXPECT_FALSE(Matches(Req("zone", Op::kNotIn, {"a", "b"}), pod));
  EXPECT_TRUE(Matches(Req("zone", Op::kNotIn, {"a"}), bare));
  // Exists / DoesNotExist: the key only, whatever its value (even "").
  EXPECT_TRUE(Matches(Req("tier", Op::kExists), pod));
  EXPECT_FALSE(Matches(Req("tier", Op::kExists), bare));
  EXPECT_TRUE(Matches(Req("empty", Op::kExists), {{"empty", ""}}));
  EXPECT_FALSE(Matches(Req("tier", Op::kDoesNotExist), pod));
  EXPECT_TRUE(Matches(Req("tier", Op::kDoesNotExist), bare));
  EXPECT_TRUE(Matches(Req("tier", Op::kDoesNotExist), {}));
  // A key prefix is not the key.
  EXPECT_FALSE(Matches(Req("zon", Op::kExists), pod));
  EXPECT_FALSE(Matches(Req("zone2", Op::kExists), pod));
}

TEST(Matches, PoolAndsLabelsAndExpressions) {
  InferencePool pool = Pool({{"app", "vllm"}}, {8000});
  pool.selector_expressions = {Req("zone", Op::kIn, {"a", "b"}), Req("canary", Op::kDoesNotExist)};
  EXPECT_TRUE(Matches(pool, {{"app", "vllm"}, {"zone", "a"}}));
  EXPECT_FALSE(Matches(pool, {{"app", "other"}, {"zone", "a"}}));          // matchLabels
  EXPECT_FALSE(Matches(pool, {{"app", "vllm"}, {"zone", "c"}}));           // In
  EXPECT_FALSE(Matches(pool, {{"app", "vllm"}}));                          // In, absent
  EXPECT_FALSE(Matches(pool, {{"app", "vllm"}, {"canary", "1"}, {"zone", "a"}}));  // DNE
  InferencePool only_expressions = Pool({}, {8000});
  only_expressions.selector_expressions = {Req("app", Op::kExists)};
  EXPECT_TRUE(Matches(only_expressions, {{"app", "anything"}}));
  EXPECT_FALSE(Matches(only_expressions, {{"other", "x"}}));
  EXPECT_TRUE(Matches(Pool({{"app", "vllm"}}, {8000}), {{"app", "vllm"}}));  // no expressions
}

TEST(PoolWatchState, ExpressionsFixtureEndToEnd) {
  PoolWatchState s("vllm-llama");
  Result<InferencePool> pool = DecodeInferencePool(Fixture("pool_v1_expressions.json"));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  s.ApplyPool(*pool);
  EXPECT_EQ(s.PodLabelSelector(),
            "app=vllm-llama,topology.kubernetes.io/zone in (us-east1-b,us-east1-c),"
            "!llm-d.ai/canary,pod-template-hash,tier notin (spot)");
  Result<PodList> list = DecodePodList(Fixture("podlist.json"));
  ASSERT_TRUE(list.ok());
  s.ApplyPodList(*list);
  // The fixture's one Ready pod is in us-east1-b, has a pod-template-hash, no canary label
  // and no tier.
  EXPECT_THAT(Summary(s.endpoints()), ElementsAre("10.8.1.23:8000 vllm-llama-7d9c8b6f4-abcde"));

  const Labels base = {{"app", "vllm-llama"},
                       {"pod-template-hash", "7d9c8b6f4"},
                       {"topology.kubernetes.io/zone", "us-east1-c"}};
  auto with = [&](std::string key, std::string value) {
    Labels l = base;
    l.emplace_back(std::move(key), std::move(value));
    std::sort(l.begin(), l.end());
    return l;
  };
  const std::vector<Pod> pods = {
      MakePod("p-canary", "10.8.4.1", true, with("llm-d.ai/canary", "true")),   // DoesNotExist
      MakePod("p-spot", "10.8.4.2", true, with("tier", "spot")),                // NotIn
      MakePod("p-gold", "10.8.4.3", true, with("tier", "gold")),                // selected
      MakePod("p-zone-d", "10.8.4.4", true,
              {{"app", "vllm-llama"}, {"pod-template-hash", "7d9c8b6f4"},
               {"topology.kubernetes.io/zone", "us-east1-d"}}),                 // In
      MakePod("p-no-hash", "10.8.4.5", true,
              {{"app", "vllm-llama"}, {"topology.kubernetes.io/zone", "us-east1-b"}}),  // Exists
  };
  int rv = 48300;
  for (const Pod& p : pods) {
    ASSERT_TRUE(s.ApplyPodEvent(Event(WatchEventType::kAdded, p, std::to_string(rv++))).ok());
  }
  EXPECT_THAT(Summary(s.endpoints()), ElementsAre("10.8.4.3:8000 p-gold",
                                                  "10.8.1.23:8000 vllm-llama-7d9c8b6f4-abcde"));
}

TEST(PoolWatchState, PodLabelSelectorRendering) {
  PoolWatchState s("pool");
  InferencePool pool = Pool({{"b", "2"}, {"a", "1"}}, {8000});
  std::sort(pool.selector.begin(), pool.selector.end());  // as the decoder leaves it
  pool.selector_expressions = {Req("z", Op::kExists), Req("m", Op::kNotIn, {"x", "y"}),
                               Req("c", Op::kIn, {"only"}), Req("d", Op::kDoesNotExist)};
  s.ApplyPool(pool);
  // matchLabels by key, then the expressions in the pool's order.
  EXPECT_EQ(s.PodLabelSelector(), "a=1,b=2,z,m notin (x,y),c in (only),!d");

  PoolWatchState only("pool");
  InferencePool e = Pool({}, {8000});
  e.selector_expressions = {Req("app", Op::kIn, {"v1", "v2", "v3"})};
  only.ApplyPool(e);
  EXPECT_EQ(only.PodLabelSelector(), "app in (v1,v2,v3)");

  PoolWatchState dne("pool");
  InferencePool d = Pool({}, {8000});
  d.selector_expressions = {Req("canary", Op::kDoesNotExist), Req("gpu", Op::kExists)};
  dne.ApplyPool(d);
  EXPECT_EQ(dne.PodLabelSelector(), "!canary,gpu");
}

TEST_F(PoolWatchStateTest, ExpressionChangeRelistsPodsAndFiltersAtOnce) {
  EXPECT_FALSE(state_.pods_relist_needed());
  ASSERT_TRUE(state_.ApplyPodEvent(Event(WatchEventType::kAdded,
                                         MakePod("c", "10.0.0.3", true,
                                                 {{"app", "vllm"}, {"canary", "1"}}),
                                         "101")).ok());
  state_.TakeEndpoints();
  ASSERT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a", "10.0.0.2:8000 b", "10.0.0.3:8000 c"));

  // Same matchLabels, one expression more: a different selector.
  InferencePool pool = Pool({{"app", "vllm"}}, {8000}, "2");
  pool.selector_expressions = {Req("canary", Op::kDoesNotExist)};
  ASSERT_TRUE(state_.ApplyPoolEvent(PoolModified(pool)).ok());
  EXPECT_TRUE(state_.pods_relist_needed());
  EXPECT_FALSE(state_.pool_relist_needed());
  EXPECT_EQ(state_.PodLabelSelector(), "app=vllm,!canary");
  EXPECT_TRUE(state_.endpoints_changed());
  EXPECT_THAT(Endpoints(), ElementsAre("10.0.0.1:8000 a", "10.0.0.2:8000 b"));

  // Relisted with the new selector; the same pool again changes nothing.
  PodList list;
  list.resource_version = "200";
  list.items = {MakePod("a", "10.0.0.1", true), MakePod("b", "10.0.0.2", true)};
  state_.ApplyPodList(list);
  EXPECT_FALSE(state_.pods_relist_needed());
  pool.meta.resource_version = "3";
  ASSERT_TRUE(state_.ApplyPoolEvent(PoolModified(pool)).ok());
  EXPECT_FALSE(state_.pods_relist_needed());

  // Only an expression's values move: a change too.
  pool.selector_expressions = {Req("canary", Op::kNotIn, {"1"})};
  state_.ApplyPool(pool);
  EXPECT_TRUE(state_.pods_relist_needed());
  EXPECT_EQ(state_.PodLabelSelector(), "app=vllm,canary notin (1)");
}

TEST(PoolWatchState, ValuesInAnotherOrderAreTheSameSelector) {
  // The decoder sorts values, so a rewrite that only reorders them is no selector change.
  const auto decode = [](const char* values) {
    Result<InferencePool> p = DecodeInferencePool(
        std::string(R"({"metadata":{"name":"pool"},"spec":{"selector":{"matchExpressions":)"
                    R"([{"key":"zone","operator":"In","values":)") +
        values + R"(}]},"targetPorts":[{"number":8000}]}})");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return *p;
  };
  PoolWatchState s("pool");
  s.ApplyPool(decode(R"(["b","a"])"));
  PodList list;
  list.items = {MakePod("a", "10.0.0.1", true, {{"zone", "a"}})};
  s.ApplyPodList(list);
  EXPECT_FALSE(s.pods_relist_needed());
  s.ApplyPool(decode(R"(["a","b","a"])"));
  EXPECT_FALSE(s.pods_relist_needed());
  EXPECT_EQ(s.PodLabelSelector(), "zone in (a,b)");
  EXPECT_THAT(Summary(s.endpoints()), ElementsAre("10.0.0.1:8000 a"));
  s.ApplyPool(decode(R"(["b"])"));
  EXPECT_TRUE(s.pods_relist_needed());
  EXPECT_TRUE(s.endpoints().empty());
}

}  // namespace
}  // namespace kvroute::k8s
