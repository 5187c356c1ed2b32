// A `kvroute sim` fleet that publishes vLLM KV-cache events (with replay) and reports
// cached tokens, and the router-config lines that subscribe to it: what the precise
// routing tests of serve, epp and the fault matrix start from.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "metrics/metric_sum.h"
#include "core/engine/tokenizer.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"
#include "support/wait.h"

namespace kvroute::test_support {

// A text of exactly `tokens` of the sim's tokens, distinct per `tag`.
inline std::string TokensPrompt(const std::string& tag, int tokens) {
  std::string s = tag + "-";
  while (s.size() < static_cast<size_t>(tokens) * engine::kBytesPerToken) s += 'x';
  s.resize(static_cast<size_t>(tokens) * engine::kBytesPerToken);
  return s;
}

// `n` replicas r0..r<n-1> publishing events on free ports, with replay and
// --enable-prompt-tokens-details, started. With `connect` (a router's bound address),
// they publish by connecting there instead (centralized mode), replica i listening on
// 127.0.0.<i+2> so each has its own host in its topic.
inline std::unique_ptr<sim::Fleet> StartPublishingFleet(int n, SimReplicaOptions o = {},
                                                        const std::string& connect = "") {
  std::vector<sim::ReplicaConfig> replicas;
  for (int i = 0; i < n; ++i) {
    o.name = "r" + std::to_string(i);
    sim::ReplicaConfig r = SimReplica(o);
    if (connect.empty()) {
      r.kv_events.port = 0;
      r.kv_events.replay_port = 0;
    } else {
      r.host = "127.0.0." + std::to_string(i + 2);
      r.kv_events.connect = connect;
    }
    r.enable_prompt_tokens_details = true;
    replicas.push_back(r);
  }
  auto fleet = std::make_unique<sim::Fleet>(std::move(replicas), 2);
  if (!fleet->Start().ok()) return nullptr;
  return fleet;
}

// The `pool.endpoints:` items for `fleet` (names r<i>, their events and replay addresses).
inline std::string EventsEndpointsYaml(const sim::Fleet& fleet) {
  std::string y;
  for (int i = 0; i < fleet.size(); ++i) {
    y += "    - {address: " + fleet.config(i).host + ":" + std::to_string(fleet.port(i)) + ", name: r" +
         std::to_string(i);
    // Publishers that connect to the router (centralized) are found by their topic.
    if (fleet.config(i).kv_events.connect.empty()) {
      y += ", kv_events: \"" + fleet.kv_events_endpoint(i) + "\", kv_events_replay: \"" +
           fleet.kv_events_replay_endpoint(i) + "\"";
    }
    y += "}\n";
  }
  return y;
}

// A completion sent to replica i directly, not through a router; true on 200.
inline bool DirectCompletion(const sim::Fleet& fleet, int i, const std::string& prompt) {
  auto r = http::Fetch(fleet.config(i).host, fleet.port(i), "POST", "/v1/completions", CompletionBody(prompt, 1), {},
                       std::chrono::seconds(10));
  return r && r->status == 200;
}

// Waits until every replica's events are live in the router whose /metrics `metrics`
// returns: replicas still not live get fresh prompts directly (a SUB socket misses what
// was published before its subscription reached the publisher). True when all are.
inline bool WaitAllEventsLive(const sim::Fleet& fleet, const std::function<std::string()>& metrics) {
  using metrics::testing::MetricSum;
  int n = 0;
  return WaitFor([&] {
    const std::string m = metrics();
    if (MetricSum(m, "kvroute_endpoint_metrics_fresh") < fleet.size()) return false;
    bool all = true;
    for (int i = 0; i < fleet.size(); ++i) {
      const std::string name = "r" + std::to_string(i);
      if (MetricSum(m, "kvroute_kv_events_state", {{"endpoint", name}, {"state", "live"}}) == 1) continue;
      all = false;
      DirectCompletion(fleet, i, TokensPrompt("warm" + std::to_string(n++), 20));
    }
    return all;
  });
}

}  // namespace kvroute::test_support
