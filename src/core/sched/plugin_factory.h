// How a plugin type is built from configuration: its extension point, the parameters it
// takes and the function that builds it from their validated values. Each built-in
// plugin's folder (plugins/<name>/) defines its factory next to the class; registry.cc
// registers the factories by type name in one explicit function (no static initialisers),
// validates a SchedulingSpec against them and builds the profile.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/sched/plugin.h"

namespace kvroute::sched {

// Where a plugin sits in a profile. kMarker: no score, no weight; its presence alone
// changes the scheduler (inflight-accounting).
enum class PluginKind { kFilter, kScorer, kPicker, kMarker };

// One numeric parameter a plugin takes: its name in the spec (camelCase, as in GIE's
// YAML) and the range the registry accepts (min > 0 reads "must be > 0").
struct ParamDef {
  std::string_view name;
  double min;
  double max;
  bool integer;
};

// ParamDef::max of a parameter with no upper bound.
inline constexpr double kParamUnbounded = 1e300;

// A plugin's parameters as the registry validated them: only names of its ParamDefs, each
// a finite number in range (an integer where the ParamDef says so). Parameters the spec
// left out are absent; the factory applies its defaults.
struct PluginParams {
  std::map<std::string, double, std::less<>> values;
  // The value of `name`, or `fallback` when the spec did not set it.
  double Get(std::string_view name, double fallback) const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
};

struct PluginFactory {
  PluginKind kind = PluginKind::kScorer;
  std::vector<ParamDef> params;
  // Builds the plugin (never null) from parameters validated against `params`. The
  // registry then sets its type and name. Must match `kind`: a kFilter factory returns a
  // Filter, a kScorer one a Scorer, a kPicker one a Picker.
  std::function<std::unique_ptr<Plugin>(const PluginParams&)> make;
};

}  // namespace kvroute::sched
