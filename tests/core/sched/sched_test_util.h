// Helpers shared by the scheduler tests: hand-made endpoint states and specs.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/sched/registry.h"

namespace kvroute::sched::testing {

// `n` healthy endpoints with fresh metrics scraped at t=0, ids 0..n-1.
inline std::vector<EndpointState> MakeEndpoints(size_t n) {
  std::vector<EndpointState> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i].id = static_cast<uint32_t>(i);
    v[i].name = "ep" + std::to_string(i);
    v[i].scraped_at_s = 0.0;
    v[i].scrape_ok = true;
    v[i].num_gpu_blocks = 1000;
    v[i].block_size = 16;
  }
  return v;
}

// One profile referencing every plugin in order, with the given weights.
inline SchedulingSpec SpecOf(std::vector<PluginSpec> plugins, std::vector<double> weights = {}) {
  SchedulingSpec s;
  ProfileSpec prof;
  for (size_t i = 0; i < plugins.size(); ++i) {
    ProfilePluginRef ref;
    ref.plugin_ref = plugins[i].name.empty() ? plugins[i].type : plugins[i].name;
    ref.weight = i < weights.size() ? weights[i] : 1.0;
    prof.plugins.push_back(ref);
  }
  s.plugins = std::move(plugins);
  s.profiles.push_back(prof);
  return s;
}

inline PluginSpec Plugin(std::string type, std::map<std::string, ParamValue> params = {}) {
  PluginSpec p;
  p.type = std::move(type);
  p.parameters = std::move(params);
  return p;
}

inline std::unique_ptr<Scheduler> MustBuild(const SchedulingSpec& spec,
                                            SchedulerOptions options = {}) {
  BuildResult r = BuildScheduler(spec, options);
  EXPECT_TRUE(r.ok()) << (r.error ? r.error->field + ": " + r.error->message : "");
  return std::move(r.scheduler);
}

inline std::unique_ptr<Scheduler> MustBuildPolicy(std::string_view policy,
                                                  SchedulerOptions options = {}) {
  BuildResult r = BuildPolicy(policy, options);
  EXPECT_TRUE(r.ok()) << (r.error ? r.error->field + ": " + r.error->message : "");
  return std::move(r.scheduler);
}

inline SchedRequest Req(std::string_view prompt, std::string_view model = "m") {
  SchedRequest r;
  r.model = model;
  r.prompt = prompt;
  return r;
}

}  // namespace kvroute::sched::testing
