// Decoding the Kubernetes API's JSON: fixtures in testdata/ are written in the API's own
// shape (a PodList as kubectl get -o json shows it, watch lines, both InferencePool
// versions and a v1 one with matchExpressions, InferenceObjectives one and listed, a 410
// Status). No cluster runs here.
#include "adapters/k8s/objects/objects.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "testdata.h"

namespace kvroute::k8s {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

using testing::Fixture;
using testing::Lines;

TEST(DecodePodList, RealShape) {
  Result<PodList> list = DecodePodList(Fixture("podlist.json"));
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->resource_version, "48211");
  ASSERT_EQ(list->items.size(), 3u);

  const Pod& a = list->items[0];
  EXPECT_EQ(a.meta.name, "vllm-llama-7d9c8b6f4-abcde");
  EXPECT_EQ(a.meta.namespace_name, "inference");
  EXPECT_EQ(a.meta.resource_version, "48190");
  EXPECT_FALSE(a.meta.being_deleted);
  EXPECT_THAT(a.meta.labels,
              ElementsAre(Pair("app", "vllm-llama"), Pair("pod-template-hash", "7d9c8b6f4"),
                          Pair("topology.kubernetes.io/region", "us-east1"),
                          Pair("topology.kubernetes.io/zone", "us-east1-b")));
  EXPECT_EQ(a.ip, "10.8.1.23");
  EXPECT_TRUE(a.ready);
  EXPECT_EQ(a.phase, "Running");

  const Pod& b = list->items[1];
  EXPECT_EQ(b.meta.name, "vllm-llama-7d9c8b6f4-fghij");
  EXPECT_EQ(b.ip, "10.8.2.7");
  EXPECT_FALSE(b.ready);  // Ready: "False"

  const Pod& c = list->items[2];
  EXPECT_EQ(c.ip, "");  // not scheduled an IP yet
  EXPECT_FALSE(c.ready);  // no Ready condition at all
  EXPECT_EQ(c.phase, "Pending");
}

TEST(DecodePodList, EmptyAndNullItems) {
  Result<PodList> empty =
      DecodePodList(R"({"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[]})");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->resource_version, "7");
  EXPECT_TRUE(empty->items.empty());
  Result<PodList> null_items = DecodePodList(R"({"metadata":{"resourceVersion":"8"},"items":null})");
  ASSERT_TRUE(null_items.ok());
  EXPECT_TRUE(null_items->items.empty());
}

// Data-parallel ranks: llm-d.ai/active-ports (else the older key) names the ports served;
// entries that are no port are left out; without either annotation, nullopt (all ports).
TEST(DecodePodList, ActivePortsAnnotation) {
  Result<PodList> list = DecodePodList(R"({"items":[
      {"metadata":{"name":"a","annotations":{"llm-d.ai/active-ports":"8000, 8002"}}},
      {"metadata":{"name":"b","annotations":{"inference.networking.k8s.io/active-ports":"8001"}}},
      {"metadata":{"name":"c","annotations":{"inference.networking.k8s.io/active-ports":"8001",
                                             "llm-d.ai/active-ports":"8003"}}},
      {"metadata":{"name":"d","annotations":{"llm-d.ai/active-ports":"x,0,70000,8004,"}}},
      {"metadata":{"name":"e","annotations":{"other":"1"}}},
      {"metadata":{"name":"f"}}]})");
  ASSERT_TRUE(list.ok()) << list.status().message();
  ASSERT_EQ(list->items.size(), 6u);
  EXPECT_THAT(list->items[0].active_ports.value(), ElementsAre(8000, 8002));
  EXPECT_THAT(list->items[1].active_ports.value(), ElementsAre(8001));
  EXPECT_THAT(list->items[2].active_ports.value(), ElementsAre(8003));
  EXPECT_THAT(list->items[3].active_ports.value(), ElementsAre(8004));
  EXPECT_FALSE(list->items[4].active_ports.has_value());
  EXPECT_FALSE(list->items[5].active_ports.has_value());
  Result<PodList> bad = DecodePodList(R"({"items":[{"metadata":{"name":"a","annotations":{"llm-d.ai/active-ports":8000}}}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "items[0].metadata.annotations.llm-d.ai/active-ports: not a string");
}

TEST(DecodePodList, ABadItemRejectsTheList) {
  Result<PodList> list = DecodePodList(
      R"({"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b","labels":{"app":7}}}]})");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(list.status().message(), "items[1].metadata.labels.app: not a string");
}

TEST(DecodePodList, Malformed) {
  for (const char* bad : {"", "{", "[]", "null", "{\"items\":{}}", "{\"items\":[1]}",
                          "{\"items\":[{}]}", "{\"metadata\":[]}",
                          "{\"items\":[{\"metadata\":{\"name\":\"a\"},\"status\":"
                          "{\"conditions\":[\"Ready\"]}}]}"}) {
    Result<PodList> list = DecodePodList(bad);
    EXPECT_FALSE(list.ok()) << bad;
    EXPECT_FALSE(list.status().message().empty()) << bad;
  }
  EXPECT_EQ(DecodePodList("{\"items\":[{}]}").status().message(), "items[0].metadata: missing");
  EXPECT_EQ(DecodePodList("[]").status().message(), "pod list: not an object");
  EXPECT_THAT(DecodePodList("{").status().message(), HasSubstr("not valid JSON"));
}

TEST(DecodePod, DeletionTimestampNullIsNotDeleting) {
  Result<Pod> live = DecodePod(R"({"metadata":{"name":"p","deletionTimestamp":null}})");
  ASSERT_TRUE(live.ok());
  EXPECT_FALSE(live->meta.being_deleted);
  Result<Pod> going =
      DecodePod(R"({"metadata":{"name":"p","deletionTimestamp":"2026-12-01T10:02:11Z"}})");
  ASSERT_TRUE(going.ok());
  EXPECT_TRUE(going->meta.being_deleted);
}

TEST(DecodePod, UnknownFieldsIgnored) {
  Result<Pod> pod = DecodePod(R"({
    "kind":"Pod","apiVersion":"v1","futureField":{"deep":[1,2,{"x":null}]},
    "metadata":{"name":"p","managedFields":[{"manager":"kubelet"}],"newMeta":true},
    "spec":{"whatever":1},
    "status":{"podIP":"10.0.0.1","qosClass":"Guaranteed","resize":"InProgress",
              "conditions":[{"type":"Ready","status":"True","observedGeneration":4}]}})");
  ASSERT_TRUE(pod.ok()) << pod.status().ToString();
  EXPECT_EQ(pod->meta.name, "p");
  EXPECT_EQ(pod->ip, "10.0.0.1");
  EXPECT_TRUE(pod->ready);
}

TEST(DecodePod, ReadyUnknownIsNotReady) {
  Result<Pod> pod = DecodePod(
      R"({"metadata":{"name":"p"},"status":{"conditions":[{"type":"Ready","status":"Unknown"}]}})");
  ASSERT_TRUE(pod.ok());
  EXPECT_FALSE(pod->ready);
}

TEST(DecodeInferencePool, V1) {
  Result<InferencePool> pool = DecodeInferencePool(Fixture("pool_v1.json"));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(pool->api_version, PoolApiVersion::kV1);
  EXPECT_EQ(pool->meta.name, "vllm-llama");
  EXPECT_EQ(pool->meta.namespace_name, "inference");
  EXPECT_EQ(pool->meta.resource_version, "47001");
  EXPECT_THAT(pool->selector, ElementsAre(Pair("app", "vllm-llama")));
  EXPECT_THAT(pool->target_ports, ElementsAre(8000));
  EXPECT_EQ(pool->picker_name, "kvroute-epp");
  EXPECT_EQ(pool->picker_port, 9002);
  EXPECT_EQ(pool->failure_mode, "FailClose");
}

TEST(DecodeInferencePool, V1Alpha2) {
  Result<InferencePool> pool = DecodeInferencePool(Fixture("pool_v1alpha2.json"));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(pool->api_version, PoolApiVersion::kV1Alpha2);
  EXPECT_EQ(pool->meta.resource_version, "31337");
  EXPECT_THAT(pool->selector, ElementsAre(Pair("app", "vllm-llama")));
  EXPECT_THAT(pool->target_ports, ElementsAre(8000));
  EXPECT_EQ(pool->picker_name, "vllm-llama-epp");
  EXPECT_EQ(pool->picker_port, 9002);
  EXPECT_EQ(pool->failure_mode, "FailOpen");
}

TEST(DecodeInferencePool, V1SeveralPortsKeepTheirOrder) {
  Result<InferencePool> pool = DecodeInferencePool(
      R"({"apiVersion":"inference.networking.k8s.io/v1","metadata":{"name":"p"},
          "spec":{"selector":{"matchLabels":{"b":"2","a":"1"}},
                  "targetPorts":[{"number":8002},{"number":8000},{"number":8001}]}})");
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_THAT(pool->target_ports, ElementsAre(8002, 8000, 8001));
  EXPECT_THAT(pool->selector, ElementsAre(Pair("a", "1"), Pair("b", "2")));  // key order
  EXPECT_EQ(pool->picker_name, "");
  EXPECT_EQ(pool->picker_port, 0);
}

TEST(DecodeInferencePool, VersionFromShapeWhenApiVersionAbsent) {
  Result<InferencePool> alpha = DecodeInferencePool(
      R"({"metadata":{"name":"p"},"spec":{"selector":{"app":"x"},"targetPortNumber":8000}})");
  ASSERT_TRUE(alpha.ok()) << alpha.status().ToString();
  EXPECT_EQ(alpha->api_version, PoolApiVersion::kV1Alpha2);
  Result<InferencePool> v1 = DecodeInferencePool(
      R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"app":"x"}},
          "targetPorts":[{"number":8000}]}})");
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_EQ(v1->api_version, PoolApiVersion::kV1);
}

TEST(DecodeInferencePool, Errors) {
  struct Case {
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {R"({"apiVersion":"inference.networking.k8s.io/v9","metadata":{"name":"p"},"spec":{}})",
       "apiVersion: unknown InferencePool version \"inference.networking.k8s.io/v9\" (want "
       "inference.networking.k8s.io/v1 or inference.networking.x-k8s.io/v1alpha2)"},
      {R"({"metadata":{"name":"p"}})", "spec: missing"},
      {R"({"spec":{}})", "metadata: missing"},
      {R"({"metadata":{"name":"p"},"spec":{"targetPorts":[{"number":1}]}})",
       "spec.selector: missing"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"app":"x"},"targetPorts":[{"number":1}]}})",
       "spec.selector: no matchLabels or matchExpressions"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{}},"targetPorts":[{"number":1}]}})",
       "spec.selector: selects nothing (no labels)"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[]}})",
       "spec.targetPorts: empty"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}}}})",
       "spec.targetPorts: missing"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":0}]}})",
       "spec.targetPorts[0].number: not a port (1..65535)"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":65536}]}})",
       "spec.targetPorts[0].number: not a port (1..65535)"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":"8000"}]}})",
       "spec.targetPorts[0].number: not an integer"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":8000},{"number":8000}]}})",
       "spec.targetPorts[1].number: repeated port 8000"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{}]}})",
       "spec.targetPorts[0].number: missing"},
      {R"({"apiVersion":"inference.networking.x-k8s.io/v1alpha2","metadata":{"name":"p"},"spec":{"selector":{"a":"b"}}})",
       "spec.targetPortNumber: missing"},
      {R"({"apiVersion":"inference.networking.x-k8s.io/v1alpha2","metadata":{"name":"p"},"spec":{"selector":{"a":"b"},"targetPortNumber":-1}})",
       "spec.targetPortNumber: not a port (1..65535)"},
      {R"({"apiVersion":"inference.networking.x-k8s.io/v1alpha2","metadata":{"name":"p"},"spec":{"selector":{"a":{"b":"c"}},"targetPortNumber":8000}})",
       "spec.selector.a: not a string"},
      {R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":1}],"endpointPickerRef":{"port":{"number":99999}}}})",
       "spec.endpointPickerRef.port.number: not a port (1..65535)"},
      {R"({"metadata":{"name":"p","labels":{"a":"1","a":"2"}},"spec":{}})",
       "metadata.labels.a: repeated key"},
  };
  for (const Case& c : cases) {
    Result<InferencePool> pool = DecodeInferencePool(c.json);
    ASSERT_FALSE(pool.ok()) << c.json;
    EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_EQ(pool.status().message(), c.message) << c.json;
  }
}

TEST(DecodeStatus, NotFound) {
  Result<ApiStatus> s = DecodeStatus(
      R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
          "message":"inferencepools.inference.networking.k8s.io \"vllm-llama\" not found",
          "reason":"NotFound","details":{"name":"vllm-llama"},"code":404})");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->code, 404);
  EXPECT_EQ(s->reason, "NotFound");
  EXPECT_FALSE(s->gone());
}

TEST(DecodePodEvent, FixtureLines) {
  const std::vector<std::string> lines = Lines(Fixture("pod_watch.jsonl"));
  ASSERT_EQ(lines.size(), 5u);
  std::vector<PodEvent> events;
  for (const std::string& line : lines) {
    Result<PodEvent> e = DecodePodEvent(line);
    ASSERT_TRUE(e.ok()) << line << ": " << e.status().ToString();
    events.push_back(*e);
  }
  EXPECT_EQ(events[0].type, WatchEventType::kAdded);
  EXPECT_EQ(events[0].pod.meta.name, "vllm-llama-7d9c8b6f4-pqrst");
  EXPECT_FALSE(events[0].pod.ready);
  EXPECT_EQ(events[0].pod.ip, "");
  EXPECT_EQ(events[1].type, WatchEventType::kModified);
  EXPECT_TRUE(events[1].pod.ready);
  EXPECT_EQ(events[1].pod.ip, "10.8.3.4");
  EXPECT_EQ(events[1].pod.meta.resource_version, "48310");
  EXPECT_EQ(events[2].type, WatchEventType::kBookmark);
  EXPECT_EQ(events[2].pod.meta.resource_version, "48400");
  EXPECT_EQ(events[2].pod.meta.name, "");
  EXPECT_EQ(events[3].type, WatchEventType::kModified);
  EXPECT_TRUE(events[3].pod.meta.being_deleted);
  EXPECT_EQ(events[4].type, WatchEventType::kDeleted);
  EXPECT_EQ(events[4].pod.meta.name, "vllm-llama-7d9c8b6f4-abcde");
}

TEST(DecodePodEvent, Error410) {
  Result<PodEvent> e = DecodePodEvent(Fixture("watch_error_410.json"));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->type, WatchEventType::kError);
  EXPECT_EQ(e->status.code, 410);
  EXPECT_TRUE(e->status.gone());
  EXPECT_EQ(e->status.reason, "Expired");
  EXPECT_EQ(e->status.message, "too old resource version: 48211 (48950)");
}

TEST(DecodePodEvent, WhitespaceAndCarriageReturnAround) {
  Result<PodEvent> e = DecodePodEvent(
      " {\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"9\"}}}\r");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->pod.meta.resource_version, "9");
}

TEST(DecodePodEvent, MalformedLines) {
  struct Case {
    const char* line;
    const char* message;  // "" = only "is an error with some message"
  };
  const Case cases[] = {
      {"", ""},
      {"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"a\"}}", ""},  // cut short
      {"{\"type\":\"ADDED\"}{\"type\":\"ADDED\"}", ""},  // two objects on one line
      {"[\"ADDED\"]", "watch event: not an object"},
      {R"({"object":{}})", "type: missing"},
      {R"({"type":7,"object":{}})", "type: not a string"},
      {R"({"type":"UPSERTED","object":{}})", "type: unknown watch event type \"UPSERTED\""},
      {R"({"type":"ADDED"})", "object: missing"},
      {R"({"type":"ADDED","object":null})", "object: missing"},
      {R"({"type":"ADDED","object":"pod"})", "object: not an object"},
      {R"({"type":"ADDED","object":{"metadata":{}}})", "object.metadata.name: missing"},
      {R"({"type":"MODIFIED","object":{"metadata":{"name":"a"},"status":{"podIP":17}}})",
       "object.status.podIP: not a string"},
      {R"({"type":"MODIFIED","object":{"metadata":{"name":"a"},"status":{"conditions":{}}}})",
       "object.status.conditions: not an array"},
      {R"({"type":"BOOKMARK","object":{"metadata":{}}})",
       "object.metadata.resourceVersion: missing in a BOOKMARK"},
      {R"({"type":"ERROR","object":{"code":"410"}})", "object.code: not an integer"},
  };
  for (const Case& c : cases) {
    Result<PodEvent> e = DecodePodEvent(c.line);
    ASSERT_FALSE(e.ok()) << c.line;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << c.line;
    EXPECT_FALSE(e.status().message().empty()) << c.line;
    if (*c.message) {
      EXPECT_EQ(e.status().message(), c.message) << c.line;
    }
  }
}

TEST(DecodePoolEvent, FixtureLines) {
  const std::vector<std::string> lines = Lines(Fixture("pool_watch.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  Result<PoolEvent> modified = DecodePoolEvent(lines[0]);
  ASSERT_TRUE(modified.ok()) << modified.status().ToString();
  EXPECT_EQ(modified->type, WatchEventType::kModified);
  EXPECT_THAT(modified->pool.target_ports, ElementsAre(8000, 8001));
  Result<PoolEvent> bookmark = DecodePoolEvent(lines[1]);
  ASSERT_TRUE(bookmark.ok()) << bookmark.status().ToString();
  EXPECT_EQ(bookmark->type, WatchEventType::kBookmark);
  EXPECT_EQ(bookmark->pool.meta.resource_version, "47200");
  Result<PoolEvent> deleted = DecodePoolEvent(lines[2]);
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(deleted->type, WatchEventType::kDeleted);
  EXPECT_TRUE(deleted->pool.meta.being_deleted);
}

TEST(WatchEventTypeName, Names) {
  EXPECT_EQ(WatchEventTypeName(WatchEventType::kAdded), "ADDED");
  EXPECT_EQ(WatchEventTypeName(WatchEventType::kBookmark), "BOOKMARK");
  EXPECT_EQ(WatchEventTypeName(WatchEventType::kError), "ERROR");
}

using Op = SelectorRequirement::Op;

TEST(DecodeInferencePool, V1MatchExpressions) {
  Result<InferencePool> pool = DecodeInferencePool(Fixture("pool_v1_expressions.json"));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(pool->api_version, PoolApiVersion::kV1);
  EXPECT_THAT(pool->selector, ElementsAre(Pair("app", "vllm-llama")));
  ASSERT_EQ(pool->selector_expressions.size(), 4u);
  // In the order given; values sorted.
  const auto& e = pool->selector_expressions;
  EXPECT_EQ(e[0].key, "topology.kubernetes.io/zone");
  EXPECT_EQ(e[0].op, Op::kIn);
  EXPECT_THAT(e[0].values, ElementsAre("us-east1-b", "us-east1-c"));
  EXPECT_EQ(e[1].key, "llm-d.ai/canary");
  EXPECT_EQ(e[1].op, Op::kDoesNotExist);
  EXPECT_TRUE(e[1].values.empty());
  EXPECT_EQ(e[2].key, "pod-template-hash");
  EXPECT_EQ(e[2].op, Op::kExists);
  EXPECT_TRUE(e[2].values.empty());
  EXPECT_EQ(e[3].key, "tier");
  EXPECT_EQ(e[3].op, Op::kNotIn);
  EXPECT_THAT(e[3].values, ElementsAre("spot"));
  EXPECT_EQ(pool->failure_mode, "FailOpen");
}

TEST(DecodeInferencePool, OnlyMatchExpressionsIsASelector) {
  Result<InferencePool> pool = DecodeInferencePool(
      R"({"apiVersion":"inference.networking.k8s.io/v1","metadata":{"name":"p"},
          "spec":{"selector":{"matchExpressions":[{"key":"app","operator":"In",
                                                   "values":["b","a","b"]},
                                                  {"key":"gpu","operator":"Exists","values":null}]},
                  "targetPorts":[{"number":8000}]}})");
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_TRUE(pool->selector.empty());
  ASSERT_EQ(pool->selector_expressions.size(), 2u);
  EXPECT_THAT(pool->selector_expressions[0].values, ElementsAre("a", "b"));  // a set
  EXPECT_EQ(pool->selector_expressions[1].op, Op::kExists);
  // Empty matchLabels next to expressions is fine too.
  Result<InferencePool> with_empty_labels = DecodeInferencePool(
      R"({"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{},
          "matchExpressions":[{"key":"app","operator":"DoesNotExist","values":[]}]},
          "targetPorts":[{"number":8000}]}})");
  ASSERT_TRUE(with_empty_labels.ok()) << with_empty_labels.status().ToString();
  EXPECT_EQ(with_empty_labels->selector_expressions[0].op, Op::kDoesNotExist);
}

TEST(DecodeInferencePool, MatchExpressionErrors) {
  struct Case {
    const char* selector;  // the value of spec.selector
    const char* message;
  };
  const Case cases[] = {
      {R"({"matchExpressions":{}})", "spec.selector.matchExpressions: not an array"},
      {R"({"matchExpressions":["app"]})", "spec.selector.matchExpressions[0]: not an object"},
      {R"({"matchExpressions":[{"operator":"Exists"}]})",
       "spec.selector.matchExpressions[0].key: missing"},
      {R"({"matchExpressions":[{"key":"","operator":"Exists"}]})",
       "spec.selector.matchExpressions[0].key: missing"},
      {R"({"matchExpressions":[{"key":5,"operator":"Exists"}]})",
       "spec.selector.matchExpressions[0].key: not a string"},
      {R"({"matchExpressions":[{"key":"a","operator":"Exists"},{"key":"b"}]})",
       "spec.selector.matchExpressions[1].operator: missing"},
      {R"({"matchExpressions":[{"key":"a","operator":"Gt","values":["1"]}]})",
       "spec.selector.matchExpressions[0].operator: unknown operator \"Gt\" (want In, NotIn, "
       "Exists or DoesNotExist)"},
      {R"({"matchExpressions":[{"key":"a","operator":"in","values":["1"]}]})",
       "spec.selector.matchExpressions[0].operator: unknown operator \"in\" (want In, NotIn, "
       "Exists or DoesNotExist)"},
      {R"({"matchExpressions":[{"key":"a","operator":"In"}]})",
       "spec.selector.matchExpressions[0].values: empty (In needs at least one value)"},
      {R"({"matchExpressions":[{"key":"a","operator":"In","values":[]}]})",
       "spec.selector.matchExpressions[0].values: empty (In needs at least one value)"},
      {R"({"matchExpressions":[{"key":"a","operator":"NotIn","values":null}]})",
       "spec.selector.matchExpressions[0].values: empty (NotIn needs at least one value)"},
      {R"({"matchExpressions":[{"key":"a","operator":"Exists","values":["x"]}]})",
       "spec.selector.matchExpressions[0].values: not empty (Exists takes no values)"},
      {R"({"matchExpressions":[{"key":"a","operator":"DoesNotExist","values":["x"]}]})",
       "spec.selector.matchExpressions[0].values: not empty (DoesNotExist takes no values)"},
      {R"({"matchExpressions":[{"key":"a","operator":"In","values":"x"}]})",
       "spec.selector.matchExpressions[0].values: not an array"},
      {R"({"matchExpressions":[{"key":"a","operator":"In","values":["x",7]}]})",
       "spec.selector.matchExpressions[0].values[1]: not a string"},
      {R"({"matchLabels":{},"matchExpressions":[]})",
       "spec.selector: selects nothing (no labels)"},
      {R"({"matchExpressions":[]})", "spec.selector: selects nothing (no labels)"},
      {R"({"matchExpressions":null})", "spec.selector: no matchLabels or matchExpressions"},
      {R"({})", "spec.selector: no matchLabels or matchExpressions"},
  };
  for (const Case& c : cases) {
    const std::string json =
        std::string(R"({"apiVersion":"inference.networking.k8s.io/v1","metadata":{"name":"p"},)"
                    R"("spec":{"targetPorts":[{"number":8000}],"selector":)") +
        c.selector + "}}";
    Result<InferencePool> pool = DecodeInferencePool(json);
    ASSERT_FALSE(pool.ok()) << json;
    EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_EQ(pool.status().message(), c.message) << json;
  }
}

TEST(DecodeInferencePool, V1Alpha2HasNoExpressions) {
  Result<InferencePool> pool = DecodeInferencePool(Fixture("pool_v1alpha2.json"));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_TRUE(pool->selector_expressions.empty());
}

TEST(SelectorOpName, Names) {
  EXPECT_EQ(SelectorOpName(Op::kIn), "In");
  EXPECT_EQ(SelectorOpName(Op::kNotIn), "NotIn");
  EXPECT_EQ(SelectorOpName(Op::kExists), "Exists");
  EXPECT_EQ(SelectorOpName(Op::kDoesNotExist), "DoesNotExist");
}

TEST(DecodeInferenceObjective, LlmDFixture) {
  Result<InferenceObjective> o = DecodeInferenceObjective(Fixture("objective_llmd.json"));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->group, ObjectiveApiGroup::kLlmD);
  EXPECT_EQ(o->meta.name, "chat-interactive");
  EXPECT_EQ(o->meta.namespace_name, "inference");
  EXPECT_EQ(o->meta.resource_version, "52010");
  EXPECT_FALSE(o->meta.being_deleted);
  EXPECT_EQ(o->priority, 10);
  EXPECT_TRUE(o->has_priority);
  EXPECT_EQ(o->pool_ref_name, "vllm-llama");
  EXPECT_EQ(o->pool_ref_group, "inference.networking.k8s.io");
}

TEST(DecodeInferenceObjective, OlderGroup) {
  Result<InferenceObjective> o = DecodeInferenceObjective(
      R"({"apiVersion":"inference.networking.x-k8s.io/v1alpha2","kind":"InferenceObjective",
          "metadata":{"name":"batch","namespace":"inference","labels":{"team":"ml"}},
          "spec":{"priority":-3,"poolRef":{"name":"vllm-llama"}}})");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->group, ObjectiveApiGroup::kXK8s);
  EXPECT_EQ(o->priority, -3);
  EXPECT_TRUE(o->has_priority);
  EXPECT_EQ(o->pool_ref_name, "vllm-llama");
  EXPECT_EQ(o->pool_ref_group, "");
  EXPECT_THAT(o->meta.labels, ElementsAre(Pair("team", "ml")));
}

TEST(DecodeInferenceObjective, PriorityAndPoolRefOptional) {
  Result<InferenceObjective> o = DecodeInferenceObjective(
      R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"},"spec":{}})");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->priority, 0);
  EXPECT_FALSE(o->has_priority);
  EXPECT_EQ(o->pool_ref_name, "");
  EXPECT_EQ(o->pool_ref_group, "");
  Result<InferenceObjective> nulls = DecodeInferenceObjective(
      R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"},
          "spec":{"priority":null,"poolRef":null}})");
  ASSERT_TRUE(nulls.ok()) << nulls.status().ToString();
  EXPECT_FALSE(nulls->has_priority);
  EXPECT_EQ(nulls->pool_ref_name, "");
}

TEST(DecodeInferenceObjective, PriorityInt32Bounds) {
  const auto with_priority = [](const std::string& p) {
    return DecodeInferenceObjective(
        R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"},"spec":{"priority":)" + p +
        "}}");
  };
  Result<InferenceObjective> max = with_priority("2147483647");
  ASSERT_TRUE(max.ok()) << max.status().ToString();
  EXPECT_EQ(max->priority, 2147483647);
  Result<InferenceObjective> min = with_priority("-2147483648");
  ASSERT_TRUE(min.ok()) << min.status().ToString();
  EXPECT_EQ(min->priority, -2147483648LL);
  Result<InferenceObjective> zero = with_priority("0");
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->has_priority);
  EXPECT_EQ(zero->priority, 0);
  for (const char* p : {"2147483648", "-2147483649", "9223372036854775807",
                        "18446744073709551615"}) {
    EXPECT_EQ(with_priority(p).status().message(), "spec.priority: outside int32") << p;
  }
  for (const char* p : {"1.5", "1e3", "\"10\"", "true", "[1]"}) {
    EXPECT_EQ(with_priority(p).status().message(), "spec.priority: not an integer") << p;
  }
}

TEST(DecodeInferenceObjective, Errors) {
  struct Case {
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {R"({"metadata":{"name":"o"},"spec":{}})", "apiVersion: missing"},
      {R"({"apiVersion":"llm-d.ai/v1","metadata":{"name":"o"},"spec":{}})",
       "apiVersion: unknown InferenceObjective version \"llm-d.ai/v1\" (want llm-d.ai/v1alpha2 "
       "or inference.networking.x-k8s.io/v1alpha2)"},
      {R"({"apiVersion":7,"metadata":{"name":"o"},"spec":{}})", "apiVersion: not a string"},
      {R"({"apiVersion":"llm-d.ai/v1alpha2","spec":{}})", "metadata: missing"},
      {R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":""},"spec":{}})",
       "metadata.name: missing"},
      {R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"}})", "spec: missing"},
      {R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"},"spec":[]})",
       "spec: not an object"},
      {R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"},"spec":{"poolRef":"p"}})",
       "spec.poolRef: not an object"},
      {R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"},"spec":{"poolRef":{}}})",
       "spec.poolRef.name: missing"},
      {R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"},
           "spec":{"poolRef":{"name":"p","group":1}}})",
       "spec.poolRef.group: not a string"},
      {R"({"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"},
           "spec":{"poolRef":{"name":"p","kind":{}}}})",
       "spec.poolRef.kind: not a string"},
      {R"([])", "inferenceobjective: not an object"},
  };
  for (const Case& c : cases) {
    Result<InferenceObjective> o = DecodeInferenceObjective(c.json);
    ASSERT_FALSE(o.ok()) << c.json;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_EQ(o.status().message(), c.message) << c.json;
  }
  EXPECT_THAT(DecodeInferenceObjective("{").status().message(), HasSubstr("not valid JSON"));
}

TEST(DecodeObjectiveList, Fixture) {
  Result<ObjectiveList> list = DecodeObjectiveList(Fixture("objective_list.json"));
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->resource_version, "52100");
  ASSERT_EQ(list->items.size(), 4u);
  EXPECT_EQ(list->items[0].meta.name, "batch-summaries");
  EXPECT_EQ(list->items[0].priority, -5);
  EXPECT_EQ(list->items[1].meta.name, "chat-interactive");
  EXPECT_EQ(list->items[1].priority, 10);
  // default-traffic carries no apiVersion of its own: the list's.
  EXPECT_EQ(list->items[2].meta.name, "default-traffic");
  EXPECT_EQ(list->items[2].group, ObjectiveApiGroup::kLlmD);
  EXPECT_FALSE(list->items[2].has_priority);
  EXPECT_EQ(list->items[2].pool_ref_name, "vllm-llama");
  EXPECT_EQ(list->items[2].pool_ref_group, "");
  EXPECT_EQ(list->items[3].pool_ref_name, "mistral-7b");
  for (const InferenceObjective& o : list->items) {
    EXPECT_EQ(o.group, ObjectiveApiGroup::kLlmD) << o.meta.name;
  }
}

TEST(DecodeObjectiveList, ItemsTakeTheListsApiVersion) {
  Result<ObjectiveList> old = DecodeObjectiveList(
      R"({"apiVersion":"inference.networking.x-k8s.io/v1alpha2","kind":"InferenceObjectiveList",
          "metadata":{"resourceVersion":"9"},
          "items":[{"metadata":{"name":"a"},"spec":{"priority":1}},
                   {"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"b"},"spec":{}}]})");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  ASSERT_EQ(old->items.size(), 2u);
  EXPECT_EQ(old->items[0].group, ObjectiveApiGroup::kXK8s);
  EXPECT_EQ(old->items[1].group, ObjectiveApiGroup::kLlmD);  // its own wins
  // The list's apiVersion only matters to items without one.
  Result<ObjectiveList> own = DecodeObjectiveList(
      R"({"apiVersion":"v1","kind":"List",
          "items":[{"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"a"},"spec":{}}]})");
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_EQ(own->items[0].group, ObjectiveApiGroup::kLlmD);
}

TEST(DecodeObjectiveList, EmptyAndNullItems) {
  Result<ObjectiveList> empty = DecodeObjectiveList(
      R"({"apiVersion":"llm-d.ai/v1alpha2","kind":"InferenceObjectiveList",
          "metadata":{"resourceVersion":"5"},"items":[]})");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->resource_version, "5");
  EXPECT_TRUE(empty->items.empty());
  Result<ObjectiveList> null_items = DecodeObjectiveList(R"({"items":null})");
  ASSERT_TRUE(null_items.ok());
  EXPECT_TRUE(null_items->items.empty());
}

TEST(DecodeObjectiveList, Errors) {
  struct Case {
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {"[]", "objective list: not an object"},
      {R"({"items":{}})", "items: not an array"},
      {R"({"items":[1]})", "items[0]: not an object"},
      {R"({"metadata":{"resourceVersion":5},"items":[]})",
       "metadata.resourceVersion: not a string"},
      {R"({"items":[{"metadata":{"name":"a"},"spec":{}}]})", "items[0].apiVersion: missing"},
      {R"({"apiVersion":"v1","items":[{"metadata":{"name":"a"},"spec":{}}]})",
       "apiVersion: unknown InferenceObjective version \"v1\" (want llm-d.ai/v1alpha2 or "
       "inference.networking.x-k8s.io/v1alpha2)"},
      // One bad item rejects the whole list: a partial list would drop priorities.
      {R"({"apiVersion":"llm-d.ai/v1alpha2","items":[{"metadata":{"name":"a"},"spec":{}},
           {"metadata":{"name":"b"},"spec":{"priority":"high"}}]})",
       "items[1].spec.priority: not an integer"},
      {R"({"apiVersion":"llm-d.ai/v1alpha2","items":[{"metadata":{"name":"a"},"spec":{}},
           {"apiVersion":"llm-d.ai/v2","metadata":{"name":"b"},"spec":{}}]})",
       "items[1].apiVersion: unknown InferenceObjective version \"llm-d.ai/v2\" (want "
       "llm-d.ai/v1alpha2 or inference.networking.x-k8s.io/v1alpha2)"},
  };
  for (const Case& c : cases) {
    Result<ObjectiveList> list = DecodeObjectiveList(c.json);
    ASSERT_FALSE(list.ok()) << c.json;
    EXPECT_EQ(list.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_EQ(list.status().message(), c.message) << c.json;
  }
}

TEST(DecodeObjectiveEvent, FixtureLines) {
  const std::vector<std::string> lines = Lines(Fixture("objective_watch.jsonl"));
  ASSERT_EQ(lines.size(), 6u);
  std::vector<ObjectiveEvent> events;
  for (const std::string& line : lines) {
    Result<ObjectiveEvent> e = DecodeObjectiveEvent(line);
    ASSERT_TRUE(e.ok()) << line << ": " << e.status().ToString();
    events.push_back(*e);
  }
  EXPECT_EQ(events[0].type, WatchEventType::kAdded);
  EXPECT_EQ(events[0].objective.meta.name, "code-assist");
  EXPECT_EQ(events[0].objective.priority, 20);
  EXPECT_EQ(events[0].objective.group, ObjectiveApiGroup::kLlmD);
  EXPECT_EQ(events[1].type, WatchEventType::kModified);
  EXPECT_EQ(events[1].objective.priority, 15);
  EXPECT_EQ(events[1].objective.meta.resource_version, "52161");
  EXPECT_EQ(events[2].type, WatchEventType::kBookmark);
  EXPECT_EQ(events[2].objective.meta.resource_version, "52200");
  EXPECT_EQ(events[2].objective.meta.name, "");
  EXPECT_EQ(events[3].objective.pool_ref_name, "mistral-7b");
  EXPECT_EQ(events[4].type, WatchEventType::kDeleted);
  EXPECT_TRUE(events[4].objective.meta.being_deleted);
  EXPECT_FALSE(events[4].objective.has_priority);
  EXPECT_EQ(events[5].type, WatchEventType::kError);
  EXPECT_TRUE(events[5].status.gone());
  EXPECT_EQ(events[5].status.reason, "Expired");
}

TEST(DecodeObjectiveEvent, Error410Fixture) {
  Result<ObjectiveEvent> e = DecodeObjectiveEvent(Fixture("watch_error_410.json"));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->type, WatchEventType::kError);
  EXPECT_EQ(e->status.code, 410);
}

TEST(DecodeObjectiveEvent, BookmarkNeedsNoApiVersion) {
  Result<ObjectiveEvent> e = DecodeObjectiveEvent(
      R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"12"}}})");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->objective.meta.resource_version, "12");
}

TEST(DecodeObjectiveEvent, MalformedLines) {
  struct Case {
    const char* line;
    const char* message;
  };
  const Case cases[] = {
      {R"({"object":{}})", "type: missing"},
      {R"({"type":"ADDED"})", "object: missing"},
      {R"({"type":"ADDED","object":[]})", "object: not an object"},
      {R"({"type":"ADDED","object":{"metadata":{"name":"o"},"spec":{}}})",
       "object.apiVersion: missing"},
      {R"({"type":"MODIFIED","object":{"apiVersion":"inference.networking.k8s.io/v1",
           "metadata":{"name":"o"},"spec":{}}})",
       "object.apiVersion: unknown InferenceObjective version "
       "\"inference.networking.k8s.io/v1\" (want llm-d.ai/v1alpha2 or "
       "inference.networking.x-k8s.io/v1alpha2)"},
      {R"({"type":"ADDED","object":{"apiVersion":"llm-d.ai/v1alpha2","metadata":{"name":"o"},
           "spec":{"priority":4294967296}}})",
       "object.spec.priority: outside int32"},
      {R"({"type":"DELETED","object":{"apiVersion":"llm-d.ai/v1alpha2","metadata":{}}})",
       "object.metadata.name: missing"},
      {R"({"type":"BOOKMARK","object":{"metadata":{}}})",
       "object.metadata.resourceVersion: missing in a BOOKMARK"},
      {R"({"type":"ERROR","object":{"code":"410"}})", "object.code: not an integer"},
  };
  for (const Case& c : cases) {
    Result<ObjectiveEvent> e = DecodeObjectiveEvent(c.line);
    ASSERT_FALSE(e.ok()) << c.line;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << c.line;
    EXPECT_EQ(e.status().message(), c.message) << c.line;
  }
  EXPECT_FALSE(DecodeObjectiveEvent("").ok());
}

TEST(DecodeInferencePoolList, BothVersionsAndEmpty) {
  Result<InferencePoolList> l = DecodeInferencePoolList(
      R"({"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePoolList",
          "metadata":{"resourceVersion":"77"},
          "items":[{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool",
                    "metadata":{"name":"p","namespace":"ns","resourceVersion":"70"},
                    "spec":{"selector":{"matchLabels":{"app":"v"}},"targetPorts":[{"number":8000}]}},
                   {"apiVersion":"inference.networking.x-k8s.io/v1alpha2","kind":"InferencePool",
                    "metadata":{"name":"q"},
                    "spec":{"selector":{"app":"w"},"targetPortNumber":9000}}]})");
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->resource_version, "77");
  ASSERT_EQ(l->items.size(), 2u);
  EXPECT_EQ(l->items[0].meta.name, "p");
  EXPECT_EQ(l->items[0].api_version, PoolApiVersion::kV1);
  EXPECT_EQ(l->items[0].target_ports, std::vector<uint16_t>{8000});
  EXPECT_EQ(l->items[1].api_version, PoolApiVersion::kV1Alpha2);
  EXPECT_EQ(l->items[1].target_ports, std::vector<uint16_t>{9000});

  Result<InferencePoolList> empty = DecodeInferencePoolList(R"({"metadata":{"resourceVersion":"5"},"items":[]})");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->resource_version, "5");
  EXPECT_TRUE(empty->items.empty());
}

TEST(DecodeInferencePoolList, ABadItemRejectsTheListNamingIt) {
  Result<InferencePoolList> l = DecodeInferencePoolList(
      R"({"metadata":{"resourceVersion":"1"},"items":[{"apiVersion":"inference.networking.k8s.io/v1",
          "metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"app":"v"}},"targetPorts":[{"number":70000}]}}]})");
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("items[0].spec.targetPorts[0]"), std::string::npos) << l.status().message();
  EXPECT_FALSE(DecodeInferencePoolList("[]").ok());
  EXPECT_FALSE(DecodeInferencePoolList("{").ok());
}

}  // namespace
}  // namespace kvroute::k8s
