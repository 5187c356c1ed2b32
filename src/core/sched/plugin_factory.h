// How a plugin type is built from configuration: its extension point, the parameters it
// takes and the function that builds it from their validated values. Each built-in
// plugin's folder (plugins/<name>/) defines its factory next to the class; registry.cc
// registers the factories by type name in one explicit function (no static initialisers),
// validates a SchedulingSpec against them and builds the profile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
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

// The factory of a plugin type that takes no parameters: a default-constructed T.
template <class T>
PluginFactory FactoryWithoutParams(PluginKind kind) {
  return {kind, {}, [](const PluginParams&) -> std::unique_ptr<Plugin> {
            return std::make_unique<T>();
          }};
}

// One parameter of a plugin configured by a Params struct: its definition and the member
// of Params it sets. The member's initial value is the default; a whole-number member
// (ParamDef::integer) is a size_t, a 0/1 one may be a bool.
template <class Params>
struct ParamField {
  ParamDef def;
  std::variant<double Params::*, size_t Params::*, bool Params::*> member;

  // Sets the member from `p` when the spec gave the parameter.
  void Read(const PluginParams& p, Params& q) const {
    std::visit(
        [&](auto m) {
          using V = std::remove_reference_t<decltype(q.*m)>;
          if constexpr (std::is_same_v<V, bool>) {
            q.*m = p.Get(def.name, q.*m ? 1.0 : 0.0) != 0;
          } else {
            q.*m = static_cast<V>(p.Get(def.name, static_cast<double>(q.*m)));
          }
        },
        member);
  }
};

// A plugin of extension point Base (Filter, Scorer, Picker) configured by a Params struct
// fixed for its life: the constructor ParamsFactory calls (default: Params' defaults) and
// the parameters it keeps.
template <class Base, class P>
class Configured : public Base {
 public:
  using Params = P;
  explicit Configured(const Params& p = {}) : p_(p) {}
  const Params& params() const { return p_; }

 protected:
  Params p_;
};

// The factory of a plugin type T built from a T::Params, each of its parameters one
// member of it (`fields`, in the order the registry lists them).
template <class T>
PluginFactory ParamsFactory(PluginKind kind,
                            std::vector<ParamField<typename T::Params>> fields) {
  std::vector<ParamDef> defs;
  defs.reserve(fields.size());
  for (const auto& f : fields) defs.push_back(f.def);
  return {kind, std::move(defs),
          [fields = std::move(fields)](const PluginParams& p) -> std::unique_ptr<Plugin> {
            typename T::Params q;
            for (const auto& f : fields) f.Read(p, q);
            return std::make_unique<T>(q);
          }};
}

// A picker's ranking as a free function (Picker::Rank's arguments), for pickers with no
// parameters and no state of their own.
using RankFunction = void (*)(const PickContext& ctx, std::span<const uint32_t> candidates,
                              std::span<const double> totals, size_t max_ranked,
                              std::vector<uint32_t>& ranked);

// The picker whose Rank is `kRank`.
template <RankFunction kRank>
class FunctionPicker final : public Picker {
 public:
  void Rank(const PickContext& ctx, std::span<const uint32_t> candidates,
            std::span<const double> totals, size_t max_ranked,
            std::vector<uint32_t>& ranked) override {
    kRank(ctx, candidates, totals, max_ranked, ranked);
  }
};

// The factory of FunctionPicker<kRank> (no parameters).
template <RankFunction kRank>
PluginFactory FunctionPickerFactory() {
  return FactoryWithoutParams<FunctionPicker<kRank>>(PluginKind::kPicker);
}

}  // namespace kvroute::sched
