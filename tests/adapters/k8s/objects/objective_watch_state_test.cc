// ObjectiveWatchState: InferenceObjective list and watch results in, one pool's priority
// table out; MergePriorities over the three sources. Fed with decoded fixtures
// (testdata/objective_list.json, objective_watch.jsonl) and objectives built here.
#include "adapters/k8s/objects/objective_watch_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "adapters/k8s/objects/objects.h"

#include "testdata.h"

namespace kvroute::k8s {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

using testing::Fixture;
using testing::Lines;

InferenceObjective Objective(std::string name, int64_t priority, std::string pool_ref = "pool",
                             std::string rv = "") {
  InferenceObjective o;
  o.meta.name = std::move(name);
  o.meta.resource_version = std::move(rv);
  o.priority = priority;
  o.has_priority = true;
  o.pool_ref_name = std::move(pool_ref);
  return o;
}

ObjectiveEvent Event(WatchEventType type, InferenceObjective o, std::string rv) {
  ObjectiveEvent e;
  e.type = type;
  e.objective = std::move(o);
  e.objective.meta.resource_version = std::move(rv);
  return e;
}

ObjectiveEvent ErrorEvent(int64_t code, std::string reason, std::string message) {
  ObjectiveEvent e;
  e.type = WatchEventType::kError;
  e.status.code = code;
  e.status.reason = std::move(reason);
  e.status.message = std::move(message);
  return e;
}

// A state for pool "pool" that has listed {a: 1, b: 2} at resourceVersion 100, taken.
class ObjectiveWatchStateTest : public ::testing::Test {
 protected:
  ObjectiveWatchStateTest() : state_("pool") {
    ObjectiveList list;
    list.resource_version = "100";
    list.items = {Objective("a", 1), Objective("b", 2)};
    state_.ApplyList(list);
    state_.TakePriorities();
  }

  ObjectiveWatchState state_;
};

TEST(ObjectiveWatchState, StartsNeedingAListWithAnEmptyTable) {
  ObjectiveWatchState s("pool");
  EXPECT_EQ(s.pool_name(), "pool");
  EXPECT_TRUE(s.relist_needed());
  EXPECT_EQ(s.resource_version(), "");
  EXPECT_EQ(s.objective_count(), 0u);
  EXPECT_THAT(s.priorities(), IsEmpty());
  EXPECT_TRUE(s.changed());  // the first publication must happen
  EXPECT_THAT(s.TakePriorities(), IsEmpty());
  EXPECT_FALSE(s.changed());
}

TEST(ObjectiveWatchState, ListFixture) {
  Result<ObjectiveList> list = DecodeObjectiveList(Fixture("objective_list.json"));
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ObjectiveWatchState s("vllm-llama");
  s.ApplyList(*list);
  EXPECT_FALSE(s.relist_needed());
  EXPECT_EQ(s.resource_version(), "52100");
  EXPECT_EQ(s.objective_count(), 4u);
  // mistral-chat references pool mistral-7b: kept, but not in this pool's table.
  // default-traffic has no spec.priority: the API's default, 0.
  EXPECT_THAT(s.priorities(), ElementsAre(Pair("batch-summaries", -5),
                                          Pair("chat-interactive", 10),
                                          Pair("default-traffic", 0)));
  EXPECT_TRUE(s.changed());
}

TEST(ObjectiveWatchState, WatchFixtureAfterTheList) {
  Result<ObjectiveList> list = DecodeObjectiveList(Fixture("objective_list.json"));
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ObjectiveWatchState s("vllm-llama");
  s.ApplyList(*list);
  s.TakePriorities();
  const std::vector<std::string> lines = Lines(Fixture("objective_watch.jsonl"));
  ASSERT_EQ(lines.size(), 6u);
  std::vector<ObjectiveEvent> events;
  for (const std::string& line : lines) {
    Result<ObjectiveEvent> e = DecodeObjectiveEvent(line);
    ASSERT_TRUE(e.ok()) << line << ": " << e.status().ToString();
    events.push_back(*e);
  }

  // ADDED code-assist (20).
  ASSERT_TRUE(s.ApplyEvent(events[0]).ok());
  EXPECT_EQ(s.resource_version(), "52140");
  EXPECT_TRUE(s.changed());
  EXPECT_THAT(s.TakePriorities(),
              ElementsAre(Pair("batch-summaries", -5), Pair("chat-interactive", 10),
                          Pair("code-assist", 20), Pair("default-traffic", 0)));
  // MODIFIED chat-interactive: 10 -> 15.
  ASSERT_TRUE(s.ApplyEvent(events[1]).ok());
  EXPECT_EQ(s.resource_version(), "52161");
  EXPECT_TRUE(s.changed());
  EXPECT_THAT(s.TakePriorities(),
              ElementsAre(Pair("batch-summaries", -5), Pair("chat-interactive", 15),
                          Pair("code-assist", 20), Pair("default-traffic", 0)));
  // BOOKMARK: only the resourceVersion.
  ASSERT_TRUE(s.ApplyEvent(events[2]).ok());
  EXPECT_EQ(s.resource_version(), "52200");
  EXPECT_FALSE(s.changed());
  EXPECT_EQ(s.objective_count(), 5u);
  // MODIFIED batch-summaries now references mistral-7b: it leaves this pool's table.
  ASSERT_TRUE(s.ApplyEvent(events[3]).ok());
  EXPECT_EQ(s.resource_version(), "52230");
  EXPECT_TRUE(s.changed());
  EXPECT_THAT(s.TakePriorities(), ElementsAre(Pair("chat-interactive", 15),
                                              Pair("code-assist", 20),
                                              Pair("default-traffic", 0)));
  EXPECT_EQ(s.objective_count(), 5u);
  // DELETED default-traffic.
  ASSERT_TRUE(s.ApplyEvent(events[4]).ok());
  EXPECT_EQ(s.resource_version(), "52244");
  EXPECT_EQ(s.objective_count(), 4u);
  EXPECT_THAT(s.TakePriorities(),
              ElementsAre(Pair("chat-interactive", 15), Pair("code-assist", 20)));
  // ERROR 410: relist; nothing else moves.
  const Status gone = s.ApplyEvent(events[5]);
  EXPECT_EQ(gone.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(gone.message(), HasSubstr("410"));
  EXPECT_THAT(gone.message(), HasSubstr("too old resource version: 52100 (52600)"));
  EXPECT_TRUE(s.relist_needed());
  EXPECT_EQ(s.resource_version(), "52244");
  EXPECT_FALSE(s.changed());
  EXPECT_THAT(s.priorities(),
              ElementsAre(Pair("chat-interactive", 15), Pair("code-assist", 20)));
}

TEST_F(ObjectiveWatchStateTest, AddedAndModifiedUpsertByName) {
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kAdded, Objective("c", 3), "101")).ok());
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kModified, Objective("a", -7), "102")).ok());
  EXPECT_EQ(state_.resource_version(), "102");
  EXPECT_TRUE(state_.changed());
  EXPECT_THAT(state_.priorities(), ElementsAre(Pair("a", -7), Pair("b", 2), Pair("c", 3)));
  // MODIFIED of an unknown name inserts it (a watch may start after its ADDED).
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kModified, Objective("d", 4), "103")).ok());
  EXPECT_THAT(state_.priorities(),
              ElementsAre(Pair("a", -7), Pair("b", 2), Pair("c", 3), Pair("d", 4)));
  // ADDED of a known name replaces it.
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kAdded, Objective("d", 40), "104")).ok());
  EXPECT_EQ(state_.priorities().at("d"), 40);
  EXPECT_EQ(state_.objective_count(), 4u);
}

TEST_F(ObjectiveWatchStateTest, DeletedRemovesUnknownIsANoOp) {
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kDeleted, Objective("a", 1), "101")).ok());
  EXPECT_THAT(state_.TakePriorities(), ElementsAre(Pair("b", 2)));
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kDeleted, Objective("zz", 1), "102")).ok());
  EXPECT_FALSE(state_.changed());
  EXPECT_EQ(state_.resource_version(), "102");
  EXPECT_THAT(state_.priorities(), ElementsAre(Pair("b", 2)));
}

TEST_F(ObjectiveWatchStateTest, PoolRefToAnotherPoolIsIgnored) {
  ASSERT_TRUE(
      state_.ApplyEvent(Event(WatchEventType::kAdded, Objective("x", 50, "other"), "101")).ok());
  EXPECT_FALSE(state_.changed());
  EXPECT_THAT(state_.priorities(), ElementsAre(Pair("a", 1), Pair("b", 2)));
  EXPECT_EQ(state_.objective_count(), 3u);
  // Pointed at this pool later: it joins the table.
  ASSERT_TRUE(
      state_.ApplyEvent(Event(WatchEventType::kModified, Objective("x", 50, "pool"), "102")).ok());
  EXPECT_TRUE(state_.changed());
  EXPECT_THAT(state_.TakePriorities(), ElementsAre(Pair("a", 1), Pair("b", 2), Pair("x", 50)));
  // And away again (a is freed for another pool): it leaves.
  ASSERT_TRUE(
      state_.ApplyEvent(Event(WatchEventType::kModified, Objective("a", 1, "other"), "103")).ok());
  EXPECT_TRUE(state_.changed());
  EXPECT_THAT(state_.TakePriorities(), ElementsAre(Pair("b", 2), Pair("x", 50)));
}

TEST_F(ObjectiveWatchStateTest, NoPoolRefAppliesToThisPool) {
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kAdded, Objective("n", 9, ""), "101")).ok());
  EXPECT_THAT(state_.priorities(), ElementsAre(Pair("a", 1), Pair("b", 2), Pair("n", 9)));
}

TEST_F(ObjectiveWatchStateTest, NoPriorityIsZero) {
  InferenceObjective o = Objective("p", 0);
  o.has_priority = false;
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kAdded, o, "101")).ok());
  EXPECT_THAT(state_.priorities(), ElementsAre(Pair("a", 1), Pair("b", 2), Pair("p", 0)));
}

TEST_F(ObjectiveWatchStateTest, SamePriorityAgainIsNoChange) {
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kModified, Objective("a", 1), "101")).ok());
  EXPECT_FALSE(state_.changed());
  EXPECT_EQ(state_.resource_version(), "101");
}

TEST_F(ObjectiveWatchStateTest, BookmarkOnlyMovesTheResourceVersion) {
  ObjectiveEvent b;
  b.type = WatchEventType::kBookmark;
  b.objective.meta.resource_version = "150";
  ASSERT_TRUE(state_.ApplyEvent(b).ok());
  EXPECT_EQ(state_.resource_version(), "150");
  EXPECT_FALSE(state_.changed());
  EXPECT_THAT(state_.priorities(), ElementsAre(Pair("a", 1), Pair("b", 2)));
}

TEST_F(ObjectiveWatchStateTest, EventWithoutResourceVersionKeepsTheLast) {
  ASSERT_TRUE(state_.ApplyEvent(Event(WatchEventType::kAdded, Objective("c", 3), "")).ok());
  EXPECT_EQ(state_.resource_version(), "100");
  EXPECT_EQ(state_.priorities().at("c"), 3);
}

TEST_F(ObjectiveWatchStateTest, GoneNeedsARelistOtherErrorsDoNot) {
  const Status other = state_.ApplyEvent(ErrorEvent(500, "InternalError", "etcd timeout"));
  EXPECT_EQ(other.code(), StatusCode::kUnavailable);
  EXPECT_EQ(other.message(), "inferenceobjectives watch: ERROR 500 InternalError: etcd timeout");
  EXPECT_FALSE(state_.relist_needed());
  EXPECT_EQ(state_.resource_version(), "100");
  EXPECT_FALSE(state_.changed());

  const Status gone = state_.ApplyEvent(ErrorEvent(410, "Expired", "too old"));
  EXPECT_EQ(gone.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(gone.message(),
            "inferenceobjectives watch: ERROR 410 Expired: too old (resourceVersion expired: "
            "relist)");
  EXPECT_TRUE(state_.relist_needed());
  EXPECT_EQ(state_.resource_version(), "100");
  EXPECT_THAT(state_.priorities(), ElementsAre(Pair("a", 1), Pair("b", 2)));
  EXPECT_FALSE(state_.changed());
}

TEST_F(ObjectiveWatchStateTest, RelistReplacesEverything) {
  ASSERT_TRUE(state_.ApplyEvent(ErrorEvent(410, "Expired", "")).code() ==
              StatusCode::kFailedPrecondition);
  ObjectiveList list;
  list.resource_version = "300";
  list.items = {Objective("b", 2), Objective("c", 30)};
  state_.ApplyList(list);
  EXPECT_FALSE(state_.relist_needed());
  EXPECT_EQ(state_.resource_version(), "300");
  EXPECT_EQ(state_.objective_count(), 2u);
  EXPECT_TRUE(state_.changed());
  EXPECT_THAT(state_.TakePriorities(), ElementsAre(Pair("b", 2), Pair("c", 30)));
}

TEST_F(ObjectiveWatchStateTest, MissingCrdEmptiesTheTableAndKeepsRelisting) {
  state_.ApplyMissing();
  EXPECT_TRUE(state_.relist_needed());
  EXPECT_EQ(state_.resource_version(), "");
  EXPECT_EQ(state_.objective_count(), 0u);
  EXPECT_TRUE(state_.changed());
  EXPECT_THAT(state_.TakePriorities(), IsEmpty());
  // Still missing at the next try: nothing moves.
  state_.ApplyMissing();
  EXPECT_FALSE(state_.changed());
  EXPECT_TRUE(state_.relist_needed());
  // The CRD got installed: the list works again.
  ObjectiveList list;
  list.resource_version = "7";
  list.items = {Objective("a", 5)};
  state_.ApplyList(list);
  EXPECT_FALSE(state_.relist_needed());
  EXPECT_THAT(state_.TakePriorities(), ElementsAre(Pair("a", 5)));
}

TEST(ObjectiveWatchState, MissingBeforeAnyListStillPublishesOnce) {
  ObjectiveWatchState s("pool");
  s.ApplyMissing();
  EXPECT_TRUE(s.changed());
  EXPECT_TRUE(s.relist_needed());
  EXPECT_THAT(s.TakePriorities(), IsEmpty());
  EXPECT_FALSE(s.changed());
}

TEST(ObjectiveWatchState, LookupByStringView) {
  ObjectiveWatchState s("pool");
  ObjectiveList list;
  list.items = {Objective("chat", 3)};
  s.ApplyList(list);
  const std::string_view header = "chat";
  const auto it = s.priorities().find(header);
  ASSERT_NE(it, s.priorities().end());
  EXPECT_EQ(it->second, 3);
}

TEST(MergePriorities, LaterSourcesWin) {
  const ObjectivePriorities configured = {{"a", 1}, {"b", 2}, {"c", 3}};
  const ObjectivePriorities old_group = {{"b", 20}, {"d", 40}};
  const ObjectivePriorities llm_d = {{"c", 300}, {"d", 400}, {"e", 500}};
  EXPECT_THAT(MergePriorities(configured, old_group, llm_d),
              ElementsAre(Pair("a", 1), Pair("b", 20), Pair("c", 300), Pair("d", 400),
                          Pair("e", 500)));
  // llm-d.ai over the old group even when the configured table agrees with the old one.
  EXPECT_THAT(MergePriorities({{"x", 1}}, {{"x", 1}}, {{"x", -1}}), ElementsAre(Pair("x", -1)));
}

TEST(MergePriorities, EmptySources) {
  EXPECT_THAT(MergePriorities({}, {}, {}), IsEmpty());
  EXPECT_THAT(MergePriorities({{"a", 1}}, {}, {}), ElementsAre(Pair("a", 1)));
  EXPECT_THAT(MergePriorities({}, {{"a", 2}}, {}), ElementsAre(Pair("a", 2)));
  EXPECT_THAT(MergePriorities({}, {}, {{"a", 3}}), ElementsAre(Pair("a", 3)));
  EXPECT_THAT(MergePriorities({{"a", 1}}, {{"a", 2}}, {}), ElementsAre(Pair("a", 2)));
}

TEST(MergePriorities, FromTwoStates) {
  // The adapter's shape: one state per group, each for the same pool, merged with config.
  ObjectiveWatchState llm_d("pool");
  ObjectiveWatchState old_group("pool");
  ObjectiveList new_list;
  new_list.items = {Objective("chat", 10)};
  llm_d.ApplyList(new_list);
  ObjectiveList old_list;
  old_list.items = {Objective("chat", 1), Objective("batch", -1)};
  old_group.ApplyList(old_list);
  old_group.ApplyMissing();  // the old CRD was removed
  EXPECT_THAT(MergePriorities({{"batch", -3}}, old_group.priorities(), llm_d.priorities()),
              ElementsAre(Pair("batch", -3), Pair("chat", 10)));
}

}  // namespace
}  // namespace kvroute::k8s
