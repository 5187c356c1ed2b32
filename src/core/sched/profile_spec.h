// The typed form of a scheduling configuration (the Gateway API Inference Extension's
// EndpointPickerConfig shape). The config loader (src/config) builds it from YAML and
// attaches file/line to errors; the scheduler builds plugins from it. No YAML here.
#pragma once

#include <map>
#include <string>
#include <variant>
#include <vector>

namespace kvroute::sched {

// A plugin parameter value as written in the config file.
using ParamValue = std::variant<bool, double, std::string>;

struct PluginSpec {
  std::string type;                           // e.g. "prefix-cache-scorer"
  std::string name;                           // defaults to type
  std::map<std::string, ParamValue> parameters;
  int line = 0;                               // 1-based source line, 0 when unknown
};

struct ProfilePluginRef {
  std::string plugin_ref;                     // a PluginSpec name
  double weight = 1.0;                        // missing weight is 1
  int line = 0;
};

struct ProfileSpec {
  std::string name = "default";
  std::vector<ProfilePluginRef> plugins;
  int line = 0;
};

// The whole scheduling section. `policy` names a complete built-in policy
// (round-robin, random, least-request, gie-default, sglang-cache-aware, dynamo-cost,
// kvroute); when set, plugins/profiles must be empty. When neither is set the
// kvroute default applies.
struct SchedulingSpec {
  std::string policy;
  std::vector<PluginSpec> plugins;
  std::vector<ProfileSpec> profiles;
};

}  // namespace kvroute::sched
