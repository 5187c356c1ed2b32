#include "core/sched/registry.h"

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/sched/dynamo_cost.h"
#include "core/sched/llmd_sticky.h"
#include "core/sched/plugin_factory.h"
#include "core/sched/plugins/inflight_accounting/inflight_accounting.h"
#include "core/sched/plugins/kv_utilization_scorer/kv_utilization_scorer.h"
#include "core/sched/plugins/load_aware_scorer/load_aware_scorer.h"
#include "core/sched/plugins/locality_filter/locality_filter.h"
#include "core/sched/plugins/lora_affinity/lora_affinity.h"
#include "core/sched/plugins/max_score_picker/max_score_picker.h"
#include "core/sched/plugins/min_max_scorer/min_max_scorer.h"
#include "core/sched/plugins/prefix_cache_scorer/prefix_cache_scorer.h"
#include "core/sched/plugins/random_picker/random_picker.h"
#include "core/sched/plugins/recent_load_scorer/recent_load_scorer.h"
#include "core/sched/plugins/round_robin_picker/round_robin_picker.h"
#include "core/sched/plugins/saturation_filter/saturation_filter.h"
#include "core/sched/plugins/tpot_guard_filter/tpot_guard_filter.h"
#include "core/sched/plugins/slo_headroom_picker/slo_headroom_picker.h"
#include "core/sched/plugins/soft_load_scorer/soft_load_scorer.h"
#include "core/sched/plugins/swapped_requests_scorer/swapped_requests_scorer.h"
#include "core/sched/plugins/weighted_random_picker/weighted_random_picker.h"
#include "core/sched/profile_scheduler.h"
#include "core/sched/sglang_cache_aware.h"

namespace kvroute::sched {

struct PluginAccess {
  static void Name(Plugin& p, std::string type, std::string name) {
    p.type_ = std::move(type);
    p.name_ = std::move(name);
  }
};

namespace {

struct PluginDef {
  std::string_view type;
  PluginFactory factory;
};

// The one place built-in plugin types are registered: one line each, its type name and
// its factory (plugins/<name>/). PluginTypes() lists them in this order.
void RegisterBuiltinPlugins(std::vector<PluginDef>& defs) {
  auto add = [&defs](std::string_view type, PluginFactory f) {
    defs.push_back({type, std::move(f)});
  };
  add("prefix-cache-scorer", PrefixCacheScorerFactory(/*precise_default=*/false));
  add("precise-prefix-cache-scorer", PrefixCacheScorerFactory(/*precise_default=*/true));
  add("kv-cache-utilization-scorer", KvUtilizationScorerFactory());
  add("queue-depth-scorer", MinMaxScorerFactory(LoadField::kWaiting));
  add("queue-scorer", MinMaxScorerFactory(LoadField::kWaiting));
  add("running-requests-scorer", MinMaxScorerFactory(LoadField::kRunning));
  add("least-request-scorer", MinMaxScorerFactory(LoadField::kInflight));
  add("soft-load-scorer", SoftLoadScorerFactory());
  add("recent-load-scorer", RecentLoadScorerFactory());
  add("lora-affinity-scorer", LoraAffinityScorerFactory());
  add("lora-affinity-filter", LoraAffinityFilterFactory());
  add("load-aware-scorer", LoadAwareScorerFactory());
  add("swapped-requests-scorer", SwappedRequestsScorerFactory());
  add("saturation-filter", SaturationFilterFactory());
  add("tpot-guard-filter", TpotGuardFilterFactory());
  add("locality-filter", LocalityFilterFactory());
  add("inflight-accounting", InflightAccountingFactory());
  add("max-score-picker", MaxScorePickerFactory());
  add("slo-headroom-picker", SloHeadroomPickerFactory());
  add("weighted-random-picker", WeightedRandomPickerFactory());
  add("random-picker", RandomPickerFactory());
  add("round-robin-picker", RoundRobinPickerFactory());
}

const std::vector<PluginDef>& Defs() {
  static const std::vector<PluginDef> defs = [] {
    std::vector<PluginDef> d;
    RegisterBuiltinPlugins(d);
    return d;
  }();
  return defs;
}

const PluginDef* FindDef(std::string_view type) {
  for (const PluginDef& d : Defs()) {
    if (d.type == type) return &d;
  }
  return nullptr;
}

constexpr std::string_view kPolicies[] = {"round-robin",   "random",        "least-request",
                                          "gie-default",   "sglang-cache-aware",
                                          "dynamo-cost",   "dynamo-kv",     "llm-d-sticky",
                                          "llm-d-precise", "kvroute"};
// Accepted by name but not in PolicyNames() (so default comparisons do not run them):
// peer variants with a non-default option of the peer turned on.
// kvroute-region-blind is kvroute without the locality-filter even when a region is set (the
// simulator's comparison). kvroute-slo is kvroute with the slo-headroom-picker (issue 24:
// not the default, because it did not beat the blend in simulate; docs/BENCHMARKS.md).
// kvroute-lora-blind is kvroute without the lora-affinity-scorer (issue 26: the simulator's
// comparison of adapter affinity).
// kvroute-blend is the weighted blend kvroute was from issue 12 to issue 43, by name, so it
// stays comparable (issue 43, item 5): kvroute without the tpot-guard-filter.
// kvroute-speed-aware is kvroute with soft load counted by each replica's measured slowness
// (soft-load-scorer's speedAware), kvroute-token-aware that with soft load also counted by
// estimated work (tokenAware): measured, not the default (docs/BENCHMARKS.md "Issue 43").
// llm-d-2025-*: the four arms of llm-d's published precise / approximate / load / random
// comparison (REFERENCE.md section 8; the inference scheduler v0.2.1 over the Inference
// Extension v0.5.1, configurations from llm-d-kv-cache-manager's benchmarking/73-capacity),
// random being `random`; docs/POLICIES.md, "llm-d's 2025 comparison".
constexpr std::string_view kVariantPolicies[] = {
    "dynamo-cost-output-blocks", "kvroute-region-blind", "kvroute-slo", "kvroute-lora-blind",
    "llm-d-2025-precise",        "llm-d-2025-approximate", "llm-d-2025-load", "kvroute-speed-aware", "kvroute-blend",
    "kvroute-token-aware"};

std::string PluginField(size_t i, std::string_view rest = {}) {
  std::string f = "plugins[" + std::to_string(i) + "]";
  if (!rest.empty()) f += "." + std::string(rest);
  return f;
}
std::string RefField(size_t p, size_t r, std::string_view rest) {
  return "schedulingProfiles[" + std::to_string(p) + "].plugins[" + std::to_string(r) + "]." +
         std::string(rest);
}

// Checks one plugin's parameters and converts them to numbers.
std::optional<SpecError> CheckParams(const PluginSpec& ps, size_t i, const PluginDef& def,
                                     PluginParams& out) {
  for (const auto& [name, value] : ps.parameters) {
    const ParamDef* pd = nullptr;
    for (const ParamDef& d : def.factory.params) {
      if (d.name == name) pd = &d;
    }
    const std::string field = PluginField(i, "parameters." + name);
    if (pd == nullptr) {
      std::string known;
      for (const ParamDef& d : def.factory.params) known += (known.empty() ? "" : ", ") + std::string(d.name);
      return SpecError{ps.line, field,
                       "unknown parameter '" + name + "' for plugin type '" + ps.type + "'" +
                           (known.empty() ? " (it takes none)" : " (known: " + known + ")")};
    }
    const double* v = std::get_if<double>(&value);
    if (v == nullptr) return SpecError{ps.line, field, "must be a number"};
    if (!std::isfinite(*v) || *v < pd->min) {
      return SpecError{ps.line, field,
                       "must be " + std::string(pd->min > 0 ? "> 0" : ">= 0") + ", got " +
                           std::to_string(*v)};
    }
    if (*v > pd->max) {
      return SpecError{ps.line, field, "too large: " + std::to_string(*v)};
    }
    if (pd->integer && *v != std::floor(*v)) {
      return SpecError{ps.line, field, "must be an integer"};
    }
    out.values[name] = *v;
  }
  return std::nullopt;
}

const std::string& NameOf(const PluginSpec& p) { return p.name.empty() ? p.type : p.name; }

// Validation and building share this walk so they cannot disagree.
std::optional<SpecError> Walk(const SchedulingSpec& spec, ProfileScheduler::Parts* parts) {
  if (!spec.policy.empty()) {
    bool known = false;
    for (std::string_view p : kPolicies) known |= (p == spec.policy);
    for (std::string_view p : kVariantPolicies) known |= (p == spec.policy);
    if (!known) {
      std::string all;
      for (std::string_view p : kPolicies) all += (all.empty() ? "" : ", ") + std::string(p);
      return SpecError{0, "policy", "unknown policy '" + spec.policy + "' (known: " + all + ")"};
    }
    if (!spec.plugins.empty() || !spec.profiles.empty()) {
      const int line = !spec.plugins.empty() ? spec.plugins[0].line : spec.profiles[0].line;
      return SpecError{line, "policy",
                       "a named policy cannot be combined with plugins or schedulingProfiles"};
    }
    return std::nullopt;
  }

  std::map<std::string, size_t, std::less<>> by_name;
  std::vector<PluginParams> params(spec.plugins.size());
  for (size_t i = 0; i < spec.plugins.size(); ++i) {
    const PluginSpec& ps = spec.plugins[i];
    if (ps.type.empty()) return SpecError{ps.line, PluginField(i, "type"), "missing plugin type"};
    const PluginDef* def = FindDef(ps.type);
    if (def == nullptr) {
      return SpecError{ps.line, PluginField(i, "type"), "unknown plugin type '" + ps.type + "'"};
    }
    if (!by_name.emplace(NameOf(ps), i).second) {
      return SpecError{ps.line, PluginField(i, "name"),
                       "duplicate plugin name '" + NameOf(ps) + "'"};
    }
    if (auto err = CheckParams(ps, i, *def, params[i])) return err;
  }
  if (spec.profiles.size() > 1) {
    return SpecError{spec.profiles[1].line, "schedulingProfiles[1]",
                     "only one scheduling profile is supported"};
  }

  // The plugins the profile uses, with weights; without a profile, all of them, weight 1.
  struct Use {
    size_t plugin;
    double weight;
  };
  std::vector<Use> uses;
  if (spec.profiles.empty()) {
    for (size_t i = 0; i < spec.plugins.size(); ++i) uses.push_back({i, 1.0});
  } else {
    const ProfileSpec& prof = spec.profiles[0];
    std::set<size_t> seen;
    for (size_t r = 0; r < prof.plugins.size(); ++r) {
      const ProfilePluginRef& ref = prof.plugins[r];
      auto it = by_name.find(ref.plugin_ref);
      if (it == by_name.end()) {
        return SpecError{ref.line, RefField(0, r, "pluginRef"),
                         "pluginRef '" + ref.plugin_ref + "' names no plugin in plugins"};
      }
      if (!std::isfinite(ref.weight) || ref.weight < 0) {
        return SpecError{ref.line, RefField(0, r, "weight"),
                         "weight must be a finite number >= 0, got " + std::to_string(ref.weight)};
      }
      if (!seen.insert(it->second).second) {
        return SpecError{ref.line, RefField(0, r, "pluginRef"),
                         "plugin '" + ref.plugin_ref + "' referenced twice"};
      }
      uses.push_back({it->second, ref.weight});
    }
  }
  // Picker: the one the profile uses; else the only declared one; else max-score.
  int picker = -1;
  int picker_line = 0;
  for (const Use& u : uses) {
    if (FindDef(spec.plugins[u.plugin].type)->factory.kind != PluginKind::kPicker) continue;
    if (picker >= 0) {
      return SpecError{spec.plugins[u.plugin].line, PluginField(u.plugin, "type"),
                       "more than one picker in the profile"};
    }
    picker = static_cast<int>(u.plugin);
    picker_line = spec.plugins[u.plugin].line;
  }
  (void)picker_line;
  if (picker < 0) {
    int declared = -1, count = 0;
    for (size_t i = 0; i < spec.plugins.size(); ++i) {
      if (FindDef(spec.plugins[i].type)->factory.kind == PluginKind::kPicker) {
        declared = static_cast<int>(i);
        ++count;
      }
    }
    if (count == 1) picker = declared;
  }
  if (parts == nullptr) return std::nullopt;

  auto make = [&](size_t i) {
    const PluginSpec& ps = spec.plugins[i];
    std::unique_ptr<Plugin> p = FindDef(ps.type)->factory.make(params[i]);
    PluginAccess::Name(*p, ps.type, NameOf(ps));
    return p;
  };
  for (const Use& u : uses) {
    const PluginKind kind = FindDef(spec.plugins[u.plugin].type)->factory.kind;
    if (kind == PluginKind::kFilter) {
      parts->filters.emplace_back(static_cast<Filter*>(make(u.plugin).release()));
    } else if (kind == PluginKind::kScorer) {
      parts->scorers.push_back(
          {std::unique_ptr<Scorer>(static_cast<Scorer*>(make(u.plugin).release())), u.weight});
    }
  }
  if (picker >= 0) {
    parts->picker.reset(static_cast<Picker*>(make(static_cast<size_t>(picker)).release()));
  }
  // In-flight accounting is on when declared, referenced or not.
  for (size_t i = 0; i < spec.plugins.size(); ++i) {
    if (FindDef(spec.plugins[i].type)->factory.kind == PluginKind::kMarker) {
      parts->inflight_adjustment = true;
      parts->others.push_back(make(i));
    }
  }
  return std::nullopt;
}

PluginSpec P(std::string type, std::map<std::string, ParamValue> params = {}) {
  PluginSpec p;
  p.type = std::move(type);
  p.parameters = std::move(params);
  return p;
}

SchedulingSpec Profile(std::vector<PluginSpec> plugins,
                       const std::vector<std::pair<std::string, double>>& refs) {
  SchedulingSpec s;
  s.plugins = std::move(plugins);
  ProfileSpec prof;
  for (auto& [name, w] : refs) prof.plugins.push_back({name, w, 0});
  s.profiles.push_back(std::move(prof));
  return s;
}

}  // namespace

std::optional<SpecError> ValidateSchedulingSpec(const SchedulingSpec& spec) {
  return Walk(spec, nullptr);
}

std::optional<SchedulingSpec> PolicyAsSpec(std::string_view policy) {
  if (policy == "round-robin") {
    return Profile({P("round-robin-picker")}, {{"round-robin-picker", 1}});
  }
  if (policy == "random") return Profile({P("random-picker")}, {{"random-picker", 1}});
  if (policy == "least-request") {
    return Profile({P("least-request-scorer"), P("max-score-picker")},
                   {{"least-request-scorer", 1}, {"max-score-picker", 1}});
  }
  if (policy == "gie-default") {
    return Profile({P("prefix-cache-scorer"), P("kv-cache-utilization-scorer"), P("queue-scorer"),
                    P("max-score-picker")},
                   {{"prefix-cache-scorer", 3},
                    {"kv-cache-utilization-scorer", 2},
                    {"queue-scorer", 2},
                    {"max-score-picker", 1}});
  }
  // llm-d's 2025 arms: max-score-picker over a plain weighted sum. approximate: the
  // Extension's prefix-cache-scorer (64-character blocks, 256 of them, an LRU of 31,250 per
  // server) 1, kv-cache 1, queue 1. precise: the KV-event scorer (held leading blocks,
  // min-max normalised among the endpoints holding any; no speculative entries) 3,
  // kv-cache 2, queue 2. load: kv-cache 1, queue 1.
  if (policy == "llm-d-2025-approximate") {
    return Profile({P("prefix-cache-scorer", {{"lruCapacityPerServer", 31250.0}}),
                    P("kv-cache-utilization-scorer"), P("queue-scorer"), P("max-score-picker")},
                   {{"prefix-cache-scorer", 1},
                    {"kv-cache-utilization-scorer", 1},
                    {"queue-scorer", 1},
                    {"max-score-picker", 1}});
  }
  if (policy == "llm-d-2025-precise") {
    return Profile({P("precise-prefix-cache-scorer",
                      {{"speculativeWeight", 0.0}, {"minMaxNormalize", 1.0}}),
                    P("kv-cache-utilization-scorer"), P("queue-scorer"), P("max-score-picker")},
                   {{"precise-prefix-cache-scorer", 3},
                    {"kv-cache-utilization-scorer", 2},
                    {"queue-scorer", 2},
                    {"max-score-picker", 1}});
  }
  if (policy == "llm-d-2025-load") {
    return Profile({P("kv-cache-utilization-scorer"), P("queue-scorer"), P("max-score-picker")},
                   {{"kv-cache-utilization-scorer", 1}, {"queue-scorer", 1}, {"max-score-picker", 1}});
  }
  if (policy == "kvroute" || policy == "kvroute-region-blind" || policy == "kvroute-slo" ||
      policy == "kvroute-lora-blind" || policy == "kvroute-speed-aware" ||
      policy == "kvroute-blend" || policy == "kvroute-token-aware") {
    // Prefix affinity and KV headroom as in gie-default, plus: the router's own accounting
    // between scrapes; a saturation filter on queues and stale metrics only (metrics may
    // be older than GIE's 200 ms, because in-flight accounting covers the gap; KV usage
    // alone does not filter, since in a KV-bound fleet every replica sits near 80% and
    // dropping the prefix holder only copies its prefix elsewhere); and, instead of the
    // min-max queue scorer, a soft load scorer on in-flight requests that pulls traffic
    // towards idle replicas before anything queues, but lets a replica keep a prefix
    // until its load is about a dozen requests above the least loaded one; and a light
    // pull towards the replicas that got the least traffic over the last half minute, so a
    // prompt group seen for the first time does not land, by the random tie-break, on a
    // replica that already serves several groups (between bursts it looks as idle as the
    // others; once their long answers overlap, its KV fills and requests queue for
    // seconds: issue 12's demo). Weights from sweeps over the five example scenarios and
    // seeds 1-3 (docs/POLICIES.md); recent-load's half-life and weight from the demo's
    // scaled-down seed-8x over seeds 1-20 and the example scenarios (issue 12).
    // kvroute-slo: the blend's choice unless the latency model predicts it misses the
    // request's objective and another endpoint meets it with room (issue 24).
    // LoRA adapter affinity (issue 26), weight 3 (the prefix scorer's: a loaded adapter
    // is cached state too): for an adapter request, running it (1.0) against room to load
    // it (0.8) is worth 0.6, about 1.5 requests of load difference on soft-load-scorer
    // (4 * d / (d + 8 + 0.25 * mean)) or 3 recent requests on recent-load-scorer, so at
    // equal load the adapter's replica wins; a replica with room (0.8) against one with
    // neither room nor the adapter (0) is worth 2.4, which soft load outweighs from about
    // 12 requests of difference; saturated replicas are filtered before any scorer.
    // Base-model requests score 0 everywhere (no change to their picks).
    const char* picker = policy == "kvroute-slo" ? "slo-headroom-picker" : "max-score-picker";
    SchedulingSpec spec =
        Profile({P("inflight-accounting"),
                 P("saturation-filter", {{"kvThreshold", 1.0}, {"staleAfterSeconds", 1.0}}),
                 P("lora-affinity-filter"),
                 P("prefix-cache-scorer", {{"preciseEvents", 1.0}}), P("kv-cache-utilization-scorer"),
                 P("soft-load-scorer", {{"minSpread", 8.0}, {"relativeSpread", 0.25}}),
                 P("recent-load-scorer", {{"halfLifeSeconds", 30.0}, {"minSpread", 2.0}}),
                 P("lora-affinity-scorer"), P(picker)},
                {{"saturation-filter", 1},
                 {"lora-affinity-filter", 1},
                 {"prefix-cache-scorer", 3},
                 {"kv-cache-utilization-scorer", 2},
                 {"soft-load-scorer", 4},
                 {"recent-load-scorer", 1},
                 {"lora-affinity-scorer", 3},
                 {picker, 1}});
    // Issue 43: the default drops endpoints whose measured TPOT fails the request's
    // objective (tpot-guard-filter, after the saturation filter); kvroute-blend does not.
    // Soft load counted by slowness (and by work) only in the measured variants: on
    // Mooncake's traces it read noise as slowness (docs/BENCHMARKS.md "Issue 43").
    const bool guard = policy != "kvroute-blend";
    const bool speed = policy == "kvroute-speed-aware" || policy == "kvroute-token-aware";
    if (guard) {
      spec.plugins.insert(spec.plugins.begin() + 2, P("tpot-guard-filter"));
      spec.profiles[0].plugins.insert(spec.profiles[0].plugins.begin() + 1,
                                      ProfilePluginRef{"tpot-guard-filter", 1, 0});
    }
    for (PluginSpec& ps : spec.plugins) {
      if (ps.type != "soft-load-scorer") continue;
      if (speed) ps.parameters["speedAware"] = 1.0;
      if (policy == "kvroute-token-aware") ps.parameters["tokenAware"] = 1.0;
    }
    if (policy == "kvroute-lora-blind") {  // without the LoRA filter and scorer
      std::erase_if(spec.plugins,
                    [](const PluginSpec& p) { return p.type.rfind("lora-affinity-", 0) == 0; });
      std::erase_if(spec.profiles[0].plugins, [](const ProfilePluginRef& r) {
        return r.plugin_ref.rfind("lora-affinity-", 0) == 0;
      });
    }
    return spec;
  }
  return std::nullopt;
}

std::optional<SchedulingSpec> PolicyAsSpec(std::string_view policy,
                                           const SchedulerOptions& options) {
  std::optional<SchedulingSpec> spec = PolicyAsSpec(policy);
  if (spec && (policy == "kvroute" || policy == "kvroute-slo" ||
               policy == "kvroute-lora-blind" || policy == "kvroute-speed-aware" ||
               policy == "kvroute-blend" || policy == "kvroute-token-aware") &&
      !options.region.empty()) {
    // Locality first: it must see every candidate, before the saturation filter drops the
    // saturated local ones (which would hide why they are gone).
    spec->plugins.insert(spec->plugins.begin(), P("locality-filter"));
    ProfileSpec& prof = spec->profiles[0];
    prof.plugins.insert(prof.plugins.begin(), ProfilePluginRef{"locality-filter", 1, 0});
  }
  return spec;
}

SchedulingSpec SeedArticleSpec() {
  return Profile({P("prefix-cache-scorer"), P("kv-cache-utilization-scorer"),
                  P("queue-depth-scorer")},
                 {{"prefix-cache-scorer", 3},
                  {"kv-cache-utilization-scorer", 2},
                  {"queue-depth-scorer", 1}});
}

BuildResult BuildScheduler(const SchedulingSpec& spec, const SchedulerOptions& options) {
  BuildResult r;
  if (auto err = Walk(spec, nullptr)) {
    r.error = std::move(err);
    return r;
  }
  std::string policy = spec.policy;
  if (policy.empty() && spec.plugins.empty() && spec.profiles.empty()) policy = "kvroute";
  if (policy == "sglang-cache-aware") {
    r.scheduler = std::make_unique<SglangCacheAwareScheduler>(SglangCacheAwareScheduler::Config{},
                                                              options);
    return r;
  }
  if (policy == "llm-d-sticky" || policy == "llm-d-precise") {
    LlmdStickyScheduler::Config config;
    config.precise = policy == "llm-d-precise";
    r.scheduler = std::make_unique<LlmdStickyScheduler>(config, options);
    return r;
  }
  if (policy == "dynamo-cost" || policy == "dynamo-cost-output-blocks" || policy == "dynamo-kv") {
    DynamoCostScheduler::Config config;
    config.track_output_blocks = policy == "dynamo-cost-output-blocks";
    config.events = policy == "dynamo-kv";
    r.scheduler = std::make_unique<DynamoCostScheduler>(config, options);
    return r;
  }
  const SchedulingSpec* effective = &spec;
  std::optional<SchedulingSpec> expanded;
  if (!policy.empty()) {
    expanded = PolicyAsSpec(policy, options);
    effective = &*expanded;
  }
  ProfileScheduler::Parts parts;
  parts.policy = policy.empty() ? "custom" : policy;
  if (auto err = Walk(*effective, &parts)) {
    r.error = std::move(err);
    return r;
  }
  r.scheduler = std::make_unique<ProfileScheduler>(std::move(parts), options);
  return r;
}

BuildResult BuildPolicy(std::string_view policy, const SchedulerOptions& options) {
  SchedulingSpec s;
  s.policy = std::string(policy);
  return BuildScheduler(s, options);
}

std::span<const std::string_view> PluginTypes() {
  static const std::vector<std::string_view> types = [] {
    std::vector<std::string_view> t;
    for (const PluginDef& d : Defs()) t.push_back(d.type);
    return t;
  }();
  return types;
}

std::span<const std::string_view> PolicyNames() { return kPolicies; }

bool PolicyNeedsEvents(std::string_view policy) {
  return policy == "llm-d-precise" || policy == "dynamo-kv" || policy == "llm-d-2025-precise";
}

}  // namespace kvroute::sched
